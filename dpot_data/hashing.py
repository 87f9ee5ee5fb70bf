"""sha256 of files (streamed) and of arrays (uncompressed C-order bytes, block by block), and re-hash checks of an
ingested dataset against its manifest entry, reusable by `inspect --verify` and `verify`."""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

CHUNK = 8 << 20
ARRAY_BLOCK_BYTES = 64 << 20


def sha256_file(path: str | os.PathLike[str], chunk: int = CHUNK) -> str:
    """Hex sha256 of a file, read in `chunk`-byte pieces (never whole in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class ArrayHasher:
    """Incremental sha256 of an array's C-order bytes, fed with consecutive blocks along axis 0."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def update(self, block: np.ndarray) -> None:
        """Add the next block (the rows that follow the previous block along axis 0)."""
        self._digest.update(np.ascontiguousarray(block).tobytes(order="C"))

    def hexdigest(self) -> str:
        return self._digest.hexdigest()


def _row_blocks(shape: tuple[int, ...], itemsize: int, chunk_rows: int | None) -> Iterable[slice]:
    """Slices along axis 0 of about ARRAY_BLOCK_BYTES each (a multiple of the chunk rows when known)."""
    if not shape:
        yield slice(None)
        return
    row = max(1, int(np.prod(shape[1:], dtype=np.int64)) * itemsize)
    step = max(1, ARRAY_BLOCK_BYTES // row)
    if chunk_rows:
        step = max(chunk_rows, step // chunk_rows * chunk_rows)
    for start in range(0, shape[0], step):
        yield slice(start, min(start + step, shape[0]))


def sha256_array(array: Any) -> str:
    """sha256 of an array's uncompressed C-order bytes (numpy, zarr or dask), read block by block along axis 0.

    The digest depends on dtype (including byte order), shape and values only, not on chunking or codecs, so the
    same data stored as Zarr with any compressor hashes the same. Numeric and bool arrays only.
    """
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "biuf":
        raise TypeError(f"sha256_array hashes numeric/bool arrays, not {dtype}")
    shape = tuple(array.shape)
    chunks = getattr(array, "chunks", None)
    chunk_rows = chunks[0] if chunks and isinstance(chunks[0], int) else None
    hasher = ArrayHasher()
    for rows in _row_blocks(shape, dtype.itemsize, chunk_rows):
        block = array[rows] if shape else array[()]
        hasher.update(np.asarray(block, dtype=dtype))
    return hasher.hexdigest()


@dataclass
class Check:
    """One re-hash result: what was checked, the expected and actual digest (or a reason), and whether they agree."""

    kind: str  # "shard" | "zarr" | "input"
    path: str
    expected: str
    actual: str
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_shards(root: str | Path, entry: dict, rehash: bool = True) -> list[Check]:
    """Each shard of a manifest dataset entry: present, of the recorded size, and (if rehash) of the recorded sha256."""
    out = []
    for shard in entry.get("shards", []):
        path = Path(root) / shard["path"]
        if not path.is_file():
            out.append(Check("shard", shard["path"], shard["sha256"], "missing", False))
            continue
        size = path.stat().st_size
        if size != shard["bytes"]:
            out.append(Check("shard", shard["path"], f"{shard['bytes']} bytes", f"{size} bytes", False))
            continue
        if rehash:
            actual = sha256_file(path)
            out.append(Check("shard", shard["path"], shard["sha256"], actual, actual == shard["sha256"]))
        else:
            out.append(Check("shard", shard["path"], f"{shard['bytes']} bytes", f"{size} bytes", True))
    return out


def check_zarr(root: str | Path, entry: dict, rehash: bool = True) -> list[Check]:
    """Each array listed in a dataset entry's `zarr.arrays`: present, and (if rehash) of the recorded sha256."""
    import zarr

    spec = entry.get("zarr")
    if not spec:
        return []
    out = []
    store = Path(root) / spec["path"]
    try:
        group = zarr.open_group(str(store), mode="r", path=spec["group"])
    except Exception as exc:  # noqa: BLE001 - any failure to open is reported as a failed check
        return [Check("zarr", f"{spec['path']}/{spec['group']}", "readable group", f"unreadable: {exc}", False)]
    for name, expected in spec["arrays"].items():
        where = f"{spec['path']}/{spec['group']}/{name}"
        if name not in group:
            out.append(Check("zarr", where, expected, "missing", False))
            continue
        if rehash:
            actual = sha256_array(group[name])
            out.append(Check("zarr", where, expected, actual, actual == expected))
        else:
            out.append(Check("zarr", where, expected, "present", True))
    return out


def check_inputs(entry: dict) -> list[Check]:
    """Each raw input still at its recorded path with the recorded sha256 (missing inputs are reported, not failed)."""
    out = []
    for item in entry.get("inputs", []):
        path = Path(item["path"])
        if not path.is_file():
            out.append(Check("input", item["path"], item["sha256"], "not present here", True))
            continue
        actual = sha256_file(path)
        out.append(Check("input", item["path"], item["sha256"], actual, actual == item["sha256"]))
    return out


def check_dataset(root: str | Path, entry: dict, rehash: bool = True) -> list[Check]:
    """All shard and Zarr checks of one manifest dataset entry (sizes only when rehash is False)."""
    return check_shards(root, entry, rehash) + check_zarr(root, entry, rehash)
