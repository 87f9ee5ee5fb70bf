"""WebDataset tar shards of whole trajectories, written deterministically (fixed member metadata, sorted order) and
atomically (temporary name, fsync, rename), rolling to a new shard when the target size would be exceeded.

The tar stream is written directly (ustar headers, then each array's memory after its .npy header, then padding):
the same bytes as `tarfile` writes, without copying each trajectory twice on the way."""

from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dpot_format.io import atomic_write, drop_cached, fsync_dir
from dpot_format.names import sample_key, shard_file
from dpot_format.shard_index import INDEX_NAME, index_bytes, index_document, shard_samples
from dpot_format.tar import Member, SampleIndex

DEFAULT_SHARD_BYTES = 256 << 20
_BLOCK = tarfile.BLOCKSIZE


def npy_header(array: np.ndarray) -> bytes:
    """The .npy format 1.0 header of a C-order array (what `numpy.save` writes before the data)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(array))
    return buf.getvalue()


def _tar_header(name: str, size: int) -> bytes:
    """The ustar header of a regular member with the fixed metadata of every shard member."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % _BLOCK)


def _member_bytes(size: int) -> int:
    return _BLOCK + (size + _BLOCK - 1) // _BLOCK * _BLOCK


class _HashingFile:
    """A write-only file wrapper that hashes and counts what passes through (tarfile writes sequentially). A large
    write is hashed on the `hasher` thread while the same bytes go to the file: both release the GIL, so the two
    run on two cores and a shard costs the longer of the two instead of their sum."""

    PARALLEL_BYTES = 1 << 16  # below this, handing the hash to another thread costs more than it saves

    def __init__(self, fh: Any, hasher: ThreadPoolExecutor | None = None) -> None:
        self.fh, self.sha, self.size, self.hasher = fh, hashlib.sha256(), 0, hasher

    def write(self, data: bytes | memoryview) -> int:
        n = memoryview(data).nbytes
        self.size += n
        if self.hasher is None or n < self.PARALLEL_BYTES:
            self.sha.update(data)
            return self.fh.write(data)
        hashed = self.hasher.submit(self.sha.update, data)
        try:
            return self.fh.write(data)
        finally:
            hashed.result()

    def tell(self) -> int:
        return self.size


@dataclass
class ShardInfo:
    """A finished shard as the manifest lists it."""

    path: str  # relative to the output root
    split: str
    sha256: str
    bytes: int
    samples: int
    members: list[SampleIndex] | None = field(default=None, compare=False)  # as written; None: resumed, not known

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "split": self.split, "sha256": self.sha256, "bytes": self.bytes,
                "samples": self.samples}


class SplitShardWriter:
    """Writes the trajectories of one split of one dataset into <folder>/<split>-NNNNNN.tar shards, in call order."""

    def __init__(self, root: str | Path, rel_folder: str, split: str, target_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        self.root = Path(root)
        self.rel_folder = rel_folder.strip("/")
        self.split = split
        self.target = max(1, int(target_bytes))
        self.done: list[ShardInfo] = []
        self._open_shard = False
        self._fh: Any = None
        self._hf: _HashingFile | None = None
        self._tmp: Path | None = None
        self._samples = 0
        self._members: list[SampleIndex] = []  # the open shard's member index, as its bytes are written
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpot-shard-hash")
        (self.root / self.rel_folder).mkdir(parents=True, exist_ok=True)

    def _name(self) -> str:
        return f"{self.rel_folder}/{shard_file(self.split, len(self.done))}"

    def _open(self) -> None:
        final = self.root / self._name()
        self._tmp = final.with_name(f".{final.name}.tmp")
        self._fh = open(self._tmp, "wb")
        self._hf = _HashingFile(self._fh, self._hasher)
        self._open_shard = True
        self._samples = 0
        self._members = []

    def _finish(self) -> None:
        assert self._open_shard and self._hf is not None and self._tmp is not None
        end = self._hf.size + 2 * _BLOCK  # two zero blocks end the archive, padded to whole records (as tarfile)
        self._hf.write(b"\0" * (end + (-end % tarfile.RECORDSIZE) - self._hf.size))
        self._fh.flush()
        os.fsync(self._fh.fileno())
        drop_cached(self._fh.fileno())
        self._fh.close()
        name = self._name()
        os.replace(self._tmp, self.root / name)
        fsync_dir(self.root / self.rel_folder)  # the rename too survives a power loss: the journal will list it
        self.done.append(ShardInfo(name, self.split, self._hf.sha.hexdigest(), self._hf.size, self._samples,
                                   self._members))
        self._open_shard = False
        self._fh = self._hf = self._tmp = None

    def add(self, index: int, fields: np.ndarray, mask: np.ndarray, meta: dict[str, Any]) -> None:
        """Append one trajectory as {key}.fields.npy, {key}.mask.npy, {key}.meta.json (sorted member names)."""
        key = sample_key(index)
        fields = np.ascontiguousarray(fields, dtype=np.float32)
        mask = np.ascontiguousarray(mask, dtype=np.uint8)
        members = [
            (f"{key}.fields.npy", npy_header(fields), fields),
            (f"{key}.mask.npy", npy_header(mask), mask),
            (f"{key}.meta.json", json.dumps(meta, sort_keys=True, separators=(",", ":")).encode("utf-8"), None),
        ]
        sizes = [len(head) + (0 if data is None else data.nbytes) for _, head, data in members]
        size = sum(_member_bytes(n) for n in sizes)
        if self._open_shard and self._samples and self._hf.size + size + 2 * _BLOCK > self.target:
            self._finish()
        if not self._open_shard:
            self._open()
        placed = {}
        for (name, head, data), n in zip(members, sizes):
            placed[name.split(".", 1)[1]] = Member(name, key, name.split(".", 1)[1], self._hf.size + _BLOCK, n)
            self._hf.write(_tar_header(name, n))
            self._hf.write(head)
            if data is not None:
                self._hf.write(memoryview(data).cast("B"))
            self._hf.write(_padding(n))
        self._members.append(SampleIndex(key, placed))
        self._samples += 1

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs: the completed shards (the open one is dropped by a crash and rewritten)."""
        return {"done": [s.to_dict() for s in self.done]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the shards a crashed run completed: numbering goes on after them."""
        if self._open_shard:
            raise RuntimeError("load_state_dict on a writer with an open shard")
        self.done = [ShardInfo(**s) for s in state.get("done", [])]

    def close(self) -> list[ShardInfo]:
        """Finish the open shard; returns every shard written, in order."""
        if self._open_shard:
            self._finish()
        self._hasher.shutdown(wait=True)
        return self.done

    def abort(self) -> None:
        """Drop the shard being written (its temporary file), leaving finished shards alone."""
        self._hasher.shutdown(wait=True)
        if self._open_shard:
            try:
                self._fh.close()
            finally:
                if self._tmp is not None and self._tmp.exists():
                    self._tmp.unlink()
            self._open_shard = False
            self._fh = self._hf = self._tmp = None


def write_shard_index(root: str | Path, dataset: str, shards: Sequence[ShardInfo]) -> dict[str, Any] | None:
    """Write the dataset's member index (dpot_format.shard_index) beside its shards, atomically, and return the
    manifest's `shard_index` entry (path, sha256, bytes); None when there are no shards. A shard written by an
    earlier run of a resumed ingest is indexed from its local tar headers (the writer of this run did not see it)."""
    if not shards:
        return None
    folder = posixpath.dirname(shards[0].path)
    rows = []
    for s in shards:
        if posixpath.dirname(s.path) != folder:
            raise ValueError(f"{s.path}: the shards of one dataset share one folder ({folder})")
        members = shard_samples(Path(root) / s.path, s.members, where=s.path)
        rows.append((posixpath.basename(s.path), s.sha256, members))
    data = index_bytes(index_document(dataset, rows))
    rel = f"{folder}/{INDEX_NAME}" if folder else INDEX_NAME
    atomic_write(Path(root) / rel, data)
    return {"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
