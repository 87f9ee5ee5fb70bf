"""Process loader workers writing into a shared ring of batch slots (`dpot_train.data.process_ring`): the pipe carries
slot indices and layouts, not windows; a slot is reused only after the consumer is done with it; no shared memory is
left behind; a worker's error or death reaches the consumer as one WorkerError, without a hang."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from dpot_train.core.config import DataConfig
from dpot_train.data import process_ring
from dpot_train.data.datasets import DataError
from dpot_train.data.loader import make_loader
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.stream import EpochPlans, WindowStream

BATCH = 4
RING = "dpot-loader-ring"


@pytest.fixture(scope="module")
def stream_data(fno_train_shards: Path):
    return prepare_stream(DataConfig(manifests=[str(fno_train_shards)], verify_checksums=False), seed=5, verify=False)


def _ring_maps() -> list[str]:
    with open("/proc/self/maps", encoding="utf-8") as f:
        return [ln for ln in f if RING in ln]


def _ring_fds() -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if RING in os.readlink(f"/proc/self/fd/{fd}"):
                out.append(fd)
        except OSError:
            pass
    return out


def test_a_batch_travels_as_slot_offsets_not_bytes(stream_data) -> None:
    """What a worker sends for a batch built in its slot: offsets, shapes and strides of x, y and mask, and the small
    values; a few hundred bytes for a batch of 4 windows of 11 x 4 x 32 x 32 floats."""
    spec, reader = stream_data
    stream = WindowStream(spec, reader, 0, BATCH)
    ring = process_ring.SharedRing(2, process_ring.slot_bytes(stream))
    alloc = process_ring.SlotAlloc(ring)
    alloc.start(1)
    batch = stream.batch(0, EpochPlans(spec), alloc=alloc)
    described = process_ring.describe(batch, ring.slot(1))
    kinds = {key: kind for key, kind, _ in described}
    assert kinds == {"x": "slot", "y": "slot", "mask": "slot", "channel_valid": "tensor", "dataset": "tensor",
                     "position": "tensor", "id": "value"}
    message = pickle.dumps(("batch", 0, 1, described), protocol=pickle.HIGHEST_PROTOCOL)
    window_bytes = batch["x"].numel() * 4
    assert len(message) < 2048 < window_bytes
    again = process_ring.rebuild(ring, 1, described)
    assert list(again) == list(batch)
    for key in ("x", "y", "mask"):
        assert again[key].data_ptr() == batch[key].data_ptr() and again[key].stride() == batch[key].stride()
    for key in ("channel_valid", "dataset", "position"):
        assert torch.equal(again[key], batch[key]) and again[key].dtype == batch[key].dtype
    assert again["id"] == batch["id"]


def test_a_slot_is_reused_only_after_the_consumer_let_go_of_its_batch(stream_data) -> None:
    """One worker, 2 slots: step 0's slot is not written while its batch is the current one; asking for step 1
    gives it back, and step 2 is built into it. A batch the caller still holds then keeps its values (its tensors
    moved out of the slot first); one it dropped costs no copy."""
    spec, reader = stream_data
    want = [b["x"].clone() for b, _ in zip(iter(make_loader(WindowStream(spec, reader, 0, BATCH), 0)), range(4))]
    it = process_ring.ProcessBatches(WindowStream(spec, reader, 0, BATCH), 1, prefetch=1)
    first = next(it)
    in_slot = first["x"][0]  # a view made before the release stays a view of the slot
    assert torch.equal(first["x"], want[0])
    assert it._ready[0].poll(120)  # the worker built step 1 into the other slot; it has no free slot for step 2
    time.sleep(0.5)  # (time for a worker that took step 0's slot anyway to write into it)
    assert torch.equal(first["x"], want[0])
    second = next(it)  # step 0's slot goes back, `first` is still held: its x, y and mask are copied out
    assert it.copies == 3 and torch.equal(second["x"], want[1])
    assert it._ready[0].poll(120)  # step 2 delivered, built in step 0's slot
    assert torch.equal(in_slot, want[2][0]) and torch.equal(first["x"], want[0])
    assert first["x"].untyped_storage().data_ptr() == first["y"].untyped_storage().data_ptr()  # still one window
    del second
    assert torch.equal(next(it)["x"], want[2]) and it.copies == 3  # nothing held: the slot goes back as it is
    it.close()


def test_no_shared_memory_is_left_behind(stream_data) -> None:
    """The ring is an anonymous memfd: nothing in /dev/shm at any time; its map (and the descriptor the map holds)
    goes with the last batch viewing it."""
    spec, reader = stream_data
    gc.collect()
    shm = set(os.listdir("/dev/shm"))
    assert _ring_maps() == [] and _ring_fds() == []
    it = iter(make_loader(WindowStream(spec, reader, 0, BATCH), 2, kind="process"))
    pids = {str(p.pid) for p in it._procs} | {str(os.getpid())}
    batches = [{k: v for k, v in next(it).items()} for _ in range(3)]
    assert len(_ring_maps()) == 1 and len(_ring_fds()) == 1
    new = set(os.listdir("/dev/shm")) - shm
    assert [n for n in new if any(p in n for p in pids)] == []  # (other programs of the machine may add their own)
    it.close()
    assert len(_ring_maps()) == 1  # the batches handed out are still readable
    assert torch.isfinite(batches[-1]["x"]).all()
    del it, batches
    gc.collect()
    assert _ring_maps() == [] and _ring_fds() == []
    new = set(os.listdir("/dev/shm")) - shm
    assert [n for n in new if any(p in n for p in pids)] == []


def test_shared_memory_refused_is_one_line(stream_data, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, reader = stream_data

    def refuse(fd: int, offset: int, size: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", refuse)
    with pytest.raises(DataError) as err:
        iter(make_loader(WindowStream(spec, reader, 0, BATCH), 2, kind="process"))
    assert str(err.value).startswith("--worker-kind process: the loader's 6 batch slots need ")
    assert "No space left on device" in str(err.value) and "--worker-kind thread" in str(err.value)
    assert "\n" not in str(err.value)


class _Unpicklable(Exception):
    def __init__(self, message: str, handle: object) -> None:
        super().__init__(message)
        self.handle = handle

    def __reduce__(self):
        raise TypeError("cannot pickle this")


class _Raising:
    """A reader whose every read raises an exception that cannot be pickled."""

    def refs(self, ds, split):
        return []

    def read(self, ref, t0, length):
        raise _Unpicklable(f"cannot read {ref.id}", object())


def test_an_unpicklable_worker_error_still_reaches_the_consumer_with_its_traceback(stream_data) -> None:
    from dpot_train.data.prefetch import WorkerError

    spec, _ = stream_data
    it = iter(make_loader(WindowStream(spec, _Raising(), 0, BATCH), 1, kind="process"))
    with pytest.raises(WorkerError) as info:
        next(it)
    assert "loader process 0 failed building step 0" in str(info.value)
    assert "_Unpicklable: cannot read fno-ns-v1e-3:" in str(info.value)
    assert info.value.__cause__ is None


KILL = textwrap.dedent("""
    import multiprocessing, os, signal, sys, time
    from dpot_train.core.config import DataConfig
    from dpot_train.data.prepare import prepare_stream
    from dpot_train.data.loader import make_loader
    from dpot_train.data.prefetch import WorkerError
    from dpot_train.data.stream import WindowStream

    spec, reader = prepare_stream(DataConfig(manifests=[sys.argv[1]], verify_checksums=False), seed=0, verify=False)
    it = iter(make_loader(WindowStream(spec, reader, 0, 4), 2, kind="process"))
    next(it)
    victim = it._procs[1]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join()
    try:
        for _ in range(20):
            next(it)
    except WorkerError as exc:
        print(exc)
    else:
        print("no error")
    for _ in range(600):
        if not [p for p in multiprocessing.active_children() if p.name.startswith("dpot-loader-")]:
            break
        time.sleep(0.1)
    print("left:", [p.name for p in multiprocessing.active_children() if p.name.startswith("dpot-loader-")])
""")


def test_a_killed_worker_is_named_without_a_hang(fno_train_shards: Path) -> None:
    """SIGKILL one of two workers: the consumer, waiting on that worker's pipe and its process sentinel together,
    raises a WorkerError naming it (no timeout involved) and stops the other."""
    r = subprocess.run([sys.executable, "-c", KILL, str(fno_train_shards)], capture_output=True, text=True,
                       timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("loader process 1 (pid ") and " was killed by SIGKILL without delivering step " \
        in lines[0], r.stdout
    assert lines[-1] == "left: []"


def test_training_with_process_workers_copies_no_batch_and_equals_thread_workers(fno_train_shards: Path,
                                                                                 tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    """A tiny run in this process with 2 process workers: every batch's slot goes back untouched (the loop drops
    each batch before it asks for the next), and the losses and weights are those of 2 thread workers."""
    import json

    from dpot_train.core.config import TrainConfig
    from dpot_train.train.trainer import train

    loaders: list[process_ring.ProcessBatches] = []
    start = process_ring.ProcessBatches.__init__

    def spy(self, *args, **kwargs) -> None:
        start(self, *args, **kwargs)
        loaders.append(self)

    monkeypatch.setattr(process_ring.ProcessBatches, "__init__", spy)
    runs = {}
    for kind in ("process", "thread"):
        out = tmp_path / kind
        cfg = TrainConfig(out=str(out), model="tiny", steps=6, batch_size=4, device="cpu", progress=False,
                          ckpt_every=6, log_every=1, eval_at_end=False,
                          data=DataConfig(manifests=[str(fno_train_shards)], num_workers=2, worker_kind=kind))
        train(cfg)
        runs[kind] = ([json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()],
                      torch.load(out / "checkpoints" / "step-00000006.pt", weights_only=True)["model"])
    assert len(loaders) == 1 and loaders[0]._step == 6 and loaders[0].copies == 0
    assert runs["process"][0] == runs["thread"][0] and len(runs["process"][0]) == 6
    assert all(torch.equal(runs["process"][1][k], runs["thread"][1][k]) for k in runs["thread"][1])


class _FakeEvent:
    """Stands in for torch.cuda.Event: complete once the test says so (the copies queued before it have run)."""

    made: list["_FakeEvent"] = []

    def __init__(self) -> None:
        self.done = False
        _FakeEvent.made.append(self)

    def record(self) -> None:
        pass

    def query(self) -> bool:
        return self.done


def test_with_pinned_slots_a_slot_goes_back_only_after_its_copies_ran(stream_data,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA rule, on the CPU with a stand-in event: a page-locked slot whose batch was copied with
    non_blocking=True goes back only once the event recorded when the next batch was asked for has completed; the
    consumer keeps polling those events while it waits (no deadlock when the worker has no free slot)."""
    import threading

    spec, reader = stream_data
    want = [b["x"].clone() for b, _ in zip(iter(make_loader(WindowStream(spec, reader, 0, BATCH), 0)), range(3))]
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    _FakeEvent.made.clear()
    it = process_ring.ProcessBatches(WindowStream(spec, reader, 0, BATCH), 1, prefetch=1)  # slots A and B
    it.ring.pinned = True  # as if cudaHostRegister had been called (no CUDA here)
    try:
        first = next(it)
        in_slot = first["x"][0]  # a view of slot A
        del first
        assert torch.equal(next(it)["x"], want[1])  # A's event recorded, not complete: A stays with the consumer
        assert len(_FakeEvent.made) == 1 and len(it._pending) == 1
        time.sleep(0.5)  # (time for a worker given slot A too early to write step 2 into it)
        assert torch.equal(in_slot, want[0][0])
        threading.Timer(0.3, lambda: setattr(_FakeEvent.made[0], "done", True)).start()
        third = next(it)  # waits for step 2, polling the events: A goes back once its event completes
        assert torch.equal(third["x"], want[2]) and torch.equal(in_slot, want[2][0])
        assert len(it._pending) == 1  # B's event, recorded at this next()
    finally:
        it.ring.pinned = False
        it.close()


class _FakeCudart:
    """Stands in for torch.cuda.cudart(): records cudaHostRegister / cudaHostUnregister and answers `code`."""

    def __init__(self, code: int = 0) -> None:
        self.code = code
        self.calls: list[tuple] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:  # noqa: N802 - CUDA's name
        self.calls.append(("register", ptr, size, flags))
        return self.code

    def cudaHostUnregister(self, ptr: int) -> int:  # noqa: N802 - CUDA's name
        self.calls.append(("unregister", ptr))
        return 0


def test_on_the_cpu_the_ring_is_not_page_locked(stream_data, monkeypatch: pytest.MonkeyPatch) -> None:
    """pin_memory asked for where CUDA is not available (the trainer asks on a CUDA device only): no cudart call,
    prefetch + 1 slots per worker, and the loader's batches as without it."""
    def no_cudart() -> None:
        raise AssertionError("cudart called without CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "cudart", no_cudart)
    spec, reader = stream_data
    it = process_ring.ProcessBatches(WindowStream(spec, reader, 0, BATCH), 2, prefetch=2, pin_memory=True)
    try:
        assert not it.ring.pinned and it.ring.count == 2 * 3
        assert next(it)["x"].shape[0] == BATCH
    finally:
        it.close()
    loader = make_loader(WindowStream(spec, reader, 0, BATCH), 1, pin_memory=True, kind="process")
    assert loader.pin_memory is False


def test_on_cuda_the_whole_ring_is_registered_once_and_unregistered_at_close(
        stream_data, monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA (stood in for): the region is registered page-locked in one cudaHostRegister of its address and
    whole size, portable (flag 1), with one more slot per worker; close() waits for the queued copies and
    unregisters that address; a refused registration is one warning and the slots stay pageable."""
    cudart = _FakeCudart()
    synced: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(True))
    spec, reader = stream_data
    stream = WindowStream(spec, reader, 0, BATCH)
    it = process_ring.ProcessBatches(stream, 2, prefetch=2, pin_memory=True)
    ring = it.ring
    address, size = ring.base.data_ptr(), ring.count * ring.size
    try:
        assert ring.count == 2 * 4 and size == ring.base.numel() and ring.pinned
        assert cudart.calls == [("register", address, size, 1)]
    finally:
        it.close()
    assert cudart.calls == [("register", address, size, 1), ("unregister", address)] and synced and not ring.pinned
    it.close()  # twice: nothing more
    assert len(cudart.calls) == 2

    refused = _FakeCudart(code=712)  # cudaErrorHostMemoryAlreadyRegistered, say
    monkeypatch.setattr(torch.cuda, "cudart", lambda: refused)
    with pytest.warns(UserWarning, match=r"page-locking the loader's \d+ MiB of batch slots failed \(cudaError "
                                         r"712\); batches are copied to the GPU from pageable memory"):
        it = process_ring.ProcessBatches(stream, 1, prefetch=1, pin_memory=True)
    try:
        assert not it.ring.pinned and len(refused.calls) == 1
    finally:
        it.close()
    assert len(refused.calls) == 1  # nothing to unregister
