"""Shared plumbing of the HDF5/npy readers: lazy sample-block arrays for dask, and cheap integrity probes.

A reader describes its trajectories as a `SampleBlocks` object (shape, float32, and a `block(n0, n1)` method that
opens the raw file, reads trajectories n0..n1-1 and closes it). Wrapped by `to_dask`, it becomes a dask array
chunked along `sample` only. Nothing holds an open file handle between tasks, so the graph pickles and runs on a
dask.distributed cluster as well as on local threads.

Before that, `checked` can scan the trajectories once (NaN/Inf, read errors of files corrupt past their header);
the bad ones are left out of the SampleBlocks itself (`Subset`), so no later read ever touches them again.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import dask.array as da
import h5py
import numpy as np
from dask.base import tokenize

TARGET_BLOCK_BYTES = 64 << 20


class SampleBlocks(ABC):
    """An array-like of float32 trajectories, readable only in blocks of whole samples (axis 0)."""

    shape: tuple[int, ...]
    dtype = np.dtype(np.float32)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @abstractmethod
    def block(self, n0: int, n1: int) -> np.ndarray:
        """Trajectories n0..n1-1 as a float32 array of shape (n1 - n0,) + shape[1:]."""

    def finite_frames(self, n0: int, n1: int) -> np.ndarray:
        """(n1 - n0, time) bool, True where a frame holds no NaN/Inf; readers override it to check the raw
        arrays as stored, without reordering them."""
        data = self.block(n0, n1)
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
    ok = np.isfinite(raw) if raw.dtype.itemsize <= 4 else np.abs(raw) <= np.finfo(np.float32).max
    ok = np.moveaxis(ok, time_axis, 1)
    return ok.reshape(ok.shape[0], ok.shape[1], -1).all(axis=2)


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
    except OSError as exc:
        return f"cannot open as HDF5 (truncated or corrupt): {exc}"


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a .npy file from its header (memory-mapped, no data read); ValueError/OSError if broken."""
    arr = np.load(path, mmap_mode="r", allow_pickle=False)
    return tuple(arr.shape), arr.dtype


READ_ERRORS = (OSError, ValueError, EOFError, KeyError, RuntimeError)


@dataclass(frozen=True)
class BadSample:
    """A trajectory left out: its index in its SampleBlocks, why, and whether it could not be read at all."""

    index: int
    reason: str
    unreadable: bool


def _finite_frames(blocks: SampleBlocks, n0: int, n1: int) -> np.ndarray:
    """(n1 - n0, time) bool: frames without NaN/Inf, read through the raw reader (never through dask)."""
    return blocks.finite_frames(n0, n1)


def _scan_range(blocks: SampleBlocks, n0: int, n1: int) -> list[tuple[int, np.ndarray | str]]:
    """Per trajectory of n0..n1-1: its finite-frame flags, or the read error; a failing block is retried one
    trajectory at a time so that only the unreadable ones are blamed."""
    try:
        return list(zip(range(n0, n1), _finite_frames(blocks, n0, n1)))
    except READ_ERRORS:
        out: list[tuple[int, np.ndarray | str]] = []
        for i in range(n0, n1):
            try:
                out.append((i, _finite_frames(blocks, i, i + 1)[0]))
            except READ_ERRORS as exc:
                out.append((i, f"unreadable (corrupt data): {type(exc).__name__}: {exc}"))
        return out


def scan(blocks: SampleBlocks, block: int, lengths: Sequence[int] | None = None,
         workers: int | None = None) -> list[BadSample]:
    """Trajectories of `blocks` that cannot be read or hold NaN/Inf in their valid frames (frames past `lengths`,
    the NaN padding of variable-length sources, are not checked). One streamed pass, `block` trajectories per read,
    a few reads in flight; memory stays at about `workers` blocks."""
    n = blocks.shape[0]
    ranges = [(i, min(i + block, n)) for i in range(0, n, block)]
    workers = workers or min(4, os.cpu_count() or 1)
    bad: list[BadSample] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for rows in pool.map(lambda r: _scan_range(blocks, *r), ranges):
            for i, frames in rows:
                if isinstance(frames, str):
                    bad.append(BadSample(i, frames, True))
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

    def block(self, n0: int, n1: int) -> np.ndarray:
        runs = self._runs(n0, n1)
        if not runs:
            return np.empty((0,) + self.shape[1:], np.float32)
        return np.concatenate([self.base.block(int(r[0]), int(r[-1]) + 1) for r in runs], axis=0)

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


def checked(blocks: SampleBlocks, block: int, ids: Sequence[str], label: str, check: bool,
            lengths: Sequence[int] | None = None) -> tuple[SampleBlocks, np.ndarray, list[tuple[str, str]]]:
    """Scan `blocks` when `check` is set: (the blocks without bad trajectories, kept indices, `skipped` entries)."""
    n = blocks.shape[0]
    if not check or n == 0:
        return blocks, np.arange(n, dtype=np.int64), []
    bad = scan(blocks, block, lengths)
    kept, keep = without_bad(blocks, bad)
    return kept, keep, skipped_entries(bad, ids, n, label)


def unique_names(paths: Sequence[Path]) -> None:
    """Trajectory ids start with the file name: two different inputs with one name would collide (InputError)."""
    seen: dict[str, Path] = {}
    for p in paths:
        other = seen.setdefault(p.name, p)
        if other != p:
            from dpot_data.errors import InputError

            raise InputError(p, f"has the same file name as {other}; trajectory ids are '<file name>#<index>', so "
                                "inputs need distinct names")


def files_in(paths: Sequence[str | Path], suffixes: tuple[str, ...]) -> list[Path]:
    """Paths as given, with folders replaced by the files with one of `suffixes` inside them (sorted)."""
    out: list[Path] = []
    for p in map(Path, paths):
        out.extend(sorted(q for q in p.rglob("*") if q.is_file() and q.suffix.lower() in suffixes)
                   if p.is_dir() else [p])
    return out
