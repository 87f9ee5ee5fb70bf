"""Where ingest tasks run: local threads (`--workers N`) or a `dask.distributed` cluster (`--scheduler ADDRESS`).
Both stream tasks through the same call, `Runner.imap`: a bounded number in flight, so that memory stays a few
blocks big, results (for the resume journal) arrive in order while the job runs, and a new task starts as soon as a
worker is free. A task reads its dask array block itself (`compute_in_task`)."""

from __future__ import annotations

import os
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import dask
import dask.local

from dpot_data.errors import InputError

T = TypeVar("T")
_NOTHING: Any = object()  # imap without a shared argument
TIMEOUT_ENV = "DPOT_SCHEDULER_TIMEOUT"  # seconds to wait for a --scheduler before giving up (default 10)


def _default_timeout() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV, "10"))
    except ValueError:
        raise InputError(TIMEOUT_ENV, f"expected a number of seconds, got {os.environ[TIMEOUT_ENV]!r}") from None
R = TypeVar("R")


@dataclass(frozen=True)
class SchedulerOptions:
    """`workers`: local threads (None: one per CPU core); `address`: a dask.distributed scheduler to use instead;
    `connect_timeout`: seconds to wait for that scheduler (default: $DPOT_SCHEDULER_TIMEOUT, else 10)."""

    workers: int | None = None
    address: str | None = None
    connect_timeout: float = field(default_factory=_default_timeout)

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"--workers must be at least 1, got {self.workers}")
        if self.address is not None and not self.address.strip():
            raise ValueError("--scheduler needs an address such as tcp://host:8786")


class Runner:
    """Runs a function over items on the chosen scheduler, in order, `window` tasks in flight at a time."""

    def __init__(self, options: SchedulerOptions, client: Any | None = None) -> None:
        self.options = options
        self.client = client

    @property
    def workers(self) -> int:
        """Parallel task slots: threads of the local scheduler, or total threads of the cluster's workers."""
        if self.client is not None:
            info = self.client.scheduler_info()
            threads = sum(int(w.get("nthreads", 1)) for w in info.get("workers", {}).values())
            return max(threads, 1)
        return self.options.workers or os.cpu_count() or 1

    def describe(self) -> str:
        """One line for logs: which scheduler and how many task slots."""
        if self.client is not None:
            return f"dask.distributed scheduler at {self.options.address} ({self.workers} threads)"
        return f"local threaded scheduler ({self.workers} workers)"

    def sees(self, folder: str | os.PathLike[str]) -> bool:
        """Whether every worker sees this folder of ours (a shared filesystem): always for local threads; on a
        cluster, whether each worker finds a file of a fresh random name made in it here."""
        if self.client is None:
            return True
        probe = os.path.join(os.fspath(folder), f"probe-{uuid.uuid4().hex}")
        with open(probe, "wb"):
            pass
        try:
            found = self.client.run(os.path.exists, probe)
        finally:
            os.unlink(probe)
        return bool(found) and all(found.values())

    def compute(self, tasks: Sequence[Any]) -> list[Any]:
        """Compute a list of dask collections / delayed objects on this runner's scheduler, results in order."""
        if not tasks:
            return []
        if self.client is not None:
            return list(dask.compute(*tasks, scheduler=self.client))
        return list(dask.compute(*tasks, scheduler="threads", num_workers=self.workers))

    def imap(self, fn: Callable[..., R], items: Iterable[T], window: int | None = None, prefetch: bool = True,
             shared: Any = _NOTHING) -> Iterator[R]:
        """Yield fn(item) (fn(shared, item) when `shared` is given) for every item, in order, at most `window`
        (default: workers, at least 2) tasks running at a time.

        With `prefetch`, tasks are streamed: a new one starts as soon as a slot is free, while the caller consumes
        earlier results (writing shards, say), so reading and writing overlap and no task waits for a slower one of
        the same window; at most 2 × window results are held at once. Without it, the items go in windows of
        `window`, each computed after the caller has consumed the one before. `shared` travels to a cluster once,
        not with every task.
        """
        size = window or max(2, self.workers)
        if size < 1:
            raise ValueError(f"window must be at least 1, got {size}")
        args = () if shared is _NOTHING else (shared,)
        if not prefetch:
            for batch in _batched(items, size):
                tasks = [dask.delayed(fn, pure=False)(*args, item) for item in batch]
                yield from self.compute(tasks)
            return
        with self._submitter(size, args) as submit:
            pending: deque[Any] = deque()  # futures not consumed yet: a result is released once taken
            try:
                for item in items:
                    pending.append(submit(fn, item))
                    if len(pending) >= 2 * size:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:  # the caller stopped early, or a task failed
                    future.cancel()

    @contextmanager
    def _submitter(self, size: int, args: tuple[Any, ...]) -> Iterator[Callable[[Callable[..., R], T], Any]]:
        """A function that starts fn(*args, item) and returns its future: on the cluster's workers, or on a pool of
        `size` local threads. No future is kept here: a cluster keeps a result only while a future refers to it."""
        if self.client is not None:
            client = self.client
            if args:
                args = (client.scatter(args[0], broadcast=True, hash=False),)
            try:
                yield lambda fn, item: client.submit(fn, *args, item, pure=False)
            finally:
                if args:
                    client.cancel(list(args))
            return
        with ThreadPoolExecutor(max_workers=size, thread_name_prefix="dpot-task") as pool:
            try:
                yield lambda fn, item: pool.submit(fn, *args, item)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)


def _batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of `size` items (the last one shorter)."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


@contextmanager
def scheduler_context(options: SchedulerOptions) -> Iterator[Runner]:
    """Open the scheduler for the duration of an ingest: a `distributed.Client` on `address`, else the local one.

    Tasks that hold dask arrays of their own compute them with `compute_in_task`, so a task never starts a second
    pool of threads on the same cores nor asks the cluster for more work from inside a worker.
    """
    if options.address:
        from distributed import Client

        try:
            client = Client(options.address, set_as_default=False, timeout=f"{options.connect_timeout}s",
                            direct_to_workers=True)
        except OSError as exc:
            raise InputError("--scheduler", f"cannot reach the dask scheduler at {options.address} within "
                             f"{options.connect_timeout:g} s ({type(exc).__name__}); is it running? "
                             f"(set {TIMEOUT_ENV} to wait longer)") from None
        try:
            yield Runner(options, client)
        finally:
            client.close()
    else:
        yield Runner(options)


def compute_in_task(obj: Any) -> Any:
    """Compute a dask collection from inside a running task without starting another thread pool. A dask array of
    one chunk (what a block task reads) is computed as that chunk's key alone: the reader's block itself, without
    the copy dask's array finalize makes."""
    if getattr(obj, "numblocks", None) is not None and all(n == 1 for n in obj.numblocks):
        key = obj.__dask_keys__()
        while isinstance(key, list):
            key = key[0]
        return dask.local.get_sync(obj.__dask_graph__(), key)
    return dask.compute(obj, scheduler="synchronous")[0]
