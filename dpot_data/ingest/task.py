"""The work of one block of trajectories, run as a task on local threads or a dask.distributed worker: read, cut
into pieces, resample, pad, and the block's train statistics. Picklable, pure apart from reading the input."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dpot_data import stats as st
from dpot_data.errors import InputError
from dpot_data.ingest.plan import IngestPlan, Piece
from dpot_data.ingest.scheduler import compute_in_task
from dpot_data.transform import pad_channels, resample_mask, resample_trajectories
from dpot_data.writers.zarr_store import EncodedRows, encode_rows, write_rows
from dpot_format.resample import keeps_reference_resize


@dataclass
class BlockTask:
    """Everything a block task needs: the lazy input arrays and the plan's per-block facts."""

    fields: Any  # dask array (sample, time, channel, *space)
    mask: Any  # dask array (sample, *space)
    pieces: list[Piece]
    frames: int
    shape: tuple[int, ...]
    method: str
    mask_method: str
    channels: int
    fill: float
    stats: bool
    model_layout: str = "xy"
    codec: str | None = None  # encode the Zarr chunks in the task with this codec (dpot_data.writers.zarr_store)
    first_rows: dict[int, int] = field(default_factory=dict)  # a block's first source trajectory -> first stored row
    group_dir: str | None = None  # store the encoded chunks in this staged Zarr group folder from the task
    spill_dir: str | None = None  # hand fields and mask to the writer as a file in this folder (cluster workers)
    identity: Any = None  # the inputs as recorded when the job was resolved (InputIdentity): compared after each read
    reference_resize: bool = False  # keep the reference's plain resize for solid cells too (keeps_reference_resize)
    max_abs: float = math.inf  # the largest magnitude a stored value may have (--max-abs)
    names: tuple[str, ...] = ()  # channel names (the plan's), and the inputs by file name, for what a refusal says
    inputs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, p: IngestPlan, data: Any, fill: float, stats: bool, codec: str) -> "BlockTask":
        """The task of a plan over a reader's dataset (chunks encoded with `codec` when the plan writes Zarr)."""
        starts = [0, *p.rows_per_block()[:-1]]
        return cls(data["fields"].data, data["mask"].data, p.pieces, p.frames, p.grid.target, p.grid.method,
                   p.grid.mask_method, len(p.channels), float(fill), stats, p.model_layout,
                   codec if "zarr" in p.formats else None, {i0: row for (i0, _), row in zip(p.blocks, starts)},
                   reference_resize=keeps_reference_resize(p.entry.get("source"),
                                                           p.entry.get("convention", {}).get("name")))


@dataclass
class BlockResult:
    """A processed block: fields (b, frames, C, *grid) float32, mask (b, *grid) uint8, train stats, its pieces;
    `encoded` chunks for the writer, or `stored` True when the task wrote them into the store itself; `spilled`
    (file, fields shape, mask shape) when fields and mask wait in a file instead (`spill`, `unspill`)."""

    fields: np.ndarray | None
    mask: np.ndarray | None
    stats: Any
    pieces: list[Piece]
    encoded: EncodedRows | None = None
    stored: bool = False
    spilled: tuple[str, tuple[int, ...], tuple[int, ...]] | None = None


def spill(block: BlockResult, folder: str, name: str) -> BlockResult:
    """The block with its fields and mask written to `folder`/`name` (fields' bytes, then the mask's), so that a
    cluster worker hands the writer a file name on the filesystem both see, not the data over the network."""
    assert block.fields is not None and block.mask is not None
    path = os.path.join(folder, name)
    with open(path, "wb") as fh:
        fh.write(memoryview(block.fields).cast("B"))
        fh.write(memoryview(block.mask).cast("B"))
    return replace(block, fields=None, mask=None, spilled=(path, block.fields.shape, block.mask.shape))


def unspill(block: BlockResult) -> BlockResult:
    """A spilled block with fields and mask mapped from its file (read-only, no copy); the file is removed at once
    (the mapping keeps its pages until the arrays are dropped)."""
    if block.spilled is None:
        return block
    path, fshape, mshape = block.spilled
    fields = np.memmap(path, dtype="<f4", mode="r", shape=fshape)
    mask = np.memmap(path, dtype=np.uint8, mode="r", offset=fields.nbytes, shape=mshape)
    os.unlink(path)
    return replace(block, fields=fields, mask=mask, spilled=None)


def _cut(task: BlockTask, raw: np.ndarray, mask: np.ndarray, pieces: list[Piece], i0: int
         ) -> tuple[np.ndarray, np.ndarray]:
    """The pieces' frames and masks, stacked in stored order."""
    if not pieces:
        return np.empty((0, task.frames) + raw.shape[2:], np.float32), np.empty((0,) + mask.shape[1:], np.uint8)
    whole = [p.source - i0 for p in pieces] == list(range(len(raw))) and task.frames == raw.shape[1]
    if whole and all(p.start == 0 for p in pieces):  # every trajectory of the block, whole: nothing to cut
        return raw, mask
    f = np.stack([raw[p.source - i0, p.start:p.start + task.frames] for p in pieces])
    return f, np.stack([mask[p.source - i0] for p in pieces])


def check_magnitude(f: np.ndarray, pieces: list[Piece], task: BlockTask) -> None:
    """No value of the pieces' frames (as read, before resampling) beyond `task.max_abs` in magnitude (--max-abs),
    else InputError naming the file, the trajectory, the frame, the channel and the value: HDF5 chunks carry no
    checksum, so a damaged one decodes to values like 1e23 that would otherwise be stored. Two reductions over the
    block, no copy unless one is found."""
    bound = task.max_abs
    if not math.isfinite(bound) or not f.size or max(np.fmax.reduce(f, axis=None),
                                                     -np.fmin.reduce(f, axis=None)) <= bound:
        return
    k, t, c = (int(v[0]) for v in np.nonzero(np.abs(f) > bound)[:3])
    piece = pieces[k]
    frame = np.abs(f[k, t, c])
    value = float(f[k, t, c].flat[int(np.argmax(frame))])
    name = piece.id.partition("#")[0]
    channel = task.names[c] if c < len(task.names) else str(c)
    raise InputError(task.inputs.get(name.rsplit("/", 1)[-1], name),
                     f"trajectory {piece.id}, frame {piece.start + t}, {channel}: value {value:.6g}, beyond --max-abs "
                     f"{bound:g}; expected field values within it (a damaged chunk decodes to such values; give a "
                     "larger --max-abs if the data holds them)")


def _resample(task: BlockTask, f: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fields and mask on the target grid (trajectories with solid cells by the mask-aware rule unless the task
    keeps the reference's resize). Fields are interpolated on the grid as the model sees it (H, W), so that float32
    rounding matches the reference's."""
    if task.method == "none":
        return f, (m if task.mask_method == "none" else resample_mask(m, task.shape, task.mask_method))
    swap = task.model_layout == "xy" and len(task.shape) == 2 and task.method != "fourier"
    return resample_trajectories(f, m, task.shape, task.method, task.mask_method, swap=swap,
                                 fluid_rule=not task.reference_resize)


def process_block(task: BlockTask, rng: tuple[int, int]) -> BlockResult:
    """Read source trajectories rng[0]..rng[1]-1 and turn them into the stored pieces of the block."""
    i0, i1 = rng
    pieces = [p for p in task.pieces if i0 <= p.source < i1]
    try:
        raw = np.asarray(compute_in_task(task.fields[i0:i1]), dtype=np.float32)
        mask = np.asarray(compute_in_task(task.mask[i0:i1]), dtype=np.uint8)
    except Exception:
        if task.identity is not None:
            task.identity.check(local=False)  # a read that failed on a file replaced meanwhile: said as such
        raise
    if task.identity is not None:  # the reader reopened the inputs by name: still the files the job recorded?
        task.identity.check(local=False)
    f, m = _cut(task, raw, mask, pieces, i0)
    check_magnitude(f, pieces, task)
    f, m = _resample(task, f, m)
    f, valid = pad_channels(f, task.channels, task.fill, axis=2)
    block_stats = None
    if task.stats:
        train = np.array([p.split == "train" for p in pieces], dtype=bool)
        block_stats = st.block_stats(f, m, valid, include=train)
    f, m = np.ascontiguousarray(f, dtype=np.float32), np.ascontiguousarray(m, dtype=np.uint8)
    out = BlockResult(f, m, block_stats, pieces, encode_rows(f, m, task.codec) if task.codec else None)
    if out.encoded is not None and task.group_dir is not None:
        write_rows(task.group_dir, task.first_rows[i0], out.encoded, len(task.shape))
        out = replace(out, encoded=None, stored=True)
    return spill(out, task.spill_dir, f"block-{i0}") if task.spill_dir is not None else out
