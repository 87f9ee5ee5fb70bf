"""The resume journal of an ingest: what a re-run after a crash or SIGKILL may keep instead of redoing.

Ingest writes everything into a staging folder `OUT/.staging-<dataset>` and publishes it at the end (manifest last).
The journal (`journal.jsonl` in that folder, one fsynced JSON line per finished block of trajectories) records:

- a header with the fingerprint of the job (inputs by path/size/mtime, every option that changes the output, tool
  version): a re-run with anything different starts afresh;
- per block: the stored trajectories written so far, the shards completed during the block (path, size, sha256,
  samples), and the train statistics accumulated so far (float64 values, exact through JSON).

A re-run resumes at the first block holding a trajectory that is in no completed shard of its split: completed
shards stay as they are, the Zarr rows before that block are kept (and re-hashed), the statistics restart from the
journalled accumulator, and every later block is written again. Because shard roll-over depends only on the
trajectories in order, the resumed output is byte-identical to an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

import dpot_data
from dpot_data.stats import FieldStats, Moments
from dpot_format.errors import FormatError
from dpot_format.lock import FileLock, LockBusy, is_held
from dpot_format.names import ZARR_PATH, is_temporary
from dpot_format.output import check_folder

JOURNAL_NAME = "journal.jsonl"
LOCK_NAME = "lock"
STAGING_PREFIX = ".staging-"
FORMAT = 1


class JournalBusy(RuntimeError):
    """Another process holds the staging folder of the same dataset (two ingests into one OUT)."""


def fingerprint(parts: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of everything that determines the output."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def input_identity(paths: Sequence[str | os.PathLike[str]]) -> list[list[Any]]:
    """Inputs as [resolved path, size, mtime_ns]: a changed raw file makes a different job."""
    out = []
    for p in paths:
        st = os.stat(p)
        out.append([str(Path(p).resolve()), st.st_size, st.st_mtime_ns])
    return out


def job_fingerprint(inputs: Sequence[str | os.PathLike[str]], options: Mapping[str, Any],
                    blocks: Sequence[tuple[int, int]]) -> str:
    """Fingerprint of one ingest job: inputs, output-shaping options, block layout and tool version."""
    return fingerprint({"format": FORMAT, "tool": dpot_data.__version__, "inputs": input_identity(inputs),
                        "options": dict(options), "blocks": [list(b) for b in blocks]})


# ------------------------------------------------------------------------------------------------ (de)serialising

def moments_to_json(m: Moments) -> dict[str, list]:
    """Moments as JSON lists (Python floats round-trip float64 exactly)."""
    return {"count": m.count.tolist(), "mean": m.mean.tolist(), "m2": m.m2.tolist(),
            "min": m.min.tolist(), "max": m.max.tolist()}


def moments_from_json(d: Mapping[str, list]) -> Moments:
    """Inverse of moments_to_json."""
    return Moments(count=np.asarray(d["count"], dtype=np.int64), mean=np.asarray(d["mean"], dtype=np.float64),
                   m2=np.asarray(d["m2"], dtype=np.float64), min=np.asarray(d["min"], dtype=np.float64),
                   max=np.asarray(d["max"], dtype=np.float64))


def stats_to_json(s: FieldStats | None) -> dict | None:
    """FieldStats as JSON (None stays None)."""
    if s is None:
        return None
    return {"values": moments_to_json(s.values), "diffs": moments_to_json(s.diffs), "trajectories": s.trajectories}


def stats_from_json(d: Mapping[str, Any] | None) -> FieldStats | None:
    """Inverse of stats_to_json."""
    if d is None:
        return None
    return FieldStats(moments_from_json(d["values"]), moments_from_json(d["diffs"]), int(d["trajectories"]))


# ------------------------------------------------------------------------------------------------ resume state

@dataclass
class ResumePoint:
    """Where a job continues: first block to process, first stored row, kept shards and statistics."""

    block: int = 0
    row: int = 0
    shards: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # split -> completed shard dicts
    stats: dict | None = None
    zarr: dict[str, Any] | None = None  # the Zarr writer's state_dict at the resume point, when it was recorded

    def kept_samples(self, split: str) -> int:
        """Trajectories of `split` already in completed shards."""
        return sum(int(s["samples"]) for s in self.shards.get(split, []))

    def shard_state(self, split: str) -> dict[str, Any]:
        """The state a split's shard writer resumes from (`SplitShardWriter.load_state_dict`)."""
        return {"done": [dict(s) for s in self.shards.get(split, [])]}

    def zarr_state(self) -> dict[str, Any]:
        """The state the Zarr writer resumes from (`ZarrDatasetWriter.load_state_dict`)."""
        return dict(self.zarr) if self.zarr is not None and self.zarr.get("rows") == self.row else {"rows": self.row}


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The journal's complete JSON lines (a line cut short by a kill is dropped)."""
    if not path.is_file():
        return []
    out = []
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError:
                break
    return out


def resume_point(lines: Sequence[Mapping[str, Any]], row_splits: Sequence[str],
                 block_rows: Sequence[int], shards_written: bool = True) -> ResumePoint:
    """From journal block lines, the split of every stored row and the cumulative rows after each block.

    Without WebDataset shards (`shards_written` False, a Zarr-only ingest) every journalled block is complete, so the
    job resumes after the last of them.
    """
    shards: dict[str, dict[str, dict[str, Any]]] = {}  # split -> path -> shard, in completion order
    after: dict[int, Mapping[str, Any]] = {}
    for line in lines:
        if "block" not in line:
            continue
        after[int(line["block"])] = line
        for shard in line.get("shards", []):
            shards.setdefault(shard["split"], {})[shard["path"]] = dict(shard)
    if not after:
        return ResumePoint()
    kept = {s: list(v.values()) for s, v in shards.items()}
    # first row, per split, that no completed shard holds; the job resumes at the block of the earliest of them
    done = {s: sum(int(x["samples"]) for x in v) for s, v in kept.items()}
    seen: dict[str, int] = {}
    first_missing = len(row_splits)
    for row, split in enumerate(row_splits):
        seen[split] = seen.get(split, 0) + 1
        if seen[split] > done.get(split, 0):
            first_missing = row
            break
    block = 0
    if shards_written:
        while block < len(block_rows) and block_rows[block] <= first_missing:
            block += 1
    else:
        while block < len(block_rows) and block in after:
            block += 1
    if block == 0 or (block - 1) not in after:  # nothing to keep (or a journal with a gap): start afresh
        return ResumePoint()
    row = block_rows[block - 1] if block > 0 else 0
    stats = after[block - 1].get("stats") if block > 0 else None
    # completed shards holding rows past `row` are kept too: `Journal.needs` skips their trajectories
    return ResumePoint(block=block, row=row, shards=kept, stats=stats, zarr=after[block - 1].get("zarr"))


# ------------------------------------------------------------------------------------------------ the journal

class Journal:
    """Owns `OUT/.staging-<name>`: creates or resumes it, records finished blocks, holds an exclusive lock."""

    def __init__(self, staging: Path, point: ResumePoint, lock_fd: FileLock | None, header: Mapping[str, Any],
                 row_splits: Sequence[str]) -> None:
        """`header`: the first line of a fresh journal (for `restart`); `row_splits`: the split of each stored row."""
        self.staging = staging
        self.point = point
        self._lock_fd = lock_fd
        self._header = dict(header)
        self._row_splits = list(row_splits)
        self._reported: set[str] = {s["path"] for v in point.shards.values() for s in v}
        self._seen: dict[str, int] = {}
        self._kept = {split: point.kept_samples(split) for split in point.shards}

    @property
    def resumed(self) -> bool:
        """True when this run continues an interrupted one."""
        return self.point.block > 0

    @classmethod
    def open(cls, out: Path, name: str, job: str, row_splits: Sequence[str], block_rows: Sequence[int],
             zarr: bool = True, shards: bool = True) -> "Journal":
        """Resume the staging folder of `name` in `out` when its journal has the same job fingerprint and its kept
        files are intact, else start it afresh. Raises JournalBusy when another process is writing it."""
        out.mkdir(parents=True, exist_ok=True)
        staging = out / f"{STAGING_PREFIX}{name}"
        remove_stale_staging(out, keep=staging.name)  # leftovers of other jobs, never under a final name
        check_folder(staging, None, owned=False)  # the one output rule: never a link (FormatError, one line)
        if staging.is_dir() and not is_staging(staging) and any(staging.iterdir()):
            raise FormatError(str(staging), "exists and is not a staging folder of dpot-data ingest (no journal or "
                                            "lock in it); move it away: the ingest would empty it")
        staging.mkdir(exist_ok=True)
        header = {"job": job, "format": FORMAT, "dataset": name}
        lock_fd = _lock(staging)
        try:
            lines = read_lines(staging / JOURNAL_NAME)
            point = ResumePoint()
            if lines and lines[0].get("job") == job:
                point = resume_point(lines, row_splits, block_rows, shards)
                if point.block > 0 and not _staged_files_ok(staging, point, zarr):
                    point = ResumePoint()
                remove_temporaries(staging)  # a kill mid-write leaves partial chunk and shard files
            journal = cls(staging, point, lock_fd, header, row_splits)
            if point.block == 0:
                journal.restart()  # a fresh start keeps nothing: no shard, no row, no statistics
            else:
                journal.start_counts(row_splits)
        except BaseException:
            _unlock(lock_fd)
            raise
        return journal

    def restart(self) -> None:
        """Throw the staged part away and start the job afresh: for a new job, or when what is staged is not what
        the journal says (a writer's `load_state_dict` found its files short of their recorded digests)."""
        _empty_folder(self.staging, keep={LOCK_NAME})
        _append(self.staging / JOURNAL_NAME, self._header)
        self.point = ResumePoint()
        self._reported, self._kept = set(), {}
        self.start_counts(self._row_splits)

    def describe(self) -> str:
        """One line for the user about what a resumed run kept."""
        shards = sum(len(v) for v in self.point.shards.values())
        return (f"{self.staging.parent}: resumed an interrupted ingest at trajectory {self.point.row} "
                f"(block {self.point.block}); kept {shards} completed shard(s)")

    def stats(self, n_channels: int) -> FieldStats:
        """The train statistics accumulated before the resume point (empty when starting afresh)."""
        restored = stats_from_json(self.point.stats)
        return restored if restored is not None else FieldStats.empty(n_channels)

    def start_counts(self, row_splits: Sequence[str]) -> None:
        """Count, per split, the stored rows before the resume row (used by `needs`)."""
        self._seen = {}
        for split in row_splits[: self.point.row]:
            self._seen[split] = self._seen.get(split, 0) + 1

    def needs(self, split: str) -> bool:
        """Call once per stored trajectory from the resume row on, in order: False when a completed shard has it."""
        self._seen[split] = self._seen.get(split, 0) + 1
        return self._seen[split] > self._kept.get(split, 0)

    def record(self, block: int, rows: int, stats: FieldStats | None, writers: Mapping[str, Any],
               zarr: Mapping[str, Any] | None = None) -> None:
        """Journal a finished block: rows stored so far, shards completed since the last record, statistics, and
        the Zarr writer's state (`zarr`, its state_dict)."""
        new = []
        for split in sorted(writers):
            for info in writers[split].state_dict()["done"]:
                if info["path"] not in self._reported:
                    new.append(info)
                    self._reported.add(info["path"])
        line = {"block": int(block), "rows": int(rows), "shards": new, "stats": stats_to_json(stats)}
        if zarr is not None:
            line["zarr"] = dict(zarr)
        _append(self.staging / JOURNAL_NAME, line)

    def close(self) -> None:
        """Release the lock (the staging folder itself is removed by publishing, or kept for a resume)."""
        _unlock(self._lock_fd)
        self._lock_fd = None


def rows_per_block(sources: Sequence[int], blocks: Sequence[tuple[int, int]]) -> list[int]:
    """Cumulative stored rows after each block, from the source trajectory of every stored row (in order)."""
    out, total = [], 0
    src = np.asarray(sources, dtype=np.int64)
    for i0, i1 in blocks:
        total += int(np.count_nonzero((src >= i0) & (src < i1)))
        out.append(total)
    return out


# ------------------------------------------------------------------------------------------------ file helpers

def _staged_files_ok(staging: Path, point: ResumePoint, zarr: bool) -> bool:
    """Every kept shard is there with its recorded size, and the staged Zarr store is there when one is written."""
    for shards in point.shards.values():
        for s in shards:
            p = staging / s["path"]
            if not p.is_file() or p.stat().st_size != int(s["bytes"]):
                return False
    return not zarr or (staging / ZARR_PATH / "zarr.json").is_file()


def remove_temporaries(folder: Path) -> list[Path]:
    """Delete every temporary file below `folder` (never published, never kept); returns what was removed."""
    removed = []
    for parent, _dirs, files in os.walk(folder):
        for name in files:
            if is_temporary(name):
                path = Path(parent) / name
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def _empty_folder(folder: Path, keep: set[str]) -> None:
    for child in folder.iterdir():
        if child.name in keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _append(path: Path, record: Mapping[str, Any]) -> None:
    """Append one JSON line and fsync it (a kill leaves at most one partial line, which is ignored)."""
    data = (json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(staging: Path) -> FileLock:
    """Exclusive, non-blocking lock on the staging folder; JournalBusy when another ingest holds it."""
    lock = FileLock(staging / LOCK_NAME, busy=f"{staging}: another ingest of this dataset is running into the same "
                                              "folder")
    try:
        return lock.acquire()
    except LockBusy as exc:
        raise JournalBusy(str(exc)) from None


def is_staging(folder: Path) -> bool:
    """Whether `folder` is a staging folder this tool made: `.staging-<name>/` holding its lock or journal file."""
    return (folder.name.startswith(STAGING_PREFIX) and folder.is_dir() and not folder.is_symlink()
            and ((folder / LOCK_NAME).is_file() or (folder / JOURNAL_NAME).is_file()))


def remove_stale_staging(out: Path, keep: str | None = None, spent_only: bool = False) -> None:
    """Remove the staging folders in OUT other than `keep` that no running ingest holds (its lock is free);
    `spent_only`: only those holding nothing but the journal and lock (published: their output moved out)."""
    for child in out.iterdir():
        if child.name == keep or not is_staging(child) or is_held(child / LOCK_NAME):
            continue
        if not spent_only or {c.name for c in child.iterdir()} <= {LOCK_NAME, JOURNAL_NAME}:
            shutil.rmtree(child, ignore_errors=True)


def _unlock(lock: FileLock | None) -> None:
    if lock is not None:
        lock.release()
