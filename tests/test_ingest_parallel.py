"""How ingest work is spread: tasks streamed to free workers in order, chunks stored by the tasks, and on a cluster
blocks handed over as files when the workers see the staging folder, sent back otherwise, with the same output."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dpot_data.ingest import IngestOptions, run_ingest
from dpot_data.ingest.task import BlockResult, spill, unspill
from dpot_data.ingest.scheduler import Runner, SchedulerOptions, scheduler_context
from dpot_format.names import is_temporary
from tests.toy_output import write_fno_raw


def test_a_slow_task_does_not_hold_back_the_next_ones() -> None:
    """Streaming: while task 0 runs, the other worker goes on through 1, 2, 3 (in windows of two, 2 and 3 would
    wait for 0): task 0 is held until task 3 starts. Results still come in order, never more than `window` at once."""
    running, peak = [0], [0]
    lock = threading.Lock()
    third_started = threading.Event()
    released: list[bool] = []

    def work(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            if i == 3:
                third_started.set()
            if i == 0:
                released.append(third_started.wait(10))  # False: task 3 only started after task 0 gave up
            return i
        finally:
            with lock:
                running[0] -= 1

    with scheduler_context(SchedulerOptions(workers=2)) as runner:
        assert list(runner.imap(work, range(6), window=2)) == list(range(6))
    assert released == [True]
    assert peak[0] == 2


def test_shared_argument_reaches_every_task(cluster) -> None:
    with scheduler_context(SchedulerOptions(address=cluster.scheduler_address)) as remote:
        assert list(remote.imap(pow, range(5), shared=3)) == [3 ** i for i in range(5)]
    assert list(Runner(SchedulerOptions(workers=2)).imap(pow, range(5), shared=2)) == [2 ** i for i in range(5)]


def test_workers_that_see_a_folder_are_told_apart(cluster, tmp_path, monkeypatch) -> None:
    assert Runner(SchedulerOptions(workers=1)).sees(tmp_path)
    with scheduler_context(SchedulerOptions(address=cluster.scheduler_address)) as remote:
        assert remote.sees(tmp_path)
        monkeypatch.setattr(remote.client, "run", lambda fn, path: {"a": True, "b": False})
        assert not remote.sees(tmp_path)
    assert list(tmp_path.iterdir()) == []  # the probe is removed


def test_a_spilled_block_comes_back_with_its_values_and_leaves_no_file(tmp_path) -> None:
    rng = np.random.default_rng(0)
    fields = rng.standard_normal((3, 4, 2, 5, 6)).astype(np.float32)
    mask = (rng.random((3, 5, 6)) > 0.5).astype(np.uint8)
    block = spill(BlockResult(fields, mask, None, []), str(tmp_path), "block-0")
    assert block.fields is None and block.mask is None
    assert (tmp_path / "block-0").stat().st_size == fields.nbytes + mask.nbytes
    back = unspill(block)
    np.testing.assert_array_equal(back.fields, fields)
    np.testing.assert_array_equal(back.mask, mask)
    assert list(tmp_path.iterdir()) == []


def _ingest(raw: Path, out: Path, **where) -> dict:
    opts = IngestOptions(resolution=16, shard_size=100 << 10, block=2, command="test", **where)
    manifest = run_ingest("fno", [raw], out, opts).manifest
    manifest.pop("created")
    assert not [p for p in out.rglob("*") if is_temporary(p.name)]  # no spill folder, block file or probe left
    return manifest


def test_cluster_output_is_the_same_whether_blocks_travel_as_files_or_over_the_network(cluster, tmp_path,
                                                                                         monkeypatch) -> None:
    raw = write_fno_raw(tmp_path / "raw", n=10, res=32, frames=6)
    import dpot_data.ingest.run as run_module

    handed: list[bool] = []

    def counting_unspill(block):
        handed.append(block.spilled is not None)
        return unspill(block)

    monkeypatch.setattr(run_module, "unspill", counting_unspill)
    local = _ingest(raw, tmp_path / "local", workers=2)
    assert handed and not any(handed)  # local threads hand blocks over in memory
    handed.clear()
    shared = _ingest(raw, tmp_path / "shared", scheduler=cluster.scheduler_address)
    assert handed and all(handed)  # the workers see the staging folder: every block came as a file
    handed.clear()
    monkeypatch.setattr(Runner, "sees", lambda self, folder: False)
    apart = _ingest(raw, tmp_path / "apart", scheduler=cluster.scheduler_address)
    assert handed and not any(handed)
    assert json.dumps(shared, sort_keys=True) == json.dumps(local, sort_keys=True)
    assert json.dumps(apart, sort_keys=True) == json.dumps(local, sort_keys=True)
    chunks = sorted(p.relative_to(tmp_path / "local") for p in (tmp_path / "local").rglob("c.*"))
    assert chunks and chunks == sorted(p.relative_to(tmp_path / "shared") for p in (tmp_path / "shared").rglob("c.*"))
    for rel in chunks:
        assert (tmp_path / "local" / rel).read_bytes() == (tmp_path / "shared" / rel).read_bytes()


def test_input_hashes_start_early_name_each_file_once_and_stop_when_closed(tmp_path) -> None:
    import hashlib
    from concurrent.futures import CancelledError

    from dpot_data.ingest import InputHashes
    from dpot_format.io import sha256_file

    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    a.write_bytes(b"a" * 1000)
    b.write_bytes(b"b" * (9 << 20))  # more than one read piece
    with InputHashes([a, tmp_path / "." / "a.h5", tmp_path]) as hashes:  # the same file twice, and a folder
        assert len(hashes._futures) == 1
        got = hashes.entries([b, a])
    assert got == [{"path": str(p.resolve()), "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                    "bytes": p.stat().st_size} for p in (b, a)]
    stop = threading.Event()
    stop.set()
    with pytest.raises(CancelledError, match="b.h5: hashing cancelled"):
        sha256_file(b, cancel=stop)


def test_a_cluster_keeps_no_result_the_caller_has_taken(cluster) -> None:
    """Results stay in the workers' memory only while a future refers to them: a long ingest on a cluster must not
    pile up every block it already wrote."""
    def held() -> int:
        return sum(1 for t in cluster.scheduler.tasks.values() if t.state == "memory")

    seen = []
    with scheduler_context(SchedulerOptions(address=cluster.scheduler_address)) as remote:
        for i, value in enumerate(remote.imap(pow, range(12), window=1, shared=2)):
            seen.append(value)
            if i == 8:
                deadline = time.monotonic() + 5
                while held() > 3 and time.monotonic() < deadline:  # releases reach the scheduler asynchronously
                    time.sleep(0.05)
                assert held() <= 3  # at most 2 x window results not taken yet, and the shared argument
    assert seen == [2 ** i for i in range(12)]
