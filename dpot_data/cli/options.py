"""The option declarations several `dpot-data` commands share (typing.Annotated aliases), the one-line error and
the printing helpers (JSON or text lines, written paths)."""

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

# synth: the raw files' folder, the seed of the random fields, and the sizes several writers share
RawOut = Annotated[Path, typer.Option("--out", help="Folder for the raw files.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the random smooth fields.")]
Samples = Annotated[int, typer.Option("--n", help="Samples (groups).")]
FramesOf101 = Annotated[int, typer.Option("--frames", help="Frames (published: 101).")]
GridOf128 = Annotated[int, typer.Option("--res", help="Grid size (published: 128).")]
PerFile = Annotated[int, typer.Option("--n", help="Trajectories per file.")]
Trajectories = Annotated[int, typer.Option("--n", help="Trajectories.")]
Frames = Annotated[int, typer.Option("--frames", help="Frames.")]

# commands that read an ingest output
OutputFolder = Annotated[str, typer.Argument(help="An ingest output folder or fsspec URL (holding manifest.json).")]
Scheduler = Annotated[Optional[str], typer.Option("--scheduler", help="dask.distributed scheduler address.")]


def _workers(help_text: str) -> Any:
    """`--workers N`: local threads, as the command's help says."""
    return Annotated[Optional[int], typer.Option("--workers", help=help_text)]


def _json_flag(what: str) -> Any:
    """`--json`: print `what` as JSON instead of text."""
    return Annotated[bool, typer.Option("--json", help=f"Print the {what} as JSON.")]


HashWorkers = _workers("Local threads hashing in parallel.")
StatsWorkers = _workers("Local threads.")
EntriesJson, ReportJson, ProblemsJson, StatsJson = map(_json_flag, ("entries", "report", "problems", "statistics"))


def fail(exc: Exception) -> typer.Exit:
    """Bad input: one line on stderr naming the file and what was expected, exit code 2."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(code=2)


def say(as_json: bool, doc: object, lines: list[str], indent: int = 2) -> None:
    """Print `doc` as JSON (--json), else the text lines, one a line."""
    if as_json:
        typer.echo(json.dumps(doc, indent=indent))
    else:
        for line in lines:
            typer.echo(line)


def echo_paths(paths: object) -> None:
    """Print each path written, one a line."""
    for path in paths if isinstance(paths, (list, tuple)) else [paths]:
        typer.echo(str(path))
