"""Deterministic, resumable streaming of training windows, partitioned across ranks and DataLoader workers.

The rule (documented in docs/training.md and checked by tests/test_train_ddp.py):

* Epoch e is a list of M trajectory visits (see mixture.py for the visit count n_k of each dataset): dataset k's
  visits are ``n_k // |D_k|`` seeded permutations of its trajectories plus the first ``n_k % |D_k|`` of one more,
  and the whole list is shuffled with a generator seeded by (seed, epoch).
* The epochs are concatenated into one global stream; the loader state is the global position p (samples consumed),
  so epoch = p // M and the position inside it = p % M.
* Step s consumes positions [p, p + B) of the stream (B = global batch), and rank r of W takes the slice
  [p + r * B / W, p + (r + 1) * B / W). Loader worker w of K (a thread or a DataLoader process, see
  dpot_train.data.loader.make_loader)
  produces the steps s with s % K == w, and the batches are delivered in step order. Every visit
  of an epoch is thus consumed by exactly one rank: nothing is dropped or duplicated, and batches run across epoch
  boundaries instead of truncating them.
* The window start and the noise of the sample at position p come from generators seeded by (seed, p), so the data
  a step sees does not depend on the number of ranks or workers: a resume on another GPU count continues the
  same stream, given the same global batch. The noise is added on the training device (windows.inject_noise).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dpot_train.data.datasets import DataError, DatasetInfo
from dpot_train.data.readers import TrajectoryReader, TrajRef
from dpot_train.data.seeded import window_start_at
from dpot_train.data.windows import (as_model_order, mask_view, model_batch_view, model_view, split_window,
                                     stored_reversed_axes, window_start)
from dpot_train.core.normalize import Stats, normalize_array


def _name_seed(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


def epoch_plan(names: list[str], sizes: list[int], visits: list[int], seed: int, epoch: int) -> np.ndarray:
    """The visits of one epoch as an (M, 2) int64 array of (dataset index, trajectory position), shuffled."""
    parts = []
    for k, (name, n, v) in enumerate(zip(names, sizes, visits)):
        if v <= 0:
            continue
        if n <= 0:
            raise DataError(f"dataset {name!r} has no trajectories to visit")
        rng = np.random.default_rng([seed, epoch, _name_seed(name)])
        q, r = divmod(v, n)
        idx = [rng.permutation(n) for _ in range(q)]
        if r:
            idx.append(rng.permutation(n)[:r])
        pos = np.concatenate(idx)
        parts.append(np.stack([np.full_like(pos, k), pos], axis=1))
    plan = np.concatenate(parts).astype(np.int64)
    order = np.random.default_rng([seed, epoch, 0x5EED]).permutation(len(plan))
    return plan[order]


def rank_slice(position: int, global_batch: int, world: int, rank: int) -> range:
    """Global stream positions that `rank` consumes in the step that starts at `position`."""
    if global_batch % world:
        raise ValueError(f"global batch {global_batch} is not divisible by the {world} processes")
    b = global_batch // world
    return range(position + rank * b, position + (rank + 1) * b)


@dataclass
class StreamSpec:
    """What the stream needs to know about the data (all picklable, shared by every worker)."""

    datasets: list[DatasetInfo]
    refs: list[list[TrajRef]]  # per dataset, its trajectories of the split
    visits: list[int]  # per dataset, visits per epoch
    t_in: int
    t_out: int
    seed: int
    # per dataset name, the statistics its windows are normalised with (dpot_train.core.normalize; absent or None: as
    # read)
    norm: dict[str, Stats | None] = field(default_factory=dict)

    @property
    def epoch_length(self) -> int:
        """M: visits per epoch."""
        return int(sum(self.visits))


class EpochPlans:
    """Cache of the current epoch's plan; maps global positions to (dataset, TrajRef)."""

    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        self._epoch = -1
        self._length = spec.epoch_length
        self._plan: list[tuple[int, TrajRef]] = []  # the epoch's visits as (dataset index, trajectory ref)

    def lookup(self, position: int) -> tuple[int, TrajRef, int]:
        """(dataset index, trajectory ref, epoch) for a global stream position."""
        epoch, offset = divmod(position, self._length)
        if epoch != self._epoch:
            s = self.spec
            plan = epoch_plan([d.name for d in s.datasets], [len(r) for r in s.refs], s.visits, s.seed, epoch)
            self._plan = [(k, s.refs[k][j]) for k, j in plan.tolist()]
            self._epoch = epoch
        k, ref = self._plan[offset]
        return k, ref, epoch


def make_sample(spec: StreamSpec, reader: TrajectoryReader, k: int, ref: TrajRef, position: int,
                t0: int | None = None) -> dict[str, Any]:
    """Read the window of the sample at `position`: frames (T, C, *S) and frames_mask (*S), the stored window and
    mask with their space axes in the model's reverse order (windows.as_model_order: the stored ones, or for a 2D
    "yx" dataset the last two swapped), plus the model's (H, W[, D], T, C) views x and y and its (H, W[, D]) mask.

    No noise here: it is injected on the training device (windows.inject_noise), seeded by the same position.
    The dataset's normalisation (spec.norm) is applied here, the one place of the training data path.
    `t0`: the window's first frame (an ordered pass over every window); None: drawn from (seed, position).
    """
    ds = spec.datasets[k]
    length = spec.t_in + spec.t_out
    if t0 is None:
        t0 = window_start(np.random.default_rng([spec.seed, position, 0xD907]), ds.frames, length)
    fields, mask = reader.read(ref, t0, length)
    fields, mask = as_model_order(normalize_array(fields, spec.norm.get(ds.name), axis=1), mask, ds.model_layout)
    x, y = split_window(model_view(fields), spec.t_in)
    return {"frames": fields, "x": x, "y": y, "frames_mask": mask, "mask": mask_view(mask).astype(bool),
            "channel_valid": np.asarray(ds.channel_valid, bool), "dataset": k, "id": ref.id,
            "position": position, "t0": t0}


def collate(samples: list[dict[str, Any]], t_in: int) -> dict[str, Any]:
    """Batch: x (B, X, Y[, Z], T_in, C), y (B, X, Y[, Z], T_out, C), mask (B, X, Y[, Z]), channel_valid (B, C), ids.

    Windows and masks are stacked as make_sample orders them (a plain copy) and x, y, mask are permuted views
    (windows.model_batch_view: the model's order for the fields and the mask alike).
    """
    frames, mask = model_batch_view(torch.from_numpy(np.stack([s["frames"] for s in samples])),
                                    torch.from_numpy(np.stack([s["frames_mask"] for s in samples]).astype(bool)))
    return {
        "x": frames[..., :t_in, :],
        "y": frames[..., t_in:, :],
        "mask": mask,
        "channel_valid": torch.from_numpy(np.stack([s["channel_valid"] for s in samples])),
        "dataset": torch.tensor([s["dataset"] for s in samples], dtype=torch.int64),
        "position": torch.tensor([s["position"] for s in samples], dtype=torch.int64),
        "id": [s["id"] for s in samples],
    }


Alloc = Callable[[tuple[int, ...], type], "torch.Tensor | None"]  # (shape, numpy dtype) -> a tensor, or None


class BatchBuffers:
    """A batch's window and mask buffers, (B, T, C, *S) float32 and (B, *S) bool (page-locked tensors when `pin`),
    laid out as `collate`'s stacking copy lays them out, and their `as_model_order` views (what `collate` gives).

    `axes`: `as_model_order`'s permutation of the samples' stored windows (`windows.stored_reversed_axes`) when
    they all share one, and the buffers then keep the stored order, so that a window is read into its slot as it
    lies in the file; the identity otherwise (np.stack's layout for windows of mixed orders), each window copied.
    `alloc`: where the buffers are taken from (a slot of a process loader's shared ring,
    `dpot_train.data.process_ring`), `(shape, dtype) -> tensor` or None where it has no room; default numpy's heap.
    """

    def __init__(self, size: int, axes: tuple[int, ...] | None, pin: bool = False, alloc: Alloc | None = None
                 ) -> None:
        self.size, self.pin, self.alloc = size, pin, alloc
        self.axes = axes
        self.frames: torch.Tensor | None = None  # (B, T, C, *S), stored order
        self.model_frames: torch.Tensor | None = None  # its as_model_order view
        self.model_masks: torch.Tensor | None = None  # (B, *S) bool, as_model_order view of the stored-order masks
        self.frames_np: np.ndarray | None = None  # `frames` and the stored-order masks as numpy arrays (cheap slots)
        self.masks_np: np.ndarray | None = None
        self._stored: tuple[tuple[int, ...], str] | None = None  # (stored shape, model layout) of the direct slots

    def _new(self, shape: tuple[int, ...], dtype: type) -> torch.Tensor:
        if self.alloc is not None:
            got = self.alloc((self.size, *shape), dtype)
            if got is not None:
                return got
        if self.pin:
            return torch.empty((self.size, *shape), dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True)
        # numpy's allocation, as np.stack's: torch's own (aligned) one maps fresh pages for every batch
        return torch.from_numpy(np.empty((self.size, *shape), dtype))

    def _allocate(self, model_shape: tuple[int, ...]) -> None:
        """Buffers for windows of `model_shape` (as_model_order's), laid out in the stored order of `axes`."""
        if self.axes is None or len(self.axes) != len(model_shape):
            self.axes = tuple(range(len(model_shape)))
        axes, inverse = self.axes, tuple(int(a) for a in np.argsort(self.axes))
        self.frames = self._new(tuple(model_shape[a] for a in inverse), np.float32)
        self.model_frames = self.frames.permute(0, *(1 + a for a in axes))
        masks = self._new(tuple(model_shape[a] for a in inverse[2:]), np.bool_)  # the frames' space axes
        self.model_masks = masks.permute(0, *(a - 1 for a in axes[2:]))
        self.frames_np, self.masks_np = self.frames.numpy(), masks.numpy()

    def stored_window(self, i: int, shape: tuple[int, ...], model_layout: str, where: str) -> np.ndarray | None:
        """Slot i, in stored order, for a stored window of `shape` (T, C, *S) of a dataset with `model_layout`
        (the first sample allocates the buffers); None when the batch is laid out in another order (the window then
        goes through `model_window`). `where`: the sample, for a DataError when its shape is not the batch's."""
        if self._stored is not None and self._stored == (shape, model_layout):
            return self.frames_np[i]  # type: ignore[index]  # the shape and order of the batch's slots
        axes = stored_reversed_axes(2, len(shape) - 2, model_layout)
        model_shape = tuple(shape[a] for a in axes)
        if self.model_frames is None:
            self._allocate(model_shape)
        assert self.model_frames is not None and self.frames_np is not None
        _same_shape(self.model_frames, model_shape, "window", where)
        if axes != self.axes:
            return None
        self._stored = (tuple(shape), model_layout)
        return self.frames_np[i]

    def stored_mask(self, i: int, shape: tuple[int, ...]) -> np.ndarray | None:
        """Slot i of the masks in stored order, for a stored mask of `shape` after `stored_window` gave slot i of
        the windows; None when its shape is not the slot's (the caller then reports it through `model_mask`)."""
        assert self.masks_np is not None
        slot = self.masks_np[i]
        return slot if slot.shape == tuple(shape) else None

    def model_window(self, i: int, shape: tuple[int, ...], where: str) -> np.ndarray:
        """Slot i in `as_model_order` order, for a window of that (as_model_order) `shape`."""
        assert self.model_frames is not None
        _same_shape(self.model_frames, shape, "window", where)
        return self.model_frames[i].numpy()

    def model_mask(self, i: int, shape: tuple[int, ...], where: str) -> np.ndarray:
        """Slot i of the masks in `as_model_order` order, for a mask of that (as_model_order) `shape`."""
        assert self.model_masks is not None
        _same_shape(self.model_masks, shape, "mask", where)
        return self.model_masks[i].numpy()


def _same_shape(batch: torch.Tensor, shape: tuple[int, ...], what: str, where: str) -> None:
    """DataError (one line, naming the sample) when a sample's `shape` is not that of the batch's slots."""
    if tuple(batch.shape[1:]) != tuple(shape):
        raise DataError(f"{where} {what} of shape {tuple(shape)}; the batch's first is {tuple(batch.shape[1:])}: "
                        "the datasets of one run need one grid and channel count")


class _Slots:
    """The `into` and `mask_into` of one batch's `read_into` calls: sample i's slots of `buffers` (set `i`,
    `layout` and `ref` before each read). `direct` and `mask_direct` say whether the window and its mask went
    straight into their slots."""

    def __init__(self, buffers: BatchBuffers) -> None:
        self.buffers = buffers
        self.i, self.layout, self.ref, self.direct, self.mask_direct = 0, "", None, False, False

    def where(self) -> str:
        return f"{self.ref.url}: {self.ref.id}"  # type: ignore[union-attr]

    def window(self, shape: tuple[int, ...]) -> np.ndarray:
        buffers = self.buffers
        if buffers._stored is not None and buffers._stored == (shape, self.layout):  # the batch's shape and order
            self.direct = True
            return buffers.frames_np[self.i]  # type: ignore[index]
        slot = buffers.stored_window(self.i, shape, self.layout, self.where())
        self.direct = slot is not None
        return slot if slot is not None else np.empty(shape, np.float32)

    def mask(self, shape: tuple[int, ...]) -> np.ndarray:
        slot = self.buffers.stored_mask(self.i, shape) if self.direct else None
        self.mask_direct = slot is not None
        return slot if slot is not None else np.empty(shape, np.uint8)


def read_batch(spec: StreamSpec, reader: TrajectoryReader, picks: list[tuple[int, TrajRef, int]],
               pin: bool = False, alloc: Alloc | None = None) -> dict[str, Any]:
    """The batch of the samples at `picks` ((dataset index, trajectory ref, position) each): bit for bit
    `collate([make_sample(...) for each pick])`, built without per-sample arrays or a stacking copy.

    With a `read_into` reader each window goes from the shard file straight into its slot of the batch buffer
    (kept in stored order, as collate's stacking copy keeps it), its mask straight into the mask buffer, and it is
    normalised there in place. Otherwise (a reader without `read_into`, or a sample whose axis order differs from
    the batch's first) it is read as `make_sample` reads it and written into its slot in the same pass as its
    normalisation. `pin`: page-locked buffers (CUDA only), so that pinning the batch copies nothing. `alloc`: where
    the buffers come from (`BatchBuffers`).
    """
    length = spec.t_in + spec.t_out
    datasets = spec.datasets
    # per dataset of the batch: (frames, model layout, statistics), read once
    known = {k: (datasets[k].frames, datasets[k].model_layout, spec.norm.get(datasets[k].name))
             for k in {k for k, _, _ in picks}}
    orders = {stored_reversed_axes(2, len(datasets[k].shape), layout) for k, (_, layout, _) in known.items()}
    buffers = BatchBuffers(len(picks), orders.pop() if len(orders) == 1 else None, pin, alloc)
    read_into = getattr(reader, "read_into", None)
    slots = _Slots(buffers)
    for i, (k, ref, position) in enumerate(picks):
        frames, layout, stats = known[k]
        t0 = window_start_at(spec.seed, position, frames, length)
        slots.i, slots.layout, slots.ref, slots.direct, slots.mask_direct = i, layout, ref, False, False
        if read_into is not None:
            fields, mask = read_into(ref, t0, length, slots.window, slots.mask)
        else:
            fields, mask = reader.read(ref, t0, length)
            buffers.stored_window(i, fields.shape, layout, slots.where())  # the first lays the batch out
        if slots.mask_direct:  # the window and its mask in their slots, in stored order
            if stats is not None:  # elementwise per channel: the stored order gives the model order's bits
                normalize_array(fields, stats, axis=1, out=fields)
            continue
        fields, mask = as_model_order(fields, mask, layout)
        where = slots.where()
        slot = fields if slots.direct else buffers.model_window(i, fields.shape, where)  # direct: the slot's view
        if stats is not None:
            normalize_array(fields, stats, axis=1, out=slot)
        elif not slots.direct:
            np.copyto(slot, fields)
        np.copyto(buffers.model_mask(i, mask.shape, where), mask, casting="unsafe")  # uint8 -> bool: nonzero
    assert buffers.model_frames is not None and buffers.model_masks is not None
    frames, mask = model_batch_view(buffers.model_frames, buffers.model_masks)
    return {
        "x": frames[..., :spec.t_in, :],
        "y": frames[..., spec.t_in:, :],
        "mask": mask,
        "channel_valid": torch.from_numpy(np.array([datasets[k].channel_valid for k, _, _ in picks], bool)),
        "dataset": torch.tensor([k for k, _, _ in picks], dtype=torch.int64),
        "position": torch.tensor([p for _, _, p in picks], dtype=torch.int64),
        "id": [ref.id for _, ref, _ in picks],
    }


class WindowStream(IterableDataset):
    """Infinite stream of this rank's batches from global position `start`; yields one collated batch per step."""

    def __init__(self, spec: StreamSpec, reader: TrajectoryReader, start: int, global_batch: int,
                 world: int = 1, rank: int = 0, direct: bool = True) -> None:
        super().__init__()
        if global_batch % world:
            raise ValueError(f"global batch {global_batch} is not divisible by the {world} processes")
        self.spec, self.reader = spec, reader
        self.start, self.global_batch, self.world, self.rank = start, global_batch, world, rank
        self.direct = direct  # read_batch (False: collate of make_sample, the plain path, kept for comparison)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        wid, nworkers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.worker_batches(wid, nworkers)

    def worker_batches(self, worker: int, workers: int, pin: bool = False, alloc: Alloc | None = None
                       ) -> Iterator[dict[str, Any]]:
        """The batches of steps worker, worker + workers, ... (worker `worker` of `workers`, process or thread);
        `pin`: built in page-locked memory (CUDA only); `alloc`: where their buffers come from (`BatchBuffers`)."""
        plans = EpochPlans(self.spec)  # per worker: the plan cache is not shared between threads
        prefetch = getattr(self.reader, "prefetch", None)  # readers of remote shards fetch ahead of the stream
        ahead = EpochPlans(self.spec)
        step = worker
        while True:
            if prefetch is not None:
                prefetch(self.upcoming_urls(step, ahead))
            yield self.batch(step, plans, pin, alloc)
            step += workers

    def upcoming_urls(self, step: int, plans: EpochPlans, steps: int = 2) -> list[str]:
        """Shard urls this rank reads in steps step + 1 .. step + `steps`, in stream order (what to prefetch)."""
        urls: list[str] = []
        for s in range(step + 1, step + 1 + steps):
            first = self.start + s * self.global_batch
            urls += [plans.lookup(p)[1].url for p in rank_slice(first, self.global_batch, self.world, self.rank)]
        return list(dict.fromkeys(urls))

    def batch(self, step: int, plans: EpochPlans, pin: bool = False, alloc: Alloc | None = None) -> dict[str, Any]:
        """This rank's collated batch of step `step` (counted from `start`); `pin`: in page-locked memory;
        `alloc`: where its buffers come from (`BatchBuffers`; the plain path, direct=False, takes none)."""
        first = self.start + step * self.global_batch
        picks = [(k, ref, p) for p in rank_slice(first, self.global_batch, self.world, self.rank)
                 for k, ref, _ in [plans.lookup(p)]]
        if self.direct:
            return read_batch(self.spec, self.reader, picks, pin, alloc)
        return collate([make_sample(self.spec, self.reader, k, ref, p) for k, ref, p in picks], self.spec.t_in)
