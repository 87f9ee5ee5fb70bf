"""Read back an ingest output folder (manifest + Zarr store + WebDataset shards, see docs/format.md), local or URL.

Used by `stats` and `inspect --plot`: they need trajectories one at a time, never a whole array. The manifest and
shards are read through dpot_format (its checks apply), and the Zarr store is opened only after the validator's cheap
check of it (links, non-regular files, array shapes against the manifest); checking an output fully is
dpot_format.validate's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from dpot_format.errors import FormatError
from dpot_format.io import zarr_store
from dpot_format.manifest import read_manifest
from dpot_format.names import sample_key
from dpot_format.paths import resolve_member
from dpot_format.tar import Sample, iter_samples
from dpot_format.validate import validate_output

__all__ = ["DatasetView", "Sample", "datasets", "recompute_stats"]


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

        resolve_member(self.root, f"{z['path']}/{z['group']}")
        store = zarr_store(resolve_member(self.root, z["path"]), read_only=True)
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
            raise FormatError(f"{self.name}: no trajectory with index {index} in the shards")
        n = group["fields"].shape[0]
        if not 0 <= index < n:
            raise FormatError(f"{self.name}: trajectory index {index} out of range (0..{n - 1})")
        meta = {"index": index, "dataset": self.name, "split": split, "id": sample_id}
        return Sample(sample_key(index), np.asarray(group["fields"][index]), np.asarray(group["mask"][index]), meta)

    def iter_shards(self) -> Iterator[Sample]:
        """Every sample of every shard listed in the manifest, shard by shard (streamed, nothing whole)."""
        for shard in self.entry.get("shards", []):
            yield from iter_samples(resolve_member(self.root, shard["path"]), where=shard["path"])


def _as_str(values: Any) -> np.ndarray:
    """A numpy str array from whatever string dtype Zarr returns (StringDType, object or fixed width)."""
    return np.array([str(v) for v in np.asarray(values).ravel().tolist()], dtype=str)


def datasets(root: str, manifest: dict | None = None) -> list[DatasetView]:
    """One view per dataset of the output at `root`, once the validator's cheap check of its Zarr store has passed
    (so that no read follows a link out of the folder, opens a FIFO, or trusts a shape the manifest does not imply);
    FormatError naming the first problem otherwise."""
    doc = manifest if manifest is not None else read_manifest(root)
    problems = [p for p in validate_output(root, rehash=False, parts=("zarr",), scan=False) if p.fatal]
    if problems:
        more = f" (and {len(problems) - 1} more; `dpot-data verify` lists them)" if len(problems) > 1 else ""
        raise FormatError(f"{root.rstrip('/')}/{problems[0]}{more}")
    return [DatasetView(root, entry) for entry in doc["datasets"]]


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


def check_stats(folder: str, workers: int | None = None, scheduler: str | None = None
                ) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """`dpot-data stats`: the statistics recomputed from the stored trajectories and, per dataset, how the
    manifest's differ from them. FormatError / InputError for an output that cannot be read."""
    from dpot_data.ingest.scheduler import SchedulerOptions, scheduler_context
    from dpot_data.paths import absolute_path
    from dpot_data.stats import compare

    folder = absolute_path(folder)
    manifest = read_manifest(folder)
    with scheduler_context(SchedulerOptions(workers=workers, address=scheduler)) as runner:
        recomputed = recompute_stats(folder, runner)
    problems = {}
    for entry in manifest["datasets"]:
        stored = entry.get("stats")
        problems[entry["name"]] = (["the manifest holds no statistics"] if stored is None
                                   else compare(stored, recomputed[entry["name"]]))
    return recomputed, problems
