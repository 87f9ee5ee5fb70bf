"""The source-agnostic ingest: ReadResult → plan → run (Zarr + WebDataset into a staging folder) → publish.

- `plan` (dpot_data.ingest.plan) decides everything about the output without I/O;
- `run` (dpot_data.ingest.run) processes blocks of trajectories as tasks (a bounded window in flight, never whole
  files) and writes them into OUT/.staging-<dataset>, whose journal (dpot_data.ingest.journal) records every finished block
  so that re-running an interrupted ingest resumes it with a byte-identical result;
- `publish` (dpot_data.ingest.publish) makes the staged output the output of OUT with one atomic manifest rename,
  the old output valid until then; one ingest at a time writes into an OUT (`OutputLock`).

`run_ingest` is the one entry point from raw files (local or URLs, optionally named by a catalog dataset); the CLI,
the corpus and library users call it. An OUT that already holds a valid manifest is left alone unless `overwrite`.
"""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

from dpot_data.ingest import journal as jn
from dpot_data import manifest_io as mf
from dpot_data import stats as st
from dpot_data.errors import InputError
from dpot_data.ingest.input_hashes import InputHashes
from dpot_data.ingest.options import CONVENTIONS, FORMATS, IngestOptions, IngestOutcome, check_options, parse_split
from dpot_data.ingest.plan import IngestPlan, assign_splits, resampled_coord, zarr_attrs
from dpot_data.ingest.plan import plan as make_plan
from dpot_data.ingest.publish import OutputLock, existing_manifest, left_alone_note
from dpot_data.ingest.publish import publish as publish_output
from dpot_data.ingest.run import Written, zarr_layout
from dpot_data.ingest.run import run as run_plan
from dpot_data.ingest.task import BlockTask
from dpot_data.ingest.scheduler import SchedulerOptions, scheduler_context
from dpot_data.sources.base import ReadResult, load_source

__all__ = ["CONVENTIONS", "FORMATS", "IngestOptions", "IngestOutcome", "InputHashes", "assign_splits", "ingest",
           "ingest_files",
           "parse_split", "read_source", "resampled_coord", "run_ingest"]

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def ingest(result: ReadResult, out: str | Path, options: IngestOptions | None = None, *,
           hashes: InputHashes | None = None) -> IngestOutcome:
    """Write one dataset from a reader's result into the local folder OUT (Zarr and/or WebDataset, then the
    manifest); a second ingest into the same OUT while this one runs is refused. `hashes`: the input files' hashes
    if already started (run_ingest starts them before reading)."""
    opts = options or IngestOptions()
    out = Path(out)
    try:
        with OutputLock(out):
            existing = existing_manifest(out)
            if existing is not None and not opts.overwrite:
                return IngestOutcome(existing, out / mf.MANIFEST_NAME, False, [left_alone_note(out)])
            p = make_plan(result, opts)
            if opts.scheduler:  # an unreachable scheduler fails here, before a staging folder exists
                with scheduler_context(SchedulerOptions(address=opts.scheduler)):
                    pass
            for text in p.warnings:
                warnings.warn(text, stacklevel=2)
            with contextlib.ExitStack() as stack:
                if hashes is None:
                    hashes = stack.enter_context(InputHashes())
                return _write(result, out, opts, p, hashes)
    except OSError as exc:  # the output folder, its lock, staging, writing or publishing
        if exc.errno in NO_SPACE:
            raise InputError(out, f"no space left on the device ({exc.strerror}); nothing was published and "
                                  "the output folder holds what it held before; the finished part stays staged, "
                                  "so re-running the same command after freeing space resumes") from None
        raise


def _write(result: ReadResult, out: Path, opts: IngestOptions, p: IngestPlan, hashes: InputHashes) -> IngestOutcome:
    """Run the plan into the staging folder (resuming an interrupted run of the same job) and publish it."""
    command = opts.command if opts.command is not None else mf.command_line()
    job = jn.job_fingerprint(result.inputs, p.identity, p.blocks)
    try:
        journal = jn.Journal.open(out, p.name, job, [x.split for x in p.pieces], p.rows_per_block(),
                                  zarr="zarr" in p.formats, shards="wds" in p.formats)
    except jn.JournalBusy as exc:
        raise InputError(out, str(exc)) from None
    notes = [journal.describe()] if journal.resumed else []
    hashes.add(list(result.inputs))  # hashed while the blocks run, if not already
    try:
        layout = zarr_layout(p, opts.fill, zarr_attrs(p, result, opts, command))
        task = BlockTask.of(p, result.data, opts.fill, opts.stats, layout.codec)
        written = run_plan(p, task, journal, layout, opts)
        entry = _complete_entry(p, written, hashes.entries(list(result.inputs)), layout.codec)
        manifest = publish_output(out, journal.staging, entry, command, opts.overwrite)
    finally:
        journal.close()
    return IngestOutcome(manifest, out / mf.MANIFEST_NAME, True, notes)


def _complete_entry(p: IngestPlan, written: Written, inputs: list[dict[str, Any]], codec: str) -> dict[str, Any]:
    """The plan's manifest entry with what the run produced."""
    acc = written.stats
    stats = st.to_manifest(acc, p.channels, p.channel_valid.tolist()) if acc is not None and acc.trajectories else None
    zarr = None if written.arrays is None else {"path": "data.zarr", "group": p.name, "arrays": written.arrays,
                                                "codec": codec}
    return {**p.entry, "shards": written.shards, "zarr": zarr, "inputs": inputs, "stats": stats}


def read_source(source: str, paths: Sequence[str | Path], options: IngestOptions | None = None,
                **reader_options: Any) -> ReadResult:
    """Open raw files with the named source's reader (dpot_data.sources.<source>.read); `options.block` becomes the
    reader's `block` (trajectories per task) unless reader_options names one."""
    if options is not None and options.block is not None:
        reader_options.setdefault("block", options.block)
    if options is not None:
        reader_options.setdefault("convention", options.convention)
        reader_options.setdefault("check_finite", True if options.nonfinite == "skip" else options.nonfinite)
    try:
        module = load_source(source)
    except ValueError as exc:
        raise InputError(source, str(exc)) from None
    params = inspect.signature(module.read).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        reader_options = {k: v for k, v in reader_options.items()
                          if k not in ("block", "convention", "check_finite") or k in params}
    return module.read([Path(os.fsdecode(p)) for p in paths], **reader_options)


def run_ingest(source: str | None, paths: Sequence[str | Path], out: str | Path,
               options: IngestOptions | None = None, *, dataset: str | None = None, catalog: Any = None,
               catalog_split: bool = True, workdir: str | Path | None = None, hashes: InputHashes | None = None,
               **reader_options: Any) -> IngestOutcome:
    """Ingest raw files into OUT: the one entry point. Paths and OUT may be fsspec URLs (inputs are copied into a
    local cache, the output uploaded with its manifest last). `source` None or "auto" detects it. With `dataset`
    (a catalog name), a detected source, or `catalog` (True, or a dpot_data.catalog.Catalog), the files are compared
    with the catalog (warnings in `outcome.warnings`) and take its split unless one is given. An OUT that already
    holds a complete manifest is left alone without reading anything. `hashes`: input hashing the caller started
    earlier still (the CLI starts it before its imports); else it starts here, before the files are read."""
    from dpot_data import catalog as cat
    from dpot_data.ingest import remote

    opts = options or IngestOptions()
    check_options(opts)  # before anything is read
    paths = [os.fsdecode(p) for p in paths]  # str, Path or bytes (a name that is not UTF-8 arrives as bytes)
    staged = remote.prepare(paths, out, opts.overwrite, workdir)
    if staged.existing is not None:
        return staged.existing
    source = None if source == "auto" else source
    compare = bool(catalog) or dataset is not None or source is None
    book = catalog if isinstance(catalog, cat.Catalog) else None
    inputs = [Path(p) for p in staged.inputs]
    found = cat.match(inputs, dataset=dataset, source=source, catalog=book, reader_options=reader_options) \
        if compare else cat.CatalogMatch(str(source), inputs, None, reader_options)
    with contextlib.ExitStack() as stack:
        hashes = hashes if hashes is not None else stack.enter_context(InputHashes())
        hashes.add(found.inputs)
        result = read_source(found.source, found.inputs, opts, **found.reader_options)
        notes: list[str] = []
        if compare:
            opts, notes = cat.review(result, found, opts, catalog_split and opts.split is None, catalog=book)
        outcome = ingest(result, staged.out, opts, hashes=hashes)
    outcome.source, outcome.entry, outcome.warnings = found.source, found.entry, notes
    return remote.publish(staged, outcome)


def ingest_files(source: str | None, paths: Sequence[str | Path], out: str | Path,
                 options: IngestOptions | None = None, **kwargs: Any) -> dict[str, Any]:
    """`run_ingest`, returning the manifest (the existing one when OUT was already complete)."""
    return run_ingest(source, paths, out, options, **kwargs).manifest
