"""Read back an ingest output folder (manifest + Zarr store + WebDataset shards, see docs/format.md), local or URL.

Used by `stats`, `inspect --plot` and `inspect --verify`: they need trajectories one at a time, never a whole array.
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from dpot_data import fs

MANIFEST = "manifest.json"


class OutputError(Exception):
    """The output folder is missing a file or holds something the format does not allow; str() names it."""


def load_manifest(root: str) -> dict:
    """Parse `<root>/manifest.json`; OutputError when it is missing or not a manifest."""
    path = fs.join(root, MANIFEST)
    if not fs.exists(path):
        raise OutputError(f"{path}: no manifest (not an ingest output folder, or the ingest has not finished)")
    try:
        doc = fs.read_json(path)
    except json.JSONDecodeError as exc:
        raise OutputError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("datasets"), list):
        raise OutputError(f"{path}: expected a manifest object with a 'datasets' list")
    return doc


@dataclass
class Sample:
    """One trajectory: fields (time, channel, *space) float32, mask (*space) uint8, and its meta."""

    fields: np.ndarray
    mask: np.ndarray
    meta: dict[str, Any]


@dataclass
class DatasetView:
    """One dataset entry of a manifest, with lazy access to its Zarr group and shards."""

    root: str
    entry: dict

    @property
    def name(self) -> str:
        return str(self.entry["name"])

    @property
    def channel_valid(self) -> np.ndarray:
        return np.asarray(self.entry["channel_valid"], dtype=bool)

    def zarr_group(self) -> Any | None:
        """The dataset's Zarr group (read-only), or None when the manifest lists no Zarr store."""
        z = self.entry.get("zarr")
        if not z:
            return None
        import zarr

        store = fs.zarr_store(fs.join(self.root, z["path"]), read_only=True)
        return zarr.open_group(store, mode="r", path=z["group"])

    def split_labels(self) -> np.ndarray:
        """The split of every trajectory, in index order (from Zarr, else from the shards' split)."""
        group = self.zarr_group()
        if group is not None and "split" in group:
            return _as_str(group["split"][:])
        labels: dict[int, str] = {}
        for sample in self.iter_shards():
            labels[int(sample.meta["index"])] = str(sample.meta["split"])
        return np.array([labels[i] for i in sorted(labels)], dtype=str)

    def iter_split(self, split: str | None) -> Iterator[Sample]:
        """Trajectories of one split (None: all), one at a time, in index order."""
        group = self.zarr_group()
        if group is None:
            for sample in self.iter_shards():
                if split is None or sample.meta.get("split") == split:
                    yield sample
            return
        labels = self.split_labels()
        ids = _as_str(group["sample"][:]) if "sample" in group else None
        for i in np.flatnonzero(labels == split) if split is not None else range(len(labels)):
            yield self.trajectory(int(i), group=group, split=str(labels[i]), sample_id=None if ids is None else ids[i])

    def trajectory(self, index: int, group: Any | None = None, split: str | None = None,
                   sample_id: str | None = None) -> Sample:
        """Trajectory `index` from the Zarr store (one chunk read), else from the shards."""
        group = group if group is not None else self.zarr_group()
        if group is None:
            for sample in self.iter_shards():
                if int(sample.meta["index"]) == index:
                    return sample
            raise OutputError(f"{self.name}: no trajectory with index {index} in the shards")
        n = group["fields"].shape[0]
        if not 0 <= index < n:
            raise OutputError(f"{self.name}: trajectory index {index} out of range (0..{n - 1})")
        meta = {"index": index, "dataset": self.name, "split": split, "id": sample_id}
        return Sample(np.asarray(group["fields"][index]), np.asarray(group["mask"][index]), meta)

    def iter_shards(self) -> Iterator[Sample]:
        """Every sample of every shard listed in the manifest, shard by shard (streamed, nothing whole)."""
        for shard in self.entry.get("shards", []):
            yield from iter_tar(fs.join(self.root, shard["path"]))


def _as_str(values: Any) -> np.ndarray:
    """A numpy str array from whatever string dtype Zarr returns (StringDType, object or fixed width)."""
    return np.array([str(v) for v in np.asarray(values).ravel().tolist()], dtype=str)


def datasets(root: str, manifest: dict | None = None) -> list[DatasetView]:
    """One view per dataset of the output at `root`."""
    doc = manifest if manifest is not None else load_manifest(root)
    return [DatasetView(root, entry) for entry in doc["datasets"]]


def iter_tar(path: str) -> Iterator[Sample]:
    """Samples of one WebDataset shard, streamed; members are grouped by key and never extracted to disk."""
    import fsspec

    current: str | None = None
    parts: dict[str, bytes] = {}
    with fsspec.open(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.partition(".")
            if "/" in key or member.name.startswith(("/", "..")):
                raise OutputError(f"{path}: unexpected member name {member.name!r}")
            if current is not None and key != current:
                yield _sample(path, current, parts)
                parts = {}
            current = key
            handle = tar.extractfile(member)
            parts[ext] = handle.read() if handle is not None else b""
        if current is not None:
            yield _sample(path, current, parts)


def _sample(path: str, key: str, parts: dict[str, bytes]) -> Sample:
    """Decode the three members of one shard sample."""
    missing = {"fields.npy", "mask.npy", "meta.json"} - set(parts)
    if missing:
        raise OutputError(f"{path}: sample {key} lacks {sorted(missing)}")
    fields = np.load(io.BytesIO(parts["fields.npy"]), allow_pickle=False)
    mask = np.load(io.BytesIO(parts["mask.npy"]), allow_pickle=False)
    return Sample(fields, mask, json.loads(parts["meta.json"]))


def recompute_stats(root: str, runner: Any | None = None, block: int = 8) -> dict[str, dict]:
    """Normalisation statistics of every dataset of an output, recomputed from the stored train trajectories.

    Trajectories are read one Zarr chunk at a time; blocks of `block` trajectories run as tasks on `runner`
    (a `scheduler.Runner`; None: in this thread) and merge with Chan's update, so the result does not depend on it.
    """
    from dpot_data.stats import FieldStats, merge_all, to_manifest, trajectory_stats

    out: dict[str, dict] = {}
    for view in datasets(root):
        valid = view.channel_valid
        n_valid = int(valid.sum())
        group = view.zarr_group()
        if group is None:
            parts = [trajectory_stats(s.fields, s.mask, valid) for s in view.iter_split("train")]
        else:
            train = np.flatnonzero(view.split_labels() == "train")
            blocks = [train[i : i + block] for i in range(0, len(train), block)]

            def one_block(indices: np.ndarray, view: DatasetView = view) -> FieldStats:
                g = view.zarr_group()
                acc = FieldStats.empty(n_valid)
                for i in indices:
                    acc = acc.merge(trajectory_stats(g["fields"][int(i)], g["mask"][int(i)], valid))
                return acc

            parts = list(runner.imap(one_block, blocks)) if runner is not None else [one_block(b) for b in blocks]
        out[view.name] = to_manifest(merge_all(parts, n_valid), view.entry["channels"], valid.tolist())
    return out
