"""The catalog's word on what a reader returned, as a pure function of (result, job): files that are another
dataset than the one named are refused; partial sets, odd shapes and counts are warnings, recorded in the entry's
provenance under "catalog"; the catalog's split applies when none is given and the reader has none."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from dpot_data import catalog as cat
from dpot_data.errors import InputError
from dpot_data.ingest.job import IngestJob
from dpot_data.ingest.options import IngestOptions
from dpot_data.sources.base import ReadResult


@dataclass(frozen=True)
class Review:
    """The options to ingest with, the warnings, the result with its provenance, the catalog entry (or None)."""

    options: IngestOptions
    warnings: list[str]
    result: ReadResult
    entry: Any


def review(result: ReadResult, job: IngestJob) -> Review:
    """Compare what was read with the job's catalog entry (or the entry the files' dataset name finds); the reader's
    result is not changed: the one returned carries the provenance."""
    if job.catalog is None:
        return Review(job.options, [], result, job.entry)
    entry = job.entry
    if entry is not None:
        wrong = cat.conflicts(result, entry)
        if wrong:
            raise InputError(job.inputs[0], f"does not belong to catalog dataset {entry.name}: {'; '.join(wrong)}; "
                                            "name the matching dataset, or leave out --dataset")
    else:
        entry = job.catalog.find(str(result.data.attrs.get("dataset", "")))
    warnings = cat.compare(result, entry) if entry is not None else [
        f"{result.data.attrs.get('dataset')}: not in the catalog ({job.catalog.path}); nothing to compare with"]
    options = job.options
    # the catalog's split whether the entry was named (--dataset) or found from the files: one file, one split
    if entry is not None and job.catalog_split and entry.split.rule == "random" and result.split is None:
        options = replace(options, split=(entry.split.ratios["train"], entry.split.ratios["valid"]),
                          seed=entry.split.seed)
    provenance = dict(result.data.attrs.get("provenance") or {})
    provenance["catalog"] = {"entry": entry.name if entry else None, "warnings": warnings}
    data = result.data.assign_attrs(provenance=provenance)  # a new Dataset over the same lazy arrays
    return Review(options, warnings, replace(result, data=data), entry)
