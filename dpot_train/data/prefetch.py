"""Thread workers for the window stream: K threads build the steps s with s % K == w, delivered in step order.

The stream's own work per sample is a copy from the shard (its memory map, or a read) straight into the batch buffer
(no decode), and the reads and copies release the GIL; worker *processes* would add a shared-memory transfer of every batch (several times the read
cost on a small host). Worker w of K builds exactly the steps that DataLoader worker w of K builds
(`WindowStream.worker_batches`), and the consumer takes step s from worker s % K, so the batches, their order and
their content are the same as with no workers or with process workers.
"""

from __future__ import annotations

import atexit
import queue
import threading
import traceback
import weakref
from typing import Any

import torch

from dpot_train.data.stream import WindowStream

_POLL_S = 0.1  # how often a blocked worker or consumer re-checks the stop event / a dead worker
_JOIN_S = 30.0  # how long close() waits for a worker to finish the batch in hand
LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()  # every open batch iterator (threads or processes), closed at exit


class WorkerError(RuntimeError):
    """An exception raised in a loader thread, re-raised in the consumer with the worker's traceback."""


class _Failure:
    """What a worker puts in its queue instead of a batch when building one raised."""

    def __init__(self, worker: int, exc: BaseException) -> None:
        self.worker, self.exc = worker, exc
        self.trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def pin_batch(batch: Any) -> Any:
    """The batch with every tensor copied to page-locked memory (dicts, lists, tuples walked; other values kept)."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: pin_batch(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(pin_batch(v) for v in batch)
    return batch


def _put(out: queue.Queue, item: Any, stop: threading.Event) -> bool:
    """Put `item` into the bounded queue, waiting while it is full; False when `stop` was set first."""
    while not stop.is_set():
        try:
            out.put(item, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _work(stream: WindowStream, worker: int, workers: int, out: queue.Queue, stop: threading.Event,
          pin: bool) -> None:
    """Thread body: build this worker's batches into `out` until `stop` is set or a batch fails."""
    try:
        for batch in stream.worker_batches(worker, workers, pin):  # pinned as built: pin_batch then copies none
            if not _put(out, pin_batch(batch) if pin else batch, stop):
                return
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the consumer, which re-raises it
        _put(out, _Failure(worker, exc), stop)


class ThreadBatches:
    """Iterator over a stream's batches built by `workers` daemon threads, each `prefetch` batches ahead at most.

    Not shared with the threads (they hold only the stream, their queue and the stop event), so dropping the last
    reference stops them; `close()` does so explicitly. A worker's exception is raised by `next()` as WorkerError
    with the worker's traceback in the message and the original exception as its cause.
    """

    def __init__(self, stream: WindowStream, workers: int, prefetch: int = 2, pin_memory: bool = False) -> None:
        if workers < 1:
            raise ValueError(f"thread workers must be at least 1, got {workers}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be at least 1 batch per worker, got {prefetch}")
        self.workers = workers
        self._stop = threading.Event()
        self._queues: list[queue.Queue] = [queue.Queue(maxsize=prefetch) for _ in range(workers)]
        pin = pin_memory and torch.cuda.is_available()
        self._threads = [threading.Thread(target=_work, args=(stream, w, workers, self._queues[w], self._stop, pin),
                                          name=f"dpot-loader-{w}", daemon=True) for w in range(workers)]
        self._step = 0
        self._failed: WorkerError | None = None
        LIVE.add(self)
        for t in self._threads:
            t.start()

    def __iter__(self) -> "ThreadBatches":
        return self

    def __next__(self) -> dict[str, Any]:
        if self._failed is not None:
            raise self._failed
        if self._stop.is_set():
            raise StopIteration
        w = self._step % self.workers
        q, thread = self._queues[w], self._threads[w]
        while True:
            try:
                item = q.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not thread.is_alive() and q.empty():
                    self._fail(WorkerError(f"loader thread {w} exited without delivering step {self._step}"))
        if isinstance(item, _Failure):
            self._fail(WorkerError(f"loader thread {item.worker} failed building step {self._step}:\n{item.trace}"),
                       item.exc)
        self._step += 1
        return item

    def _fail(self, err: WorkerError, cause: BaseException | None = None) -> None:
        """Stop every worker and raise `err` (now and on every later next())."""
        err.__cause__ = cause
        self._failed = err
        self.close()
        raise err

    def close(self) -> None:
        """Stop the threads, wait for them to finish the batch in hand, and drop the prefetched batches.

        Waiting matters at exit: a daemon thread still inside a torch or numpy call while the interpreter and the
        process group are torn down can abort the process.
        """
        self._stop.set()
        me = threading.current_thread()
        for t in self._threads:
            if t is not me and t.is_alive():
                t.join(_JOIN_S)
        for q in self._queues:
            while True:
                try:
                    q.get_nowait()
                except queue.Empty:
                    break

    def __del__(self) -> None:
        self.close()


@atexit.register
def _close_all() -> None:
    """Stop every live loader's workers (threads or processes) before the interpreter shuts down (threads are
    daemons, but may be mid-call; processes would be left behind)."""
    for batches in list(LIVE):
        batches.close()


class WorkerLoader:
    """Iterable like a DataLoader: each iter() starts fresh workers at the stream's start position. A subclass
    names its kind (`thread`, `process`) and the batch iterator it starts (`batches`)."""

    kind = "thread"

    def __init__(self, stream: WindowStream, num_workers: int, pin_memory: bool = False, prefetch: int = 2) -> None:
        if num_workers < 1:
            raise ValueError(f"{self.kind} workers must be at least 1, got {num_workers}")
        self.stream, self.num_workers, self.pin_memory, self.prefetch = stream, num_workers, pin_memory, prefetch

    def batches(self) -> Any:
        """A fresh iterator of batches over the stream, its workers started."""
        raise NotImplementedError

    def __iter__(self) -> Any:
        # a DataLoader iterator draws one base seed from the torch RNG; so does this one, so that the process RNG
        # state after iter() is the same whichever worker kind is used
        torch.empty((), dtype=torch.int64).random_()
        return self.batches()


class ThreadLoader(WorkerLoader):
    """Batches made by worker threads of this process."""

    kind = "thread"

    def batches(self) -> ThreadBatches:
        return ThreadBatches(self.stream, self.num_workers, self.prefetch, self.pin_memory)
