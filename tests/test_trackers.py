"""`launch --tracker mlflow|wandb`: rank 0 mirrors metrics.jsonl (same names, steps and values) and eval.json's
scalars. One short CPU launch per tracker, read back with the tool's own client (MLflow's file store) or from the
offline W&B run's transaction log (its records parsed with wandb.proto); plus the missing-package error, the option
parsing, a --resume continuing the same tracker run, and a tracker failure that leaves metrics.jsonl whole. A
resume leaves each step once in the tracker's history: fake trackers killed after, in the middle of, or without
keeping a flush; MLflow and offline W&B in-process; one two-process launch killed past a checkpoint, then resumed."""

from __future__ import annotations

import inspect
import json
import math
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dpot_train.cli import app as train_app
from dpot_train.core.config import TrainConfig
from dpot_train.integrations import trackers as trackers_module
from dpot_train.integrations.trackers import (INSTALL, STATE_NAME, Held, TrackerError, Trackers, open_trackers,
                                              read_state, tracker_names, wandb_history_steps)
from dpot_train.train.log import eval_scalars
from tests import train_runs
from tests.test_readme_path import ROOT, bash_blocks

STEPS = 6


def _metrics(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _launch(shards: Path, out: Path, tracker: str, nproc: int) -> None:
    """A short CPU run (tiny model, STEPS steps, a log line every 2) with --tracker."""
    args = train_runs.launch_args(shards, out, "--tracker", tracker, steps=STEPS, nproc=nproc)
    args[args.index("--log-every") + 1] = "2"
    r = train_runs.run(args, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "warning: --tracker" not in r.stderr, r.stderr[-3000:]
    assert yaml.safe_load((out / "config.yaml").read_text())["tracker"] == [tracker]


def _assert_mirrors(run: Path, history: dict[str, list[tuple[int, float]]], steps: int = STEPS,
                    redone: frozenset[int] = frozenset()) -> None:
    """Every scalar of every metrics.jsonl line is in `history` (name -> [(step, value)]) at its step, once, with the
    same value; nothing else is there but eval.json's scalars, at the final step. At the `redone` steps of a resume,
    samples_per_s (a timing) is the attempt's that sent it first."""
    lines = _metrics(run)
    assert [x["step"] for x in lines] == list(range(1, steps + 1))
    expected: dict[str, list[tuple[int, float]]] = {}
    for line in lines:
        for key, value in line.items():
            if key != "step":
                expected.setdefault(key, []).append((line["step"], value))
    assert {"loss", "lr", "grad_norm", "epoch", "samples_per_s"} <= set(expected)
    evals = eval_scalars(json.loads((run / "eval.json").read_text()))
    assert "eval/fno-ns-v1e-3/model/one_step_l2re" in evals and "eval/fno-ns-v1e-3/model/rollout_l2re" in evals
    for key, value in evals.items():
        expected[key] = [(steps, value)]
    assert sorted(history) == sorted(expected)
    for key, points in expected.items():
        got = sorted(history[key])
        assert [s for s, _ in got] == [s for s, _ in points], key
        assert all(_close(a, b) or (key == "samples_per_s" and s in redone)
                   for (s, a), (_, b) in zip(got, points)), (key, got, points)


@pytest.mark.slow
def test_readme_mlflow_block_mirrors_every_metrics_line_and_the_eval_scalars(
        fno_train_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's "Experiment trackers" block, run verbatim in a fresh folder (STEPS=12: log lines at steps 10 and
    12, two processes) and read back with MLflow's client."""
    blocks = bash_blocks((ROOT / "README.md").read_text(encoding="utf-8"), "Experiment trackers")
    assert len(blocks) == 1 and "--tracker mlflow" in blocks[0]
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # `.venv/bin/...` as in a checkout
    (tmp_path / "shards").symlink_to(fno_train_shards)
    env = {**train_runs.env(), "STEPS": "12"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + blocks[0]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "warning: --tracker" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    out = tmp_path / "tracked"
    assert yaml.safe_load((out / "config.yaml").read_text())["tracker"] == ["mlflow"]

    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it to open a file store
    uri = f"file://{tmp_path}/mlruns"
    state = json.loads((out / STATE_NAME).read_text())["mlflow"]
    assert state["tracking_uri"] == uri
    client = MlflowClient(tracking_uri=uri)
    found = client.get_run(state["run_id"])
    assert found.info.status == "FINISHED" and found.info.run_name == "tracked"
    assert client.get_experiment(found.info.experiment_id).name == "dpot"
    assert len(client.search_runs([found.info.experiment_id])) == 1  # rank 1 opened none
    assert found.data.params["steps"] == "12" and found.data.params["tracker"] == "['mlflow']"
    history = {key: [(m.step, m.value) for m in client.get_metric_history(state["run_id"], key)]
               for key in found.data.metrics}
    _assert_mirrors(out, history, 12)


_LOG_BLOCK, _LOG_HEADER = 32768, 7  # the .wandb file: LevelDB's log format (records in 32 KiB blocks)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """The protobuf Records of a .wandb transaction log, each record's CRC checked: a file header (":W&B", 0xBEE1,
    version 0), then chunks with a 7-byte header (CRC32 of type + data, length, type) that never straddle a 32 KiB
    block (a shorter block tail is zero padding); a record too long for one chunk is FIRST, MIDDLE..., LAST."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:_LOG_HEADER] == struct.pack("<4sHB", b":W&B", 0xBEE1, 0), data[:_LOG_HEADER]
    records, parts, pos = [], b"", _LOG_HEADER
    while pos + _LOG_HEADER <= len(data):
        tail = _LOG_BLOCK - pos % _LOG_BLOCK
        if tail < _LOG_HEADER:
            pos += tail
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        body = data[pos + _LOG_HEADER:pos + _LOG_HEADER + length]
        pos += _LOG_HEADER + length
        if kind == 0 and length == 0:  # the rest of a block that was never written
            continue
        assert zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, f"bad CRC at {pos}"
        parts += body
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


@pytest.mark.slow
def test_wandb_offline_run_holds_every_metrics_line_and_the_eval_scalars(fno_train_shards: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                       "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_X_DISABLE_STATS": "true",
                       "WANDB_X_DISABLE_MACHINE_INFO": "true", "WANDB_PROJECT": "from-env"}.items():
        monkeypatch.setenv(key, value)  # offline: no network; no git, code, system or machine probes
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "run"
    _launch(fno_train_shards, out, "wandb", nproc=1)

    state = json.loads((out / STATE_NAME).read_text())["wandb"]
    assert state["project"] == "from-env"  # no --tracker-project: $WANDB_PROJECT
    logs = list((tmp_path / "wandb").glob(f"offline-run-*-{state['id']}/run-{state['id']}.wandb"))
    assert len(logs) == 1, sorted(p.name for p in (tmp_path / "wandb").iterdir())
    assert not (out / "wandb").exists()  # $WANDB_DIR wins over the run folder
    records = wandb_records(logs[0])
    run_record = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run_record.display_name == "run" and run_record.run_id == state["id"]
    assert next(r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit") == 0
    history: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for key, value in row.items():
                if not key.startswith("_"):  # wandb's own _step, _runtime, _timestamp
                    history.setdefault(key, []).append((int(row["_step"]), float(value)))
    _assert_mirrors(out, history)


def test_a_missing_tracker_package_stops_launch_with_one_line(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails, as where it is not installed
    out = tmp_path / "run"
    result = CliRunner().invoke(train_app, ["launch", "--manifest", str(tmp_path / "shards"), "--out", str(out),
                                            "--tracker", "mlflow,wandb", "--device", "cpu"])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines == [f"error: --tracker wandb: the wandb package is not installed; {INSTALL}"], result.output
    assert not out.exists()  # stopped before RUN_DIR was touched


def test_tracker_names_options_and_config() -> None:
    assert tracker_names("wandb,mlflow") == ["wandb", "mlflow"]
    assert tracker_names(["MLflow", "wandb", "mlflow"]) == ["mlflow", "wandb"]
    assert tracker_names("none") == tracker_names(None) == tracker_names([]) == []
    with pytest.raises(TrackerError, match=r"^tracker: expected wandb, mlflow or none, got 'tensorboard'$"):
        tracker_names("mlflow,tensorboard")
    cfg = TrainConfig.from_dict({"tracker": "mlflow", "tracker_project": "p"})
    assert cfg.tracker == ["mlflow"] and cfg.to_dict()["tracker"] == ["mlflow"]
    assert TrainConfig().tracker == [] and TrainConfig.from_dict(cfg.to_dict()).tracker == ["mlflow"]
    with pytest.raises(ValueError, match=r"^tracker: expected a string or a list of strings, got 3$"):
        TrainConfig.from_dict({"tracker": 3})
    from dpot_train.cli_train import launch_cmd, launch_overrides

    given = {name: p.default.default if hasattr(p.default, "default") else p.default
             for name, p in inspect.signature(launch_cmd).parameters.items()}
    assert launch_overrides(given)["tracker"] is None  # not given: a resume keeps the run's trackers
    given.update(tracker=["wandb", "mlflow"], tracker_project="proj")
    over = launch_overrides(given)
    assert over["tracker"] == ["wandb", "mlflow"] and over["tracker_project"] == "proj"


def _mlflow_cfg(run: Path) -> TrainConfig:
    return TrainConfig(out=str(run), tracker=["mlflow"], tracker_project="resume-check")


def _mlflow_first_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, Trackers]:
    """An MLflow file store under tmp_path (its URI in MLFLOW_TRACKING_URI), an empty RUN_DIR and the first
    attempt's trackers opened there: (RUN_DIR, the store's URI, the trackers)."""
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    run.mkdir()
    return run, uri, open_trackers(_mlflow_cfg(run), run, resume=False)


def test_mlflow_resume_continues_the_stored_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, uri, first = _mlflow_first_attempt(tmp_path, monkeypatch)
    first.log({"loss": 0.5}, 1)
    first.flush()
    first.finish(failed=True)  # killed: the resume marks it running, then finished
    run_id = json.loads((run / STATE_NAME).read_text())["mlflow"]["run_id"]

    again = open_trackers(_mlflow_cfg(run), run, resume=True)
    again.log({"loss": 0.25}, 2)
    again.finish()
    assert json.loads((run / STATE_NAME).read_text())["mlflow"]["run_id"] == run_id
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")] == [(1, 0.5), (2, 0.25)]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert client.get_experiment_by_name("resume-check") is not None

    fresh = open_trackers(_mlflow_cfg(run), run, resume=False)  # not a resume: a new tracker run
    fresh.finish()
    assert json.loads((run / STATE_NAME).read_text())["mlflow"]["run_id"] != run_id


def test_mlflow_defaults_to_a_file_store_in_the_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    run.mkdir()
    trackers = open_trackers(TrainConfig(out=str(run), tracker=["mlflow"]), run, resume=False)
    trackers.log({"loss": 2.0}, 3)
    trackers.finish()
    state = json.loads((run / STATE_NAME).read_text())["mlflow"]
    assert state["tracking_uri"] == (run / "mlruns").as_uri()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=state["tracking_uri"])
    assert client.get_experiment(client.get_run(state["run_id"]).info.experiment_id).name == "dpot"
    assert [(m.step, m.value) for m in client.get_metric_history(state["run_id"], "loss")] == [(3, 2.0)]


def test_wandb_resume_reuses_the_stored_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
                       "WANDB_DISABLE_CODE": "true", "WANDB_X_DISABLE_STATS": "true",
                       "WANDB_X_DISABLE_MACHINE_INFO": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    cfg = TrainConfig(out=str(run), tracker=["wandb"])
    for resume in (False, True):
        t = open_trackers(cfg, run, resume=resume)
        assert list(t.open) == ["wandb"]
        t.log({"loss": 1.0}, 1 + resume)
        t.finish()
    run_id = json.loads((run / STATE_NAME).read_text())["wandb"]["id"]
    logs = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))  # the run folder: no $WANDB_DIR
    assert len(logs) == 2 and all(p.name == f"run-{run_id}.wandb" for p in logs), logs


class _Broken:
    """A tracker whose server went away: every call raises."""

    state: dict[str, Any] = {}

    def __init__(self) -> None:
        self.calls = 0

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.calls += 1
        raise ConnectionError("server unreachable\nretries exhausted")

    def flush(self) -> None:
        raise ConnectionError("server unreachable")

    def finish(self, failed: bool = False) -> None:
        raise ConnectionError("server unreachable")


class _Kept:
    state: dict[str, Any] = {}

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.flushes = 0
        self.finished = False

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.steps.append(step)

    def flush(self) -> None:
        self.flushes += 1

    def finish(self, failed: bool = False) -> None:
        self.finished = True


class _Writer:
    def add_scalar(self, *args: Any) -> None:
        pass


def test_a_failing_tracker_is_one_warning_and_metrics_jsonl_stays_whole(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    from dpot_train.train.log import _flush, _StepLog

    broken, kept = _Broken(), _Kept()
    trackers = Trackers({"mlflow": broken, "wandb": kept})
    cfg = TrainConfig(steps=4, log_every=2, batch_size=2)
    log = _StepLog(cfg, 8, tmp_path / "metrics.jsonl", _Writer(), None, trackers)
    for steps in ([1, 2], [3, 4]):  # two log steps, each reading back its pending steps
        _flush([(s, 2 * s, 1e-3, torch.tensor(1.0 / s), torch.tensor(0.5)) for s in steps], log)
    trackers.finish()
    assert [x["step"] for x in _metrics(tmp_path)] == [1, 2, 3, 4]
    assert broken.calls == 1 and kept.steps == [1, 2, 3, 4] and kept.flushes == 2 and kept.finished
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert warnings == ["warning: --tracker mlflow: logging step 1 failed (ConnectionError: server unreachable "
                        "retries exhausted); it receives nothing more from this run, metrics.jsonl is unaffected"]


def test_a_tracker_that_cannot_start_is_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "no-such-scheme://nowhere")
    run = tmp_path / "run"
    run.mkdir()
    trackers = open_trackers(TrainConfig(out=str(run), tracker=["mlflow"]), run, resume=False)
    assert trackers.open == {}
    trackers.log({"loss": 1.0}, 1)
    trackers.finish()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("warning: --tracker mlflow: could not start (") and \
        err[0].endswith("); training goes on without it"), err
    assert not (run / STATE_NAME).exists()


def test_trackers_json_that_cannot_be_written_is_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "run"
    (run / STATE_NAME).mkdir(parents=True)  # a folder where the file goes: the write fails
    trackers = open_trackers(TrainConfig(out=str(run), tracker=["mlflow"]), run, resume=False)
    assert list(trackers.open) == ["mlflow"]  # the tracking itself goes on
    trackers.finish()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"warning: {run / STATE_NAME}: cannot record the tracker runs ("), err


# --- a resume leaves each step once in the tracker's history -------------------------------------------------


class _Killed(BaseException):
    """The process dies here (a SIGKILL): nothing after this point runs."""


class _Store(list):
    """A fake tracker's durable store: every (name, step, value) it kept, in order."""

    def once(self) -> dict[tuple[str, int], float]:
        """{(name, step): value}, asserting that no (name, step) came twice."""
        keys = [(n, s) for n, s, _ in self]
        assert len(keys) == len(set(keys)), sorted(k for k in keys if keys.count(k) > 1)
        return {(n, s): v for n, s, v in self}


class _Fake:
    """A tracker that buffers until flush, as MLflowTracker does, and reads its store back. `kept`: only the first
    that many flushes reach the store (then only finish), as wandb writes its .wandb file every 15 s: a kill loses
    the rest. `die_after`: that many items of the next flush reach the store, then the process dies."""

    def __init__(self, store: _Store, kept: int | None = None) -> None:
        self.store, self.kept = store, kept
        self.die_after: int | None = None
        self.pending: list[tuple[str, int, float]] = []
        self.unkept: list[tuple[str, int, float]] = []
        self.flushes = 0
        self.state = {"id": "fake"}

    def held(self) -> Held:
        steps: dict[str, int] = {}
        for name, step, _ in self.store:
            steps[name] = max(steps.get(name, 0), step)
        return Held(steps=steps)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.pending += [(k, step, v) for k, v in scalars.items()]

    def flush(self) -> None:
        self.unkept += self.pending
        self.pending = []
        if self.die_after is not None:
            self.store.extend(self.unkept[:self.die_after])
            raise _Killed
        self.flushes += 1
        if self.kept is None or self.flushes <= self.kept:
            self.store.extend(self.unkept)
            self.unkept = []

    def finish(self, failed: bool = False) -> None:
        self.kept = None
        self.flush()


def _value(name: str, step: int) -> float:
    """The value a step logs: the same in every attempt (the resume contract)."""
    return float(len(name) * 1000 + step)


def _line(step: int) -> dict[str, float]:
    return {name: _value(name, step) for name in ("loss", "lr")}


def _steps(run: Path, trackers: Trackers, first: int, last: int, flush_every: int = 2) -> None:
    """Steps first..last as _StepLog records them: the metrics.jsonl line, then the trackers' copy; a flush at each
    log step."""
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        for step in range(first, last + 1):
            f.write(json.dumps({"step": step, **_line(step)}) + "\n")
            f.flush()
            trackers.log(_line(step), step)
            if step % flush_every == 0:
                trackers.flush()


def _resume(monkeypatch: pytest.MonkeyPatch, run: Path, tracker: _Fake, checkpoint: int) -> Trackers:
    """`launch --resume` from the checkpoint at `checkpoint`: metrics.jsonl cut back to it (as TrainLog does), the
    trackers opened with resume=True and sent the lines they lack."""
    from dpot_train.train.log import _truncate_jsonl

    _truncate_jsonl(run / "metrics.jsonl", checkpoint)
    trackers = _open_fake(monkeypatch, run, tracker, resume=True)
    trackers.backfill(run / "metrics.jsonl", checkpoint)
    return trackers


def _open_fake(monkeypatch: pytest.MonkeyPatch, run: Path, tracker: _Fake, resume: bool) -> Trackers:
    monkeypatch.setitem(trackers_module._KINDS, "mlflow", lambda cfg, run_dir, stored: tracker)
    return open_trackers(TrainConfig(out=str(run), tracker=["mlflow"]), run, resume=resume)


def _expected(last: int, evals: dict[str, float] | None = None) -> dict[tuple[str, int], float]:
    out = {(name, s): v for s in range(1, last + 1) for name, v in _line(s).items()}
    out.update({(name, last): value for name, value in (evals or {}).items()})
    return out


def test_resume_sends_only_the_steps_the_tracker_does_not_hold(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed right after the flush at step 4 (step 5 buffered), resumed from the checkpoint at step 2: steps 3-4
    are redone and not sent again, 5-8 are sent; the eval scalars at the final step once, also when the finished
    run is resumed again (only the evaluation is repeated; a scalar new to the tracker is sent)."""
    store = _Store()
    first = _open_fake(monkeypatch, tmp_path, _Fake(store), resume=False)
    _steps(tmp_path, first, 1, 5)  # then SIGKILL: no finish
    again = _resume(monkeypatch, tmp_path, _Fake(store), 2)
    _steps(tmp_path, again, 3, 8)
    evals = {"eval/a/model/rollout_l2re": 0.25, "eval/a/trajectories": 2.0}
    again.log(evals, 8)
    again.finish()
    assert store.once() == _expected(8, evals)

    finished = _resume(monkeypatch, tmp_path, _Fake(store), 8)
    finished.log({**evals, "eval/a/model/one_step_l2re": 0.5}, 8)
    finished.finish()
    assert store.once() == _expected(8, {**evals, "eval/a/model/one_step_l2re": 0.5})


def test_steps_the_tracker_never_kept_are_sent_from_metrics_jsonl(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool that keeps what it is sent only now and then (wandb's .wandb file, every 15 s) is killed having kept
    steps 1-2 of the 1-6 it was sent and flushed: the resume from the checkpoint at step 4 sends 3-4 from
    metrics.jsonl, then the redone 5-6 and the rest. Its history is whole, each step once."""
    store = _Store()
    first = _open_fake(monkeypatch, tmp_path, _Fake(store, kept=1), resume=False)
    _steps(tmp_path, first, 1, 6)  # flushes at 2 (kept), 4, 6 (not kept), then SIGKILL
    assert first.open["mlflow"].flushes == 3 and {s for _, s, _ in store} == {1, 2}
    again = _resume(monkeypatch, tmp_path, _Fake(store), 4)
    assert {s for _, s, _ in store} == {1, 2, 3, 4}  # sent before the first redone step
    _steps(tmp_path, again, 5, 8)
    again.finish()
    assert store.once() == _expected(8)
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == list(range(1, 9))


def test_a_kill_in_the_middle_of_a_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process dies after part of a flush reached the tracker (loss at 3 in; lr at 3, loss and lr at 4 out):
    read back per name, the resume from the checkpoint at step 2 sends exactly the rest."""
    store = _Store()
    first = _open_fake(monkeypatch, tmp_path, _Fake(store), resume=False)
    _steps(tmp_path, first, 1, 2)
    first.open["mlflow"].die_after = 1  # of [loss@3, lr@3, loss@4, lr@4]: loss@3 only
    with pytest.raises(_Killed):
        _steps(tmp_path, first, 3, 4)
    again = _resume(monkeypatch, tmp_path, _Fake(store), 2)
    assert again.held["mlflow"].steps == {"loss": 3, "lr": 2}
    _steps(tmp_path, again, 3, 6)
    again.finish()
    assert store.once() == _expected(6)


def test_held_steps() -> None:
    held = Held(upto=4, steps={"eval/a": 6})
    assert held.holds("loss", 4) and not held.holds("loss", 5) and held.holds("eval/a", 6)
    assert not held.holds("eval/a", 7)
    held.add(["loss"], 9)
    assert held.holds("loss", 9) and not held.holds("lr", 9)


def test_mlflow_resume_of_a_finished_run_logs_the_eval_scalars_once(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's own store: a run killed after its last training step, before the evaluation, gets the eval scalars
    on its resume; resuming the finished run again repeats only the evaluation, which MLflow does not get twice."""
    run, uri, first = _mlflow_first_attempt(tmp_path, monkeypatch)
    _steps(run, first, 1, 4)  # then killed before the evaluation
    evals = {"eval/a/model/rollout_l2re": 0.25}
    for _ in range(2):
        again = open_trackers(_mlflow_cfg(run), run, resume=True)  # the final checkpoint: only the eval is redone
        again.backfill(run / "metrics.jsonl", 4)
        again.log(evals, 4)
        again.finish()
    run_id = json.loads((run / STATE_NAME).read_text())["mlflow"]["run_id"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    got = {(name, m.step): m.value for name in ("loss", "lr", *evals)
           for m in client.get_metric_history(run_id, name)}
    assert sum(len(client.get_metric_history(run_id, name)) for name in ("loss", "lr", *evals)) == len(got)
    assert got == _expected(4, evals)


def _wandb_history(logs: list[Path]) -> list[tuple[str, int, float]]:
    """(name, step, value) of every history record of the .wandb transaction logs, in order."""
    out = []
    for log in logs:
        for r in wandb_records(log):
            if r.WhichOneof("record_type") == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
                out += [(k, int(row["_step"]), float(v)) for k, v in row.items() if not k.startswith("_")]
    return out


def test_wandb_offline_resume_sends_each_step_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline W&B reads back the history of the run's earlier offline files (in every $WANDB_DIR its attempts
    used). Steps 1-4, then a stop; the resume from step 2 redoes 3-4 and sends 5-6: the offline files together hold
    every step once, and the final eval scalars once, also after the finished run is resumed again. The reader of
    the files stops at a record cut short, keeping what came before."""
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true",
                       "WANDB_DISABLE_CODE": "true", "WANDB_X_DISABLE_STATS": "true",
                       "WANDB_X_DISABLE_MACHINE_INFO": "true"}.items():
        monkeypatch.setenv(key, value)
    run = tmp_path / "run"
    run.mkdir()
    cfg = TrainConfig(out=str(run), tracker=["wandb"])

    def attempt(n: int, checkpoint: int | None) -> Trackers:
        """Each attempt its own $WANDB_DIR: offline folders are named to the second, and these come quicker."""
        monkeypatch.setenv("WANDB_DIR", str(tmp_path / f"attempt-{n}"))
        if checkpoint is None:
            return open_trackers(cfg, run, resume=False)
        from dpot_train.train.log import _truncate_jsonl

        _truncate_jsonl(run / "metrics.jsonl", checkpoint)
        trackers = open_trackers(cfg, run, resume=True)
        trackers.backfill(run / "metrics.jsonl", checkpoint)
        return trackers

    first = attempt(1, None)
    _steps(run, first, 1, 4)
    first.finish(failed=True)  # the run was stopped
    evals = {"eval/a/model/rollout_l2re": 0.25}
    again = attempt(2, 2)
    _steps(run, again, 3, 6)
    again.log(evals, 6)
    again.finish()
    finished = attempt(3, 6)
    finished.log(evals, 6)
    finished.finish()
    state = json.loads((run / STATE_NAME).read_text())["wandb"]
    assert state["dirs"] == [str(tmp_path / f"attempt-{n}" / "wandb") for n in (1, 2, 3)]
    run_id = state["id"]
    logs = [next((tmp_path / f"attempt-{n}" / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
            for n in (1, 2, 3)]
    assert _Store(_wandb_history(logs)).once() == _expected(6, evals)

    whole = logs[1].read_bytes()
    assert wandb_history_steps(logs[1]) == {"loss": 6, "lr": 6, "eval/a/model/rollout_l2re": 6}
    cut = tmp_path / "cut.wandb"
    seen = []
    for size in range(0, len(whole), 97):  # cut anywhere: a prefix of the history, never an error
        cut.write_bytes(whole[:size])
        got = wandb_history_steps(cut)
        assert all(step <= 6 for step in got.values()) and set(got) <= {"loss", "lr", "eval/a/model/rollout_l2re"}
        seen.append(got.get("loss", 0))
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] >= 5


def _complete_lines(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line]


def _stop_after_a_flush_past_a_checkpoint(proc: subprocess.Popen[str], out: Path, steps: int) -> tuple[int, int]:
    """Freeze the launch (SIGSTOP: no step moves on while it is looked at) once MLflow holds steps after the newest
    checkpoint, then SIGKILL the launcher and its workers, as a lost node would be; (checkpoint, MLflow's last
    step). metrics.jsonl holds that step too: its lines are written before the trackers get them."""
    import os
    import signal
    import time

    from dpot_train.core.checkpoint import list_checkpoints

    def checkpoint() -> int:
        return max((s for s, _ in list_checkpoints(out / "checkpoints")), default=0) \
            if (out / "checkpoints").exists() else 0

    def logged() -> int:
        """The last step of metrics.jsonl (cheap: looked at every 10 ms)."""
        lines = _complete_lines(out / "metrics.jsonl")
        return lines[-1]["step"] if lines else 0

    def sent() -> int:
        """The last step MLflow holds (read once the processes are frozen)."""
        mlflow = read_state(out).get("mlflow", {})
        return max((s for s, _ in _mlflow_history(mlflow["tracking_uri"], mlflow["run_id"], ["loss"])["loss"]),
                   default=0) if "run_id" in mlflow else 0

    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, "the run ended before it could be stopped"
        assert time.monotonic() < deadline, "no checkpoint with steps sent to MLflow after it appeared"
        ckpt = checkpoint()
        assert ckpt < steps, "the run reached its last checkpoint before it could be stopped"
        if 0 < ckpt < logged():
            frozen = [proc.pid, *train_runs.child_pids(proc.pid)]
            for pid in frozen:
                os.kill(pid, signal.SIGSTOP)
            ckpt, last = checkpoint(), sent()  # what the frozen processes left
            if 0 < ckpt < last:
                for pid in frozen:
                    os.kill(pid, signal.SIGKILL)
                proc.wait()
                return ckpt, last
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)


def _mlflow_history(uri: str, run_id: str, keys: list[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    return {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
            for key in (keys or client.get_run(run_id).data.metrics)}


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to follow the worker processes")
def test_a_killed_then_resumed_launch_leaves_each_step_once_in_mlflow_and_wandb(
        fno_train_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes, --tracker mlflow,wandb (offline), a checkpoint every 4 steps and a log line every 2: killed
    once MLflow holds steps after the newest checkpoint (offline W&B, whose file is written every 15 s, has kept
    fewer), then --resume: MLflow's history, and the offline W&B files together, equal metrics.jsonl: every step
    once, the eval scalars once."""
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true",
                       "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true", "WANDB_X_DISABLE_STATS": "true",
                       "WANDB_X_DISABLE_MACHINE_INFO": "true", "MLFLOW_ALLOW_FILE_STORE": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # left by an in-process test: each launch its own service
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    steps, out = 12, tmp_path / "run"
    args = train_runs.launch_args(fno_train_shards, out, "--tracker", "mlflow,wandb", steps=steps, nproc=2)
    args[args.index("--log-every") + 1], args[args.index("--ckpt-every") + 1] = "2", "4"
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                            env=train_runs.env(), cwd=train_runs.ROOT)
    try:
        ckpt, last = _stop_after_a_flush_past_a_checkpoint(proc, out, steps)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    state = json.loads((out / STATE_NAME).read_text())
    uri = state["mlflow"]["tracking_uri"]
    assert uri == (out / "mlruns").as_uri()
    before = _mlflow_history(uri, state["mlflow"]["run_id"])
    assert max(s for s, _ in before["loss"]) >= last > ckpt  # the tracker holds steps that the resume redoes
    assert max(x["step"] for x in _complete_lines(out / "metrics.jsonl")) >= last

    r = train_runs.run([*args, "--resume"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "warning: --tracker" not in r.stderr, r.stderr[-3000:]
    assert json.loads((out / STATE_NAME).read_text())["mlflow"]["run_id"] == state["mlflow"]["run_id"]
    redone = frozenset(range(ckpt + 1, max(s for s, _ in before["samples_per_s"]) + 1))
    _assert_mirrors(out, _mlflow_history(uri, state["mlflow"]["run_id"]), steps, redone)

    run_id = state["wandb"]["id"]
    logs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(logs) == 2, logs  # the stopped attempt's and the resume's
    history: dict[str, list[tuple[int, float]]] = {}
    for name, step, value in _wandb_history(logs):
        history.setdefault(name, []).append((step, value))
    _assert_mirrors(out, history, steps, redone)
