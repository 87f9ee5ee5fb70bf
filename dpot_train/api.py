"""`open_dataset`: the windows `dpot-train launch` trains on, as a torch IterableDataset for a training loop of one's
own (plain PyTorch, Lightning), split over DDP ranks and DataLoader workers. See docs/api.md.

Built on the training stream itself (dpot_train.data.prepare.prepare_stream, dpot_train.data.stream.make_sample):
the same checks, shard cache, mixture, window draws and normalisation; no noise (launch adds it on the device).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import IterableDataset, get_worker_info

from dpot_train.core.config import MAX_RES, DataConfig, res_value
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.readers import TrajectoryReader
from dpot_train.data.stream import EpochPlans, StreamSpec, make_sample, rank_slice
from dpot_train.data.windows import resize_window, run_grid, takes_fluid_rule
from dpot_train.core.normalize import Stats, denormalize, describe

__all__ = ["NormalizationNote", "WindowDataset", "open_dataset"]


class NormalizationNote(UserWarning):
    """What `open_dataset` normalises and with which statistics: one line (`dpot-train launch` prints the same),
    so that a loop of one's own knows its units; `WindowDataset.denormalize` undoes it."""


def _ddp_rank_world() -> tuple[int, int]:
    """(rank, world size) of the initialised torch.distributed process group; (0, 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class WindowDataset(IterableDataset):
    """Windows of one split as dicts of tensors: x (H, W[, D], t_in, C), y (H, W[, D], t_out, C), mask (H, W[, D])
    bool (True: fluid), channel_valid (C,) bool, dataset (index into `names`), id, position, t0.

    shuffle=True: one epoch of launch's stream (stream positions [epoch * M, (epoch + 1) * M), M = `len(self)` on
    one rank), each position's window drawn as launch draws it for the same seed. shuffle=False: every window of
    every trajectory, datasets and trajectories in stored order, first frames 0, 1, ... in order.

    Ranks and workers: the items are cut in steps of `global_batch`; rank r of W takes the r-th of W equal slices of
    each step (launch's rule), and DataLoader worker w of K the steps s with s % K == w. So ranks and workers see
    disjoint windows that together are the whole pass.
    """

    def __init__(self, spec: StreamSpec, reader: TrajectoryReader, shuffle: bool, res: Any, epoch: int,
                 global_batch: int | None, rank: int | None, world_size: int | None) -> None:
        super().__init__()
        if (rank is None) != (world_size is None):
            raise ValueError("open_dataset: give rank and world_size together (or neither: torch.distributed's)")
        if world_size is not None and rank is not None and not 0 <= rank < world_size:
            raise ValueError(f"open_dataset: rank must be in [0, {world_size}), got {rank}")
        if global_batch is not None and global_batch < 1:
            raise ValueError(f"open_dataset: global_batch must be 1 or more, got {global_batch}")
        if epoch < 0:
            raise ValueError(f"open_dataset: epoch must be 0 or more, got {epoch}")
        self.spec, self.reader, self.shuffle, self.res, self.epoch = spec, reader, shuffle, res, epoch
        self.global_batch, self.rank, self.world_size = global_batch, rank, world_size
        length = spec.t_in + spec.t_out
        self._windows = [d.frames - length + 1 for d in spec.datasets]  # per dataset, windows of one trajectory
        self._counts = [len(r) * w for r, w in zip(spec.refs, self._windows)]  # shuffle=False: items per dataset
        self._grids = [run_grid(d.shape, d.model_layout, res, d.dims) if res else None for d in spec.datasets]

    @property
    def names(self) -> list[str]:
        """Dataset names, in the order of the items' `dataset` index."""
        return [d.name for d in self.spec.datasets]

    @property
    def norm_stats(self) -> dict[str, Stats | None]:
        """Per dataset name, the per-channel statistics its windows are normalised with ({"mean": [C], "std": [C]}),
        None for a dataset handed as stored: what `denormalize` undoes."""
        return {d.name: self.spec.norm.get(d.name) for d in self.spec.datasets}

    def denormalize(self, x: torch.Tensor, dataset: int | str | torch.Tensor) -> torch.Tensor:
        """`x` (..., C), normalised as this dataset's windows are (an item's `x` or `y`, or a model's prediction),
        back in physical units: `x * std + mean` per channel, float32. `dataset`: the item's `dataset` index or the
        dataset's name, or a batch's `dataset` tensor (B,) for a batch `x` (B, ..., C)."""
        if isinstance(dataset, torch.Tensor) and dataset.ndim == 1:
            tables = [_affine(self.norm_stats[self.names[int(k)]], x.shape[-1]) for k in dataset.tolist()]
            mean, std = (torch.stack([t[i] for t in tables]).to(x.device) for i in (0, 1))
            shape = (len(tables),) + (1,) * (x.ndim - 2) + (x.shape[-1],)
            return x.float() * std.reshape(shape) + mean.reshape(shape)
        name = dataset if isinstance(dataset, str) else self.names[int(dataset)]
        if name not in self.norm_stats:
            raise ValueError(f"denormalize: no dataset {name!r}; expected one of {self.names}")
        return denormalize(x, self.norm_stats[name])

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch `epoch` of the stream next (shuffle=True; as DistributedSampler.set_epoch)."""
        if epoch < 0:
            raise ValueError(f"open_dataset: epoch must be 0 or more, got {epoch}")
        self.epoch = epoch

    def total(self) -> int:
        """Items of one pass over all ranks: the epoch length M (shuffle=True) or the split's windows."""
        return self.spec.epoch_length if self.shuffle else sum(self._counts)

    def _split(self) -> tuple[int, int, int]:
        """(rank, world size, global batch) this iteration uses."""
        rank, world = (self.rank, self.world_size) if self.rank is not None else _ddp_rank_world()
        assert world is not None
        batch = world if self.global_batch is None else self.global_batch
        if batch % world:
            raise ValueError(f"open_dataset: global_batch {batch} is not divisible by the {world} processes")
        return rank, world, batch

    def __len__(self) -> int:
        """Items this rank gets in one pass (all its workers together)."""
        rank, world, batch = self._split()
        per = batch // world
        full, tail = divmod(self.total(), batch)
        return full * per + min(per, max(0, tail - rank * per))

    def indices(self, worker: int = 0, workers: int = 1) -> Iterator[int]:
        """Item indices (0 .. total() - 1) of this rank's worker `worker` of `workers`, in order."""
        rank, world, batch = self._split()
        n = self.total()
        for first in range(worker * batch, n, workers * batch):
            yield from (i for i in rank_slice(first, batch, world, rank) if i < n)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.shuffle:
            plans, base = EpochPlans(self.spec), self.epoch * self.spec.epoch_length
            for i in self.indices(worker, workers):
                k, ref, _ = plans.lookup(base + i)
                yield self._item(make_sample(self.spec, self.reader, k, ref, base + i))
        else:
            for i in self.indices(worker, workers):
                k, j, t0 = self._ordered(i)
                yield self._item(make_sample(self.spec, self.reader, k, self.spec.refs[k][j], i, t0=t0))

    def _ordered(self, i: int) -> tuple[int, int, int]:
        """shuffle=False: (dataset, trajectory, first frame) of item i."""
        for k, count in enumerate(self._counts):
            if i < count:
                j, t0 = divmod(i, self._windows[k])
                return k, j, t0
            i -= count
        raise IndexError(i)

    def _item(self, sample: dict[str, Any]) -> dict[str, Any]:
        """make_sample's window as contiguous tensors, resized to `res` as the trainer resizes a batch."""
        x, y = torch.from_numpy(sample["x"].copy()), torch.from_numpy(sample["y"].copy())
        mask = torch.from_numpy(sample["mask"].copy())
        grid = self._grids[sample["dataset"]]
        if grid is not None:
            rule = takes_fluid_rule(self.spec.datasets[sample["dataset"]])
            x = resize_window(x[None], mask[None], grid, rule)[0][0]
            y, mask = (a[0] for a in resize_window(y[None], mask[None], grid, rule))
        return {"x": x, "y": y, "mask": mask, "channel_valid": torch.from_numpy(sample["channel_valid"]),
                "dataset": sample["dataset"], "id": sample["id"], "position": sample["position"],
                "t0": sample["t0"]}


def open_dataset(manifest_or_url: str | Path | list[str | Path], split: str = "train", t_in: int = 10,
                 t_out: int = 1, shuffle: bool = True, seed: int = 0, res: Any = 0, *,
                 mixture: str | dict[str, float] | None = None, normalize: str = "auto",
                 norm_stats: dict | None = None, backend: str = "webdataset", cache_dir: str | None = None,
                 cache_limit: str | None = None, verify_checksums: bool = True, epoch: int = 0,
                 global_batch: int | None = None, rank: int | None = None,
                 world_size: int | None = None) -> WindowDataset:
    """The windows of `split` that `dpot-train launch` trains on, as a torch IterableDataset (WindowDataset).

    `manifest_or_url`: an output folder, a manifest, or a list of them; an object-storage url reads through the
    shard cache (`cache_dir`, `cache_limit`: launch's data.cache_dir, data.cache_limit). The data is checked as
    launch checks it (shard sizes, sha256 when `verify_checksums`). `mixture`, `normalize`, `norm_stats`, `res`:
    launch's data.mixture, data.normalize, data.norm_stats, data.res (`res`: 0, N per axis, or one side per axis in
    the manifest's axis order: "48,64" or (48, 64), D,H,W for 3D). `seed`: launch's --seed (shuffle=True).
    `epoch`: the stream epoch a pass covers (`set_epoch`). `global_batch`: launch's --batch-size, so that each rank's
    share of each step is launch's (default: the world size). `rank`, `world_size`: this process's place among
    the ranks (default: torch.distributed's when initialised, else 0 of 1).
    """
    from dpot_train.core.config import check_arguments  # each argument as launch checks its option: one line

    whole, count = (0, float("inf"), "a whole number >= 0"), (1, float("inf"), "a whole number of 1 or more")
    check_arguments([("split", split, str, None), ("t_in", t_in, int, "data.t_in"), ("t_out", t_out, int, "data.t_out"),
                     ("shuffle", shuffle, bool, None), ("seed", seed, int, whole),
                     *([] if isinstance(res, (str, list, tuple)) else [("res", res, int, "data.res")]),
                     ("verify_checksums", verify_checksums, bool, None), ("epoch", epoch, int, whole),
                     ("global_batch", global_batch, int | None, count), ("rank", rank, int | None, whole),
                     ("world_size", world_size, int | None, count)])
    res = _res_argument(res)
    manifests = [str(m) for m in manifest_or_url] if isinstance(manifest_or_url, list) else [str(manifest_or_url)]
    cfg = DataConfig(manifests=manifests, mixture=mixture, split=split, backend=backend, t_in=t_in, t_out=t_out,
                     res=res, verify_checksums=verify_checksums, cache_dir=cache_dir, cache_limit=cache_limit,
                     normalize=normalize, norm_stats=norm_stats)
    spec, reader = prepare_stream(cfg, seed)
    warnings.warn(describe(normalize, spec.datasets, spec.norm, norm_stats), NormalizationNote, stacklevel=2)
    return WindowDataset(spec, reader, shuffle, res, epoch, global_batch, rank, world_size)


def _res_argument(res: Any) -> int | list[int]:
    """`res` as data.res holds it: a whole number as it is (checked by `check_arguments`), sides per axis ("48,64",
    (48, 64), D,H,W for 3D) as a list; ValueError in check_arguments' one-line form otherwise."""
    if not isinstance(res, (str, list, tuple)):
        return int(res)
    try:
        return res_value(res, "res")
    except ValueError:
        raise ValueError(f"res: expected a grid side from 1 to {MAX_RES} (0: the stored grid) or one side per axis, "
                         f"\"H,W\" or (H, W) (D,H,W for 3D), each from 1 to {MAX_RES}, got {res!r}") from None


def _affine(stats: Stats | None, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) float32 tensors (C,) of `stats`; (0, 1) for a dataset handed as stored."""
    if stats is None:
        return torch.zeros(channels), torch.ones(channels)
    return (torch.tensor(stats["mean"], dtype=torch.float32), torch.tensor(stats["std"], dtype=torch.float32))
