"""The step log is read back from the device in batches (no host sync per step) and still records every step.

Logging every step (a device sync each step) and every 7th step (the deferred read-back) give the same metrics.jsonl
values and the same weights; `--deterministic` is recorded in the run config and leaves a CPU run unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from tests import train_runs


def _log(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_deferred_step_log_equals_per_step_log(fno_train_shards: Path,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    reference = train_runs.uninterrupted_run(fno_train_shards, tmp_path_factory.mktemp("runs"))
    out = tmp_path_factory.mktemp("logging") / "run"
    args = train_runs.launch_args(fno_train_shards, out, "--deterministic")
    args[args.index("--log-every") + 1] = "1"
    args[args.index("--ckpt-every") + 1] = "7"
    r = train_runs.run(args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("samples/s") == train_runs.STEPS  # a step line for every step at --log-every 1

    la, lb = _log(reference), _log(out)
    steps = list(range(1, train_runs.STEPS + 1))
    assert [x["step"] for x in la] == [x["step"] for x in lb] == steps
    for key in ("loss", "lr", "grad_norm", "epoch"):
        assert [x[key] for x in la] == [x[key] for x in lb], key
    assert all(x["grad_norm"] > 0 and x["loss"] > 0 for x in la)
    # each line's lr is the rate its step ran at: the one-cycle schedule before it moves on (it logged the next
    # step's before: step 1 showed the warm-up's second rate, the last step a rate past the schedule's end)
    from dpot_train.core.config import load_config
    from dpot_train.train.schedule import one_cycle

    cfg = load_config(reference / "config.yaml")
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=cfg.optim.lr)
    sched, ran_at = one_cycle(opt, cfg.steps, cfg.optim), []
    for _ in steps:
        ran_at.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert [x["lr"] for x in la] == pytest.approx(ran_at, rel=1e-12)
    assert la[0]["lr"] == pytest.approx(cfg.optim.lr / cfg.optim.div_factor)
    # the reference logged every 5th step: the rate appears on those steps (and the last) only
    assert [x["step"] for x in la if "samples_per_s" in x] == [s for s in steps if s % 5 == 0 or s == steps[-1]]

    final = f"step-{train_runs.STEPS:08d}.pt"
    a = torch.load(reference / "checkpoints" / final, weights_only=True)
    b = torch.load(out / "checkpoints" / final, weights_only=True)
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert yaml.safe_load((out / "config.yaml").read_text())["deterministic"] is True
    assert b["train_config"]["deterministic"] is True and a["train_config"]["deterministic"] is False


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.slow
def test_tensorboard_holds_config_eval_and_every_step_once_after_a_resume(
        fno_train_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    base = tmp_path_factory.mktemp("tb")
    full = base / "full"
    args = train_runs.launch_args(fno_train_shards, full, steps=12, nproc=1)
    args[args.index("--ckpt-every") + 1] = "4"
    r = train_runs.run(args)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "| elapsed 0:00:" in r.stdout and "| eta 0:00:" in r.stdout
    tags = _scalars(full)
    assert [s for s, _ in tags["train/loss"]] == list(range(1, 13))
    evals = [t for t in tags if t.startswith("eval/fno-ns-v1e-3/")]
    assert evals and all(tags[t][0][0] == 12 for t in evals), sorted(tags)
    acc = EventAccumulator(str(full / "tb"))
    acc.Reload()
    assert "config" in "".join(acc.Tags()["tensors"])

    resumed = base / "resumed"  # the same run, as if it had stopped after its step-4 checkpoint
    shutil.copytree(full, resumed)
    for step in (8, 12):
        (resumed / "checkpoints" / f"step-{step:08d}.pt").unlink()
    r = train_runs.run(train_runs.launch_args(fno_train_shards, resumed, "--resume", steps=12, nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    again = _scalars(resumed)
    assert [s for s, _ in again["train/loss"]] == list(range(1, 13))  # step 4 kept, 5..12 redone once
    assert again["train/loss"] == tags["train/loss"]


def test_a_resume_cuts_the_log_back_leaving_out_a_line_cut_short(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The resume's cut of metrics.jsonl to its checkpoint step keeps every whole line up to it, leaves out a last
    line that a crash cut short (with one warning line), and replaces the file whole, leaving no temporary."""
    from dpot_train.train.log import _truncate_jsonl

    log = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 7)]
    log.write_text("\n".join(lines) + "\n" + '{"step": 7, "lo', encoding="utf-8")
    _truncate_jsonl(log, 4)
    assert log.read_text(encoding="utf-8") == "\n".join(lines[:4]) + "\n"
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: {log}: left out 1 line(s) that are not JSON (written when the run stopped)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    _truncate_jsonl(log, 2)  # a whole log: no warning
    assert log.read_text(encoding="utf-8") == "\n".join(lines[:2]) + "\n" and capsys.readouterr().err == ""
