"""Shared plumbing of the HDF5/npy readers: lazy sample-block arrays for dask, and cheap integrity probes.

A reader describes its trajectories as a `SampleBlocks` object (shape, float32, and a `block(n0, n1)` method that
opens the raw file, reads trajectories n0..n1-1 and closes it). Wrapped by `to_dask`, it becomes a dask array
chunked along `sample` only. Nothing holds an open file handle between tasks, so the graph pickles and runs on a
dask.distributed cluster as well as on local threads.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING

import dask.array as da
import h5py
import numpy as np
from dask.base import tokenize

if TYPE_CHECKING:
    import xarray as xr

    from dpot_data.sources.base import ReadResult

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


def nonfinite_samples(data: "xr.Dataset", lengths: np.ndarray | None = None) -> list[tuple[int, str]]:
    """(index, reason) of every trajectory holding NaN or Inf in its valid frames (one streamed read pass).

    Frames past `lengths` (NaN padding of variable-length sources) are not checked.
    """
    fields = data["fields"].data
    finite = da.isfinite(fields).all(axis=tuple(range(2, fields.ndim)))  # (sample, time)
    per_frame = np.asarray(finite.compute())
    out = []
    for i, frames in enumerate(per_frame):
        valid = frames[: int(lengths[i])] if lengths is not None else frames
        bad = np.flatnonzero(~valid)
        if bad.size:
            out.append((i, f"NaN or Inf in {bad.size} of {valid.size} frames (first: frame {int(bad[0])})"))
    return out


def drop_nonfinite(result: "ReadResult") -> "ReadResult":
    """The result without trajectories holding NaN/Inf; each one is added to `skipped` with its id and reason."""
    bad = nonfinite_samples(result.data, result.lengths)
    if not bad:
        return result
    drop = {i for i, _ in bad}
    keep = np.array([i for i in range(result.n_samples) if i not in drop], dtype=np.int64)
    if keep.size == 0:
        from dpot_data.errors import InputError

        where = result.inputs[0] if result.inputs else "<inputs>"
        raise InputError(where, f"every trajectory holds NaN or Inf ({bad[0][1]} in the first); nothing to ingest")
    ids = result.data["sample"].values
    result.skipped.extend((str(ids[i]), reason) for i, reason in bad)
    result.data = result.data.isel(sample=keep)
    if result.split is not None:
        result.split = np.asarray(result.split)[keep]
    if result.lengths is not None:
        result.lengths = np.asarray(result.lengths)[keep]
    result.sample_params = {k: np.asarray(v)[keep] for k, v in result.sample_params.items()}
    return result
