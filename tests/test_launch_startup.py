"""A launch's fixed cost before the first step: the launcher imports no more than its checks need (no torch._dynamo,
whose import is a second of the checks), and torchrun runs in the launcher's own process (no second interpreter
importing torch again), which exits with torchrun's code as an exec'd torchrun did."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpot_train.train import startup
from dpot_train.run import torchrun
from dpot_train.core.config import TrainConfig
from dpot_train.run.launch import check_schedule, release_run
from dpot_train.model import families
from tests import train_runs
from tests.toy_output import write_toy_output


@pytest.fixture
def output(tmp_path: Path) -> Path:
    root = tmp_path / "out"
    write_toy_output(str(root), frames=12, index=True)
    return root


def _launch_args(root: Path, run: Path, *extra: str) -> list[str]:
    return ["launch", "--manifest", str(root), "--out", str(run), "--steps", "2", "--batch-size", "1", "--device",
            "cpu", "--normalize", "none", "--no-progress", "--no-eval", "--model", "tiny", *extra]


def test_the_launch_checks_import_no_torch_dynamo(output: Path, tmp_path: Path) -> None:
    """`launch --dry-run` (every check a launch makes before torchrun) in a fresh interpreter: the model's parameter
    count on the meta device and the schedule check leave torch._dynamo (and sympy) unimported."""
    code = textwrap.dedent(f"""
        import sys
        from dpot_train.cli import main
        sys.argv = ["dpot-train", *{_launch_args(output, tmp_path / "run", "--dry-run")!r}]
        try:
            main()
        except SystemExit as exc:
            assert exc.code in (0, None), exc.code
        print(sorted(m for m in ("torch._dynamo", "sympy") if m in sys.modules))
        """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                       env=train_runs.env(), cwd=train_runs.ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout[-3000:]


@pytest.mark.parametrize("preset", ["tiny", "Ti", "fno", "unet"])
def test_a_model_built_on_the_meta_device_has_the_real_shapes(preset: str) -> None:
    """The initial values a meta build leaves out (draws, scaling) change no parameter's name, shape or dtype."""
    config = families.resolve(preset)
    real = {k: (v.shape, v.dtype) for k, v in families.build(config).state_dict().items()}
    meta = {k: (v.shape, v.dtype) for k, v in families.build(config, device="meta").state_dict().items()}
    assert list(meta) == list(real) and meta == real
    assert families.parameter_count(config) == sum(v.numel() for v in families.build(config).parameters())


def test_the_schedule_check_refuses_what_the_trainer_cannot_build() -> None:
    """check_schedule builds the trainer's one-cycle schedule on a group of no parameters: the same refusals."""
    cfg = TrainConfig(steps=10)
    with pytest.raises(ValueError, match=r"optim.warmup_pct must lie strictly between 0 and 1, got 1.5"):
        check_schedule(replace(cfg, optim=replace(cfg.optim, warmup_pct=1.5)))
    for steps in (1, 5, 1000):  # a warm-up that ends at step 0 is a schedule like any other
        check_schedule(replace(cfg, steps=steps))


def _no_exec(*args: object) -> None:
    raise AssertionError(f"exec of {args}")


def test_torchrun_runs_in_the_launchers_process_and_its_code_is_the_exit_code(
        output: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch runs torchrun's main in its own process with the arguments of the command it prints (no exec of a
    second interpreter), with the launcher's times in the environment, and exits with torchrun's code."""
    calls: list[tuple[list[str], int, str | None]] = []

    def fake_main(argv: list[str]) -> int:
        calls.append((list(argv), os.getpid(), os.environ.get(startup.ENV)))
        return 2

    monkeypatch.setattr(torchrun, "main", fake_main)
    monkeypatch.setattr(os, "execv", _no_exec)
    monkeypatch.setenv(startup.ENV, "")  # restored after the test: the launch sets it
    from dpot_train.cli import app

    run = tmp_path / "run"
    try:
        result = CliRunner().invoke(app, _launch_args(output, run))
    finally:
        release_run(run)
    printed = [ln for ln in result.stderr.splitlines() if "-m dpot_train.run.torchrun " in ln]
    assert result.exit_code == 2, result.output + result.stderr
    assert len(calls) == 1 and len(printed) == 1
    argv, pid, timing = calls[0]
    assert printed[0].split(" ")[3:] == argv and argv[-4:] == ["dpot_train.run.worker", "--config",
                                                             str(run / "config.yaml"), "--checksums-verified"]
    assert pid == os.getpid() and startup.from_env({startup.ENV: timing or ""}) is not None
    assert (run / "config.yaml").is_file()


def test_a_torchrun_failure_is_its_traceback_and_exit_code_1(output: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """What an exec'd torchrun did with an exception it did not handle (a rank that crashed): its traceback on
    stderr and exit code 1."""
    def failing(argv: list[str]) -> int:
        raise RuntimeError("rank 0 crashed")

    monkeypatch.setattr(torchrun, "main", failing)
    monkeypatch.setattr(os, "execv", _no_exec)
    monkeypatch.setenv(startup.ENV, "")
    from dpot_train.cli import app

    run = tmp_path / "run"
    try:
        result = CliRunner().invoke(app, _launch_args(output, run))
    finally:
        release_run(run)
    assert result.exit_code == 1, result.output + result.stderr
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == "RuntimeError: rank 0 crashed"
