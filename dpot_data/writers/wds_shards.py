"""WebDataset tar shards of whole trajectories, written deterministically (fixed member metadata, sorted order) and
atomically (temporary name, fsync, rename), rolling to a new shard when the target size would be exceeded."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_SHARD_BYTES = 256 << 20
_BLOCK = tarfile.BLOCKSIZE


def sample_key(index: int) -> str:
    """WebDataset key of a trajectory: "s" + its index in the dataset, zero-padded to 7 digits (no dots)."""
    return f"s{index:07d}"


def npy_bytes(array: np.ndarray) -> bytes:
    """A plain .npy (format 1.0, C order, no pickle) of the array."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _member_bytes(size: int) -> int:
    return _BLOCK + (size + _BLOCK - 1) // _BLOCK * _BLOCK


class _HashingFile:
    """A write-only file wrapper that hashes and counts what passes through (tarfile writes sequentially)."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.sha, self.size = fh, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.fh.write(data)

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
        self._tar: tarfile.TarFile | None = None
        self._fh: Any = None
        self._hf: _HashingFile | None = None
        self._tmp: Path | None = None
        self._samples = 0
        (self.root / self.rel_folder).mkdir(parents=True, exist_ok=True)

    def _name(self) -> str:
        return f"{self.rel_folder}/{self.split}-{len(self.done):06d}.tar"

    def _open(self) -> None:
        final = self.root / self._name()
        self._tmp = final.with_name(f".{final.name}.tmp")
        self._fh = open(self._tmp, "wb")
        self._hf = _HashingFile(self._fh)
        self._tar = tarfile.open(fileobj=self._hf, mode="w", format=tarfile.USTAR_FORMAT)  # type: ignore[arg-type]
        self._samples = 0

    def _finish(self) -> None:
        assert self._tar is not None and self._hf is not None and self._tmp is not None
        self._tar.close()
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        name = self._name()
        os.replace(self._tmp, self.root / name)
        self.done.append(ShardInfo(name, self.split, self._hf.sha.hexdigest(), self._hf.size, self._samples))
        self._tar = self._fh = self._hf = self._tmp = None

    def add(self, index: int, fields: np.ndarray, mask: np.ndarray, meta: dict[str, Any]) -> None:
        """Append one trajectory as {key}.fields.npy, {key}.mask.npy, {key}.meta.json (sorted member names)."""
        key = sample_key(index)
        members = [
            (f"{key}.fields.npy", npy_bytes(np.asarray(fields, dtype=np.float32))),
            (f"{key}.mask.npy", npy_bytes(np.asarray(mask, dtype=np.uint8))),
            (f"{key}.meta.json", json.dumps(meta, sort_keys=True, separators=(",", ":")).encode("utf-8")),
        ]
        size = sum(_member_bytes(len(data)) for _, data in members)
        if self._tar is not None and self._samples and self._hf.size + size + 2 * _BLOCK > self.target:
            self._finish()
        if self._tar is None:
            self._open()
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            self._tar.addfile(info, io.BytesIO(data))
        self._samples += 1

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs: the completed shards (the open one is dropped by a crash and rewritten)."""
        return {"done": [s.to_dict() for s in self.done]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after the shards a crashed run completed: numbering goes on after them."""
        if self._tar is not None:
            raise RuntimeError("load_state_dict on a writer with an open shard")
        self.done = [ShardInfo(**s) for s in state.get("done", [])]

    def close(self) -> list[ShardInfo]:
        """Finish the open shard; returns every shard written, in order."""
        if self._tar is not None:
            self._finish()
        return self.done

    def abort(self) -> None:
        """Drop the shard being written (its temporary file), leaving finished shards alone."""
        if self._tar is not None:
            try:
                self._tar.close()
                self._fh.close()
            finally:
                if self._tmp is not None and self._tmp.exists():
                    self._tmp.unlink()
            self._tar = self._fh = self._hf = self._tmp = None
