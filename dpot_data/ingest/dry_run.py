"""`dpot-data ingest --dry-run`: what an ingest would read and write, and about how big, decided by the same job
resolution, reader, catalog review and plan as the ingest itself, without writing anything."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from dpot_data.errors import InputError
from dpot_data.ingest.job import IngestJob, resolve
from dpot_data.ingest.options import IngestOptions
from dpot_data.ingest.plan import IngestPlan
from dpot_data.ingest.plan import plan as make_plan
from dpot_data.ingest.review import review
from dpot_data.sources.base import SPLITS, ReadResult


def plan_only(source: str | None, paths: Sequence[str], options: IngestOptions, *, out: str,
              dataset: str | None = None, catalog_split: bool = True, reader: dict[str, Any] | None = None,
              ) -> tuple[ReadResult | None, IngestPlan | None, IngestJob, list[str]]:
    """Resolve the job as `run_ingest` does (`resolve`: options, output, catalog match) and plan its output; nothing
    is written and no value is scanned (`reader`: the source's own options). Returns the reader's result, the plan,
    the job and the catalog's notes; result and plan are None when OUT already holds this ingest (`job.existing`)."""
    from dpot_data.ingest.pipeline import read_source

    if any("://" in str(p) for p in [*paths, out]):
        raise InputError("--dry-run", "expected local files and --out (a URL is copied before it is read; run "
                                      "without --dry-run)")
    job = resolve(source, paths, out, options, dataset=dataset, catalog=True, catalog_split=catalog_split,
                  reader_options=reader)
    if job.existing is not None:
        return None, None, job, []
    # no NaN/Inf scan: it reads every value, which a dry run is meant to avoid
    result = read_source(job.source, job.inputs, replace(job.options, nonfinite="raise"), **job.reader_options)
    checked = review(result, job)
    return checked.result, make_plan(checked.result, checked.options), job, checked.warnings


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
    result, p, job, notes = plan_only(source, paths, options, **kwargs)
    if result is None or p is None:
        return [f"{n}; nothing would be written" for n in job.existing.notes]
    return [f"warning: {n}" for n in notes] + describe(result, p, job.source)
