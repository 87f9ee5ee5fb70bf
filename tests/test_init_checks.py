"""`launch --init` checks the file before torchrun: a file that is not a checkpoint is named as such (never steered
to --trust), a torch file of another network is refused, and an --init that would load nothing of what --load asks
stops in one line instead of training from scratch. Nothing is written into RUN_DIR."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpot_train.cli import app
from dpot_train.model import build_model


def _launch(shards: Path, out: Path, init: Path, *extra: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["launch", "--manifest", str(shards), "--out", str(out), "--init", str(init),
                                      "--steps", "10", "--device", "cpu", "--dry-run", *extra])
    return result.exit_code, [ln for ln in result.output.splitlines() if ln.strip()]


def _npy(path: Path) -> None:
    np.save(path, np.zeros(3), allow_pickle=False)


@pytest.mark.parametrize("name, write, what", [
    ("data.nc", lambda p: p.write_bytes(b"CDF\x01" + bytes(60)), "a NetCDF-3 file"),
    ("data.nc4", lambda p: p.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(60)), "an HDF5 file"),
    ("frames.png", lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(60)), "a PNG image"),
    ("eval.json", lambda p: p.write_text(json.dumps({"model": {"rollout_l2re": 0.1}})), "JSON text"),
    ("x.npy", _npy, "a NumPy .npy array"),
    ("notes.txt", lambda p: p.write_text("weights\n"), "text"),
    ("empty.pth", lambda p: p.write_bytes(b""), "an empty file"),
])
def test_a_file_that_is_not_a_checkpoint_is_named_so(fno_train_shards: Path, tmp_path: Path, name: str,
                                                     write, what: str) -> None:
    path = tmp_path / name
    write(path)
    code, lines = _launch(fno_train_shards, tmp_path / "run", path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: not a checkpoint: {what}"), lines
    assert "--trust" not in lines[0] and "trusted" not in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("content", ["bare", "wrapped"])
def test_a_torch_file_of_another_network_is_refused_before_torchrun(fno_train_shards: Path, tmp_path: Path,
                                                                    content: str) -> None:
    state = torch.nn.Linear(2, 2).state_dict()
    path = tmp_path / "linear.pt"
    torch.save(state if content == "bare" else {"model": state}, path)
    code, lines = _launch(fno_train_shards, tmp_path / "run", path)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: not a DPOT state dict: missing ['pos_embed'"), lines
    assert not (tmp_path / "run").exists()


def test_an_init_that_loads_nothing_requested_stops_before_torchrun(fno_train_shards: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    three = build_model("tiny", img_size=32, in_channels=3, out_channels=3)  # the data has 4 channels
    path = tmp_path / "three.pth"
    torch.save({"model": three.state_dict()}, path)
    code, lines = _launch(fno_train_shards, tmp_path / "run", path, "--load", "patch_embed,out")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: --init {path}: nothing of --load patch_embed,out can load into this run's "
                               "model: patch_embed (cannot load: patch_embed.proj.0.weight is "), lines
    assert "out (cannot load: " in lines[0] and "train from scratch" in lines[0]
    assert not (tmp_path / "run").exists()
    code, lines = _launch(fno_train_shards, tmp_path / "run", path, "--load", "all")  # blocks and the rest fit
    assert code == 0, lines
