"""The source-agnostic ingest pipeline: ReadResult → split → (segment) → resample → pad → Zarr + WebDataset → manifest.

Trajectories are processed in blocks (one dask chunk of whole trajectories per task, a bounded window of tasks in
flight), never whole files. Everything is first written into the staging folder OUT/.staging-<dataset>; when all of
it is complete and durable it is renamed into place, and the manifest is written last, atomically. The staging
folder's journal (`dpot_data.journal`) records every finished block, so re-running an interrupted ingest with the
same inputs and options resumes it (completed shards kept, byte-identical result). An OUT that already holds a valid
manifest is left alone unless `overwrite` is set.
"""

from __future__ import annotations

import inspect
import json
import warnings
import math
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import dpot_data
from dpot_data import journal as jn
from dpot_data import manifest as mf
from dpot_data import stats as st
from dpot_data.errors import InputError
from dpot_data.hashing import sha256_file
from dpot_data.scheduler import SchedulerOptions, compute_in_task, scheduler_context
from dpot_data.sources.base import DATASET_NAME, SPLITS, ReadResult, check_result, load_source
from dpot_data.transform import (ANTIALIASED, MASK_METHODS, choose_method, pad_channels, resample_fields,
                                  resample_mask)
from dpot_data.writers.wds_shards import DEFAULT_SHARD_BYTES, SplitShardWriter
from dpot_data.writers.zarr_store import ZarrLayout

FORMATS = ("zarr", "wds")
CONVENTIONS = ("dpot-reference", "canonical")
MODEL_LAYOUTS = ("xy", "yx")


@dataclass
class IngestOptions:
    """How to turn a ReadResult into shards. `split`: train fraction, or (train, valid) fractions, rest is test."""

    resolution: int | None = 128  # target size of every spatial axis; None or 0 keeps the native grid
    channels: int | None = None  # pad to this many channels; None: 4, or the native count when larger (3D CNS: 5)
    fill: float = 1.0
    resample: str = "auto"  # auto | fourier | bilinear | bilinear-antialias | bicubic
    mask_resample: str = "nearest"  # nearest | area-threshold
    formats: tuple[str, ...] = FORMATS
    # None: the convention's split (the reference's rule where the reader knows it), else seeded 0.9; a value given
    # here replaces a reader's split with the seeded rule (recorded as a deviation from the convention)
    split: tuple[float, ...] | None = None
    convention: str = "dpot-reference"  # dpot-reference: what the released DPOT checkpoints saw; canonical: ours
    seed: int = 0
    name: str | None = None
    shard_size: int = DEFAULT_SHARD_BYTES
    segment: int | None = None  # frames per piece; defaults to the reader's when trajectories differ in length
    block: int | None = None  # trajectories per task, passed to readers that take `block` (tasks follow dask chunks)
    overwrite: bool = False
    progress: bool = False
    stats: bool = True
    workers: int | None = None
    scheduler: str | None = None
    command: str | None = None  # recorded in the manifest; default: this process's command line


@dataclass
class IngestOutcome:
    """The manifest of OUT, where it is, and whether this call wrote it (False: an existing one was left alone)."""

    manifest: dict[str, Any]
    path: Path
    written: bool
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Piece:
    """One stored trajectory: source trajectory index, first frame, id and split."""

    source: int
    start: int
    id: str
    split: str


def parse_split(text: str | float | Sequence[float]) -> tuple[float, ...]:
    """"0.9" → (0.9,) train/test; "0.8,0.1" → train/valid, rest test. Fractions in [0, 1] summing to at most 1."""
    if isinstance(text, str):
        try:
            values = tuple(float(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise InputError("--split", f"expected a train fraction or 'train,valid' fractions, got {text!r}") from None
    elif isinstance(text, (int, float)):
        values = (float(text),)
    else:
        values = tuple(float(v) for v in text)
    if not 1 <= len(values) <= 2 or any(v < 0 or v > 1 for v in values) or sum(values) > 1 + 1e-9:
        raise InputError("--split", f"expected 1 or 2 fractions in [0, 1] summing to at most 1, got {values}")
    return values


def assign_splits(ids: Sequence[str], fractions: Sequence[float], seed: int) -> np.ndarray:
    """Split trajectories by a seeded permutation of their sorted ids: first round(f_train n) train, then valid, test."""
    ids = list(ids)
    n = len(ids)
    order = sorted(range(n), key=lambda i: ids[i])
    perm = np.random.default_rng(seed).permutation(n)
    n_train = int(math.floor(fractions[0] * n + 0.5))
    n_valid = int(math.floor(fractions[1] * n + 0.5)) if len(fractions) > 1 else 0
    n_valid = min(n_valid, n - n_train)
    out = np.empty(n, dtype=object)
    for rank, p in enumerate(perm):
        out[order[p]] = "train" if rank < n_train else ("valid" if rank < n_train + n_valid else "test")
    return out.astype(str)


def _split_rule(fractions: Sequence[float], seed: int) -> str:
    parts = [f"train {fractions[0]:g}"] + ([f"valid {fractions[1]:g}"] if len(fractions) > 1 else []) + ["test rest"]
    return (f"by trajectory: numpy default_rng({seed}).permutation over sorted trajectory ids; "
            f"{', '.join(parts)} (counts rounded half up)")


def resampled_coord(values: np.ndarray, m: int, periodic: bool) -> np.ndarray:
    """Coordinates of m cells spanning the same domain as `values`: periodic point grid, or cell centres."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    if m == n:
        return v
    step = (v[-1] - v[0]) / (n - 1) if n > 1 else 1.0
    if periodic:
        return v[0] + np.arange(m) * (step * n / m)
    lo, hi = v[0] - step / 2, v[-1] + step / 2
    return lo + (np.arange(m) + 0.5) * (hi - lo) / m


def _pieces(result: ReadResult, splits: np.ndarray, segment: int | None) -> tuple[list[_Piece], int, list[tuple[str, str]]]:
    """The stored trajectories in order, the frames each holds, and trajectories left out for being too short."""
    ids = [str(s) for s in result.data["sample"].values]
    t = int(result.data.sizes["time"])
    if segment is None:
        return [_Piece(i, 0, ids[i], str(splits[i])) for i in range(len(ids))], t, []
    lengths = result.lengths if result.lengths is not None else np.full(len(ids), t)
    pieces, skipped = [], []
    for i, (sid, length) in enumerate(zip(ids, lengths)):
        count = int(length) // segment
        if count == 0:
            skipped.append((sid, f"{int(length)} frames, shorter than one {segment}-frame segment"))
        pieces.extend(_Piece(i, k * segment, f"{sid}/seg{k}", str(splits[i])) for k in range(count))
    return pieces, segment, skipped


def _blocks(chunks: tuple[int, ...]) -> list[tuple[int, int]]:
    """Trajectory index ranges processed per task: the reader's dask chunks (a task reads exactly one chunk)."""
    out, start = [], 0
    for c in chunks:
        out.append((start, start + c))
        start += c
    return out


@dataclass
class _Plan:
    """Everything a block task needs, picklable for a dask.distributed worker."""

    fields: Any  # dask array (sample, time, channel, *space)
    mask: Any  # dask array (sample, *space)
    pieces: list[_Piece]
    frames: int
    shape: tuple[int, ...]
    method: str
    mask_method: str
    channels: int
    fill: float
    stats: bool
    model_layout: str = "xy"


def _process_block(plan: _Plan, rng: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, Any, list[_Piece]]:
    """Read trajectories rng[0]..rng[1]-1, cut pieces, resample, pad; returns (fields, mask, train stats, pieces)."""
    i0, i1 = rng
    raw = np.asarray(compute_in_task(plan.fields[i0:i1]), dtype=np.float32)
    mask = np.asarray(compute_in_task(plan.mask[i0:i1]), dtype=np.uint8)
    pieces = [p for p in plan.pieces if i0 <= p.source < i1]
    f = np.stack([raw[p.source - i0, p.start:p.start + plan.frames] for p in pieces]) if pieces else \
        np.empty((0, plan.frames) + raw.shape[2:], np.float32)
    m = np.stack([mask[p.source - i0] for p in pieces]) if pieces else np.empty((0,) + mask.shape[1:], np.uint8)
    if plan.method != "none":
        # interpolate on the grid as the model sees it (H, W), so that float32 rounding matches the reference's
        swap = plan.model_layout == "xy" and len(plan.shape) == 2 and plan.method != "fourier"
        if swap:
            f = np.swapaxes(resample_fields(np.swapaxes(f, -1, -2), plan.shape[::-1], plan.method), -1, -2)
        else:
            f = resample_fields(f, plan.shape, plan.method)
    if plan.mask_method != "none":
        m = resample_mask(m, plan.shape, plan.mask_method)
    f, valid = pad_channels(f, plan.channels, plan.fill, axis=2)
    block_stats = None
    if plan.stats:
        train = np.array([p.split == "train" for p in pieces], dtype=bool)
        block_stats = st.block_stats(f, m, valid, include=train)
    return np.ascontiguousarray(f, dtype=np.float32), np.ascontiguousarray(m, dtype=np.uint8), block_stats, pieces


def counts_of(pieces: list[_Piece], split: str) -> int:
    """Stored trajectories of one split."""
    return sum(1 for p in pieces if p.split == split)


def _deviations(opts: IngestOptions, method: str, reader_split: bool) -> dict[str, Any]:
    """The options this ingest was given that depart from its convention (empty when it follows it exactly)."""
    if opts.convention != "dpot-reference":
        return {}
    out: dict[str, Any] = {}
    if reader_split and opts.split is not None:
        out["split"] = f"seeded {','.join(f'{v:g}' for v in opts.split)} (seed {opts.seed}) instead of the reference rule"
    if method not in ("none", "bilinear"):
        out["resample"] = method
    if opts.channels not in (None, 4):
        out["channels"] = opts.channels
    if float(opts.fill) != 1.0:
        out["fill"] = float(opts.fill)
    return out


def _existing(out: Path) -> dict[str, Any] | None:
    """The valid manifest already in OUT, None when there is none; InputError when one is there but broken."""
    path = out / mf.MANIFEST_NAME
    if not path.exists():
        return None
    return mf.read(path)


def _hash_inputs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    return [{"path": str(Path(p).resolve()), "sha256": sha256_file(p), "bytes": os.path.getsize(p)} for p in paths]


def ingest(result: ReadResult, out: str | Path, options: IngestOptions | None = None) -> IngestOutcome:
    """Write one dataset from a reader's result into OUT (Zarr and/or WebDataset shards, then the manifest)."""
    opts = options or IngestOptions()
    out = Path(out)
    existing = _existing(out)
    if existing is not None and not opts.overwrite:
        return IngestOutcome(existing, out / mf.MANIFEST_NAME, False,
                             [f"{out}: already holds a complete manifest; left alone (use --overwrite to replace it)"])
    check_result(result)
    ds = result.data
    name = opts.name or ds.attrs["dataset"]
    if not DATASET_NAME.match(name):
        raise InputError("--name", f"expected a dataset name of [a-z0-9_-], got {name!r}")
    formats = tuple(dict.fromkeys(opts.formats))
    if not formats or any(f not in FORMATS for f in formats):
        raise InputError("--format", f"expected a comma list of {', '.join(FORMATS)}, got {','.join(opts.formats)}")
    if opts.convention not in CONVENTIONS:
        raise InputError("--convention", f"expected one of {', '.join(CONVENTIONS)}, got {opts.convention!r}")
    model_layout = str(ds.attrs.get("model_layout", "xy"))
    if model_layout not in MODEL_LAYOUTS:
        raise ValueError(f"reader set model_layout {model_layout!r}; expected one of {MODEL_LAYOUTS}")
    if opts.mask_resample not in MASK_METHODS:
        raise InputError("--mask-resample", f"expected one of {', '.join(MASK_METHODS)}, got {opts.mask_resample!r}")
    native_channels = [str(c) for c in ds["channel"].values]
    n_channels = opts.channels if opts.channels is not None else max(4, len(native_channels))
    if len(native_channels) > n_channels:
        raise InputError("--channels", f"expected at least {len(native_channels)} channels for {name} "
                                       f"({', '.join(native_channels)}), got {n_channels}")
    if len(ds["fields"].dims) == 6:
        warnings.warn(f"{name}: 3D data; `dpot-train launch` trains on 2D data only (the library has DPOT3D and "
                      "transfer_2d_to_3d for downstream use, docs/model.md)", stacklevel=2)
    if opts.shard_size < 1:
        raise InputError("--shard-size", f"expected a positive byte count, got {opts.shard_size}")
    space = list(ds["fields"].dims[3:])
    native_shape = tuple(int(ds.sizes[d]) for d in space)
    target = native_shape if not opts.resolution else (int(opts.resolution),) * len(space)
    boundary = ds.attrs["boundary"]
    if target == native_shape:
        method, mask_method, antialias = "none", "none", False
    else:
        try:
            method = choose_method(boundary, opts.resample, opts.convention)
        except ValueError as exc:
            raise InputError("--resample", str(exc)) from None
        mask_method = opts.mask_resample
        antialias = method in ANTIALIASED and any(t < n for t, n in zip(target, native_shape))

    # split (by source trajectory), then pieces
    ids = [str(s) for s in ds["sample"].values]
    if result.split is not None and opts.split is None:
        splits = np.asarray(result.split, dtype=str)
        rule = str(ds.attrs.get("split_rule", "fixed by the source files"))
    else:
        fractions = parse_split(opts.split if opts.split is not None else (0.9,))
        splits = assign_splits(ids, fractions, opts.seed)
        rule = _split_rule(fractions, opts.seed)
    deviations = _deviations(opts, method, result.split is not None)
    segment = opts.segment or (result.segment if result.lengths is not None else None)
    if result.lengths is not None and segment is None:
        raise InputError("--segment", "expected a segment length: the trajectories of this source differ in length")
    if segment is not None and segment > ds.sizes["time"]:
        raise InputError("--segment", f"expected at most {ds.sizes['time']} frames per segment, got {segment}")
    pieces, frames, short = _pieces(result, splits, segment)
    time = np.asarray(ds["time"].values, dtype=np.float64)[:frames]
    if segment is not None:
        time = time - time[0]
    dt = ds.attrs.get("dt")
    if dt is None and len(time) > 1 and np.allclose(np.diff(time), time[1] - time[0], rtol=1e-6):
        dt = float(time[1] - time[0])
    channels = native_channels + [f"pad{k}" for k in range(len(native_channels), n_channels)]
    channel_valid = np.arange(n_channels) < len(native_channels)
    coords = {d: resampled_coord(ds[d].values, m, boundary == "periodic") for d, m in zip(space, target)}
    sample_params = {k: np.asarray(v)[[p.source for p in pieces]] for k, v in result.sample_params.items()}
    command = opts.command if opts.command is not None else mf.command_line()

    blocks = _blocks(ds["fields"].data.chunks[0])
    block_rows = jn.rows_per_block([p.source for p in pieces], blocks)
    row_splits = [p.split for p in pieces]
    job = jn.job_fingerprint(result.inputs, {
        **jn.options_identity(opts), "name": name, "target": list(target), "method": method, "mask": mask_method,
        "rows": [[p.id, p.split, p.start] for p in pieces], "frames": frames,
        "reader": _plain(ds.attrs.get("provenance", {})), "parameters": _plain(ds.attrs.get("parameters", {})),
    }, blocks)
    if opts.scheduler:  # an unreachable scheduler fails here, before a staging folder exists
        with scheduler_context(SchedulerOptions(address=opts.scheduler)):
            pass
    grow = math.prod(target) / math.prod(native_shape)
    if grow > 1:
        out_bytes = len(pieces) * frames * n_channels * math.prod(target) * 4
        warnings.warn(f"{name}: resampling {'x'.join(map(str, native_shape))} -> {'x'.join(map(str, target))} "
                      f"multiplies the data {grow:g}x: about {out_bytes / 1e9:.3g} GB per output format "
                      f"({', '.join(formats)}); --resolution 0 keeps the native grid", stacklevel=2)
    if not counts_of(pieces, "train"):
        warnings.warn(f"{name}: the split leaves no training trajectory ({rule})", stacklevel=2)
    elif not counts_of(pieces, "test"):
        warnings.warn(f"{name}: the split leaves no test trajectory ({rule}); evaluation will have nothing to score",
                      stacklevel=2)
    try:
        journal = jn.Journal.open(out, name, job, row_splits, block_rows, zarr="zarr" in formats,
                                  shards="wds" in formats)
    except jn.JournalBusy as exc:
        raise InputError(out, str(exc)) from None
    staging = journal.staging
    notes = [journal.describe()] if journal.resumed else []
    hasher = ThreadPoolExecutor(max_workers=1)
    inputs_future = hasher.submit(_hash_inputs, list(result.inputs))
    writers: dict[str, SplitShardWriter] = {}
    try:
        zw = None
        if "zarr" in formats:
            attrs = {
                "title": f"{name}: {ds.attrs['source']} trajectories on a {'x'.join(map(str, target))} grid",
                "source": f"{ds.attrs['source']} raw files: {', '.join(Path(p).name for p in result.inputs)}",
                "history": f"{command} (dpot {dpot_data.__version__})",
                "Conventions": "CF-1.10",
                "dataset": name,
                "boundary": boundary,
                "parameters": json.dumps(ds.attrs.get("parameters", {}), sort_keys=True),
                "resample": method,
                "fill_value": float(opts.fill),
            }
            layout = ZarrLayout(group=name, frames=frames, channels=channels, channel_valid=channel_valid,
                                fill_value=float(opts.fill), coords=coords, time=time,
                                samples=np.array([p.id for p in pieces], dtype=str),
                                splits=np.array([p.split for p in pieces], dtype=str),
                                sample_params=sample_params, attrs=attrs)
            zw = jn.zarr_writer(journal, staging / "data.zarr", layout)
        if "wds" in formats:
            for split in SPLITS:
                writers[split] = journal.restore_shards(
                    SplitShardWriter(staging, f"shards/{name}", split, opts.shard_size))
        plan = _Plan(ds["fields"].data, ds["mask"].data, pieces, frames, target, method, mask_method,
                     n_channels, float(opts.fill), opts.stats, model_layout)
        acc = journal.stats(len(native_channels)) if opts.stats else None
        first = journal.point.block
        index = journal.point.row
        with scheduler_context(SchedulerOptions(workers=opts.workers, address=opts.scheduler)) as runner, \
                _progress(len(pieces), opts.progress, name) as bar:
            bar.update(index)
            tasks = runner.imap(partial(_process_block, plan), blocks[first:])
            for block_no, (f, m, bstats, block_pieces) in enumerate(tasks, start=first):
                if zw is not None:
                    zw.write_block(f, m)
                for j, piece in enumerate(block_pieces):
                    if writers and journal.needs(piece.split):
                        meta = {"id": piece.id, "dataset": name, "split": piece.split, "index": index,
                                "frames": frames, "channels": channels, "channel_valid": channel_valid.tolist(),
                                "params": {k: _scalar(v[index]) for k, v in sample_params.items()}}
                        writers[piece.split].add(index, f[j], m[j], meta)
                    index += 1
                if acc is not None and bstats is not None:
                    acc = acc.merge(bstats)
                journal.record(block_no, index, acc, writers)
                bar.update(len(block_pieces))
        shards = [s.to_dict() for split in SPLITS if split in writers for s in writers[split].close()]
        arrays = zw.close() if zw is not None else None
        inputs = inputs_future.result()
    except BaseException:
        for w in writers.values():
            w.abort()  # the shard being written goes; completed ones stay in staging for a resume
        journal.close()
        raise
    finally:
        hasher.shutdown(wait=True)

    counts = {s: int(sum(1 for p in pieces if p.split == s)) for s in SPLITS}
    entry = {
        "name": name,
        "source": ds.attrs["source"],
        "boundary": boundary,
        "parameters": _plain(ds.attrs.get("parameters", {})),
        "channels": channels,
        "channel_valid": channel_valid.tolist(),
        "fill_value": float(opts.fill),
        "grid": {"dims": space, "shape": list(target), "native_shape": list(native_shape)},
        "frames": int(frames),
        "dt": None if dt is None else float(dt),
        "resample": {"fields": method, "mask": mask_method, "antialias": bool(antialias)},
        "splits": {"seed": int(opts.seed), "rule": rule, "counts": counts,
                   "ids": {s: [p.id for p in pieces if p.split == s] for s in SPLITS}},
        "convention": {"name": opts.convention, "model_layout": model_layout, "deviations": deviations,
                       **{k: int(ds.attrs[k]) for k in ("pred_channels", "t_test")
                          if k in ds.attrs and opts.convention == "dpot-reference"}},
        "trajectories": len(pieces),
        "shards": shards,
        "zarr": None if arrays is None else {"path": "data.zarr", "group": name, "arrays": arrays},
        "inputs": inputs,
        "skipped": [{"what": w, "reason": r} for w, r in list(result.skipped) + short],
        "stats": st.to_manifest(acc, channels, channel_valid.tolist()) if acc is not None and acc.trajectories else None,
        "segment": segment,
        "provenance": _plain(ds.attrs.get("provenance", {})),
    }
    if sample_params:
        entry["sample_params"] = sorted(sample_params)
    try:
        manifest = mf.build([entry], command)
        _publish(out, staging)
        path = mf.write(out, manifest)
    finally:
        journal.close()
    return IngestOutcome(manifest, path, True, notes)


def _publish(out: Path, staging: Path) -> None:
    """Move the staged Zarr store and shard folder into place (old manifest first removed, so none points at a mix)."""
    old = out / mf.MANIFEST_NAME
    if old.exists():
        old.unlink()
        mf.fsync_dir(out)
    for rel in ("data.zarr", "shards"):
        target = out / rel
        if target.exists():
            shutil.rmtree(target)
        if (staging / rel).exists():
            os.replace(staging / rel, target)
    mf.fsync_dir(out)
    shutil.rmtree(staging, ignore_errors=True)


class _NoBar:
    def update(self, n: int) -> None:
        pass


class _progress:
    """A tqdm bar over stored trajectories when enabled (stderr), a no-op otherwise."""

    def __init__(self, total: int, enabled: bool, name: str) -> None:
        self.total, self.enabled, self.name, self.bar = total, enabled, name, None

    def __enter__(self) -> Any:
        if not self.enabled:
            return _NoBar()
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, unit="traj", desc=f"ingest {self.name}", dynamic_ncols=True)
        return self.bar

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _plain(value: Any) -> Any:
    """JSON round trip of attributes (numpy scalars to Python)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if isinstance(v, np.generic) else str(v)))


def read_source(source: str, paths: Sequence[str | Path], options: IngestOptions | None = None,
                **reader_options: Any) -> ReadResult:
    """Open raw files with the named source's reader (dpot_data.sources.<source>.read); `options.block` becomes the
    reader's `block` (trajectories per task) unless reader_options names one."""
    if options is not None and options.block is not None:
        reader_options.setdefault("block", options.block)
    if options is not None:
        reader_options.setdefault("convention", options.convention)
    try:
        module = load_source(source)
    except ValueError as exc:
        raise InputError(source, str(exc)) from None
    params = inspect.signature(module.read).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        reader_options = {k: v for k, v in reader_options.items() if k not in ("block", "convention") or k in params}
    return module.read([Path(p) for p in paths], **reader_options)


def run_ingest(source: str, paths: Sequence[str | Path], out: str | Path, options: IngestOptions | None = None,
               **reader_options: Any) -> IngestOutcome:
    """Read raw files of a source and ingest them into OUT; an OUT with a complete manifest is left alone."""
    opts = options or IngestOptions()
    existing = _existing(Path(out))
    if existing is not None and not opts.overwrite:
        return IngestOutcome(existing, Path(out) / mf.MANIFEST_NAME, False,
                             [f"{out}: already holds a complete manifest; left alone (use --overwrite to replace it)"])
    return ingest(read_source(source, paths, opts, **reader_options), out, opts)


def ingest_files(source: str, paths: Sequence[str | Path], out: str | Path, options: IngestOptions | None = None,
                 **reader_options: Any) -> dict[str, Any]:
    """Library entry point: ingest raw files of `source` into OUT and return the manifest (existing one if complete)."""
    return run_ingest(source, paths, out, options, **reader_options).manifest

