"""Downloads from object storage: range GETs reassemble the object, retryable errors are retried a bounded number of
times, and what cannot be fetched fails with one line naming the URL (no server needed: a scripted filesystem)."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from dpot_train.data.remote_fetch import FetchError, FetchPlan, RetryPolicy, fetch_into, is_retryable

FAST = RetryPolicy(attempts=3, base_s=0.001, max_s=0.002)


class ScriptedFS:
    """cat_file over one object; `errors` are raised by the first calls, in order."""

    def __init__(self, data: bytes, errors: list[BaseException] | None = None) -> None:
        self.data, self.errors, self.calls = data, list(errors or []), []

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        self.calls.append((start, end))
        if self.errors:
            raise self.errors.pop(0)
        return self.data[start:end]


def _fetch(tmp_path: Path, fs: ScriptedFS, size: int, plan: FetchPlan) -> tuple[str, bytes]:
    out = tmp_path / "obj"
    fd = os.open(out, os.O_RDWR | os.O_CREAT)
    try:
        digest = fetch_into("s3://bucket/shard.tar", fd, size, plan, filesystem=lambda url: (fs, url))
    finally:
        os.close(fd)
    return digest, out.read_bytes()


def test_concurrent_range_gets_reassemble_the_object_in_order(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    fs = ScriptedFS(data)
    digest, got = _fetch(tmp_path, fs, len(data), FetchPlan(part=1024, range_from=4096, concurrency=3, policy=FAST))
    assert got == data and digest == hashlib.sha256(data).hexdigest()
    assert sorted(fs.calls) == [(a, min(a + 1024, 10_000)) for a in range(0, 10_000, 1024)]
    small = ScriptedFS(data[:100])
    _fetch(tmp_path, small, 100, FetchPlan(range_from=4096, policy=FAST))
    assert small.calls == [(None, None)]  # a small object: one whole-object GET


def test_throttling_and_server_errors_are_retried_then_succeed(tmp_path: Path) -> None:
    data = b"x" * 500
    fs = ScriptedFS(data, [OSError(errno.EBUSY, "503 Service Unavailable"), TimeoutError("read timed out")])
    digest, got = _fetch(tmp_path, fs, 500, FetchPlan(policy=FAST))
    assert got == data and len(fs.calls) == 3


def test_retries_run_out_with_one_line_naming_the_url(tmp_path: Path) -> None:
    fs = ScriptedFS(b"x", [OSError("An error occurred (SlowDown): Please reduce\nyour request rate")] * 5)
    with pytest.raises(FetchError) as err:
        _fetch(tmp_path, fs, 1, FetchPlan(policy=FAST))
    msg = str(err.value)
    assert msg.startswith("s3://bucket/shard.tar: download failed after 3 attempts") and "\n" not in msg
    assert len(fs.calls) == 3


def test_missing_objects_and_refused_access_are_not_retried(tmp_path: Path) -> None:
    for exc in (FileNotFoundError("no such key"), PermissionError("Access Denied")):
        fs = ScriptedFS(b"x", [exc])
        with pytest.raises(FetchError, match=r"^s3://bucket/shard.tar: download failed: "):
            _fetch(tmp_path, fs, 1, FetchPlan(policy=FAST))
        assert len(fs.calls) == 1


def test_a_shorter_object_than_the_manifest_says_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="holds 10 bytes, the manifest says 12"):
        _fetch(tmp_path, ScriptedFS(b"0123456789"), 12, FetchPlan(policy=FAST))
    with pytest.raises(FetchError, match="shorter than the 9000 bytes"):
        _fetch(tmp_path, ScriptedFS(b"0" * 8000), 9000, FetchPlan(part=1024, range_from=2048, policy=FAST))


def test_retryable_classification() -> None:
    class ClientError(Exception):
        def __init__(self, code: int) -> None:
            super().__init__("boom")
            self.response = {"ResponseMetadata": {"HTTPStatusCode": code}}

    assert is_retryable(ClientError(429)) and is_retryable(ClientError(503)) and not is_retryable(ClientError(403))
    assert is_retryable(ConnectionResetError()) and not is_retryable(FileNotFoundError("x"))


def test_the_worker_reports_a_failed_download_on_one_line() -> None:
    from dpot_train.data.prefetch import WorkerError
    from dpot_train.run.worker import fetch_failure

    err = FetchError("s3://b/x.tar: download failed after 6 attempts (last: OSError: 503)")
    wrapped = WorkerError("loader thread 0 failed building step 3:\nTraceback ...")
    wrapped.__cause__ = err
    assert fetch_failure(wrapped) == str(err)
    from_process = FetchError("Caught FetchError in DataLoader worker process 0.\nOriginal Traceback:\n  File x\n"
                              f"dpot_train.data.remote_fetch.FetchError: {err}\n")
    assert fetch_failure(from_process) == str(err)
    assert fetch_failure(ValueError("other")) is None


def test_the_worker_reports_a_broken_cache_folder_on_one_line() -> None:
    from dpot_train.data.cache import CacheError
    from dpot_train.data.prefetch import WorkerError
    from dpot_train.run.worker import fetch_failure

    err = CacheError("--cache-dir /scratch/cache: the disk is full while caching s3://b/x.tar (No space left on "
                     "device); free space there, or lower --cache-limit (now 1024 bytes) below its free space")
    wrapped = WorkerError("loader thread 1 failed building step 0:\nTraceback ...")
    wrapped.__cause__ = err
    assert fetch_failure(wrapped) == str(err)
    from_process = CacheError("Caught CacheError in DataLoader worker process 1.\nOriginal Traceback:\n  File x\n"
                              f"dpot_train.data.cache.CacheError: {err}\n")
    assert fetch_failure(from_process) == str(err)


def test_retries_end_when_the_budget_is_spent_with_one_line(tmp_path: Path) -> None:
    fs = ScriptedFS(b"x", [TimeoutError()] * 10_000)
    plan = FetchPlan(policy=RetryPolicy(attempts=10_000, base_s=0.01, max_s=0.02, timeout_s=1.0, budget_s=0.2))
    with pytest.raises(FetchError) as err:
        _fetch(tmp_path, fs, 1, plan)
    msg = str(err.value)
    assert msg.startswith("s3://bucket/shard.tar: download failed: no success within the budget of 0.2 s (")
    assert "last: TimeoutError: no answer within " in msg and "\n" not in msg and 1 < len(fs.calls) < 10_000


def test_the_budget_and_timeout_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPOT_FETCH_TIMEOUT_S", "7.5")
    monkeypatch.setenv("DPOT_FETCH_BUDGET_S", "90")
    assert RetryPolicy().limits() == (7.5, 90.0) and RetryPolicy(timeout_s=1, budget_s=2).limits() == (1, 2)
    monkeypatch.delenv("DPOT_FETCH_TIMEOUT_S")
    monkeypatch.delenv("DPOT_FETCH_BUDGET_S")
    assert RetryPolicy().limits() == (60.0, 300.0)
    for bad in ("soon", "0", "-3", "inf", "nan"):
        monkeypatch.setenv("DPOT_FETCH_BUDGET_S", bad)
        with pytest.raises(FetchError) as err:
            RetryPolicy().limits()
        assert str(err.value) == f"$DPOT_FETCH_BUDGET_S: expected a number of seconds > 0, got {bad!r}"


def test_a_failed_download_in_a_loader_worker_process_is_reported_as_its_own_line(tmp_path: Path, monkeypatch,
                                                                                  capsys) -> None:
    """torch re-raises a worker process's FetchError with the worker's traceback as its message: the training
    process prints the download's own line, not the traceback joined into one."""
    from dpot_train.train import trainer
    from dpot_train.run import worker
    from dpot_train.core.config import TrainConfig, save_config

    cfg = tmp_path / "config.yaml"
    save_config(TrainConfig(out=str(tmp_path)), cfg)
    line = "s3://b/x.tar: download failed after 6 attempts (last: OSError: [Errno 16] 503 Service Unavailable)"

    def train(*args: object, **kwargs: object) -> None:
        raise FetchError("Caught FetchError in DataLoader worker process 0.\nOriginal Traceback (most recent call "
                         f"last):\n  File \"x\", line 1, in f\ndpot_train.data.remote_fetch.FetchError: {line}\n")

    monkeypatch.setattr(trainer, "train", train)
    assert worker.main(["--config", str(cfg)]) == worker.REPORTED
    assert capsys.readouterr().err == f"error: {line}\n"


def test_an_hf_url_with_hub_offline_mode_is_one_line(tmp_path: Path) -> None:
    """`ingest auto hf://...` with HF_HUB_OFFLINE=1: one line naming the URL and the offline mode, exit 2, nothing
    written (huggingface_hub's OfflineModeIsEnabled was a traceback)."""
    import subprocess
    import sys

    url = "hf://datasets/nobody/nothing/x.h5"
    out = tmp_path / "out"
    proc = subprocess.run([str(Path(sys.executable).parent / "dpot-data"), "ingest", "auto", url, "--out", str(out),
                           "--no-progress"], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf")))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {url}: cannot be reached: HF_HUB_OFFLINE=1 is set; expected a local copy of the file, or "
        "HF_HUB_OFFLINE unset to download it"], proc.stderr
    assert not out.exists()
