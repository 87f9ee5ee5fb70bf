"""Thread and process loader workers: the same batches, in the same order, as no workers; worker failures reach the
consumer; an abandoned loader stops its threads or processes."""

from __future__ import annotations

import gc
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.core.config import DataConfig, TrainConfig, apply_overrides
from dpot_train.data.datasets import DataError
from dpot_train.data.prefetch import ThreadLoader, WorkerError
from dpot_train.data.process_ring import ProcessLoader
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.loader import make_loader
from dpot_train.data.stream import WindowStream

BATCH = 4


def _take(loader, n: int) -> list[dict]:
    """n batches, each copied out of the loader's memory (a process loader recycles a batch's slot at the next)."""
    it = iter(loader)
    out = [_owned(next(it)) for _ in range(n)]
    del it
    return out


def _owned(batch: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for s, (x, y) in enumerate(zip(a, b)):
        assert x["id"] == y["id"], f"step {s}"
        assert torch.equal(x["position"], y["position"]), f"step {s}"
        for k in ("x", "y", "mask", "channel_valid", "dataset"):
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, f"step {s} {k}"
            assert torch.equal(x[k], y[k]), f"step {s}: {k} differs"


def _loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("dpot-loader-")]


def _wait_no_loader_threads(timeout: float = 5.0) -> list[threading.Thread]:
    end = time.monotonic() + timeout
    while _loader_threads() and time.monotonic() < end:
        time.sleep(0.05)
    return _loader_threads()


def _loader_processes() -> list:
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.name.startswith("dpot-loader-")]


def _wait_no_loader_processes(timeout: float = 60.0) -> list:
    end = time.monotonic() + timeout
    while _loader_processes() and time.monotonic() < end:
        time.sleep(0.05)
    return _loader_processes()


@pytest.fixture(scope="module")
def stream_data(fno_train_shards: Path):
    return prepare_stream(DataConfig(manifests=[str(fno_train_shards)], verify_checksums=False), seed=5, verify=False)


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("backend", ["webdataset", "zarr"])
@pytest.mark.parametrize("start", [0, 7 * BATCH + 2])
def test_workers_give_the_zero_worker_batches_bitwise(fno_train_shards: Path, backend: str, start: int,
                                                      kind: str) -> None:
    spec, reader = prepare_stream(DataConfig(manifests=[str(fno_train_shards)], backend=backend,
                                             verify_checksums=False), seed=5, verify=False)
    steps = 7  # crosses an epoch boundary (12 visits per epoch, 4 per step) and is not a multiple of K
    direct = _take(make_loader(WindowStream(spec, reader, start, BATCH), 0), steps)
    assert [int(b["position"][0]) for b in direct] == [start + s * BATCH for s in range(steps)]
    for k in (1, 2, 3):
        loader = make_loader(WindowStream(spec, reader, start, BATCH), k, kind=kind)
        assert isinstance(loader, ThreadLoader if kind == "thread" else ProcessLoader) and loader.num_workers == k
        _same(direct, _take(loader, steps))
    assert _wait_no_loader_threads() == [] and _wait_no_loader_processes() == []


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_workers_split_over_ranks_match_one_rank(stream_data, kind: str) -> None:
    spec, reader = stream_data
    one = _take(make_loader(WindowStream(spec, reader, 0, BATCH), 2, kind=kind), 5)
    r0 = _take(make_loader(WindowStream(spec, reader, 0, BATCH, world=2, rank=0), 3, kind=kind), 5)
    r1 = _take(make_loader(WindowStream(spec, reader, 0, BATCH, world=2, rank=1), 2, kind=kind), 5)
    for a, b, c in zip(one, r0, r1):
        assert a["id"] == b["id"] + c["id"]
        assert torch.equal(a["x"], torch.cat([b["x"], c["x"]]))


def test_thread_and_process_workers_give_the_same_batches(stream_data) -> None:
    spec, reader = stream_data
    threads = _take(make_loader(WindowStream(spec, reader, 3, BATCH), 2, kind="thread"), 4)
    procs = make_loader(WindowStream(spec, reader, 3, BATCH), 2, kind="process")
    assert isinstance(procs, ProcessLoader) and procs.num_workers == 2
    _same(threads, _take(procs, 4))


def test_process_kind_falls_back_to_a_dataloader_without_fork_or_memfd(stream_data, monkeypatch) -> None:
    from dpot_train.data import process_ring

    spec, reader = stream_data
    monkeypatch.setattr(process_ring, "supported", lambda: False)
    loader = make_loader(WindowStream(spec, reader, 3, BATCH), 2, kind="process")
    assert isinstance(loader, torch.utils.data.DataLoader) and loader.num_workers == 2
    _same(_take(make_loader(WindowStream(spec, reader, 3, BATCH), 0), 3), _take(loader, 3))


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_each_iter_restarts_at_the_stream_start(stream_data, kind: str) -> None:
    spec, reader = stream_data
    loader = make_loader(WindowStream(spec, reader, 8, BATCH), 2, kind=kind)
    _same(_take(loader, 3), _take(loader, 3))


class _FailingReader:
    """Delegates to a real reader and raises on the read of one trajectory window."""

    def __init__(self, reader, bad_id: str) -> None:
        self.reader, self.bad_id = reader, bad_id

    def refs(self, ds, split):
        return self.reader.refs(ds, split)

    def read(self, ref, t0, length):
        if ref.id == self.bad_id:
            raise DataError(f"shard damaged under {ref.id}")
        return self.reader.read(ref, t0, length)


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_reader_error_reaches_the_consumer_with_its_traceback(stream_data, kind: str) -> None:
    spec, reader = stream_data
    direct = _take(make_loader(WindowStream(spec, reader, 0, BATCH), 0), 3)
    bad = direct[2]["id"][1]  # first needed by step 2, i.e. worker 0 of 2 on its second batch
    failing = _FailingReader(reader, bad)
    if bad in direct[0]["id"] + direct[1]["id"]:
        pytest.skip("the chosen trajectory is visited earlier in this stream")
    it = iter(make_loader(WindowStream(spec, failing, 0, BATCH), 2, kind=kind))
    _same(direct[:2], [_owned(next(it)), _owned(next(it))])
    with pytest.raises(WorkerError) as info:
        next(it)
    msg = str(info.value)
    assert f"loader {kind} 0 failed building step 2" in msg
    assert f"DataError: shard damaged under {bad}" in msg and "in read" in msg  # the worker's traceback
    assert isinstance(info.value.__cause__, DataError) and str(info.value.__cause__) == f"shard damaged under {bad}"
    with pytest.raises(WorkerError):  # stays failed
        next(it)
    assert _wait_no_loader_threads() == [] and _wait_no_loader_processes() == []


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_an_abandoned_loader_stops_its_workers(stream_data, kind: str) -> None:
    spec, reader = stream_data
    running = _loader_threads if kind == "thread" else _loader_processes
    it = iter(make_loader(WindowStream(spec, reader, 0, BATCH), 3, kind=kind))
    for _ in range(3):
        next(it)
    assert len(running()) == 3
    del it
    gc.collect()
    assert _wait_no_loader_threads() == [] and _wait_no_loader_processes() == []
    it = iter(make_loader(WindowStream(spec, reader, 0, BATCH), 2, kind=kind))
    next(it)
    it.close()
    with pytest.raises(StopIteration):
        next(it)
    assert _wait_no_loader_threads() == [] and _wait_no_loader_processes() == []


def test_concurrent_reads_of_one_reader_never_mix_offsets(stream_data) -> None:
    spec, reader = stream_data
    refs = spec.refs[0]
    want = {(i, t0): reader.read(refs[i], t0, 5)[0] for i in range(len(refs)) for t0 in (0, 3, 8)}
    errors: list[str] = []

    def hammer(seed: int) -> None:
        rng = np.random.default_rng(seed)
        keys = list(want)
        for j in rng.integers(0, len(keys), 60):
            i, t0 = keys[j]
            got, _ = reader.read(refs[i], t0, 5)
            if not np.array_equal(got, want[(i, t0)]):
                errors.append(f"thread {seed}: {refs[i].id} frames {t0}..")

    threads = [threading.Thread(target=hammer, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_worker_kind_config_and_errors() -> None:
    assert DataConfig().worker_kind == "thread"
    cfg = apply_overrides(TrainConfig(), {"data.worker_kind": "process", "data.num_workers": 2})
    assert cfg.data.worker_kind == "process" and TrainConfig.from_dict(cfg.to_dict()).data.worker_kind == "process"
    with pytest.raises(ValueError, match="data.worker_kind must be 'thread' or 'process', got 'fork'"):
        DataConfig(worker_kind="fork")
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0, got -1"):
        DataConfig(num_workers=-1)


def test_make_loader_rejects_unknown_kinds(stream_data) -> None:
    spec, reader = stream_data
    with pytest.raises(ValueError, match=r"unknown loader worker kind 'greenlet'; expected one of \['thread', "
                                         r"'process'\]"):
        make_loader(WindowStream(spec, reader, 0, BATCH), 2, kind="greenlet")
    assert isinstance(make_loader(WindowStream(spec, reader, 0, BATCH), 0), torch.utils.data.DataLoader)


@pytest.mark.slow
def test_launch_worker_kind_option_reaches_the_run_config(fno_train_shards: Path, tmp_path: Path) -> None:
    import sys

    import yaml

    from tests import train_runs

    base = [sys.executable, "-m", "dpot_train", "launch", "--manifest", str(fno_train_shards), "--dry-run"]
    r = train_runs.run([*base, "--out", str(tmp_path / "a"), "--num-workers", "2", "--worker-kind", "process"])
    assert r.returncode == 0, r.stderr
    saved = yaml.safe_load(r.stdout)["data"]  # the run config --dry-run prints (it writes nothing)
    assert saved["worker_kind"] == "process" and saved["num_workers"] == 2 and not (tmp_path / "a").exists()
    r = train_runs.run([*base, "--out", str(tmp_path / "b"), "--num-workers", "2"])
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["data"]["worker_kind"] == "thread"
    r = train_runs.run([*base, "--out", str(tmp_path / "c"), "--worker-kind", "fork"])
    assert r.returncode == 2 and "data.worker_kind must be 'thread' or 'process', got 'fork'" in r.stderr


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_interpreter_exits_with_a_loader_still_running(fno_train_shards: Path, kind: str) -> None:
    import subprocess
    import sys

    code = ("from dpot_train.core.config import DataConfig\n"
            "from dpot_train.data.prepare import prepare_stream\n"
            "from dpot_train.data.loader import make_loader\n"
            "from dpot_train.data.stream import WindowStream\n"
            f"spec, reader = prepare_stream(DataConfig(manifests=[{str(fno_train_shards)!r}]), seed=0, verify=False)\n"
            f"it = iter(make_loader(WindowStream(spec, reader, 0, 4), 3, kind={kind!r}))\n"
            "print(next(it)['id'])\n")  # exits holding the iterator, its workers blocked on full queues or rings
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("['fno-ns-v1e-3:")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["thread", "process"])
def test_training_with_loader_workers_is_bitwise_the_run_without_workers(
        fno_train_shards: Path, tmp_path_factory: pytest.TempPathFactory, kind: str) -> None:
    import json

    from tests import train_runs

    reference = train_runs.uninterrupted_run(fno_train_shards, tmp_path_factory.mktemp("runs"))  # 0 workers
    out = tmp_path_factory.mktemp(kind) / "run"
    r = train_runs.run(train_runs.launch_args(fno_train_shards, out, "--audit", "--num-workers", "2",
                                              "--worker-kind", kind, "--no-eval"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    final = f"step-{train_runs.STEPS:08d}.pt"
    a = torch.load(reference / "checkpoints" / final, weights_only=True)
    b = torch.load(out / "checkpoints" / final, weights_only=True)
    assert b["train_config"]["data"]["num_workers"] == 2 and b["train_config"]["data"]["worker_kind"] == kind
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["loader"] == b["loader"]
    la = [json.loads(x)["loss"] for x in (reference / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert la == lb and len(lb) == train_runs.STEPS
    for rank in range(train_runs.NPROC):
        name = f"audit/rank-{rank}.jsonl"
        assert (reference / name).read_text() == (out / name).read_text() != ""
