"""PDEArena Navier–Stokes 2D reader (docs/sources.md): standard and conditioned smoke-buoyancy files, lazily.

Each file holds one top group named after its split (`train`, `valid`, `test`) with `u`, `vx`, `vy` (N, T, nx, ny)
float64 stored in (x, y) order (the generator groups phiflow axes as x, y). They become float32 channels
`u, vx, vy` in (y, x) order. The split comes from the group and is kept per trajectory; `buo_y` is kept per
trajectory as a sample parameter. A file that cannot be opened or is truncated is skipped and reported by name
(one such file is known in the public set); a readable file with missing keys or wrong shapes is an error naming
the file and the key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import dask.array as da
import h5py
import numpy as np
import xarray as xr

from dpot_format.names import manifest_name
from dpot_data.errors import InputError
from dpot_data.sources._blocks import (SampleBlocks, all_finite, auto_block, check_file_total, check_h5_dataset,
                                        check_hdf5_contained, check_sizes, checked, checked_rows, file_token,
                                        frames_ok, h5_rows, hdf5_problem, input_files, require_file, to_dask)
from dpot_data.sources.base import SPLITS, ReadResult

READER_VERSION = "1"
# check_finite="raise" refuses, with a TrajectoryError, every trajectory that check_finite=True leaves out (NaN/Inf,
# unreadable data): the ingest reads with "raise" first and scans only when a block read meets one (`ingest.pipeline`)
SCAN_IN_BLOCK_READS = True
CHANNELS = ("u", "vx", "vy")
OTHER_KEYS = ("t", "x", "y", "dt", "dx", "dy", "buo_y")  # what else a generator file holds beside the fields
_NAME = re.compile(r"NavierStokes2D_(?P<split>train|valid|test)_(?P<seed>\d+)_(?P<buo>[0-9.]+?)(?:_(?P<n>\d+))?\.h5$")
_COND_FOLDER = re.compile(r"condit?i?oned", re.IGNORECASE)  # the public folder is spelled "conditoned"


class _Blocks(SampleBlocks):
    """(N, T, 3, y, x) float32 view of one PDEArena file. A block is read field by field, one trajectory at a time,
    straight into one reused float64 buffer (h5py `read_direct`), checked for NaN/Inf (and values beyond float32)
    while in cache, and cast and transposed once into the preallocated output block."""

    def __init__(self, path: Path, group: str, shape: tuple[int, int, int, int]) -> None:
        self.path, self.group = path, group
        n, t, nx, ny = shape
        self.shape = (n, t, len(CHANNELS), ny, nx)

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        check = self.checks if check is None else check
        out = np.empty((n1 - n0,) + self.shape[1:], dtype=np.float32)
        with h5py.File(self.path, "r") as f, np.errstate(over="ignore"):  # beyond float32: Inf, as always
            g = f[self.group]
            for c, k in enumerate(CHANNELS):
                for s0, raw in checked_rows(g[k], n0, n1, self.path, f"{self.group}/{k}", check):
                    out[s0 - n0: s0 - n0 + len(raw), :, c] = raw.transpose(0, 1, 3, 2)  # (x, y) -> (y, x)
        return out

    def finite_frames(self, n0: int, n1: int) -> np.ndarray:
        ok = np.ones((n1 - n0, self.shape[1]), dtype=bool)
        with h5py.File(self.path, "r") as f:
            for k in CHANNELS:
                for s0, raw in h5_rows(f[self.group][k], n0, n1):
                    if not all_finite(raw):
                        ok[s0 - n0: s0 - n0 + len(raw)] &= frames_ok(raw)
        return ok


def parse_name(path: Path) -> dict[str, object] | None:
    """Split, seed, buo_y (and sample count for train files) from a generator file name, or None."""
    match = _NAME.search(path.name)
    if not match:
        return None
    return {"split": match.group("split"), "seed": int(match.group("seed")), "buo_y": float(match.group("buo")),
            "n": int(match.group("n")) if match.group("n") else None}


def _order(path: Path) -> tuple[int, str, str]:
    """Files in split order (train, valid, test), then by folder and name."""
    named = parse_name(path)
    return (SPLITS.index(named["split"]) if named else len(SPLITS), str(path.parent), path.name)


def _inspect(path: Path) -> dict[str, object]:
    """Check keys and shapes of one readable file; InputError naming the file and the key otherwise."""
    with h5py.File(path, "r") as f:
        groups = [k for k in f.keys() if k in SPLITS and isinstance(f[k], h5py.Group)]
        if len(groups) != 1:
            raise InputError(path, "expected exactly one top group named train, valid or test; "
                                   f"found {sorted(f.keys())}")
        split = groups[0]
        g = f[split]
        missing = [k for k in (*CHANNELS, "t", "x", "y", "buo_y") if k not in g]
        if missing:
            raise InputError(path, f"group {split!r}: missing key(s) {missing}; expected u, vx, vy (N, T, nx, ny), "
                                   "t (N, T), x (N, nx), y (N, ny), buo_y (N,)")
        shape = tuple(g["u"].shape)
        if len(shape) != 4:
            raise InputError(path, f"{split}/u: expected (N, T, nx, ny), found shape {shape}")
        n, nt, nx, ny = shape
        for k in CHANNELS[1:]:
            if tuple(g[k].shape) != shape:
                raise InputError(path, f"{split}/{k}: expected shape {shape} like {split}/u, found {tuple(g[k].shape)}")
        for k, want in (("t", (n, nt)), ("x", (n, nx)), ("y", (n, ny)), ("buo_y", (n,))):
            if tuple(g[k].shape) != want:
                raise InputError(path, f"{split}/{k}: expected shape {want}, found {tuple(g[k].shape)}")
        for k in CHANNELS:
            if g[k].dtype.kind != "f":
                raise InputError(path, f"{split}/{k}: expected floats, found {g[k].dtype}")
        for k in ("t", "x", "y", "buo_y"):
            if g[k].dtype.kind not in "fiu":
                raise InputError(path, f"{split}/{k}: expected numbers, found {g[k].dtype}")
        extra = [k for k in g.keys() if k not in CHANNELS and k not in OTHER_KEYS and isinstance(g[k], h5py.Dataset)
                 and tuple(g[k].shape[:2]) == (n, nt) and len(g[k].shape) >= 3]
        if extra:
            raise InputError(path, f"{split}/{extra[0]}: expected the {len(CHANNELS)} fields {', '.join(CHANNELS)} "
                                   f"of 2D Navier-Stokes (N, T, nx, ny), found {len(CHANNELS) + len(extra)}: "
                                   f"{', '.join([*CHANNELS, *extra])}")
        check_sizes(path, f"{split}/u", trajectories=n, frames=nt, space=(nx, ny), channels=len(CHANNELS))
        for k in (*CHANNELS, "t", "x", "y", "buo_y"):
            check_h5_dataset(path, f"{split}/{k}", g[k])
        check_file_total(path, sum(g[k].nbytes for k in CHANNELS), f"{split}/u, vx, vy")
        if "dt" in g and g["dt"].shape == (n,):
            check_h5_dataset(path, f"{split}/dt", g["dt"])
        info = {
            "split": split, "shape": shape, "dtype": g["u"].dtype.name,
            "buo_y": np.asarray(g["buo_y"], dtype=np.float64),
            "t": np.asarray(g["t"][0], dtype=np.float64) if n else None,
            "x": np.asarray(g["x"][0], dtype=np.float64) if n else None,
            "y": np.asarray(g["y"][0], dtype=np.float64) if n else None,
            "dt": float(np.asarray(g["dt"][0])) if "dt" in g and g["dt"].shape == (n,) and n else None,
        }
    return info


def _readable_files(paths: list[Path]) -> tuple[list[tuple[Path, dict[str, object]]], list[tuple[str, str]]]:
    """Each readable file with its checked layout; the unreadable ones (by name, with why) are skipped."""
    skipped: list[tuple[str, str]] = []
    good: list[tuple[Path, dict[str, object]]] = []
    for p in paths:
        require_file(p)
        problem = hdf5_problem(p)
        if problem is not None:
            skipped.append((p.name, problem))
            continue
        check_hdf5_contained(p)  # nothing read from outside the file: refused, never skipped
        good.append((p, _inspect(p)))
    if not good:
        raise InputError(paths[0], "no readable file among the inputs: " + "; ".join(f"{w}: {r}" for w, r in skipped))
    return good, skipped


def _check_alike(good: list[tuple[Path, dict[str, object]]]) -> None:
    """Refuse a file whose frame count or grid differs from the first file's: standard and conditioned data differ."""
    p0, first = good[0]
    for p, info in good[1:]:
        if info["shape"][1:] != first["shape"][1:]:
            raise InputError(p, f"expected {first['shape'][1]} frames on a {first['shape'][2]}x{first['shape'][3]} "
                                f"grid like {p0.name}, found {info['shape'][1:]}: standard (14 frames) and "
                                "conditioned (56 frames) files are different datasets")


def _file_notes(p: Path, info: dict[str, object]) -> dict[str, object]:
    """What the reader saw in one file (dtype, split, trajectories, name parameters), for the provenance."""
    named = parse_name(p)
    return {
        "container": "hdf5", "dtype": info["dtype"], "split": info["split"], "trajectories": info["shape"][0],
        "storage_axes": ["sample", "time", "x", "y"],
        "name": named,
        "name_split_differs": bool(named and named["split"] != info["split"]),
    }


def _lazy_fields(good: list[tuple[Path, dict[str, object]]], blk: int, check_finite: bool | str,
                 skipped: list[tuple[str, str]]) -> tuple[da.Array, list[str], list[str], np.ndarray,
                                                          dict[str, dict[str, object]], list[Path]]:
    """All files' usable trajectories as one lazy array, with ids, splits, buo_y, file notes and the files used."""
    parts, ids, splits, buo, notes, used = [], [], [], [], {}, []
    for p, info in good:
        n = info["shape"][0]
        if n == 0:
            skipped.append((p.name, "holds no trajectories"))
            continue
        file_ids = [f"{p.name}#{i}" for i in range(n)]
        blocks, keep, bad = checked(_Blocks(p, info["split"], info["shape"]), blk, file_ids, p.name, check_finite)
        skipped.extend(bad)
        if keep.size == 0:
            continue
        parts.append(to_dask(blocks, blk, "pdearena", file_token(p), keep.tolist()))
        ids.extend(file_ids[i] for i in keep)
        splits.extend([info["split"]] * len(keep))
        buo.append(info["buo_y"][keep])
        used.append(p)
        notes[p.name] = _file_notes(p, info)
    if not parts:
        raise InputError(good[0][0], "no usable trajectory in the readable inputs: "
                                     + "; ".join(f"{w}: {r}" for w, r in skipped[:3]))
    fields = da.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    return fields, ids, splits, np.concatenate(buo), notes, used


def _looks_conditioned(good: list[tuple[Path, dict[str, object]]], buo_y: np.ndarray, n_t: int) -> bool:
    """Whether the files are the conditioned set: a folder says so, buo_y varies, or trajectories have 56 frames."""
    return (any(_COND_FOLDER.search(part) for p, _ in good for part in p.parent.parts)
            or len(np.unique(buo_y)) > 1 or n_t == 56)


def _dataset(fields: da.Array, ids: list[str], first: dict[str, object], buo_y: np.ndarray, name: str | None,
             conditioned: bool, notes: dict[str, dict[str, object]]) -> xr.Dataset:
    """The canonical dataset: channels u, vx, vy on the first file's grid and times, an all-fluid mask."""
    _, n_t, nx, ny = first["shape"]
    parameters: dict[str, object] = {"buo_y": float(buo_y[0])} if len(np.unique(buo_y)) == 1 else {}
    mask = da.ones((fields.shape[0], ny, nx), dtype=np.uint8, chunks=(fields.chunks[0], ny, nx))
    time = first["t"] if first["t"] is not None and len(first["t"]) == n_t else np.arange(n_t, dtype=np.float64)
    dt = float(np.diff(time)[0]) if n_t > 1 else first["dt"]
    return xr.Dataset(
        {"fields": (("sample", "time", "channel", "y", "x"), fields), "mask": (("sample", "y", "x"), mask)},
        coords={"sample": np.array(ids, dtype=str), "time": time, "channel": np.array(CHANNELS),
                "y": first["y"], "x": first["x"]},
        attrs={"source": "pdearena",
               "dataset": manifest_name(name or ("pdearena-ns-cond" if conditioned else "pdearena-ns")),
               "boundary": "non-periodic", "parameters": parameters, "dt": dt,
               "provenance": {"reader": "dpot_data.sources.pdearena", "reader_version": READER_VERSION,
                              "conditioned": bool(conditioned), "files": notes},
               "model_layout": "xy"},
    )


def read(paths: Sequence[str | Path], *, name: str | None = None, conditioned: bool | None = None,
         block: int | None = None, check_finite: bool | str = True, convention: str = "dpot-reference") -> ReadResult:
    """Open PDEArena NS files lazily as one dataset; the split and buo_y of every trajectory come from its file.

    Under the "dpot-reference" convention the `valid` files are training data (the reference trains on train and
    valid together, and tests on the test files); under "canonical" they stay "valid". The model sees the stored
    (x, y) either way (`model_layout` "xy": the reference's H, W are the raw axes 2, 3).

    With `check_finite=True` (one streamed pass over the data when opened, before anything is written),
    trajectories holding NaN or Inf, or whose data cannot be read (a file corrupt past its header), are left out and
    listed in `skipped` with their id (a file none of whose trajectories can be read, by its name). With "raise"
    nothing is scanned when opened: the block reads check the values they read and a trajectory holding NaN or Inf
    raises InputError naming the file, the key and the trajectory. False keeps such values.

    `conditioned` picks the dataset name (pdearena-ns-cond or pdearena-ns); by default it is true when a folder
    name says "conditoned"/"conditioned", buo_y differs between trajectories, or trajectories have 56 frames.
    """
    paths = sorted(input_files(paths, (".h5", ".hdf5")), key=_order)
    if not paths:
        raise InputError("<no files>", "expected PDEArena NavierStokes2D_*.h5 files")
    good, skipped = _readable_files(paths)
    _check_alike(good)
    first = good[0][1]
    _, n_t, nx, ny = first["shape"]
    blk = auto_block(n_t * len(CHANNELS) * nx * ny * 4, block)
    fields, ids, splits, buo_y, notes, used = _lazy_fields(good, blk, check_finite, skipped)
    if conditioned is None:
        conditioned = _looks_conditioned(good, buo_y, n_t)
    data = _dataset(fields, ids, first, buo_y, name, conditioned, notes)
    split = np.array(splits)
    if convention == "dpot-reference":
        split = np.where(split == "valid", "train", split)
        data.attrs["split_rule"] = "dpot-reference: from the files; train and valid files are train, test files test"
    else:
        data.attrs["split_rule"] = "from the files: train, valid and test files"
    return ReadResult(data=data, split=split, sample_params={"buo_y": buo_y}, skipped=skipped, inputs=used)
