"""`dpot-data catalog`: the public datasets dpot-data knows (dpot_data.catalog), or what a download folder holds
(dpot_data.corpus.check_downloads)."""

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from dpot_data.cli.options import EntriesJson, fail, say
from dpot_data.errors import CatalogError, InputError


def catalog_command(
    name: Annotated[Optional[str], typer.Argument(help="One dataset (catalog or manifest name): all its "
                                                  "facts.")] = None,
    pretrain: Annotated[bool, typer.Option("--pretrain", help="Only the 12 datasets of the DPOT pre-training "
                                           "corpus.")] = False,
    as_json: EntriesJson = False,
    check: Annotated[Optional[Path], typer.Option("--check", help="A download folder: which catalog datasets it "
                                                  "holds, which pre-training datasets it lacks, files no dataset "
                                                  "claims.")] = None,
    md5: Annotated[bool, typer.Option("--md5", help="With --check: compare each found file with its published "
                                      "MD5.")] = False,
) -> None:
    """The public datasets dpot-data knows: source, expected file names, trajectories, frames, grid, channels,
    the published download location and MD5 where there is one, and whether DPOT pre-trains on them; with a NAME, the
    ingest command for it; with --check DIR, what a download folder holds."""
    from dpot_data.catalog import catalog_table, entry_facts, entry_lines, select_entries

    if check is not None:
        raise typer.Exit(code=_check_downloads(check, md5, as_json))
    try:
        catalog, entries = select_entries(name, pretrain)
    except CatalogError as exc:
        raise fail(exc) from None
    if as_json:
        typer.echo(json.dumps([entry_facts(e) for e in entries], indent=1, default=str))
    elif name is not None:
        (entry,) = entries
        for line in entry_lines(entry):
            typer.echo(line)
    else:
        from rich.console import Console

        Console(width=200).print(catalog_table(catalog, entries))


def _check_downloads(folder: Path, md5: bool, as_json: bool) -> int:
    """`catalog --check DIR`: what the folder holds, said; the exit code (1 when a published MD5 differs)."""
    from dpot_data.corpus import check_downloads

    try:
        found = check_downloads(folder, md5)
    except InputError as exc:
        raise fail(exc) from None
    say(as_json, found.report, found.lines, indent=1)
    return found.code
