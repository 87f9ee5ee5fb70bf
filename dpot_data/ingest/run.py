"""The run step of an ingest: blocks of trajectories processed as tasks (a bounded window in flight), written in
order into the staged Zarr store and WebDataset shards, each finished block recorded in the resume journal."""

from __future__ import annotations

import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dpot_data.ingest import journal as jn
from dpot_data.ingest.plan import IngestPlan, Piece
from dpot_data.ingest.task import BlockResult, BlockTask, process_block, unspill
from dpot_data.ingest.scheduler import Runner, SchedulerOptions, scheduler_context
from dpot_format.names import SPLITS
from dpot_data.stats import FieldStats
from dpot_data.writers.wds_shards import SplitShardWriter, write_shard_index
from dpot_data.writers.zarr_store import StagedDataLost, ZarrDatasetWriter, ZarrLayout
from dpot_format.names import SHARDS_FOLDER, ZARR_PATH


SPILL_FOLDER = ".spill.tmp"  # in staging: blocks that cluster workers hand over as files (a temporary name)


@dataclass
class Written:
    """What the run leaves in staging: shard list, Zarr array digests (None without a store), train statistics, and
    the shards' member index file (the manifest's `shard_index`; None without shards)."""

    shards: list[dict[str, Any]]
    arrays: dict[str, str] | None
    stats: FieldStats | None
    shard_index: dict[str, Any] | None = None


class _Writers:
    """The staged outputs of one dataset: an optional Zarr writer and one shard writer per split."""

    def __init__(self, p: IngestPlan, journal: jn.Journal, layout: ZarrLayout, shard_size: int) -> None:
        staging = journal.staging
        self.staging, self.name = staging, p.name
        self.zarr = ZarrDatasetWriter(staging / ZARR_PATH, layout) if "zarr" in p.formats else None
        self.shards: dict[str, SplitShardWriter] = {}
        if "wds" in p.formats:
            self.shards = {s: SplitShardWriter(staging, f"{SHARDS_FOLDER}/{p.name}", s, shard_size) for s in SPLITS}
        if journal.resumed:
            if self.zarr is not None:
                self.zarr.load_state_dict(journal.point.zarr_state())
            for split, writer in self.shards.items():
                writer.load_state_dict(journal.point.shard_state(split))
        elif self.zarr is not None:
            self.zarr.create()
        # one thread per writer: the Zarr store and the shards take each block at the same time (their hashing and
        # file writes release the GIL), each in block order
        self._threads = {k: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"dpot-write-{k}")
                         for k in ("zarr", "shards")}

    def write(self, p: IngestPlan, journal: jn.Journal, block: BlockResult, index: int) -> int:
        """Write one processed block in order into the store and the shards, concurrently, and wait for both;
        returns the index of the next stored trajectory."""
        block = unspill(block)
        jobs = []
        if self.zarr is not None:
            jobs.append(self._threads["zarr"].submit(self.zarr.write_block, block.fields, block.mask, block.encoded,
                                                     block.stored))
        adds = []
        for j, piece in enumerate(block.pieces):
            if self.shards and journal.needs(piece.split):
                adds.append((piece.split, index, j, _meta(p, piece, index)))
            index += 1
        if adds:
            jobs.append(self._threads["shards"].submit(self._add, block, adds))
        for job in jobs:
            job.result()
        return index

    def _add(self, block: BlockResult, adds: list[tuple[str, int, int, dict[str, Any]]]) -> None:
        for split, index, j, meta in adds:
            self.shards[split].add(index, block.fields[j], block.mask[j], meta)

    def _stop_threads(self) -> None:
        for pool in self._threads.values():
            pool.shutdown(wait=True, cancel_futures=True)

    def abort(self) -> None:
        """Drop the shards being written; completed ones stay in staging for a resume."""
        self._stop_threads()
        for w in self.shards.values():
            w.abort()

    def close(self) -> tuple[list[dict[str, Any]], dict[str, str] | None, dict[str, Any] | None]:
        """Finish every writer: (shard entries in manifest order, Zarr digests, the shard index's manifest entry)."""
        self._stop_threads()
        done = [s for split in SPLITS if split in self.shards for s in self.shards[split].close()]
        index = write_shard_index(self.staging, self.name, done)  # in staging: published with the shards
        return [s.to_dict() for s in done], self.zarr.close() if self.zarr is not None else None, index


def zarr_layout(p: IngestPlan, fill: float, attrs: dict[str, Any]) -> ZarrLayout:
    """The Zarr group of a plan."""
    return ZarrLayout(group=p.name, frames=p.frames, channels=p.channels, channel_valid=p.channel_valid,
                      fill_value=float(fill), coords=p.coords, time=p.time,
                      samples=np.array([x.id for x in p.pieces], dtype=str),
                      splits=np.array([x.split for x in p.pieces], dtype=str), sample_params=p.sample_params,
                      attrs=attrs, units=p.units)


def _meta(p: IngestPlan, piece: Piece, index: int) -> dict[str, Any]:
    """The meta.json of one stored trajectory."""
    return {"id": piece.id, "dataset": p.name, "split": piece.split, "index": index, "frames": p.frames,
            "channels": p.channels, "channel_valid": p.channel_valid.tolist(),
            "params": {k: _scalar(v[index]) for k, v in p.sample_params.items()}}


def _placed(task: BlockTask, p: IngestPlan, journal: jn.Journal, runner: Runner) -> BlockTask:
    """The task told to put its outputs where the writer finds them, so that they need not travel back: its Zarr
    chunks into the staged store, and on a cluster whose workers see the staging folder, fields and mask as a file
    there too (`spill`). Workers that do not see it send everything back, as local threads do with fields and mask."""
    group_dir = str((journal.staging / ZARR_PATH / p.name).resolve()) if task.codec else None
    spill_dir = None
    if runner.client is not None:
        folder = (journal.staging / SPILL_FOLDER).resolve()
        shutil.rmtree(folder, ignore_errors=True)  # blocks a killed run left behind
        folder.mkdir()
        if runner.sees(folder):
            spill_dir = str(folder)
        else:
            group_dir = None
    return replace(task, group_dir=group_dir, spill_dir=spill_dir)


def run(p: IngestPlan, task: BlockTask, journal: jn.Journal, layout: ZarrLayout, opts: Any) -> Written:
    """Process every block from the journal's resume point on and close the writers."""
    try:
        writers = _Writers(p, journal, layout, opts.shard_size)
    except StagedDataLost as exc:
        warnings.warn(f"{exc}; ingesting this dataset afresh", stacklevel=2)
        journal.restart()
        writers = _Writers(p, journal, layout, opts.shard_size)
    acc = journal.stats(p.native_channels) if opts.stats else None
    first, index = journal.point.block, journal.point.row
    try:
        with scheduler_context(SchedulerOptions(workers=opts.workers, address=opts.scheduler)) as runner, \
                _progress(len(p.pieces), opts.progress, p.name) as bar:
            bar.update(index)
            blocks = runner.imap(process_block, p.blocks[first:], shared=_placed(task, p, journal, runner))
            for block_no, block in enumerate(blocks, start=first):
                index = writers.write(p, journal, block, index)
                if acc is not None and block.stats is not None:
                    acc = acc.merge(block.stats)
                journal.record(block_no, index, acc, writers.shards,
                               writers.zarr.state_dict() if writers.zarr is not None else None)
                bar.update(len(block.pieces))
        shards, arrays, index = writers.close()
    except BaseException:
        writers.abort()
        raise
    return Written(shards, arrays, acc, index)


class _NoBar:
    def update(self, n: int) -> None:
        pass


class _progress:
    """A tqdm bar over stored trajectories when enabled (stderr), a no-op otherwise."""

    def __init__(self, total: int, enabled: bool, name: str) -> None:
        self.total, self.enabled, self.name, self.bar = total, enabled, name, None

    def __enter__(self) -> Any:
        if not self.enabled:
            return _NoBar()
        from tqdm.auto import tqdm

        self.bar = tqdm(total=self.total, unit="traj", desc=f"ingest {self.name}", dynamic_ncols=True)
        return self.bar

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value
