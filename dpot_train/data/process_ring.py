"""Process loader workers that write batches straight into a ring of shared-memory slots.

`--worker-kind process` runs K worker processes (forked); worker w builds the steps s with s % K == w, as a thread
worker or a DataLoader worker does, so the batches are the same bit for bit. Each batch is built in a slot of one
shared memory region made before the workers start (`SharedRing`: an anonymous memfd, mapped by every process,
never a file in /dev/shm): `stream.read_batch` takes its window and mask buffers from the slot (`SlotAlloc`), so the
windows are copied once, from the shard into the slot, and the pipe from a worker carries only the slot index, the
tensors' layout in it and the batch's few small values (ids, positions, dataset indices, channel flags). No batch is
pickled, no shared-memory segment is made per batch (a DataLoader's per-batch cost: its pages are faulted in twice).

Slots are recycled only once the consumer is done with them: a batch's slot goes back to its worker when the next
batch is asked for (or at `release()`); with page-locked slots on CUDA, once the copies queued from it so far have
run (an event recorded on the current stream at that moment). Each worker owns prefetch + 1 slots (+ 1 on CUDA).
A batch still referenced at that moment (kept by the caller beyond its step) is not overwritten: its x, y and mask
are first moved to memory of their own (`Tensor.set_`, the same shapes, strides and bytes; `copies` counts them), so
holding batches is safe and only costs a copy. The trainer drops each batch before it asks for the next.

A worker's exception is raised by `next()` as WorkerError with the worker's traceback in the message and the
original exception as its cause; a worker that dies (killed, out of memory) is noticed while the consumer waits for
it (its process sentinel, no timeout) and named in a WorkerError. `close()` stops the workers and unmaps nothing a
batch still uses: the region goes when the last batch viewing it does.
"""

from __future__ import annotations

import math
import mmap
import multiprocessing as mp
import os
import pickle
import signal
import struct
import traceback
import warnings
import weakref
from collections import deque
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch

from dpot_train.data.datasets import DataError
from dpot_train.data.prefetch import LIVE, WorkerError, WorkerLoader
from dpot_train.data.stream import WindowStream

ALIGN = 64  # bytes: every buffer of a slot starts on a cache line
_JOIN_S = 30.0  # how long close() waits for a worker to finish the batch in hand
_PARENT_CHECK_S = 1.0  # how often an idle worker checks that its parent is alive
_STOP = -1
_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.bool_): torch.bool}


def supported() -> bool:
    """Whether this platform has what the ring needs: fork and anonymous shared memory (memfd, Linux)."""
    return hasattr(os, "memfd_create") and "fork" in mp.get_all_start_methods()


def _round_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def slot_bytes(stream: WindowStream) -> int:
    """Bytes one batch of the stream needs in a slot: its windows (float32) and masks (bool), each buffer aligned,
    for the largest dataset of the run."""
    spec = stream.spec
    per_rank = stream.global_batch // stream.world
    length = spec.t_in + spec.t_out
    cells = max(math.prod(d.shape) for d in spec.datasets)
    channels = max(len(d.channels) for d in spec.datasets)
    return _round_up(per_rank * length * channels * cells * 4) + _round_up(per_rank * cells)


class SharedRing:
    """`count` slots of `size` bytes in one anonymous shared mapping (a memfd, reserved up front with fallocate so
    that a short memory limit is an error here and not a SIGBUS later), inherited by forked workers."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, _round_up(max(size, ALIGN))
        total = self.count * self.size
        fd = os.memfd_create("dpot-loader-ring", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, total)
            try:
                os.posix_fallocate(fd, 0, total)
            except OSError as exc:
                raise DataError(f"--worker-kind process: the loader's {count} batch slots need {total / 2**20:.0f} "
                                f"MiB of shared memory and the system refused it ({exc.strerror}); use fewer "
                                "--num-workers, a smaller --batch-size, or --worker-kind thread") from None
            self._map = mmap.mmap(fd, total)  # MAP_SHARED: the workers' writes are this process's pages
        finally:
            os.close(fd)  # the mapping keeps the memory; nothing is left to unlink
        self.base = torch.frombuffer(self._map, dtype=torch.uint8)  # views of it keep the mapping alive
        self._typed: dict[torch.dtype, torch.Tensor] = {}
        self.pinned = False

    def slot(self, i: int) -> torch.Tensor:
        """Slot i as a flat uint8 tensor."""
        return self.base[i * self.size:(i + 1) * self.size]

    def typed(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole region viewed as a flat tensor of `dtype` (cached; its storage offset is 0)."""
        if dtype not in self._typed:
            self._typed[dtype] = self.base.view(dtype)
        return self._typed[dtype]

    def pin(self) -> bool:
        """Page-lock the whole region for CUDA copies (cudaHostRegister, portable, as torch registers shared
        memory); False, with a warning, when CUDA refuses it (the copies then wait for the host)."""
        if not self.pinned:
            code = int(torch.cuda.cudart().cudaHostRegister(self.base.data_ptr(), self.count * self.size, 1))
            self.pinned = code == 0
            if not self.pinned:
                warnings.warn(f"--worker-kind process: page-locking the loader's {self.count * self.size / 2**20:.0f} "
                              f"MiB of batch slots failed (cudaError {code}); batches are copied to the GPU from "
                              "pageable memory", stacklevel=2)
        return self.pinned

    def unpin(self) -> None:
        """Undo `pin`, after every copy queued from the region has run."""
        if self.pinned:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaHostUnregister(self.base.data_ptr())
            self.pinned = False


class SlotAlloc:
    """`BatchBuffers`' allocator in a worker: buffers cut one after another from the current slot (`start`), each
    aligned; None when the slot has no room left (the buffer then comes from the heap and travels by pipe)."""

    def __init__(self, ring: SharedRing) -> None:
        self.ring = ring
        self.current: torch.Tensor | None = None
        self.cursor = 0

    def start(self, slot: int) -> None:
        self.current, self.cursor = self.ring.slot(slot), 0

    def __call__(self, shape: tuple[int, ...], dtype: type) -> torch.Tensor | None:
        assert self.current is not None
        tdtype = _TORCH_DTYPES.get(np.dtype(dtype))
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        begin = _round_up(self.cursor)
        if tdtype is None or begin + nbytes > self.current.numel():
            return None
        self.cursor = begin + nbytes
        return self.current[begin:begin + nbytes].view(tdtype).view(shape)


def describe(batch: dict[str, Any], slot: torch.Tensor) -> list[tuple[str, str, tuple]]:
    """A batch built in `slot`, as the pipe carries it, in the batch's key order: ("slot", (byte offset, dtype,
    shape, strides)) for a tensor in the slot; ("tensor", (numpy array, strides)) for another tensor; ("value",
    (value,)) for the rest (the ids)."""
    first, end = slot.data_ptr(), slot.data_ptr() + slot.numel()
    out: list[tuple[str, str, tuple]] = []
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            at = value.data_ptr()
            if value.numel() and first <= at < end:
                out.append((key, "slot", (at - first, str(value.dtype).removeprefix("torch."), tuple(value.shape),
                                          value.stride())))
            else:
                out.append((key, "tensor", (np.ascontiguousarray(value.numpy()), value.stride())))
        else:
            out.append((key, "value", (value,)))
    return out


def rebuild(ring: SharedRing, slot: int, described: list[tuple[str, str, tuple]]) -> dict[str, Any]:
    """The batch `describe` described, its large tensors views of `slot` with the worker's shapes and strides."""
    out: dict[str, Any] = {}
    for key, kind, payload in described:
        if kind == "slot":
            offset, dtype_name, shape, strides = payload
            typed = ring.typed(getattr(torch, dtype_name))
            out[key] = torch.as_strided(typed, shape, strides, (slot * ring.size + offset) // typed.element_size())
        elif kind == "tensor":
            array, strides = payload
            tensor = torch.from_numpy(array)
            if tensor.stride() != tuple(strides):  # a view in the worker: the same strides here
                tensor = torch.empty_strided(tensor.shape, strides, dtype=tensor.dtype).copy_(tensor)
            out[key] = tensor
        else:
            out[key] = payload[0]
    return out


def _send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _work(stream: WindowStream, worker: int, workers: int, ring: SharedRing, slots: list[int], free: Connection,
          ready: Connection, parent: int, inherited: list[Connection]) -> None:
    """Worker process body: build this worker's steps into its free slots until told to stop, its parent is gone,
    or a batch fails (then its exception and traceback go to the consumer)."""
    for conn in inherited:  # the parent's ends of every pipe, copied by fork: not ours to hold open
        conn.close()
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle
    available = deque(slots)
    alloc = SlotAlloc(ring)
    batches = stream.worker_batches(worker, workers, alloc=alloc)
    step = worker
    try:
        while True:
            slot = _free_slot(free, available, parent)
            if slot is None:
                return
            alloc.start(slot)
            try:
                batch = next(batches)
            except BaseException as exc:  # noqa: BLE001 - every failure goes to the consumer, which re-raises it
                trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                try:
                    cause = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception:  # noqa: BLE001 - an exception that cannot travel: its traceback does
                    cause = None
                _send(ready, ("error", step, trace, cause))
                return
            _send(ready, ("batch", step, slot, describe(batch, ring.slot(slot))))
            del batch
            step += workers
    except (BrokenPipeError, EOFError, ConnectionResetError):
        return  # the consumer closed its ends: nothing left to do


def _free_slot(free: Connection, available: deque, parent: int) -> int | None:
    """The next slot to build into: returned slots first taken from the pipe; None once told to stop or when the
    parent process is gone."""
    while True:
        while free.poll():
            (slot,) = struct.unpack("<i", free.recv_bytes())
            if slot == _STOP:
                return None
            available.append(slot)
        if available:
            return available.popleft()
        if not free.poll(_PARENT_CHECK_S) and os.getppid() != parent:
            return None


def _how_it_ended(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class ProcessBatches:
    """Iterator over a stream's batches built by `workers` forked processes into a shared ring of slots, each
    worker at most `prefetch` batches ahead. `pin_memory` (CUDA only): the ring is page-locked here, once."""

    def __init__(self, stream: WindowStream, workers: int, prefetch: int = 2, pin_memory: bool = False) -> None:
        if workers < 1:
            raise ValueError(f"process workers must be at least 1, got {workers}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be at least 1 batch per worker, got {prefetch}")
        self.workers = workers
        self._closed = False
        self._failed: WorkerError | None = None
        self._procs: list[Any] = []
        self._free: list[Connection] = []
        self._ready: list[Connection] = []
        self._held: tuple[int, int, list] | None = None  # (worker, slot, weakrefs to its slot tensors) last handed out
        self.copies = 0  # slot tensors moved to memory of their own because the caller still held them
        self._pending: deque[tuple[int, int, Any]] = deque()  # (worker, slot, CUDA event) of copies in flight
        self._step = 0
        pin = pin_memory and torch.cuda.is_available()
        per_worker = prefetch + 1 + (1 if pin else 0)  # + the consumer's batch (+ the one whose copy may run)
        self.ring = SharedRing(workers * per_worker, slot_bytes(stream))
        LIVE.add(self)
        ctx = mp.get_context("fork")
        parent_ends: list[Connection] = []
        try:
            for w in range(workers):
                free_r, free_w = ctx.Pipe(duplex=False)
                ready_r, ready_w = ctx.Pipe(duplex=False)
                parent_ends += [free_w, ready_r]
                slots = list(range(w * per_worker, (w + 1) * per_worker))
                proc = ctx.Process(target=_work, name=f"dpot-loader-{w}", daemon=True,
                                   args=(stream, w, workers, self.ring, slots, free_r, ready_w, os.getpid(),
                                         list(parent_ends)))
                proc.start()
                free_r.close()
                ready_w.close()
                self._procs.append(proc)
                self._free.append(free_w)
                self._ready.append(ready_r)
        except BaseException:
            self.close()
            raise
        if pin:
            self.ring.pin()

    def __iter__(self) -> "ProcessBatches":
        return self

    def __next__(self) -> dict[str, Any]:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise StopIteration
        self.release()
        w = self._step % self.workers
        message = self._receive(w)
        if message[0] == "error":
            _, step, trace, cause = message
            exc = None
            if cause is not None:
                try:
                    exc = pickle.loads(cause)
                except Exception:  # noqa: BLE001 - the traceback in the message says what it was
                    exc = None
            self._fail(WorkerError(f"loader process {w} failed building step {step}:\n{trace}"), exc)
        _, step, slot, described = message
        if step != self._step:
            self._fail(WorkerError(f"loader process {w} delivered step {step} where step {self._step} was due"))
        batch = rebuild(self.ring, slot, described)
        self._held = (w, slot, [weakref.ref(batch[key]) for key, kind, _ in described if kind == "slot"])
        self._step += 1
        return batch

    def release(self) -> None:
        """Give the slot of the batch last handed out back to its worker (also done by the next `next()`); its
        tensors the caller still holds are first copied out of it (views made of them before stay in the slot)."""
        if self._held is None:
            return
        w, slot, refs = self._held
        self._held = None
        held = [t for t in (ref() for ref in refs) if t is not None]
        if held:  # still held by the caller: give them memory of their own before the slot is reused
            self._move_out(slot, held)
        if self.ring.pinned:
            event = torch.cuda.Event()
            event.record()
            self._pending.append((w, slot, event))
            self._return_finished()
        else:
            self._give(w, slot)

    def _move_out(self, slot: int, held: list[torch.Tensor]) -> None:
        """Copy the part of `slot` the `held` tensors view into one new storage and point them at it (`set_`): the
        same shapes, strides and bytes, and views of one another as before (x and y share their windows)."""
        first = slot * self.ring.size
        end = max(t.storage_offset() * t.element_size()
                  + (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size() for t in held)
        own = self.ring.base[first:end].clone()
        for t in held:
            offset = t.storage_offset() * t.element_size() - first
            t.set_(own.untyped_storage(), offset // t.element_size(), t.shape, t.stride())
        self.copies += len(held)

    def _give(self, w: int, slot: int) -> None:
        try:
            self._free[w].send_bytes(struct.pack("<i", slot))
        except OSError:
            pass  # a dead worker: `_receive` reports it

    def _return_finished(self) -> None:
        """Give back the pinned slots whose queued copies have run."""
        while self._pending and self._pending[0][2].query():
            w, slot, _ = self._pending.popleft()
            self._give(w, slot)

    def _receive(self, w: int) -> tuple:
        """Worker w's next message; WorkerError when the worker died without sending it."""
        conn, proc = self._ready[w], self._procs[w]
        while True:
            waiting_on_copies = any(p[0] == w for p in self._pending)
            ready = wait([conn, proc.sentinel], 0.002 if waiting_on_copies else None)
            if waiting_on_copies:
                self._return_finished()
            if conn in ready:  # a message, or the end of the pipe (what a worker sent before it ended comes first)
                try:
                    return pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    pass
            elif proc.sentinel not in ready:
                continue  # only the copies' poll ran out
            proc.join()  # ended: its sentinel fired, or its end of the pipe closed with nothing in it
            self._fail(WorkerError(f"loader process {w} (pid {proc.pid}) {_how_it_ended(proc.exitcode)} "
                                   f"without delivering step {self._step}"))

    def _fail(self, err: WorkerError, cause: BaseException | None = None) -> None:
        """Stop every worker and raise `err` (now and on every later next())."""
        err.__cause__ = cause
        self._failed = err
        self.close()
        raise err

    def close(self) -> None:
        """Stop the workers (each finishes the batch in hand), close the pipes, unpin the ring. Batches already
        handed out stay readable (they keep the mapping alive)."""
        if self._closed:
            return
        self._closed = True
        self._held = None
        for conn in self._free:
            try:
                conn.send_bytes(struct.pack("<i", _STOP))
            except OSError:
                pass
        for proc, ready in zip(self._procs, self._ready):
            _stop(proc, ready)
        for conn in self._free + self._ready:
            conn.close()
        self._pending.clear()
        ring = getattr(self, "ring", None)
        if ring is not None and ring.pinned:
            ring.unpin()

    def __del__(self) -> None:
        self.close()


def _stop(proc: Any, ready: Connection) -> None:
    """Wait for a told-to-stop worker to end, reading what it still sends (so that it never waits on a full pipe);
    terminate it after _JOIN_S seconds."""
    waited = 0.0
    while proc.is_alive() and waited < _JOIN_S:
        got = wait([ready, proc.sentinel], 0.5)
        waited += 0.5
        if ready in got:
            try:
                ready.recv_bytes()
            except (EOFError, OSError):
                pass
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
    if proc.is_alive():
        proc.kill()
    proc.join()


class ProcessLoader(WorkerLoader):
    """Batches made by worker processes into a shared ring of slots (the pipe carries slot indices only)."""

    kind = "process"

    def batches(self) -> ProcessBatches:
        return ProcessBatches(self.stream, self.num_workers, self.prefetch, self.pin_memory)
