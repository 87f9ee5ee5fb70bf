"""Shared plumbing of the HDF5/npy readers: lazy sample-block arrays for dask, and cheap integrity probes.

A reader describes its trajectories as a `SampleBlocks` object (shape, float32, and a `block(n0, n1)` method that
opens the raw file, reads trajectories n0..n1-1 and closes it). Wrapped by `to_dask`, it becomes a dask array
chunked along `sample` only. Nothing holds an open file handle between tasks, so the graph pickles and runs on a
dask.distributed cluster as well as on local threads.

Values are checked where they are read: a block read tests every raw trajectory it reads for NaN/Inf while it is in
cache (`all_finite`) and raises InputError naming the file, the key and the trajectory (`nonfinite_error`) when
`SampleBlocks.checks` is set. Skipping bad trajectories instead (the readers' default, `check_finite=True`) needs
them known before ingest fixes the sample ids, the split and its journal, so `checked` then scans the trajectories
once when the file is opened (NaN/Inf, read errors of files corrupt past their header); the bad ones are left out of
the SampleBlocks itself (`Subset`), so no later read ever touches them again. `check_finite="raise"` reads every
value once, in the block reads, with no scan when opened.

NaN follows one rule in every reader built on this module (`nan_rule`, applied by `NanMasked` as blocks are read
and by `checked(..., nan_rule=True)` when a file is opened): a cell NaN in every frame of a trajectory is geometry
(an obstacle, land: mask 0, stored as 0); NaN that comes and goes (a missing frame, member or chunk) is missing
data, and a trajectory with no cell left unmasked is refused: such trajectories are dropped with one line each in
`skipped` (a scan) or refused in one line naming the file and the trajectory (a block read). Never is a trajectory
stored fully masked.

Also here: the size checks every reader applies before reading (`check_sizes`, `check_stored`, `check_h5_dataset`,
limits in `dpot_data.sources.base`), and the input-path checks (`text_path`, `distinct_files`).
"""

from __future__ import annotations

import errno
import math
import os
import stat
import threading
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import dask.array as da
import h5py
import numpy as np
from dask.base import tokenize
from h5py import h5d, h5l, h5o, h5s

from dpot_format.npy import read_npy_header
from dpot_data.errors import InputError, TrajectoryError
from dpot_format.io import file_kind
from dpot_data.sources.base import (INFLATION_SLACK_BYTES, MAX_FRAMES, MAX_GRID_SIDE, MAX_INFLATION,
                                    MAX_TRAJECTORIES, MAX_TRAJECTORY_BYTES)

TARGET_BLOCK_BYTES = 64 << 20
FLOAT32_MAX = float(np.finfo(np.float32).max)
FINITE_MODES = ("skip", "raise", "off")


class SampleBlocks(ABC):
    """An array-like of float32 trajectories, readable only in blocks of whole samples (axis 0).

    `checks`: `block` raises InputError (file, key, trajectory) when a value it reads is NaN or Inf (or, stored wider,
    beyond the float32 range) in a valid frame; the readers set it unless `check_finite=False`."""

    shape: tuple[int, ...]
    dtype = np.dtype(np.float32)
    checks: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @abstractmethod
    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        """Trajectories n0..n1-1 as a float32 array of shape (n1 - n0,) + shape[1:]; `check` (default `checks`):
        raise InputError on NaN/Inf in what is read (`nonfinite_error`)."""

    def finite_frames(self, n0: int, n1: int) -> np.ndarray:
        """(n1 - n0, time) bool, True where a frame holds no NaN/Inf; readers override it to check the raw
        arrays as stored, without reordering them."""
        data = self.block(n0, n1, check=False)
        return np.isfinite(data).all(axis=tuple(range(2, data.ndim)))

    def __getitem__(self, key) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        first = key[0] if key else slice(None)
        rest = tuple(key[1:])
        if isinstance(first, (int, np.integer)):
            return self.block(int(first), int(first) + 1)[(0,) + rest]
        start, stop, step = first.indices(self.shape[0])
        if stop <= start:
            return np.empty((0,) + self.shape[1:], np.float32)[(slice(None),) + rest]
        return self.block(start, stop)[(slice(None, None, step),) + rest]


def frames_ok(raw: np.ndarray, time_axis: int = 1) -> np.ndarray:
    """(samples, time) bool of a raw block in any storage order whose axis 0 is the sample: True where a frame holds
    no NaN/Inf, and, for wider floats, no value beyond the float32 range (it would become Inf when stored)."""
    ok = np.isfinite(raw) if raw.dtype.itemsize <= 4 else np.abs(raw) <= FLOAT32_MAX
    ok = np.moveaxis(ok, time_axis, 1)
    return ok.reshape(ok.shape[0], ok.shape[1], -1).all(axis=2)


def all_finite(raw: np.ndarray) -> bool:
    """Whether a raw array holds no NaN/Inf and, stored wider than float32, no value beyond the float32 range (the
    fast test of a block read; `frames_ok` says where when it fails)."""
    if raw.size == 0:
        return True
    if raw.dtype.itemsize <= 4:
        return bool(np.isfinite(raw).all())
    return bool(raw.max() <= FLOAT32_MAX and raw.min() >= -FLOAT32_MAX)  # NaN fails both comparisons


def nonfinite_error(where: str | Path, key: str, index: object, raw: np.ndarray,
                    time_axis: int = 0) -> TrajectoryError:
    """The InputError of a trajectory holding NaN/Inf: `raw` is its array as stored, time on `time_axis`."""
    ok = frames_ok(raw[None], time_axis + 1)[0]
    bad = np.flatnonzero(~ok)
    first = f", first: frame {int(bad[0])}" if bad.size else ""
    return TrajectoryError(where, f"{key}: trajectory {index} holds NaN or Inf ({bad.size} of {ok.size} frames"
                                  f"{first}); expected finite values (check_finite=True leaves such trajectories out)")


def read_error(where: str | Path, key: str, index: object, exc: BaseException) -> TrajectoryError:
    """The InputError of raw data that cannot be read (a file corrupt past its header)."""
    return TrajectoryError(where, f"{key}: trajectory {index} cannot be read (corrupt data): "
                                  f"{type(exc).__name__}: {exc}")


def no_inf(raw: np.ndarray) -> bool:
    """Whether a raw array holds no ±Inf and, stored wider than float32, no finite value beyond the float32 range
    (it would become Inf when stored); NaN is allowed (`nan_rule` decides about it)."""
    if raw.size == 0:
        return True
    with np.errstate(invalid="ignore"):
        if raw.dtype.itemsize <= 4:
            return not bool(np.isinf(raw).any())
        return not bool((np.abs(raw) > FLOAT32_MAX).any())  # NaN compares False


def nan_rule(block: np.ndarray, *, fill: bool = True) -> tuple[np.ndarray, list[str | None]]:
    """The one NaN rule of every reader (module docstring), on a block (b, T, C, *space) as read, NaN kept.

    Returns the (b, *space) uint8 masks (0 where a cell is NaN in every frame of some channel: geometry) and, per
    trajectory, None or what is wrong in words: NaN that comes and goes (missing data), or no cell left unmasked.
    With `fill`, NaN of geometry cells is set to 0 in place (the stored value of a masked cell)."""
    nan = np.isnan(block)
    always, ever = nan.all(axis=1), nan.any(axis=1)  # (b, C, *space)
    geometry = always.any(axis=1)  # (b, *space)
    masks = (~geometry).astype(np.uint8)
    problems: list[str | None] = []
    for j in range(block.shape[0]):
        flaky = ever[j] & ~always[j]
        if flaky.any():
            frames = np.flatnonzero(nan[j][:, flaky].any(axis=1))
            problems.append(f"NaN in {frames.size} of {block.shape[1]} frames (first: frame {int(frames[0])}) at "
                            f"{int(flaky.sum())} cell values that hold numbers in other frames: missing data, not "
                            "geometry (only a cell NaN in every frame is masked)")
        elif geometry[j].all():
            problems.append("NaN in every cell of every frame: no cell left unmasked, nothing to store")
        else:
            problems.append(None)
    if fill and nan.any():
        block[nan & geometry[:, None, None]] = 0.0
    return masks, problems


_MASK_CACHE = 32  # masks of blocks read but not yet asked for (one per block in flight is what is needed)


class NanMasked(SampleBlocks):
    """The blocks of a reader that returns NaN as read, under `nan_rule`: geometry cells masked and stored as 0, a
    trajectory with NaN that comes and goes (when `strict`) or with no cell left refused in one line naming `where`
    and its id. The mask a block read leaves behind is kept for `MaskBlocks`, so nothing is read twice (ingest asks
    for the fields of a block, then for its mask)."""

    def __init__(self, base: SampleBlocks, where: str | Path, ids: Sequence[str], strict: bool = True) -> None:
        self.base, self.where, self.ids, self.strict = base, where, list(ids), strict
        self.shape = tuple(base.shape)
        self._masks: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_masks", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _masks=OrderedDict(), _lock=threading.Lock())

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        out = self.base.block(n0, n1, check=check)
        masks, problems = nan_rule(out)
        for j, problem in enumerate(problems):
            if problem is not None and (self.strict or not masks[j].any()):
                raise InputError(self.where, f"trajectory {self.ids[n0 + j]}: {problem}; expected NaN only in cells "
                                             "NaN in every frame (geometry)")
        with self._lock:
            self._masks[(n0, n1)] = masks
            while len(self._masks) > _MASK_CACHE:
                self._masks.popitem(last=False)
        return out

    def mask(self, n0: int, n1: int) -> np.ndarray:
        """(n1 - n0, *space) uint8 mask of a block: the one its read left behind, else read again."""
        with self._lock:
            found = self._masks.pop((n0, n1), None)
        if found is None:
            self.block(n0, n1)
            with self._lock:
                found = self._masks.pop((n0, n1))
        return found


class MaskBlocks(SampleBlocks):
    """(n, *space) uint8 mask of a `NanMasked`, block by block."""

    dtype = np.dtype(np.uint8)

    def __init__(self, fields: NanMasked) -> None:
        self.fields = fields
        self.shape = (fields.shape[0], *fields.shape[3:])

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        return self.fields.mask(n0, n1)


def _row_dtype(dset: h5py.Dataset) -> np.dtype:
    """The buffer dtype a dataset is read into: float32 when stored as float32 or narrower (HDF5 converts exactly),
    else the stored dtype in native byte order (numpy then casts, as float32 storage always did)."""
    return np.dtype(np.float32) if dset.dtype.itemsize <= 4 else dset.dtype.newbyteorder("=")


def h5_rows(dset: h5py.Dataset, n0: int, n1: int, rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Rows (axis 0) n0..n1-1 of an HDF5 dataset, `rows` at a time (default: 1 when contiguous, else all of them,
    so that no compressed chunk is inflated twice), read straight into one reused buffer (`_row_dtype`): yields
    (first row, buffer); the buffer is overwritten by the next read. Plain stored bytes (`raw_offset`) are read with
    pread, which lets other threads run meanwhile (h5py holds the GIL for the whole of an HDF5 read); anything else
    through HDF5's own read, as h5py `read_direct` does, without rebuilding selections each time."""
    if n1 <= n0:
        return
    step = rows or (1 if dset.chunks is None else n1 - n0)
    rest = tuple(dset.shape[1:])
    buf = np.empty((min(step, n1 - n0),) + rest, dtype=_row_dtype(dset))
    offset = raw_offset(dset)
    if offset is not None:
        yield from _pread_rows(dset.file.filename, offset, buf, n0, n1)
        return
    fspace = dset.id.get_space()
    mspaces: dict[int, h5s.SpaceID] = {}
    for s0 in range(n0, n1, step):
        count = min(n1, s0 + step) - s0
        view = buf[:count]
        mspace = mspaces.get(count) or mspaces.setdefault(count, h5s.create_simple(view.shape))
        fspace.select_hyperslab((s0,) + (0,) * len(rest), (count,) + rest)
        dset.id.read(mspace, fspace, view)
        yield s0, view


def raw_offset(dset: h5py.Dataset) -> int | None:
    """Where a dataset's values start in its file when they are plain bytes of the dtype it is read into: contiguous
    layout, no filters, no external storage, allocated, stored in native byte order as `_row_dtype`; else None. (HDF5
    gives the address from the start of the file, a user block included.)"""
    if dset.chunks is not None or dset.dtype != _row_dtype(dset) or not dset.dtype.isnative \
            or dset.file.driver != "sec2":
        return None
    plist = dset.id.get_create_plist()
    if plist.get_layout() != h5d.CONTIGUOUS or plist.get_nfilters() or plist.get_external_count():
        return None
    return dset.id.get_offset()


def _pread_rows(filename: str, offset: int, buf: np.ndarray, n0: int, n1: int) -> Iterator[tuple[int, np.ndarray]]:
    """`h5_rows` of plain stored bytes: rows read with os.preadv into `buf` (the GIL released while the disk reads)."""
    row, step = buf[0].nbytes, len(buf)
    fd = os.open(filename, os.O_RDONLY)
    try:
        for s0 in range(n0, n1, step):
            view = buf[:min(n1, s0 + step) - s0]
            _pread(fd, view, offset + s0 * row)
            yield s0, view
    finally:
        os.close(fd)


def _pread(fd: int, dest: np.ndarray, position: int) -> None:
    """Fill the C-contiguous `dest` with the bytes at `position`; a short read (a truncated file) is an OSError."""
    got = os.preadv(fd, [dest], position)
    if got != dest.nbytes:
        raise OSError(errno.EIO, f"short read: {got} of {dest.nbytes} bytes at offset {position} (the file is "
                                 "truncated)")


def read_whole(dset: h5py.Dataset, dest: np.ndarray) -> None:
    """All of a dataset into `dest` (its shape, C-contiguous): by pread when its bytes are plain values of dest's
    dtype (`raw_offset`), else h5py `read_direct`."""
    offset = raw_offset(dset) if dset.dtype == dest.dtype and dest.flags.c_contiguous else None
    if offset is None:
        dset.read_direct(dest)
        return
    fd = os.open(dset.file.filename, os.O_RDONLY)
    try:
        _pread(fd, dest, offset)
    finally:
        os.close(fd)


def checked_rows(dset: h5py.Dataset, n0: int, n1: int, where: str | Path, key: str,
                 check: bool) -> Iterator[tuple[int, np.ndarray]]:
    """`h5_rows`, each row tested for NaN/Inf (`all_finite`) while still in cache when `check` is set
    (`nonfinite_error`); a read error raises `read_error`. The caller copies each buffer once into its output."""
    rows = h5_rows(dset, n0, n1)
    while True:
        try:
            s0, raw = next(rows)
        except StopIteration:
            return
        except READ_ERRORS as exc:
            raise read_error(where, key, f"{n0}..{n1 - 1}" if n1 - n0 > 1 else n0, exc) from None
        for j in range(len(raw)) if check else ():
            if not all_finite(raw[j]):
                raise nonfinite_error(where, key, s0 + j, raw[j])
        yield s0, raw


def file_token(path: Path) -> tuple[str, int, int]:
    """What identifies a file's content for dask task names: resolved path, mtime, size."""
    st = os.stat(path)
    return str(Path(path).resolve()), st.st_mtime_ns, st.st_size


def auto_block(per_sample_bytes: int, block: int | None) -> int:
    """Trajectories per dask chunk: the given number, or as many as fit in ~64 MiB (at least one)."""
    if block is not None:
        return max(1, int(block))
    return max(1, TARGET_BLOCK_BYTES // max(1, per_sample_bytes))


def to_dask(blocks: SampleBlocks, block: int, prefix: str, *token: object) -> da.Array:
    """Wrap a SampleBlocks object as a dask array chunked by `block` samples, with a content-derived name."""
    return da.from_array(blocks, chunks=(block,) + (-1,) * (blocks.ndim - 1), asarray=False, fancy=False,
                         name=f"{prefix}-" + tokenize(*token, block))


# ------------------------------------------------------------------------------------------------- sizes, never trusted

def on_disk_bytes(path: str | Path) -> int:
    """Bytes a file really occupies: its size, or less for a sparse file (allocated blocks, where reported)."""
    st = os.stat(path)
    blocks = getattr(st, "st_blocks", None)
    return int(st.st_size) if blocks is None else int(min(st.st_size, blocks * 512))


def allowed_bytes(stored: int) -> int:
    """The most uncompressed bytes accepted for `stored` bytes on disk (base.MAX_INFLATION, INFLATION_SLACK_BYTES)."""
    return MAX_INFLATION * int(stored) + INFLATION_SLACK_BYTES


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(v)) for v in shape) + ")"


def check_stored(where: str | Path, key: str, shape: Sequence[int], itemsize: int, stored: int,
                 what: str = "stored for it in the file") -> None:
    """Refuse an array whose declared size exceeds what is on disk for it by more than base.MAX_INFLATION (plus
    base.INFLATION_SLACK_BYTES): unwritten HDF5 chunks, a sparse or truncated file, a decompression bomb."""
    declared = math.prod(int(v) for v in shape) * int(itemsize)
    if declared > allowed_bytes(stored):
        raise InputError(where, f"{key}: declares shape {_shape_text(shape)} = {declared} bytes, but only {stored} "
                                f"bytes are {what}; at most {allowed_bytes(stored)} bytes allowed ({MAX_INFLATION}x "
                                f"the stored bytes + {INFLATION_SLACK_BYTES}, dpot_data.sources.base.MAX_INFLATION): "
                                "the file is truncated, sparse or not what it declares")


def check_sizes(where: str | Path, key: str, *, trajectories: int | None = None, frames: int | None = None,
                space: Sequence[int] = (), channels: int = 1) -> None:
    """Refuse declared counts beyond the limits of dpot_data.sources.base (trajectories in a file, frames, grid
    side, bytes of one float32 trajectory), before anything is allocated for them."""
    for label, value, limit, const in (("trajectories", trajectories, MAX_TRAJECTORIES, "MAX_TRAJECTORIES"),
                                       ("frames", frames, MAX_FRAMES, "MAX_FRAMES")):
        if value is not None and not 0 <= int(value) <= limit:
            raise InputError(where, f"{key}: declares {int(value)} {label}; at most {limit} allowed "
                                    f"(dpot_data.sources.base.{const})")
    for side in space:
        if not 0 <= int(side) <= MAX_GRID_SIDE:
            raise InputError(where, f"{key}: declares a grid side of {int(side)} points (grid "
                                    f"{_shape_text(space)}); at most {MAX_GRID_SIDE} allowed "
                                    "(dpot_data.sources.base.MAX_GRID_SIDE)")
    per = (frames or 1) * max(1, int(channels)) * math.prod(int(v) for v in space) * 4
    if per > MAX_TRAJECTORY_BYTES:
        raise InputError(where, f"{key}: one trajectory ({frames} frames, {channels} channels, grid "
                                f"{_shape_text(space)}) holds {per} bytes as float32; at most {MAX_TRAJECTORY_BYTES} "
                                "allowed (dpot_data.sources.base.MAX_TRAJECTORY_BYTES)")


def _outside(key: str, dset: h5py.Dataset) -> str | None:
    """Why a dataset's values are not stored in its own file (a virtual dataset, external raw files), else None."""
    if dset.is_virtual:
        return f"{key}: a virtual dataset (its data lives in other files); expected the data stored in this file"
    if dset.external:
        return (f"{key}: stored in external raw files {[e[0] for e in dset.external][:3]}; expected the data stored "
                "in this file")
    return None


def check_h5_contained(where: str | Path, f: h5py.File) -> None:
    """The one containment check of every HDF5 input (the paper's readers, `ingest xarray`, The Well), from its
    metadata alone: nothing it holds is stored outside it. No external link anywhere (`h5py.ExternalLink`: reading
    it would read another file, e.g. /etc/passwd; user-defined links alike), no virtual dataset, no dataset in
    external raw files. Soft links name paths inside the file and are followed. One InputError line naming the
    file and the key otherwise; nothing behind a link is opened (the visits follow hard links only)."""
    # low-level visits (a tenth of the cost of h5py's visititems on a file of thousands of groups); a visit stops
    # at the first callback returning something, so the callbacks return what they found
    odd = f.id.links.visit(lambda name, info: name if info.type not in (h5l.TYPE_HARD, h5l.TYPE_SOFT) else None,
                           info=True)
    if odd is not None:
        name = odd.decode("utf-8", "backslashreplace")
        lnk = f.get(name, getlink=True)
        if isinstance(lnk, h5py.ExternalLink):
            raise InputError(where, f"{name}: an external link to {lnk.filename}:{lnk.path}; expected every array "
                                    "stored in this file (external links are not followed)")
        raise InputError(where, f"{name}: a user-defined link; expected every array stored in this file (such "
                                "links are not followed)")
    elsewhere = h5o.visit(f.id, lambda name, info: name if info.type == h5o.TYPE_DATASET and _stored_elsewhere(
        f.id, name) else None, info=True)
    if elsewhere is not None:
        name = elsewhere.decode("utf-8", "backslashreplace")
        raise InputError(where, _outside(name, f[name]) or f"{name}: expected the data stored in this file")


def _stored_elsewhere(loc: h5py.h5g.GroupID, name: bytes) -> bool:
    """Whether the dataset `name` below `loc` is virtual or stored in external raw files (its creation properties)."""
    plist = h5d.open(loc, name).get_create_plist()
    return plist.get_layout() == h5d.VIRTUAL or plist.get_external_count() > 0


def check_hdf5_contained(path: Path) -> None:
    """`check_h5_contained` of the HDF5 file at `path` (opened read-only for its metadata, then closed); a file
    that does not open as HDF5 is left to the reader's own words."""
    try:
        f = h5py.File(path, "r")
    except READ_ERRORS:
        return
    with f:
        check_h5_contained(path, f)


def check_h5_dataset(where: str | Path, key: str, dset: h5py.Dataset) -> None:
    """A dataset whose data will be read: stored in this file (not virtual, no external raw files) and not declaring
    more than base.MAX_INFLATION times the bytes it has in the file (`get_storage_size`: written chunks, compressed)."""
    problem = _outside(key, dset)
    if problem:
        raise InputError(where, problem)
    check_stored(where, key, dset.shape, dset.dtype.itemsize, dset.id.get_storage_size())


def check_file_total(path: Path, declared: int, what: str) -> None:
    """The data a file declares in all (bytes) against the bytes the file occupies on disk (sparse files too)."""
    disk = on_disk_bytes(path)
    if declared > allowed_bytes(disk):
        raise InputError(path, f"{what} declare {declared} bytes in all, but the file occupies {disk} bytes on disk; "
                               f"at most {allowed_bytes(disk)} bytes allowed ({MAX_INFLATION}x + "
                               f"{INFLATION_SLACK_BYTES}, dpot_data.sources.base.MAX_INFLATION): the file is "
                               "truncated, sparse or not what it declares")


# ------------------------------------------------------------------------------------------------- coordinates

def check_times(where: str | Path, key: str, times: np.ndarray) -> None:
    """One trajectory's frame times: finite and strictly increasing, or InputError naming `where` and `key` (a
    constant, non-monotonic, NaN or Inf time coordinate gives no frame times and no time step)."""
    t = np.asarray(times, dtype=np.float64).ravel()
    if not t.size:
        raise InputError(where, f"{key}: no frame times (a time axis of 0 frames); expected at least one frame")
    bad = np.flatnonzero(~np.isfinite(t))
    if bad.size:
        raise InputError(where, f"{key}: time of frame {int(bad[0])} is {t[bad[0]]}; expected finite frame times")
    if t.size > 1:
        step = np.diff(t)
        if (step == 0).all():
            raise InputError(where, f"{key}: every frame has the time {t[0]:g} (a constant time coordinate); expected "
                                    "frame times strictly increasing")
        k = np.flatnonzero(step <= 0)
        if k.size:
            i = int(k[0])
            raise InputError(where, f"{key}: frame {i + 1} has the time {t[i + 1]:g} after {t[i]:g} at frame {i}; "
                                    "expected frame times strictly increasing")


def check_coordinate(where: str | Path, key: str, values: np.ndarray) -> None:
    """A spatial coordinate: finite, or InputError naming `where` and `key`."""
    v = np.asarray(values, dtype=np.float64).ravel()
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
        raise InputError(where, f"{key}: value {int(bad[0])} is {v[bad[0]]}; expected finite coordinates")


def uniform_step(times: np.ndarray) -> float | None:
    """The time step when frame times are evenly spaced, else None (unknown: `dt` null in the manifest)."""
    t = np.asarray(times, dtype=np.float64)
    if t.size < 2:
        return None
    step = np.diff(t)
    return float(step[0]) if np.allclose(step, step[0]) else None


def common_times(rows: Sequence[tuple[str | Path, str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray | None]:
    """The stored `time` coordinate of trajectories given as (file, trajectory, frame times) rows, each already
    `check_times`-checked: the times themselves when every trajectory has them, else the times from each start
    with the starts (one per row) for the sample parameter `time_start`. Trajectories stepping differently from the
    first are refused in one line naming the file and the trajectory."""
    first = np.asarray(rows[0][2], dtype=np.float64)
    rel = first - first[0]
    span = float(abs(rel[-1])) if rel.size else 0.0
    starts = np.empty(len(rows), dtype=np.float64)
    for k, (where, label, times) in enumerate(rows):
        t = np.asarray(times, dtype=np.float64)
        if t.shape != first.shape or not np.allclose(t - t[0], rel, rtol=1e-5, atol=1e-6 * span):
            step = uniform_step(t)
            raise InputError(where, f"{label}: frame times {_times_text(t)} (step "
                                    f"{step if step is not None else 'uneven'}); expected the time steps of "
                                    f"{rows[0][1]}, {_times_text(first)}, in every trajectory of one ingest")
        starts[k] = t[0]
    if np.allclose(starts, starts[0], rtol=1e-5, atol=1e-6 * span):
        return first, None
    return rel, starts


def _times_text(t: np.ndarray) -> str:
    shown_ = ", ".join(f"{v:g}" for v in t[:3])
    return f"[{shown_}{', ...' if t.size > 3 else ''}] ({t.size} frames)"


# ------------------------------------------------------------------------------------------------- input paths

def shown(path: str | bytes | Path) -> str:
    """A path as text for messages: bytes that are not UTF-8 written as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def text_path(path: str | bytes | Path) -> None:
    """Refuse a path that is not valid UTF-8: trajectory ids and provenance are made from file and folder names and
    must be text (JSON, Zarr)."""
    try:
        os.fsdecode(path).encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(shown(path), "expected a file name that is valid UTF-8 (trajectory ids are made from it "
                                      "and stored as text); rename the file or its folder") from None


def distinct_files(paths: Sequence[Path], name_of: Callable[[Path], str] = lambda p: p.name,
                   what: str = "file") -> list[Path]:
    """The paths with every file kept once. The same file reached again (the same path twice, a folder and a file in
    it, `a/../a/f`, a link of the same name) is dropped, with one warning for all of them; the same file under another
    name (`name_of`: what trajectory ids are made from) is refused, since its ids would depend on the name that came
    first."""
    seen: dict[tuple[int, int], Path] = {}
    out: list[Path] = []
    again: list[str] = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out.append(p)  # the reader says what is wrong with it
            continue
        first = seen.setdefault((st.st_dev, st.st_ino), p)
        if first is p:
            out.append(p)
        elif name_of(first) != name_of(p):
            raise InputError(p, f"is the same {what} as {first} under another name (a link); trajectory ids are made "
                                f"from the name, so give each {what} once, under one name")
        else:
            again.append(f"{p}" if os.fspath(p) == os.fspath(first) else f"{p} (the same {what} as {first})")
    if again:
        more = f" and {len(again) - 1} more" if len(again) > 1 else ""
        warnings.warn(f"{again[0]}{more}: given more than once; read once", stacklevel=3)
    return out


def hdf5_problem(path: Path) -> str | None:
    """Why an HDF5 file cannot be read (truncated, corrupt, not HDF5), or None when it opens and its contiguous
    datasets lie inside the file. Reads metadata only."""
    try:
        size = os.path.getsize(path)
        with h5py.File(path, "r") as f:
            bad: list[str] = []

            def visit(name: str, obj: object) -> None:
                if isinstance(obj, h5py.Dataset) and obj.chunks is None and not bad:
                    offset, nbytes = obj.id.get_offset(), obj.id.get_storage_size()
                    if offset is not None and offset + nbytes > size:
                        bad.append(f"dataset {name!r} ends at byte {offset + nbytes}, past the end of the file "
                                   f"({size} bytes): the file is truncated")

            f.visititems(visit)
            return bad[0] if bad else None
    except READ_ERRORS as exc:  # h5py raises RuntimeError/KeyError/ValueError too for damaged headers
        return f"cannot open as HDF5 (truncated or corrupt): {exc}"


def npy_info(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset of a .npy file from its header alone (nothing mapped or read beyond it), parsed
    by dpot_format.npy (no `ast`: threads may read headers at once); ValueError/OSError if the header is broken or
    the dtype is not a plain number type (a pickle)."""
    with open(path, "rb") as fh:
        shape, _fortran, dtype, offset = read_npy_header(fh, str(path))
    return shape, dtype, offset


READ_ERRORS = (OSError, ValueError, EOFError, KeyError, RuntimeError)


@dataclass(frozen=True)
class BadSample:
    """A trajectory left out: its index in its SampleBlocks, why, and whether it could not be read at all."""

    index: int
    reason: str
    unreadable: bool


def finite_mode(check: bool | str) -> str:
    """The readers' `check_finite` as "skip" (True: trajectories with NaN/Inf left out, found by a scan when
    opened), "raise" (no scan; a block read meeting NaN/Inf raises InputError) or "off" (False: values kept)."""
    if check is True or check == "skip":
        return "skip"
    if check is False or check == "off":
        return "off"
    if check == "raise":
        return "raise"
    raise InputError("check_finite", f"expected True, False or one of {', '.join(map(repr, FINITE_MODES))}, "
                                     f"got {check!r}")


def _finite_frames(blocks: SampleBlocks, n0: int, n1: int) -> np.ndarray:
    """(n1 - n0, time) bool: frames without NaN/Inf, read through the raw reader (never through dask)."""
    return blocks.finite_frames(n0, n1)


def _rule_problems(blocks: SampleBlocks, n0: int, n1: int) -> list[str | None]:
    """Per trajectory of n0..n1-1 under `nan_rule`: None, or why it is left out (±Inf, NaN that comes and goes,
    nothing left unmasked)."""
    data = blocks.block(n0, n1, check=False)
    with np.errstate(invalid="ignore"):
        inf = np.isinf(data).any(axis=tuple(range(2, data.ndim)))  # (b, T)
    _masks, problems = nan_rule(data, fill=False)
    out: list[str | None] = []
    for j, problem in enumerate(problems):
        where = np.flatnonzero(inf[j])
        out.append(f"Inf in {where.size} of {inf.shape[1]} frames (first: frame {int(where[0])})" if where.size
                   else problem)
    return out


def _scan_range(blocks: SampleBlocks, n0: int, n1: int,
                by_rule: bool = False) -> list[tuple[int, np.ndarray | str | None]]:
    """Per trajectory of n0..n1-1: its finite-frame flags (`by_rule`: None or the `nan_rule` problem), or the read
    error; a failing block is retried one trajectory at a time so that only the unreadable ones are blamed."""
    look = _rule_problems if by_rule else _finite_frames
    try:
        return list(zip(range(n0, n1), look(blocks, n0, n1)))
    except READ_ERRORS:
        out: list[tuple[int, np.ndarray | str | None]] = []
        for i in range(n0, n1):
            try:
                out.append((i, look(blocks, i, i + 1)[0]))
            except READ_ERRORS as exc:
                out.append((i, UnreadableText(f"unreadable (corrupt data): {type(exc).__name__}: {exc}")))
        return out


class UnreadableText(str):
    """The reason of a trajectory that could not be read at all (told apart from a `nan_rule` problem)."""


def scan(blocks: SampleBlocks, block: int, lengths: Sequence[int] | None = None,
         workers: int | None = None, nan_rule: bool = False) -> list[BadSample]:
    """Trajectories of `blocks` that cannot be read or hold NaN/Inf in their valid frames (frames past `lengths`,
    the NaN padding of variable-length sources, are not checked); with `nan_rule`, those holding Inf or breaking
    the NaN rule (geometry NaN is fine). One streamed pass, `block` trajectories per read, a few reads in flight;
    memory stays at about `workers` blocks."""
    n = blocks.shape[0]
    ranges = [(i, min(i + block, n)) for i in range(0, n, block)]
    workers = workers or min(4, os.cpu_count() or 1)
    bad: list[BadSample] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for rows in pool.map(lambda r: _scan_range(blocks, *r, by_rule=nan_rule), ranges):
            for i, frames in rows:
                if isinstance(frames, UnreadableText):
                    bad.append(BadSample(i, str(frames), True))
                    continue
                if nan_rule:
                    if frames is not None:
                        bad.append(BadSample(i, str(frames), False))
                    continue
                valid = frames[: int(lengths[i])] if lengths is not None else frames
                where = np.flatnonzero(~valid)
                if where.size:
                    bad.append(BadSample(i, f"NaN or Inf in {where.size} of {valid.size} frames "
                                            f"(first: frame {int(where[0])})", False))
    return bad


class Subset(SampleBlocks):
    """The trajectories `keep` (sorted indices) of another SampleBlocks; reads contiguous runs, never the others."""

    def __init__(self, base: SampleBlocks, keep: Sequence[int]) -> None:
        self.base, self.keep = base, np.asarray(keep, dtype=np.int64)
        self.shape = (len(self.keep),) + tuple(base.shape[1:])

    def _runs(self, n0: int, n1: int) -> list[np.ndarray]:
        idx = self.keep[n0:n1]
        return np.split(idx, np.flatnonzero(np.diff(idx) != 1) + 1) if idx.size else []

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        runs = self._runs(n0, n1)
        check = self.checks if check is None else check
        if not runs:
            return np.empty((0,) + self.shape[1:], np.float32)
        if len(runs) == 1:
            return self.base.block(int(runs[0][0]), int(runs[0][-1]) + 1, check=check)
        return np.concatenate([self.base.block(int(r[0]), int(r[-1]) + 1, check=check) for r in runs], axis=0)

    def finite_frames(self, n0: int, n1: int) -> np.ndarray:
        runs = self._runs(n0, n1)
        if not runs:
            return np.empty((0, self.shape[1]), bool)
        return np.concatenate([self.base.finite_frames(int(r[0]), int(r[-1]) + 1) for r in runs], axis=0)


def without_bad(blocks: SampleBlocks, bad: Sequence[BadSample]) -> tuple[SampleBlocks, np.ndarray]:
    """The blocks without the bad trajectories, and the kept indices."""
    drop = {b.index for b in bad}
    keep = np.array([i for i in range(blocks.shape[0]) if i not in drop], dtype=np.int64)
    return (blocks if not drop else Subset(blocks, keep)), keep


def skipped_entries(bad: Sequence[BadSample], ids: Sequence[str], n: int, label: str) -> list[tuple[str, str]]:
    """`skipped` entries: one per bad trajectory (by id), or one for the whole `label` when none of its n could
    be read."""
    if bad and len(bad) == n and all(b.unreadable for b in bad):
        return [(label, bad[0].reason)]
    return [(ids[b.index], b.reason) for b in bad]


def checked(blocks: SampleBlocks, block: int, ids: Sequence[str], label: str, check: bool | str,
            lengths: Sequence[int] | None = None,
            nan_rule: bool = False) -> tuple[SampleBlocks, np.ndarray, list[tuple[str, str]]]:
    """Apply a reader's `check_finite` (`finite_mode`) to `blocks`: (the blocks to read, kept indices, `skipped`
    entries). "skip" scans them now and leaves the bad trajectories out (`nan_rule`: those with Inf or breaking the
    NaN rule, for readers whose blocks keep NaN for `NanMasked`); "skip" and "raise" make every later block read
    check what it reads (under "skip" a guard against a file changed since it was opened)."""
    mode = finite_mode(check)
    n = blocks.shape[0]
    blocks.checks = mode != "off"
    if mode != "skip" or n == 0:
        return blocks, np.arange(n, dtype=np.int64), []
    bad = scan(blocks, block, lengths, nan_rule=nan_rule)
    kept, keep = without_bad(blocks, bad)
    kept.checks = True
    return kept, keep, skipped_entries(bad, ids, n, label)


def unique_names(paths: Sequence[Path]) -> None:
    """Trajectory ids start with the file name: two different inputs with one name would collide (InputError).
    Run after `distinct_files`, which has dropped repeats of one file."""
    seen: dict[str, Path] = {}
    for p in paths:
        other = seen.setdefault(p.name, p)
        if other != p:
            raise InputError(p, f"has the same file name as {other}; trajectory ids are '<file name>#<index>', so "
                                "inputs need distinct names")


def input_files(paths: Sequence[str | bytes | Path], suffixes: tuple[str, ...]) -> list[Path]:
    """`files_in`, then each path checked to be UTF-8 text and each file kept once (`distinct_files`), and distinct
    names (`unique_names`) among the files found."""
    found = files_in(paths, suffixes)
    for p in found:
        text_path(p)
    found = distinct_files(found)
    unique_names([p for p in found if p.exists()])
    return found


def require_file(path: Path) -> None:
    """InputError naming `path` as given unless it is a regular file: missing, a link loop, a device, a folder."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(path, "file not found") from None
    except OSError as exc:
        why = "is a symbolic link loop" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
        raise InputError(path, f"{why}, expected a file") from None
    if not stat.S_ISREG(mode):
        raise InputError(path, f"is {file_kind(mode)}, expected a regular file")


def as_path(path: str | bytes | os.PathLike) -> Path:
    """A path given as str, bytes (any bytes, kept as surrogate escapes) or path object, as a Path."""
    return Path(os.fsdecode(path))


def files_in(paths: Sequence[str | bytes | Path], suffixes: tuple[str, ...]) -> list[Path]:
    """Paths as given, with folders replaced by the files with one of `suffixes` inside them (sorted)."""
    out: list[Path] = []
    for p in map(as_path, paths):
        out.extend(sorted(q for q in p.rglob("*") if q.is_file() and q.suffix.lower() in suffixes)
                   if p.is_dir() else [p])
    return out
