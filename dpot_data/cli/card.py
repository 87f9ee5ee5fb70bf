"""`dpot-data card`: the dataset card beside each manifest (dpot_data.card.write_cards)."""

from typing import Annotated

import typer

from dpot_data.cli.options import fail
from dpot_data.errors import InputError


def card_command(
    folder: Annotated[str, typer.Argument(help="An ingest output folder or fsspec URL (holding manifest.json), or an "
                                          "`ingest corpus` folder (one card per dataset folder in it).")],
) -> None:
    """Write a dataset card beside each manifest: README.md in the Hugging Face dataset-card form (YAML front matter:
licence, pretty_name, tags, task_categories, size_categories, configs with the shards of each split) and a body
saying what the data is (equation, source, licence and BibTeX citation from the catalog; "not given" for data the
catalog does not know), its grid and axis order, frames, dt, channels with units, geometry mask, splits (trajectories,
shards, bytes), the manifest's statistics, the sha256 of every shard, the ingest command and dpot version, and a
preview picture (card/<dataset>.png: the first frame of the first test, else train, trajectory). Each file is
written atomically; an output without a manifest, or one that fails the format's check, is refused (exit 2)."""
    from dpot_data.card import write_cards

    try:
        for written in write_cards(folder):
            typer.echo(f"wrote {written[-1]}", err=True)
    except InputError as exc:
        raise fail(exc) from None
