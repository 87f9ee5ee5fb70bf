"""`launch --compile`: the compiled training step (forward, loss, backward, clipping, AdamW through torch.compile)
follows the eager step within float32 rounding, and a compiled run killed and resumed equals an uninterrupted
compiled run bit for bit (CPU, one process; inductor's C++ kernels need gcc).

Cost on 2 cores: the first compilation of the step is about 60-80 s with an empty inductor cache, then each further
process (the killed run, its resume) finds the compiled graphs in inductor's on-disk cache and compiles in ~10-15 s;
one compiled run is shared by both tests (module fixture)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from dpot_train.core.checkpoint import list_checkpoints
from tests import train_runs

# Relative tolerance of the compiled step's loss against eager's, per step over the run: inductor fuses the
# forward, backward and AdamW into other kernels, which sum float32 values in another order; each step's loss then
# differs from eager's by float32 rounding (measured: at most 4e-7 relative over these 24 steps), and the weights it
# moves feed that difference into the next step. 1e-5 leaves room for that growth and still fails a step that
# computes something else (a lost clip, a stale learning rate, the wrong loss: differences of 1e-3 and more).
LOSS_RTOL = 1e-5
STEPS = 24


def _args(shards: Path, out: Path, *extra: str) -> list[str]:
    return train_runs.launch_args(shards, out, "--no-eval", *extra, steps=STEPS, nproc=1)


def _losses(run: Path) -> list[float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, STEPS + 1))
    return [x["loss"] for x in lines]


@pytest.fixture(scope="module")
def compiled_run(fno_train_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted `launch --compile` run (1 process, STEPS steps, a checkpoint every 2 steps)."""
    out = tmp_path_factory.mktemp("compiled") / "run"
    r = train_runs.run(_args(fno_train_shards, out, "--compile"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_compile_is_a_run_setting_shown_by_the_dry_run_and_a_bad_mode_is_one_line(fno_train_shards: Path,
                                                                                     tmp_path: Path) -> None:
    r = train_runs.run(_args(fno_train_shards, tmp_path / "run", "--compile", "--dry-run"))
    assert r.returncode == 0, r.stderr
    shown = yaml.safe_load(r.stdout)
    assert (shown["compile"], shown["compile_mode"]) == (True, None)
    r = train_runs.run(_args(fno_train_shards, tmp_path / "run", "--compile", "--compile-mode", "fast", "--dry-run"))
    assert r.returncode == 2
    assert train_runs.error_lines(r.stderr) == ["error: compile_mode: expected one of default, reduce-overhead, "
                                                "max-autotune, max-autotune-no-cudagraphs, got 'fast'"]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_compiled_step_follows_the_eager_step(fno_train_shards: Path, compiled_run: Path,
                                                  tmp_path: Path) -> None:
    eager = tmp_path / "eager"
    r = train_runs.run(_args(fno_train_shards, eager))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert yaml.safe_load((compiled_run / "config.yaml").read_text())["compile"] is True
    a, b = _losses(eager), _losses(compiled_run)
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    assert worst < LOSS_RTOL, worst
    assert a[-1] < 0.9 * a[0]  # the run trains: the comparison is over a changing model, not a constant
    final = f"step-{STEPS:08d}.pt"
    wa = torch.load(eager / "checkpoints" / final, weights_only=True)["model"]
    wb = torch.load(compiled_run / "checkpoints" / final, weights_only=True)["model"]
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-3, atol=1e-5, msg=k)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to follow the worker processes")
def test_a_compiled_run_killed_and_resumed_equals_the_uninterrupted_one_bitwise(fno_train_shards: Path,
                                                                                compiled_run: Path,
                                                                                tmp_path: Path) -> None:
    out = tmp_path / "killed"
    train_runs.kill_at_checkpoint(_args(fno_train_shards, out, "--compile"), out, 6, timeout=300)  # compiles first
    done = [s for s, _ in list_checkpoints(out / "checkpoints")]
    assert done and max(done) < STEPS, done
    time.sleep(1)  # the orphaned worker notices its launcher is gone and stops
    r = train_runs.run([sys.executable, "-m", "dpot_train", "launch", "--out", str(out), "--resume", "--no-progress"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr

    final = f"step-{STEPS:08d}.pt"
    a = torch.load(compiled_run / "checkpoints" / final, weights_only=True)
    b = torch.load(out / "checkpoints" / final, weights_only=True)
    assert a["train_config"]["compile"] is b["train_config"]["compile"] is True
    assert train_runs.states_equal(a["model"], b["model"])
    assert train_runs.states_equal(a["optimizer"], b["optimizer"])
    assert train_runs.states_equal(a["scheduler"], b["scheduler"])
    assert a["loader"] == b["loader"]
    assert _losses(compiled_run) == _losses(out)
