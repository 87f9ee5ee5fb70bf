"""The ingest, from raw files to a published output: lock the output → `resolve` the job once → read → plan → run →
publish → upload (a URL output). `ingest` is the part from a reader's result into a local folder."""

from __future__ import annotations

import contextlib
import errno
import inspect
import os
import shutil
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from dpot_data import manifest_io as mf
from dpot_data import stats as st
from dpot_data.errors import InputError, TrajectoryError
from dpot_data.ingest import journal as jn
from dpot_data.ingest import remote
from dpot_data.ingest.identity import InputIdentity
from dpot_data.ingest.input_hashes import InputHashes
from dpot_data.ingest.job import IngestJob, Target, check_out_name, resolve, url_key, work_root
from dpot_data.ingest.options import IngestOptions, IngestOutcome, check_options
from dpot_data.ingest.plan import IngestPlan, zarr_attrs
from dpot_data.ingest.plan import plan as make_plan
from dpot_data.ingest.publish import OutputLock, existing_outcome, remove_leftovers
from dpot_data.ingest.publish import publish as publish_output
from dpot_data.ingest.review import review
from dpot_data.ingest.run import Written, zarr_layout
from dpot_data.ingest.run import run as run_plan
from dpot_data.ingest.scheduler import SchedulerOptions, scheduler_context
from dpot_data.ingest.task import BlockTask
from dpot_data.sources.base import ReadResult, load_source
from dpot_format import io as fio
from dpot_format.errors import FormatError
from dpot_format.names import ZARR_PATH

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def no_space(where: str | Path, exc: OSError) -> InputError:
    """The one line for a full disk (or quota) while writing an output."""
    return InputError(where, f"no space left on the device ({exc.strerror}); nothing was published and the output "
                             "folder holds what it held before; the finished part stays staged, so re-running the "
                             "same command after freeing space resumes")


@contextlib.contextmanager
def output_lock(out: str) -> Iterator[None]:
    """Hold the output's lock for the whole ingest, upload included: a local OUT's `.dpot-ingest.lock`, a URL's lock
    in the local working root. A second ingest into the same output is refused with one line."""
    try:
        with OutputLock(Path(fio.local_path(out))) if fio.is_local(out) else remote.url_lock(out):
            yield
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise no_space(out, exc) from None
        raise


def ingest(result: ReadResult, out: str | Path, options: IngestOptions | None = None, *,
           hashes: InputHashes | None = None, input_names: Mapping[str, str] | None = None,
           identity: InputIdentity | None = None) -> IngestOutcome:
    """Write one dataset from a reader's result into the local folder OUT (Zarr and/or WebDataset, then the
    manifest); a second ingest into the same OUT while this one runs is refused; a complete OUT is left alone
    unless `overwrite`. `hashes`: the input files' hashes if already started; `identity`: the inputs as recorded
    before the reader opened them (default: as they are now)."""
    opts = options or IngestOptions()
    out = Path(out)
    with output_lock(str(out)):
        existing = existing_outcome(out, opts.overwrite)  # the one "complete: leave it alone" decision
        return existing or write_locked(result, out, opts, hashes, input_names or {}, identity)


def write_locked(result: ReadResult, out: Path, opts: IngestOptions, hashes: InputHashes | None,
                 input_names: Mapping[str, str], identity: InputIdentity | None = None) -> IngestOutcome:
    """Plan, run and publish into OUT, whose lock the caller holds. Everything the format refuses is refused by the
    plan, before a staging folder exists. Every input must stay the file `identity` recorded (default: the inputs
    as they are now) until the output is published: checked by each block task and before publishing."""
    try:
        p = make_plan(result, opts)
        if opts.scheduler:  # an unreachable scheduler fails here, before a staging folder exists
            with scheduler_context(SchedulerOptions(address=opts.scheduler)):
                pass
        for text in p.warnings:
            warnings.warn(text, stacklevel=3)
        with contextlib.ExitStack() as stack:
            if hashes is None:
                hashes = stack.enter_context(InputHashes())
            ident = (identity or InputIdentity.of(result.inputs, exclude=(out,))).covering(result.inputs)
            return _write(result, out, opts, p, hashes, input_names, ident)
    except OSError as exc:  # the output folder, staging, writing or publishing
        if exc.errno in NO_SPACE:
            raise no_space(out, exc) from None
        raise
    except FormatError as exc:  # the plan checks the format's rules; this is the last line of defence
        raise InputError(exc.where or out, exc.expected) from None


def _write(result: ReadResult, out: Path, opts: IngestOptions, p: IngestPlan, hashes: InputHashes,
           input_names: Mapping[str, str], identity: InputIdentity) -> IngestOutcome:
    """Run the plan into the staging folder (resuming an interrupted run of the same job) and publish it. An input
    refused while it is read (a bad value, a file replaced meanwhile) leaves nothing behind: the staged part goes."""
    command = opts.command if opts.command is not None else mf.command_line()
    job = jn.job_fingerprint(result.inputs, p.identity, p.blocks)
    try:
        journal = jn.Journal.open(out, p.name, job, [x.split for x in p.pieces], p.rows_per_block(),
                                  zarr="zarr" in p.formats, shards="wds" in p.formats)
    except jn.JournalBusy as exc:
        raise InputError(out, str(exc)) from None
    notes = [journal.describe()] if journal.resumed else []
    hashes.add(list(result.inputs))  # hashed while the blocks run, if not already
    spent = False  # whether the staged part goes: nothing a re-run of the same command could resume from
    try:
        try:
            layout = zarr_layout(p, opts.fill, zarr_attrs(p, result, opts, command))
            task = replace(BlockTask.of(p, result.data, opts.fill, opts.stats, layout.codec), identity=identity,
                           max_abs=float(opts.max_abs), names=tuple(p.channels),
                           inputs={Path(i).name: input_names.get(str(i), str(i)) for i in result.inputs})
            written = run_plan(p, task, journal, layout, opts)
            hashed = hashes.entries(list(result.inputs), identity)
            identity.check(full=True)  # the last look: every input, and every file in an input folder, unchanged
        except InputError:
            spent = True
            raise
        inputs = [{**i, "path": input_names.get(i["path"], i["path"])} for i in hashed]
        entry = _complete_entry(p, written, inputs, layout.codec)
        manifest = publish_output(out, journal.staging, entry, command, opts.overwrite)
    except InputError:
        raise  # publishing's refusals keep the staged part for the re-run their message names
    except BaseException as exc:
        spent = not resumable(exc)
        raise
    finally:
        journal.close()
        if spent:
            shutil.rmtree(journal.staging, ignore_errors=True)
    return IngestOutcome(manifest, out / mf.MANIFEST_NAME, True, notes)


def resumable(exc: BaseException) -> bool:
    """Whether an ingest that failed with `exc` keeps its staged part for the same command to resume: an
    interruption (Ctrl-C, SystemExit: anything not an Exception), the machine (a full disk or another OS error,
    memory, a lost worker process) -- not an error of the data or of the program, which a re-run would meet again
    (its staging goes)."""
    from concurrent.futures import BrokenExecutor

    lost_worker = type(exc).__name__ in ("KilledWorker", "CommClosedError")  # dask.distributed's, not imported here
    return not isinstance(exc, Exception) or isinstance(exc, (OSError, MemoryError, BrokenExecutor)) or lost_worker


def _complete_entry(p: IngestPlan, written: Written, inputs: list[dict[str, Any]], codec: str) -> dict[str, Any]:
    """The plan's manifest entry with what the run produced."""
    acc = written.stats
    stats = st.to_manifest(acc, p.channels, p.channel_valid.tolist()) if acc is not None and acc.trajectories else None
    zarr = None if written.arrays is None else {"path": ZARR_PATH, "group": p.name, "arrays": written.arrays,
                                                "codec": codec}
    extra = {"shard_index": written.shard_index} if written.shard_index is not None else {}
    return {**p.entry, "shards": written.shards, "zarr": zarr, "inputs": inputs, "stats": stats, **extra}


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
    local working folder keyed by the job, the output uploaded with its manifest last). `source` None or "auto"
    detects it. With `dataset` (a catalog name), a detected source, or `catalog` (True, or a Catalog), the files are
    compared with the catalog (warnings in `outcome.warnings`) and take its split unless one is given. An OUT that
    already holds a complete manifest is left alone without reading anything. `hashes`: input hashing the caller
    started earlier still (the CLI starts it before its imports); else it starts here, before the files are read."""
    opts = options or IngestOptions()
    check_options(opts)  # before anything is read or created
    check_out_name(str(out))
    with output_lock(str(out)):
        try:
            job = resolve(source, paths, out, opts, dataset=dataset, catalog=catalog, catalog_split=catalog_split,
                          workdir=workdir, reader_options=reader_options)
            outcome = execute(job, hashes)
            if opts.card:  # the manifest is published (and uploaded): the card describes it, under the same lock
                from dpot_data.card import write_card
                from dpot_data.catalog import Catalog

                write_card(str(out), catalog if isinstance(catalog, Catalog) else None)
            return outcome
        except OSError as exc:  # a full disk while copying inputs in or uploading
            if exc.errno in NO_SPACE:
                raise no_space(out, exc) from None
            raise


def execute(job: IngestJob, hashes: InputHashes | None = None) -> IngestOutcome:
    """Run a resolved job (the caller holds the output's lock): read → plan → run → publish → upload."""
    target = job.target
    if job.existing is not None:
        if target.remote is None:
            remove_leftovers(target.local, job.existing.manifest, spent_only=True)  # what a kill after the commit left
        return job.existing
    if job.upload_only:
        outcome = IngestOutcome(mf.read(target.local), target.local / mf.MANIFEST_NAME, True, [])
    else:
        outcome = _read_and_write(job, hashes)
    if target.remote is not None:
        outcome = remote.publish(job, outcome)
    if target.workdir is not None:
        _remove_workdirs(target)
    return outcome


def _remove_workdirs(target: Target) -> None:
    """Remove the job's working folder once its output is in place; under the default root, the folders other
    jobs into the same URL left too (they wait on the URL's lock, which this job holds: none is running)."""
    shutil.rmtree(target.workdir, ignore_errors=True)
    base = target.workdir.parent
    if target.remote is not None and base == work_root() / url_key(target.out) and base.is_dir():
        for other in base.iterdir():
            shutil.rmtree(other, ignore_errors=True)
    with contextlib.suppress(OSError):
        base.rmdir()  # the URL's (or the caller's) working folder, once no job is left in it


def scan_deferred(job: IngestJob) -> bool:
    """Whether the job reads without the NaN/Inf scan at open first (`_read_and_write`): under `--nonfinite skip`
    with a reader whose block reads refuse every trajectory the scan would leave out (its SCAN_IN_BLOCK_READS), unless
    the caller chose `check_finite` or a staged part waits to be resumed (it was planned from a scan, maybe)."""
    if job.options.nonfinite != "skip" or "check_finite" in job.reader_options:
        return False
    local = job.target.local
    if local.is_dir() and any(p.name.startswith(jn.STAGING_PREFIX) for p in local.iterdir()):
        return False
    try:
        return bool(getattr(load_source(job.source), "SCAN_IN_BLOCK_READS", False))
    except ValueError:
        return False  # an unknown source: read_source says so


def _read_and_write(job: IngestJob, hashes: InputHashes | None) -> IngestOutcome:
    """Read the job's inputs and write them into its local folder. Under `--nonfinite skip` the files are first read
    with no scan, every value checked by the block read that copies it (`scan_deferred`); the plan is the same as
    after a scan that finds nothing. A block meeting a trajectory the scan leaves out (TrajectoryError) ends that
    attempt with nothing kept of it (its staging goes, nothing is published), and the ingest starts again from a
    scan, as it always did: a file holding such trajectories is read once more, a clean one is never scanned."""
    with contextlib.ExitStack() as stack:
        hashes = hashes if hashes is not None else stack.enter_context(InputHashes())
        hashes.add(list(job.inputs))
        if scan_deferred(job):
            try:
                with warnings.catch_warnings(record=True) as said:  # the plan's warnings: told once it stands
                    warnings.simplefilter("always")
                    outcome = _read_and_write_with(job, hashes, {**job.reader_options, "check_finite": "raise"})
            except TrajectoryError:
                pass  # a trajectory to leave out: the scan finds every such one, then the ingest runs again
            else:
                for w in said:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
                return outcome
        return _read_and_write_with(job, hashes, job.reader_options)


def _read_and_write_with(job: IngestJob, hashes: InputHashes, reader_options: Mapping[str, Any]) -> IngestOutcome:
    """Read the job's inputs with `reader_options` and write them into its local folder."""
    result = read_source(job.source, job.inputs, job.options, **reader_options)
    said = review(result, job)
    with contextlib.ExitStack() as local:
        if job.target.remote is not None:  # the job's own working folder: its lock, no decision to make
            local.enter_context(output_lock(str(job.target.local)))
        outcome = write_locked(said.result, job.target.local, said.options, hashes, job.input_names,
                               job.identity)
    return replace(outcome, source=job.source, entry=said.entry, warnings=list(said.warnings))


def ingest_files(source: str | None, paths: Sequence[str | Path], out: str | Path,
                 options: IngestOptions | None = None, **kwargs: Any) -> dict[str, Any]:
    """`run_ingest`, returning the manifest (the existing one when OUT was already complete)."""
    return run_ingest(source, paths, out, options, **kwargs).manifest
