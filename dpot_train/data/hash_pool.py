"""The validator's sha256 pass on local threads, with a progress bar: what `launch`, `evaluate` and the trainer's own
data check (`verify_shards`) run `dpot_format.validate.validate_output` with when it rehashes.

Each shard (or Zarr array) is hashed on its own thread of a pool sized to the CPUs this process may use
(`dpot_train.core.threads.available_cores`); hashlib and file reads release the GIL on the validator's 8 MiB pieces, so
the threads hash in parallel, each holding one bounded piece, never a whole shard. Results come back in the
manifest's order (`Executor.map`), so the problems, and the error lines made from them, are those of the one-thread
pass, in the same order. Without rehashing (the recorded-index path, the shard cache) nothing here is used.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from dpot_format.io import ARRAY_BLOCK_BYTES, CHUNK
from dpot_format.validate import Item, Problem
from dpot_train.core.threads import available_cores

T = TypeVar("T")
R = TypeVar("R")

HASH_MEMORY = 1 << 30  # bytes the hashing threads hold at once, at most: this bounds the thread count
PROGRESS_MIN_BYTES = 1 << 30  # less than this to hash (a few seconds on one core): no bar


class ThreadRunner:
    """The validator's `Runner` on a local thread pool: fn over items, results in the items' order."""

    def __init__(self, pool: Executor) -> None:
        self.pool = pool

    def imap(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """fn(item) for every item, computed on the pool, yielded in order (an item's exception where it stands)."""
        return self.pool.map(fn, items)


def hash_threads(part: str, cores: int | None = None) -> int:
    """Threads for hashing `part` ("shards" or "zarr"): the CPUs this process may use, at most as many as fit
    HASH_MEMORY (a shard thread holds one CHUNK read, a Zarr thread a block of about ARRAY_BLOCK_BYTES and its
    decoded chunks)."""
    per_thread = 2 * ARRAY_BLOCK_BYTES if part == "zarr" else CHUNK
    return max(1, min(available_cores() if cores is None else cores, HASH_MEMORY // per_thread))


@contextmanager
def hash_runner(rehash: bool, part: str, workers: int | None = None) -> Iterator[ThreadRunner | None]:
    """A ThreadRunner of `workers` threads (None: `hash_threads(part)`) for the block; None (the validator's own
    thread, as before) when nothing is rehashed or one thread is all there is. Leaving the block (an error, Ctrl-C)
    cancels the items not started and waits for those being hashed."""
    threads = hash_threads(part) if workers is None else workers
    if not rehash or threads <= 1:
        yield None
        return
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="dpot-hash")
    try:
        yield ThreadRunner(pool)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def to_hash(entries: Iterable[dict[str, Any]], part: str, splits: Iterable[str] | None = None) -> tuple[int, int]:
    """(bytes, items) a rehash of these manifest dataset entries reads: the listed shards (of `splits` when given,
    their listed sizes), or the listed Zarr arrays (bytes: the fields array's float32 size, which dominates)."""
    wanted = None if splits is None else set(splits)
    size = count = 0
    for entry in entries:
        if part == "zarr":
            z = entry.get("zarr") or {}
            count += len(z.get("arrays") or {})
            cells = int(entry["trajectories"]) * int(entry["frames"]) * len(entry["channels"])
            for side in entry["grid"]["shape"]:
                cells *= int(side)
            size += 4 * cells if z else 0
            continue
        shards = [s for s in entry["shards"] if wanted is None or s["split"] in wanted]
        size += sum(int(s["bytes"]) for s in shards)
        count += len(shards)
    return size, count


class HashProgress:
    """A tqdm bar on stderr over what the sha256 pass has checked (bytes of shards, or Zarr arrays), fed by the
    validator's `progress(item, problems)` callback in the manifest's order. No bar when `enabled` is False
    (--no-progress), when less than PROGRESS_MIN_BYTES is to be hashed, or when stderr is not a terminal (a
    scheduler's log stays readable, as for the training bar)."""

    def __init__(self, size: int, count: int, part: str, enabled: bool, desc: str = "sha256") -> None:
        self.bar: Any = None
        if not enabled or size < PROGRESS_MIN_BYTES:
            return
        from tqdm import tqdm

        if part == "zarr":
            self.bar = tqdm(total=count, unit="array", desc=desc, dynamic_ncols=True, disable=None, mininterval=1.0,
                            file=sys.stderr)
        else:
            self.bar = tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, dynamic_ncols=True,
                            disable=None, mininterval=1.0, file=sys.stderr)

    def __call__(self, item: Item, problems: list[Problem]) -> None:
        """One item checked: advance by its listed bytes (a shard) or by one (a Zarr array)."""
        if self.bar is not None:
            self.bar.update(item.bytes if item.kind == "shard" else 1)

    def __enter__(self) -> "HashProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
