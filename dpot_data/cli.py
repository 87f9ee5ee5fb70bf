"""`dpot-data`: the command-line face of the data toolkit. Thin: every command calls a library function."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="dpot-data",
    help="Ingest public PDE datasets (FNO, PDEBench, PDEArena, CFDBench) into Zarr stores and WebDataset "
    "shards with a checksummed manifest, and inspect what was written.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
synth_app = typer.Typer(help="Write small raw files in the exact published layout of each source.", no_args_is_help=True)
ingest_app = typer.Typer(help="Read raw files of one source and write shards, a Zarr store and a manifest.", no_args_is_help=True)
app.add_typer(synth_app, name="synth")
app.add_typer(ingest_app, name="ingest")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
