"""`dpot-train launch` catches configuration mistakes before torchrun, stores absolute paths, reuses the run's process
layout on --resume, and never restarts or prunes over checkpoints it cannot read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from dpot_train.core.checkpoint import UnreadableCheckpointsError, latest_checkpoint, prune
from dpot_train.core.config import load_config
from dpot_train.run.launch import Topology, prepare_run, release_run
from dpot_train.model import build_model
from tests import train_runs

GOLDEN = Path(__file__).resolve().parent / "golden" / "dpot_small.pth"


def _launch(shards: Path, out: Path, *extra: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = [a for a in train_runs.launch_args(shards, out, *extra, nproc=1)]
    return subprocess.run(args, capture_output=True, text=True, timeout=240, env=train_runs.env(),
                          cwd=cwd or train_runs.ROOT)


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "dpot_train.run.torchrun" not in r.stderr + r.stdout  # stopped before torchrun
    return lines[0]


def test_unknown_preset_and_unbuildable_schedule_are_one_line_errors(fno_train_shards: Path, tmp_path: Path) -> None:
    line = _one_line_error(_launch(fno_train_shards, tmp_path / "a", "--model", "tinyy"))
    assert "--model 'tinyy'" in line and "tiny" in line
    config = tmp_path / "warmup.yaml"
    config.write_text("optim:\n  warmup_pct: 1.5\n", encoding="utf-8")
    line = _one_line_error(_launch(fno_train_shards, tmp_path / "b", "--config", str(config)))
    assert "optim.warmup_pct" in line and "1.5" in line
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # a warm-up that ends at step 0 (5 steps at 20 %) is a schedule like any other
    r = _launch(fno_train_shards, tmp_path / "c", "--steps", "5", "--dry-run")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


@pytest.mark.parametrize("preset", ["fno-tiny", "unet-tiny"])
def test_a_fresh_baseline_run_passes_the_model_size_check(fno_train_shards: Path, tmp_path: Path, preset: str) -> None:
    """The size check fits the preset to the data with its own family's fields (FNO and UNet have no in_channels)."""
    r = _launch(fno_train_shards, tmp_path / "run", "--model", preset, "--dry-run")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


class _Payload:
    """An arbitrary class: the weights-only loader must refuse it unless --trust is given."""


@pytest.mark.slow
def test_init_checkpoint_is_loaded_safely_before_torchrun(fno_train_shards: Path, tmp_path: Path) -> None:
    unsafe = tmp_path / "unsafe.pth"
    state = torch.load(GOLDEN, weights_only=True)
    torch.save({**state, "extra": _Payload()}, unsafe)
    line = _one_line_error(_launch(fno_train_shards, tmp_path / "run", "--init", str(unsafe), "--dry-run"))
    assert "refused to load" in line and "unsafe.pth" in line
    missing = _one_line_error(_launch(fno_train_shards, tmp_path / "run", "--init", str(tmp_path / "no.pth")))
    assert "not found" in missing


@pytest.mark.slow
def test_paths_are_absolute_and_resume_reuses_the_layout(fno_train_shards: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rel = Path("../" * len(elsewhere.resolve().parts)) / str(fno_train_shards.resolve()).lstrip("/")
    out = tmp_path / "run"
    args = [sys.executable, "-m", "dpot_train", "launch", "--manifest", str(rel), "--out", str(out), "--steps", "24",
            "--batch-size", "4", "--nproc-per-node", "2", "--no-progress", "--device", "cpu", "--dry-run"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=240, env=train_runs.env(), cwd=elsewhere)
    assert r.returncode == 0, r.stderr[-2000:]
    saved = yaml.safe_load(r.stdout)  # the run config --dry-run prints; it writes nothing
    assert saved["data"]["manifests"] == [str(fno_train_shards.resolve())]
    assert not out.exists()
    # the run folder a launch on 2 processes writes before torchrun (config.yaml, plan.json, launch.json)
    printed = tmp_path / "printed.yaml"
    printed.write_text(r.stdout)
    prepare_run(load_config(printed), False, Topology(nproc_per_node=2))
    release_run(out)  # the lock a launch would hand on to torchrun: this process runs none
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["manifests"] == saved["data"]["manifests"]
    # --resume from another directory, no --nproc-per-node: the run's 2 processes, said so
    r = subprocess.run([sys.executable, "-m", "dpot_train", "launch", "--out", str(out), "--resume", "--dry-run"],
                       capture_output=True, text=True, timeout=240, env=train_runs.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--nproc-per-node=2" in r.stderr and "resuming with the run's layout: 2 process(es)" in r.stderr
    r = subprocess.run([sys.executable, "-m", "dpot_train", "launch", "--out", str(out), "--resume", "--dry-run",
                        "--nproc-per-node", "1"], capture_output=True, text=True, timeout=240, env=train_runs.env(),
                       cwd=tmp_path)
    assert r.returncode == 0 and "--nproc-per-node=1" in r.stderr, r.stderr[-2000:]


@pytest.mark.slow
def test_resume_with_only_unreadable_checkpoints_stops_and_keeps_them(fno_train_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert _launch(fno_train_shards, out, "--dry-run").returncode == 0
    assert not out.exists()  # --dry-run writes nothing
    (out / "checkpoints").mkdir(parents=True)
    damaged = [out / "checkpoints" / f"step-0000000{k}.pt" for k in (2, 4)]
    for p in damaged:
        p.write_bytes(b"truncated")
    line = _one_line_error(_launch(fno_train_shards, out, "--resume"))
    assert "none of the 2 checkpoints" in line
    assert all(p.read_bytes() == b"truncated" for p in damaged)
    with pytest.raises(UnreadableCheckpointsError, match="none of the 2 checkpoints loads"):
        latest_checkpoint(out / "checkpoints")


def test_prune_keeps_the_newest_complete_checkpoints_and_never_deletes_damaged_ones(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    state = {"model": build_model("tiny", img_size=16, embed_dim=16, depth=1).state_dict()}
    for step in (1, 2, 3):
        torch.save(state, ckpt / f"step-{step:08d}.pt")
    (ckpt / "step-00000004.pt").write_bytes(b"\0" * 100)  # damaged newest
    prune(ckpt, keep=2)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000002.pt", "step-00000003.pt", "step-00000004.pt"]


@pytest.mark.slow
def test_a_node_of_a_multi_node_launch_says_it_waits(fno_train_shards: Path, tmp_path: Path) -> None:
    r = _launch(fno_train_shards, tmp_path / "run", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint",
                "node0:29500", "--rdzv-timeout", "120", "--dry-run")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--rdzv-conf=join_timeout=120" in r.stderr
    assert "node 1 of 2: waiting at node0:29500 for the other 1 node(s) to join (up to 120 s" in r.stderr
    assert "waiting" not in _launch(fno_train_shards, tmp_path / "one", "--dry-run").stderr


def test_hostile_run_configs_are_refused_in_one_line(fno_train_shards: Path, tmp_path: Path) -> None:
    import os

    bomb = tmp_path / "bomb.yaml"
    layers = ["a: &a [x, x, x, x, x, x, x, x, x]"] + [
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]" for i in range(8)]
    bomb.write_text("\n".join(layers) + "\n")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("model: tiny  # caf\xe9\n".encode("latin-1"))
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for path, expected in ((bomb, "aliases are not accepted"), (latin, "not UTF-8"), (fifo, "expected a YAML file")):
        r = subprocess.run([sys.executable, "-m", "dpot_train", "launch", "--config", str(path), "--out",
                            str(tmp_path / "run"), "--dry-run"], capture_output=True, text=True, timeout=60,
                           env=train_runs.env(), cwd=train_runs.ROOT)
        assert expected in _one_line_error(r), r.stderr
