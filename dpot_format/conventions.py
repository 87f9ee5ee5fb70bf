"""Convention names a manifest records (docs/conventions.md) and the one rule telling the paper's data, which the
released DPOT checkpoints were pre-trained on as stored, from everything else, which trains normalised by default."""

from __future__ import annotations

from typing import Any, Mapping

REFERENCE = "dpot-reference"  # the paper's sources as the reference pipeline fed them to the released checkpoints
CANONICAL = "canonical"  # our own convention (`--convention canonical`)
OWN_DATA = "own-data"  # data the reference never saw (`ingest xarray`, `ingest the-well`), processed as it would be
NAMES = (REFERENCE, CANONICAL, OWN_DATA)

PAPER_SOURCES = ("fno", "pdebench", "pdearena", "cfdbench")
"""The readers of the DPOT paper's sources (FNO, PDEBench, PDEArena, CFDBench): a manifest entry's `source`."""


def recorded_name(convention: str, source: str) -> str:
    """The convention a manifest records for an ingest of `source` asked for `convention`: the default
    (dpot-reference) applied to a source outside the paper's is `own-data`, the rest as asked."""
    return OWN_DATA if convention == REFERENCE and source not in PAPER_SOURCES else convention


def is_paper_reference(entry: Mapping[str, Any]) -> bool:
    """Whether a manifest dataset entry is one of the paper's sources under dpot-reference: handed to the model as
    stored (what the released checkpoints saw). Decided by the source, so an own-data entry written before
    `own-data` existed (it recorded dpot-reference) is not mistaken for the paper's data."""
    convention = entry.get("convention") or {}
    return entry.get("source") in PAPER_SOURCES and convention.get("name") == REFERENCE
