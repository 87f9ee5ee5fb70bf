"""The scheduler layer: local threads and a dask.distributed cluster run the same tasks with the same results."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dpot_data.ingest.scheduler import Runner, SchedulerOptions, compute_in_task, scheduler_context


def _square_sum(i: int) -> tuple[int, float]:
    import dask.array as da

    arr = da.arange(i * 10, chunks=3, dtype="f8")
    return i, float(compute_in_task((arr**2).sum()))


def test_local_runner_yields_in_order_with_bounded_windows() -> None:
    seen_windows: list[int] = []
    lock = threading.Lock()
    active = [0]

    def work(i: int) -> int:
        with lock:
            active[0] += 1
            seen_windows.append(active[0])
        try:
            return i * i
        finally:
            with lock:
                active[0] -= 1

    with scheduler_context(SchedulerOptions(workers=2)) as runner:
        assert runner.workers == 2
        assert "local threaded scheduler (2 workers)" in runner.describe()
        assert list(runner.imap(work, range(11), window=3)) == [i * i for i in range(11)]
    assert max(seen_windows) <= 3


def test_distributed_runner_matches_local(cluster) -> None:
    expected = [_square_sum(i) for i in range(7)]
    with scheduler_context(SchedulerOptions(workers=2)) as local:
        got_local = list(local.imap(_square_sum, range(7)))
    with scheduler_context(SchedulerOptions(address=cluster.scheduler_address)) as remote:
        assert remote.client is not None
        assert remote.workers == 2
        assert cluster.scheduler_address in remote.describe()
        got_remote = list(remote.imap(_square_sum, range(7), window=4))
    assert got_local == expected
    assert got_remote == expected
    np.testing.assert_allclose([v for _, v in got_remote], [np.sum(np.arange(i * 10.0) ** 2) for i in range(7)])


def test_task_errors_propagate() -> None:
    def boom(i: int) -> int:
        if i == 2:
            raise RuntimeError("trajectory 2 is broken")
        return i

    with scheduler_context(SchedulerOptions(workers=2)) as runner:
        with pytest.raises(RuntimeError, match="trajectory 2 is broken"):
            list(runner.imap(boom, range(4)))


def test_bad_options_are_rejected() -> None:
    with pytest.raises(ValueError, match="--workers must be at least 1"):
        SchedulerOptions(workers=0)
    with pytest.raises(ValueError, match="--scheduler needs an address"):
        SchedulerOptions(address=" ")
    with pytest.raises(ValueError, match="window must be at least 1"):
        list(Runner(SchedulerOptions(workers=1)).imap(abs, [1], window=-1))


def test_unreachable_scheduler_is_a_clear_error() -> None:
    from dpot_data.errors import InputError

    with pytest.raises(InputError, match="cannot reach the dask scheduler at tcp://127.0.0.1:1 within 1 s"):
        with scheduler_context(SchedulerOptions(address="tcp://127.0.0.1:1", connect_timeout=1)):
            pass


def test_prefetch_computes_the_next_window_while_the_caller_works() -> None:
    import time

    started: dict[int, float] = {}

    def work(i: int) -> int:
        started[i] = time.perf_counter()
        return i

    consumed_first_window_at = None
    with scheduler_context(SchedulerOptions(workers=2)) as runner:
        out = []
        for value in runner.imap(work, range(4), window=2):
            out.append(value)
            if value == 1:
                time.sleep(0.3)  # the caller "writes" the first window
                consumed_first_window_at = time.perf_counter()
    assert out == [0, 1, 2, 3]
    assert started[2] < consumed_first_window_at and started[3] < consumed_first_window_at
    with scheduler_context(SchedulerOptions(workers=2)) as runner:
        started.clear()
        for value in runner.imap(work, range(4), window=2, prefetch=False):
            if value == 1:
                time.sleep(0.1)
                consumed_first_window_at = time.perf_counter()
    assert started[2] > consumed_first_window_at


def test_ingest_on_a_distributed_cluster_equals_local(cluster, tmp_path) -> None:
    import json

    from dpot_data.ingest import IngestOptions, run_ingest
    from tests.toy_output import write_fno_raw

    raw = write_fno_raw(tmp_path / "raw", n=12, res=32, frames=6)

    def run(out, **where):
        opts = IngestOptions(resolution=16, shard_size=100 << 10, block=2, command="test", **where)
        return run_ingest("fno", [raw], tmp_path / out, opts).manifest

    local = run("local", workers=2)
    remote = run("remote", scheduler=cluster.scheduler_address)
    for m in (local, remote):
        m.pop("created")
    assert len(local["datasets"][0]["shards"]) >= 3
    assert json.dumps(remote, sort_keys=True) == json.dumps(local, sort_keys=True)
    assert local["datasets"][0]["stats"]["trajectories"] == local["datasets"][0]["splits"]["counts"]["train"]


def test_cli_scheduler_option_runs_the_ingest_on_the_cluster(cluster, tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from dpot_data.cli import app
    from tests.toy_output import write_fno_raw

    raw = write_fno_raw(tmp_path / "raw", n=8, res=32, frames=4)
    transitions = cluster.scheduler.transition_counter
    common = ["ingest", "fno", str(raw), "--resolution", "16", "--shard-size", "60KiB", "--no-progress"]
    runner = CliRunner()
    remote = runner.invoke(app, common + ["--out", str(tmp_path / "remote"), "--scheduler", cluster.scheduler_address])
    local = runner.invoke(app, common + ["--out", str(tmp_path / "local"), "--workers", "2"])
    assert remote.exit_code == 0 and local.exit_code == 0, remote.output + local.output
    a, b = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("remote", "local"))
    assert [s["sha256"] for s in a["datasets"][0]["shards"]] == [s["sha256"] for s in b["datasets"][0]["shards"]]
    assert a["datasets"][0]["zarr"]["arrays"] == b["datasets"][0]["zarr"]["arrays"]
    assert a["datasets"][0]["stats"] == b["datasets"][0]["stats"]
    assert cluster.scheduler.transition_counter > transitions  # the blocks ran on the cluster's workers
    assert any("process_block" in name for name in cluster.scheduler.task_prefixes)
