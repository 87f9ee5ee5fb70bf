"""`dpot-data`: the command-line face of the data toolkit, assembled from one module per command group (synth,
ingest, catalog, card, check: inspect/verify/stats); shared options in options.py. Thin: each command calls one
library function."""

from dpot_data.cli import ingest, synth
from dpot_data.cli.card import card_command
from dpot_data.cli.catalog import catalog_command
from dpot_data.cli.check import inspect_command, stats_command, verify_command
from dpot_format.cli_help import root_app

app = root_app("dpot-data", "Ingest public PDE datasets (FNO, PDEBench, PDEArena, CFDBench) into Zarr stores and "
               "WebDataset shards with a checksummed manifest, and inspect what was written.")
app.add_typer(synth.app, name="synth")
app.add_typer(ingest.app, name="ingest")
for name, command in (("catalog", catalog_command), ("inspect", inspect_command), ("card", card_command),
                      ("verify", verify_command), ("stats", stats_command)):
    app.command(name)(command)


def main() -> None:
    """The `dpot-data` console script."""
    app()
