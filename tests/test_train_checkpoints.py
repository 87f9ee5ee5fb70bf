"""Checkpoint files: a sha256 record checked on every load, damaged newest checkpoints kept aside on --resume, no
hang on FIFOs, and a failed write that leaves nothing behind and says so in one line."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dpot_train.core import checkpoint as C
from dpot_train.core.checkpoint import (CheckpointError, checkpoint_payload, file_sha256, load_state_dict_file,
                                        record_path)
from dpot_train.cli import app
from dpot_train.core.config import load_config
from dpot_train.run.launch import Topology, prepare_run, release_run
from dpot_train.model import build_model
from tests import train_runs

GOLDEN = Path(__file__).resolve().parent / "golden" / "dpot_small.pth"


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("tiny", img_size=16, embed_dim=16, depth=1)


def _save(ckpt_dir: Path, step: int, model: torch.nn.Module | None = None) -> Path:
    path = C.checkpoint_path(ckpt_dir, step)
    C.save_atomic({**checkpoint_payload(model or _model()), "format": C.FORMAT, "step": step}, path)
    return path


def _flip_weight_bit(path: Path, model: torch.nn.Module) -> None:
    """Flip one bit inside the stored bytes of `pos_embed` (a tensor record torch does not check)."""
    data = bytearray(path.read_bytes())
    at = data.find(model.state_dict()["pos_embed"].numpy().tobytes())
    assert at > 0
    data[at + 17] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_the_weights_is_refused_by_every_loader(tmp_path: Path) -> None:
    model = _model()
    path = _save(tmp_path / "checkpoints", 2, model)
    assert record_path(path).read_text() == f"{file_sha256(path)}  {path.name}\n"
    assert C.load_checkpoint(path)["step"] == 2
    _flip_weight_bit(path, model)
    with pytest.raises(CheckpointError, match=r"step-00000002.pt: damaged: its sha256 .* differs from the one "
                                              r"recorded when it was written \(step-00000002.pt.sha256"):
        C.load_checkpoint(path)  # --resume
    with pytest.raises(CheckpointError, match="damaged"):
        load_state_dict_file(path)  # --init, evaluate
    result = CliRunner().invoke(app, ["model", "info", str(path)])  # model info
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: damaged"), result.output


def test_released_files_without_a_record_load_as_before() -> None:
    assert not record_path(GOLDEN).exists()
    state, config, _ = load_state_dict_file(GOLDEN)
    assert config is None and "pos_embed" in state


def test_resume_falls_back_and_keeps_the_damaged_newest_checkpoint_aside(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "checkpoints"
    model = _model()
    _save(ckpt, 2, model)
    newest = _save(ckpt, 4, model)
    _flip_weight_bit(newest, model)
    damaged = newest.read_bytes()
    path, loaded = C.latest_checkpoint(ckpt)
    assert path.name == "step-00000002.pt" and loaded["step"] == 2
    assert not newest.exists()
    aside = ckpt / "step-00000004.pt.damaged"
    assert aside.read_bytes() == damaged and record_path(aside).exists()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "step-00000004.pt does not load" in out[0] and "kept as step-00000004.pt.damaged" in out[0]
    _save(ckpt, 4, model)  # the resumed run redoes step 4: the damaged file is still there
    assert aside.read_bytes() == damaged
    assert [s for s, _ in C.list_checkpoints(ckpt)] == [2, 4]


def test_a_fifo_checkpoint_is_skipped_without_opening_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    _save(ckpt, 2)
    fifo = ckpt / "step-00000004.pt"
    os.mkfifo(fifo)
    assert not C.looks_complete(fifo)
    with pytest.raises(CheckpointError, match="expected a checkpoint file, found something else"):
        C.load_checkpoint(fifo)
    path, _ = C.latest_checkpoint(ckpt, keep_damaged=False)
    assert path.name == "step-00000002.pt" and fifo.exists()


def test_a_full_disk_during_a_checkpoint_write_leaves_nothing_and_says_why(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = tmp_path / "checkpoints"
    first = _save(ckpt, 2)
    before = first.read_bytes()

    def full(obj: object, f: object) -> None:
        f.write(b"PK\x03\x04" + b"\0" * 1000)  # type: ignore[attr-defined]
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(C.torch, "save", full)
    with pytest.raises(C.CheckpointWriteError) as info:
        _save(ckpt, 4)
    message = str(info.value)
    assert "\n" not in message and "step-00000004.pt: the checkpoint could not be written (no space left" in message
    assert "--resume" in message
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000002.pt", "step-00000002.pt.sha256"]
    assert first.read_bytes() == before


def _launch(shards: Path, out: Path, *extra: str, steps: int = 4, timeout: float = 240) -> "subprocess.CompletedProcess[str]":
    import subprocess

    args = train_runs.launch_args(shards, out, *extra, steps=steps, nproc=1)
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=train_runs.env(),
                          cwd=train_runs.ROOT)


@pytest.mark.slow
def test_resume_at_the_final_step_only_evaluates(fno_train_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = _launch(fno_train_shards, out)
    assert r.returncode == 0, r.stderr[-3000:]
    (out / "eval.json").unlink()  # as if killed during the final evaluation
    final = out / "checkpoints" / "step-00000004.pt"
    before = final.read_bytes()
    r = _launch(fno_train_shards, out, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout and "at step 4" in r.stdout
    assert "Traceback" not in r.stderr
    import json

    result = json.loads((out / "eval.json").read_text())
    assert result["checkpoint"] == str(final) and result["datasets"]
    assert final.read_bytes() == before  # nothing retrained, nothing re-saved


@pytest.mark.slow
def test_resume_with_checkpoints_that_are_zips_but_do_not_load_is_one_line_before_torchrun(
        fno_train_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    printed = _launch(fno_train_shards, out, "--dry-run")
    assert printed.returncode == 0
    (tmp_path / "printed.yaml").write_text(printed.stdout)  # the run config --dry-run prints (it writes nothing)
    prepare_run(load_config(tmp_path / "printed.yaml"), False, Topology())  # the run folder a launch writes
    release_run(out)
    ckpt = out / "checkpoints"
    ckpt.mkdir()
    for step in (2, 4):  # complete torch zips, but not our checkpoints
        torch.save({"format": "something-else", "step": step}, C.checkpoint_path(ckpt, step))
    r = _launch(fno_train_shards, out, "--resume")
    assert r.returncode == 2
    lines = train_runs.error_lines(r.stderr)
    assert len(lines) == 1 and "none of the 2 checkpoints loads" in lines[0], r.stderr
    assert "dpot_train.run.torchrun" not in r.stderr + r.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000002.pt", "step-00000004.pt"]


@pytest.mark.slow
def test_resume_past_a_fifo_and_a_damaged_newest_checkpoint_keeps_both(fno_train_shards: Path,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = _launch(fno_train_shards, out, "--no-eval", "--ckpt-every", "2", steps=4)
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt = out / "checkpoints"
    newest = ckpt / "step-00000004.pt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    os.mkfifo(ckpt / "step-00000006.pt")
    r = _launch(fno_train_shards, out, "--resume", "--no-eval", steps=4, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step-00000004.pt does not load" in r.stdout and "kept as step-00000004.pt.damaged" in r.stdout
    assert (ckpt / "step-00000004.pt.damaged").read_bytes() == bytes(data)
    assert C.load_checkpoint(newest)["step"] == 4  # redone from step 2


def _tmpfs(path: Path, size: str) -> bool:
    import subprocess

    path.mkdir()
    return os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                                capture_output=True).returncode == 0


@pytest.mark.slow
def test_a_full_disk_at_the_first_checkpoint_is_one_line_and_leaves_no_temporary_file(
        fno_train_shards: Path, tmp_path: Path) -> None:
    import subprocess

    small = tmp_path / "small"
    if not _tmpfs(small, "1m"):
        pytest.skip("needs root and tmpfs to fill a file system")
    try:
        out = small / "run"
        r = _launch(fno_train_shards, out, "--no-eval")
        assert r.returncode == 2, r.stderr[-3000:]
        lines = train_runs.error_lines(r.stderr)
        assert len(lines) == 1, r.stderr
        assert lines[0].startswith("error: ") and "step-00000002.pt: the checkpoint could not be written (no space " \
                                                  "left" in lines[0]
        assert "Traceback" not in r.stderr
        assert [p.name for p in (out / "checkpoints").iterdir()] == []
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_model_export_writes_a_sha256_record_and_a_flipped_bit_is_refused(tmp_path: Path) -> None:
    model = _model()
    ckpt = _save(tmp_path / "checkpoints", 2, model)
    out = tmp_path / "export" / "dpot_tiny.pth"
    result = CliRunner().invoke(app, ["model", "export", str(ckpt), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert record_path(out).read_text() == f"{file_sha256(out)}  {out.name}\n"
    assert "dpot_tiny.pth.sha256" in result.output
    assert load_state_dict_file(out)[1] is None  # the released format
    _flip_weight_bit(out, model)
    result = CliRunner().invoke(app, ["model", "info", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [result.output.strip()] and f"{out}: damaged" in result.output


def _released_copy(tmp_path: Path) -> tuple[Path, str]:
    """A released file (no record beside it) with one bit flipped in its weights, and the sha256 of the intact one."""
    state = torch.load(GOLDEN, weights_only=True)["model"]
    path = tmp_path / "model_small.pth"
    path.write_bytes(GOLDEN.read_bytes())
    digest = file_sha256(path)
    data = bytearray(path.read_bytes())
    at = data.find(state["pos_embed"].numpy().tobytes())
    data[at + 9] ^= 0x04
    path.write_bytes(bytes(data))
    return path, digest


def test_released_weights_are_checked_against_the_sha256_given(fno_train_shards: Path, tmp_path: Path) -> None:
    path, digest = _released_copy(tmp_path)
    assert not record_path(path).exists() and C.load_state_dict_file(path)[1] is None  # loads unnoticed without it
    expected = f"error: {path}: damaged or another file: its sha256 is {file_sha256(path)}, expected {digest}"
    for command in (["model", "info", str(path)],
                    ["evaluate", str(path), "--manifest", str(fno_train_shards), "--out", str(tmp_path / "e.json")],
                    ["launch", "--manifest", str(fno_train_shards), "--out", str(tmp_path / "run"), "--init",
                     str(path), "--steps", "10", "--dry-run"]):
        result = CliRunner().invoke(app, [*command, "--sha256", digest.upper()])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(expected), (command, result.output)
        result = CliRunner().invoke(app, [*command, "--sha256", "abc"])
        assert result.exit_code == 2 and "--sha256 'abc': expected the file's sha256, 64 hex digits" in result.output
    assert not (tmp_path / "run").exists() and not (tmp_path / "e.json").exists()
    intact = tmp_path / "intact.pth"
    intact.write_bytes(GOLDEN.read_bytes())
    result = CliRunner().invoke(app, ["model", "info", str(intact), "--sha256", digest])
    assert result.exit_code == 0, result.output


def test_launch_records_the_init_sha256_and_the_workers_check_it(fno_train_shards: Path, tmp_path: Path) -> None:
    import yaml

    from dpot_train.train.finetune import finetune_model
    from dpot_train.core.model_setup import data_overrides

    init = tmp_path / "model_small.pth"
    init.write_bytes(GOLDEN.read_bytes())
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["launch", "--manifest", str(fno_train_shards), "--out", str(out), "--init",
                                      str(init), "--steps", "10", "--dry-run"])
    assert result.exit_code == 0, result.output
    recorded = yaml.safe_load(result.stdout)["init_sha256"]  # the run config --dry-run prints; it writes nothing
    assert recorded == file_sha256(init)
    fixed = data_overrides(4, (32, 32), 10, 1)
    finetune_model(str(init), fixed, sha256=recorded)
    flipped, _ = _released_copy(tmp_path)
    init.write_bytes(flipped.read_bytes())  # the file changed after launch checked it
    with pytest.raises(CheckpointError, match="damaged or another file"):
        finetune_model(str(init), fixed, sha256=recorded)
