"""The pure planning step of an ingest: from a reader's result and the options, everything the run and the manifest
need (grid, resampling, split, pieces, coordinates, blocks, the manifest entry's facts), with no I/O, so that tests
can check a plan without writing anything."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import dpot_data
from dpot_data.errors import InputError
from dpot_data.ingest.options import (MODEL_LAYOUTS, IngestOptions, check_options, default_resolution,
                                      parse_split)
from dpot_data.sources.base import ReadResult, check_result
from dpot_data.transform import ANTIALIASED, choose_method
from dpot_data.units import array_units
from dpot_format.conventions import recorded_name
from dpot_format.grid import target_shape
from dpot_format.manifest import limit_problems
from dpot_format.names import DATASET_NAME, MAX_DATASET_NAME, SPLITS


@dataclass(frozen=True)
class Piece:
    """One stored trajectory: source trajectory index, first frame, id and split."""

    source: int
    start: int
    id: str
    split: str


@dataclass(frozen=True)
class Grid:
    """The spatial grid: dims, native and target shapes, and how fields and mask get from one to the other."""

    dims: list[str]
    native: tuple[int, ...]
    target: tuple[int, ...]
    method: str  # fields: "none" when the grid is kept
    mask_method: str
    antialias: bool


@dataclass
class IngestPlan:
    """Everything decided before any byte is written (see `plan`)."""

    name: str
    formats: tuple[str, ...]
    grid: Grid
    pieces: list[Piece]
    frames: int
    channels: list[str]
    channel_valid: np.ndarray
    coords: dict[str, np.ndarray]
    time: np.ndarray
    sample_params: dict[str, np.ndarray]
    blocks: list[tuple[int, int]]  # source trajectory ranges, one per task
    identity: dict[str, Any]  # what determines the output, for the resume fingerprint
    entry: dict[str, Any]  # the manifest entry without shards, zarr, inputs and stats
    model_layout: str
    warnings: list[str] = field(default_factory=list)
    units: dict[str, Any] = field(default_factory=dict)  # CF units per stored array (dpot_data.units)

    @property
    def native_channels(self) -> int:
        return int(self.channel_valid.sum())

    def rows_per_block(self) -> list[int]:
        """Cumulative stored rows after each block."""
        src = np.asarray([p.source for p in self.pieces], dtype=np.int64)
        return np.cumsum([int(np.count_nonzero((src >= i0) & (src < i1))) for i0, i1 in self.blocks]).tolist()

    def count(self, split: str) -> int:
        """Stored trajectories of one split."""
        return sum(1 for p in self.pieces if p.split == split)


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


def split_rule(fractions: Sequence[float], seed: int) -> str:
    """The manifest's description of the seeded split."""
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


def plan_grid(result: ReadResult, opts: IngestOptions) -> Grid:
    """Target grid and resampling methods (nothing to do when the target is the native grid)."""
    ds = result.data
    dims = list(ds["fields"].dims[3:])
    native = tuple(int(ds.sizes[d]) for d in dims)
    size = default_resolution(opts.resolution, len(dims), ds.attrs.get("source"))
    if isinstance(size, tuple) and len(size) != len(dims):
        raise InputError("--resolution", f"expected {len(dims)} sizes ({','.join(dims)}) for this {len(dims)}D data, "
                                         f"or one for every axis; got {','.join(map(str, size))}")
    target = native if not size else target_shape(native, size, "--resolution")
    if target == native:
        return Grid(dims, native, target, "none", "none", False)
    try:
        method = choose_method(ds.attrs["boundary"], opts.resample, opts.convention)
    except ValueError as exc:
        raise InputError("--resample", str(exc)) from None
    antialias = method in ANTIALIASED and any(t < n for t, n in zip(target, native))
    return Grid(dims, native, target, method, opts.mask_resample, antialias)


def plan_split(result: ReadResult, opts: IngestOptions) -> tuple[np.ndarray, str]:
    """The split of every source trajectory and its rule: the reader's (the convention's) unless a split is given."""
    ds = result.data
    if result.split is not None and opts.split is None:
        return np.asarray(result.split, dtype=str), str(ds.attrs.get("split_rule", "fixed by the source files"))
    fractions = parse_split(opts.split if opts.split is not None else (0.9,))
    ids = [str(s) for s in ds["sample"].values]
    return assign_splits(ids, fractions, opts.seed), split_rule(fractions, opts.seed)


def plan_pieces(result: ReadResult, splits: np.ndarray, segment: int | None
                ) -> tuple[list[Piece], int, list[tuple[str, str]]]:
    """The stored trajectories in order, the frames each holds, and trajectories left out for being too short."""
    ids = [str(s) for s in result.data["sample"].values]
    t = int(result.data.sizes["time"])
    if segment is None:
        return [Piece(i, 0, ids[i], str(splits[i])) for i in range(len(ids))], t, []
    lengths = result.lengths if result.lengths is not None else np.full(len(ids), t)
    pieces, skipped = [], []
    for i, (sid, length) in enumerate(zip(ids, lengths)):
        count = int(length) // segment
        if count == 0:
            skipped.append((sid, f"{int(length)} frames, shorter than one {segment}-frame segment"))
        pieces.extend(Piece(i, k * segment, f"{sid}/seg{k}", str(splits[i])) for k in range(count))
    return pieces, segment, skipped


def plan_segment(result: ReadResult, opts: IngestOptions) -> int | None:
    """Frames per piece: the option, else the reader's when trajectories differ in length, else None (whole)."""
    segment = opts.segment or (result.segment if result.lengths is not None else None)
    if result.lengths is not None and segment is None:
        raise InputError("--segment", "expected a segment length: the trajectories of this source differ in length")
    if segment is not None and segment > result.data.sizes["time"]:
        raise InputError("--segment", f"expected at most {result.data.sizes['time']} frames per segment, got {segment}")
    return segment


def deviations(opts: IngestOptions, method: str, reader_split: bool) -> dict[str, Any]:
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


def blocks_of(chunks: tuple[int, ...]) -> list[tuple[int, int]]:
    """Trajectory index ranges processed per task: the reader's dask chunks (a task reads exactly one chunk)."""
    out, start = [], 0
    for c in chunks:
        out.append((start, start + c))
        start += c
    return out


def plain(value: Any) -> Any:
    """JSON round trip of attributes (numpy scalars to Python)."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if isinstance(v, np.generic) else str(v)))


def _channels(result: ReadResult, opts: IngestOptions, name: str) -> tuple[list[str], np.ndarray]:
    """Channel names after padding and their validity."""
    native = [str(c) for c in result.data["channel"].values]
    n = opts.channels if opts.channels is not None else max(4, len(native))
    if len(native) > n:
        raise InputError("--channels", f"expected at least {len(native)} channels for {name} "
                                       f"({', '.join(native)}), got {n}")
    return native + [f"pad{k}" for k in range(len(native), n)], np.arange(n) < len(native)


def _name_and_layout(result: ReadResult, opts: IngestOptions) -> tuple[str, str]:
    name = opts.name or result.data.attrs["dataset"]
    if not DATASET_NAME.match(name) or len(name) > MAX_DATASET_NAME:
        shown = repr(name) if len(name) <= MAX_DATASET_NAME else f"{name[:32]!r}... ({len(name)} characters)"
        where = "--name" if opts.name or not result.inputs else str(result.inputs[0])
        raise InputError(where, f"expected a dataset name of [a-z0-9_-], at most {MAX_DATASET_NAME} characters "
                                f"(give --name), got {shown}")
    layout = str(result.data.attrs.get("model_layout", "xy"))
    if layout not in MODEL_LAYOUTS:
        raise ValueError(f"reader set model_layout {layout!r}; expected one of {MODEL_LAYOUTS}")
    return name, layout


def _time(result: ReadResult, frames: int, segment: int | None) -> tuple[np.ndarray, float | None]:
    """Times of the stored frames (from 0 for pieces) and the time step when uniform."""
    time = np.asarray(result.data["time"].values, dtype=np.float64)[:frames]
    if segment is not None:
        time = time - time[0]
    dt = result.data.attrs.get("dt")
    unknown = bool(result.data.attrs.get("time_is_index", False))  # frame indices, no times: dt stays null
    if dt is None and not unknown and len(time) > 1 and np.allclose(np.diff(time), time[1] - time[0], rtol=1e-6):
        dt = float(time[1] - time[0])
    return time, None if dt is None else float(dt)


def plan(result: ReadResult, opts: IngestOptions) -> IngestPlan:
    """Check the options against the data and decide everything about the output; no I/O."""
    formats = check_options(opts)
    check_result(result)
    check_extent(result)
    name, layout = _name_and_layout(result, opts)
    channels, channel_valid = _channels(result, opts, name)
    ds = result.data
    grid = plan_grid(result, opts)
    splits, rule = plan_split(result, opts)
    segment = plan_segment(result, opts)
    pieces, frames, short = plan_pieces(result, splits, segment)
    time, dt = _time(result, frames, segment)
    coords = {d: resampled_coord(ds[d].values, m, ds.attrs["boundary"] == "periodic")
              for d, m in zip(grid.dims, grid.target)}
    sample_params = {k: np.asarray(v)[[p.source for p in pieces]] for k, v in result.sample_params.items()}
    blocks = blocks_of(ds["fields"].data.chunks[0])
    identity = {**opts.identity(), "name": name, "target": list(grid.target), "method": grid.method,
                "mask": grid.mask_method, "rows": [[p.id, p.split, p.start] for p in pieces], "frames": frames,
                "reader": plain(ds.attrs.get("provenance", {})), "parameters": plain(ds.attrs.get("parameters", {}))}
    out = IngestPlan(name, formats, grid, pieces, frames, channels, channel_valid, coords, time, sample_params,
                     blocks, identity, {}, layout)
    out.entry = _entry(result, opts, out, rule, segment, dt, short)
    check_limits(result, out.entry)
    out.warnings = _warnings(result, out, rule)
    out.units = array_units(ds.attrs["source"], channels, channel_valid.tolist(), grid.dims, list(sample_params),
                            ds.attrs.get("parameters"))
    return out


def check_extent(result: ReadResult) -> None:
    """At least one trajectory, and (the format's rule, `limit_problems`) one frame and one cell along every axis of
    the native grid, before the grid is planned: an empty axis has nothing to store, resample or index. One line
    naming the input otherwise."""
    sizes = result.data["fields"].sizes
    where = result.inputs[0] if result.inputs else result.data.attrs.get("dataset", "<input>")
    native = {"grid": {"shape": [int(sizes[d]) for d in result.spatial_dims]}, "frames": int(sizes["time"])}
    if not native["grid"]["shape"] or min(native["grid"]["shape"]) < 1 or native["frames"] < 1:
        problem = limit_problems(str(result.data.attrs.get("dataset", "data")), native)[0]
        raise InputError(where, f"the output would break the format's limits: {problem}")
    if int(sizes["sample"]) == 0:
        raise InputError(where, "holds no trajectory; expected at least one")


def check_limits(result: ReadResult, entry: dict[str, Any]) -> None:
    """The format's limits (dpot_format.limits), checked on the planned entry before anything is written: an output
    the format would refuse is refused here, in one line naming the input."""
    problems = limit_problems(str(entry["name"]), entry)
    if problems:
        where = result.inputs[0] if result.inputs else entry["name"]
        raise InputError(where, f"the output would break the format's limits: {problems[0]}")


def _entry(result: ReadResult, opts: IngestOptions, p: IngestPlan, rule: str, segment: int | None,
           dt: float | None, short: list[tuple[str, str]]) -> dict[str, Any]:
    """The manifest entry's facts known before writing (shards, zarr, inputs and stats are added by the run)."""
    ds = result.data
    entry = {
        "name": p.name, "source": ds.attrs["source"], "boundary": ds.attrs["boundary"],
        "parameters": plain(ds.attrs.get("parameters", {})), "channels": p.channels,
        "channel_valid": p.channel_valid.tolist(), "fill_value": float(opts.fill),
        "grid": {"dims": p.grid.dims, "shape": list(p.grid.target), "native_shape": list(p.grid.native)},
        "frames": int(p.frames), "dt": dt,
        "resample": {"fields": p.grid.method, "mask": p.grid.mask_method, "antialias": bool(p.grid.antialias)},
        "splits": {"seed": int(opts.seed), "rule": rule, "counts": {s: p.count(s) for s in SPLITS},
                   "ids": {s: [x.id for x in p.pieces if x.split == s] for s in SPLITS}},
        "convention": {"name": recorded_name(opts.convention, str(ds.attrs["source"])),
                       "model_layout": p.model_layout,
                       "deviations": deviations(opts, p.grid.method, result.split is not None),
                       **{k: int(ds.attrs[k]) for k in ("pred_channels", "t_test")
                          if k in ds.attrs and opts.convention == "dpot-reference"}},
        "trajectories": len(p.pieces), "shards": [], "zarr": None, "inputs": [],
        "skipped": [{"what": w, "reason": r} for w, r in list(result.skipped) + short],
        "stats": None, "segment": segment, "provenance": plain(ds.attrs.get("provenance", {})),
    }
    if p.sample_params:
        entry["sample_params"] = sorted(p.sample_params)
    return entry


def aspect_kept(native: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...] | None:
    """When `target` stretches `native` (the sides scale by different factors, beyond 1 %): the grid of `target`'s
    largest side with `native`'s aspect; None when the aspect is kept."""
    scales = [t / n for t, n in zip(target, native)]
    if max(scales) <= min(scales) * 1.01:
        return None
    factor = max(target) / max(native)
    return tuple(max(1, round(n * factor)) for n in native)


def _warnings(result: ReadResult, p: IngestPlan, rule: str) -> list[str]:
    """What the user should know before the run: a grid that grows, an empty train or test split."""
    out = []
    grow = math.prod(p.grid.target) / math.prod(p.grid.native)
    if grow > 1:
        size = len(p.pieces) * p.frames * len(p.channels) * math.prod(p.grid.target) * 4
        out.append(f"{p.name}: resampling {'x'.join(map(str, p.grid.native))} -> "
                   f"{'x'.join(map(str, p.grid.target))} multiplies the data {grow:g}x: about {size / 1e9:.3g} GB "
                   f"per output format ({', '.join(p.formats)}); --resolution 0 keeps the native grid")
    kept = aspect_kept(p.grid.native, p.grid.target)
    if kept is not None:
        out.append(f"{p.name}: resampling {'x'.join(map(str, p.grid.native))} -> {'x'.join(map(str, p.grid.target))} "
                   f"stretches the grid's aspect ({', '.join(p.grid.dims)}); --resolution {','.join(map(str, kept))} "
                   "keeps it, --resolution 0 keeps the native grid")
    if not p.count("train"):
        out.append(f"{p.name}: the split leaves no training trajectory ({rule})")
    elif not p.count("test"):
        out.append(f"{p.name}: the split leaves no test trajectory ({rule}), so there is nothing to evaluate on: "
                   "re-run with --split 0.8 --overwrite (a seeded split: 80% train, the rest test), or train with "
                   "`dpot-train launch --no-eval`")
    return out


def zarr_attrs(p: IngestPlan, result: ReadResult, opts: IngestOptions, command: str) -> dict[str, Any]:
    """CF-style attributes of the dataset's Zarr group."""
    ds = result.data
    return {
        "title": f"{p.name}: {ds.attrs['source']} trajectories on a {'x'.join(map(str, p.grid.target))} grid",
        "source": f"{ds.attrs['source']} raw files: {', '.join(Path(x).name for x in result.inputs)}",
        "history": f"{command} (dpot {dpot_data.__version__})",
        "Conventions": "CF-1.10",
        "dataset": p.name,
        "boundary": ds.attrs["boundary"],
        "parameters": json.dumps(ds.attrs.get("parameters", {}), sort_keys=True),
        "resample": p.grid.method,
        "fill_value": float(opts.fill),
    }
