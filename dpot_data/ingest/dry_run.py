"""`dpot-data ingest --dry-run`: what an ingest would read and write, and about how big, decided by the same reader,
catalog review and plan as the ingest itself (dpot_data.ingest.plan), without writing anything."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from dpot_data.errors import InputError
from dpot_data.ingest.options import IngestOptions, check_options
from dpot_data.ingest.plan import IngestPlan
from dpot_data.ingest.plan import plan as make_plan
from dpot_data.sources.base import SPLITS, ReadResult


def plan_only(source: str | None, paths: Sequence[str], options: IngestOptions, *, dataset: str | None = None,
              catalog_split: bool = True, reader: dict[str, Any] | None = None,
              ) -> tuple[ReadResult, IngestPlan, str, list[str]]:
    """Open the files as `run_ingest` would (catalog match, reader, review) and plan the output; nothing is
    written and no value is scanned (`reader`: the source's own options, as `run_ingest` takes them). Returns the
    reader's result, the plan, the source and the catalog's notes."""
    from dpot_data import catalog as cat
    from dpot_data.ingest.job import IngestJob, Target
    from dpot_data.ingest.pipeline import read_source
    from dpot_data.ingest.review import review

    check_options(options)
    if any("://" in str(p) for p in paths):
        raise InputError("--dry-run", "expected local files (a URL is copied before it is read; run without "
                                      "--dry-run)")
    source = None if source == "auto" else source
    book = cat.load_catalog()
    found = cat.match([Path(p) for p in paths], dataset=dataset, source=source, catalog=book,
                      reader_options=dict(reader or {}))
    # no NaN/Inf scan: it reads every value, which a dry run is meant to avoid
    result = read_source(found.source, found.inputs, replace(options, nonfinite="raise"), **found.reader_options)
    job = IngestJob(found.source, tuple(Path(p) for p in found.inputs), Target("", Path("."), None, None, None),
                    options, found.reader_options, entry=found.entry, catalog=book,
                    catalog_split=catalog_split and options.split is None)
    checked = review(result, job)
    result, opts, notes = checked.result, checked.options, checked.warnings
    return result, make_plan(result, opts), found.source, notes


def describe(result: ReadResult, p: IngestPlan, source: str) -> list[str]:
    """The dry run's report: one line per fact read and written."""
    inputs = [Path(x) for x in result.inputs]
    native_frames = int(result.data.sizes["time"])
    cells = math.prod(p.grid.target)
    fields = len(p.pieces) * p.frames * len(p.channels) * cells * 4  # float32
    masks = len(p.pieces) * cells  # uint8
    counts = ", ".join(f"{s} {p.count(s)}" for s in SPLITS if p.count(s))
    grid = "x".join(map(str, p.grid.target))
    native = "x".join(map(str, p.grid.native))
    lines = [f"read:  {len(inputs)} file(s), {sum(os.path.getsize(x) for x in inputs if x.is_file())} bytes: "
             + ", ".join(str(x) for x in inputs),
             f"       source {source}, dataset {p.name}, {result.n_samples} trajectories of {native_frames} frames, "
             f"native grid {native} ({', '.join(p.grid.dims)}), channels {', '.join(p.channels[:p.native_channels])}",
             f"write: {len(p.pieces)} trajectories x {p.frames} frames x {len(p.channels)} channels "
             f"({', '.join(p.channels)}) x {grid}"
             + ("" if p.grid.method == "none" else f" (resampled from {native}, {p.grid.method})"),
             f"       split {counts} ({p.entry['splits']['rule']})",
             f"       formats {', '.join(p.formats)}: about {_size(fields + masks)} per format (float32 fields and "
             "the mask" + ("; the Zarr store is compressed, so at most that)" if "zarr" in p.formats else ")")]
    return lines + [f"warning: {w}" for w in p.warnings]


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit} ({n} bytes)"
    return f"{n} bytes"


def dry_run(source: str | None, paths: Sequence[str], options: IngestOptions, **kwargs: Any) -> list[str]:
    """`plan_only` and `describe` together: the lines `dpot-data ingest --dry-run` prints."""
    result, p, found_source, notes = plan_only(source, paths, options, **kwargs)
    return [f"warning: {n}" for n in notes] + describe(result, p, found_source)
