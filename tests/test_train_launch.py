"""`dpot-train launch`: YAML config + CLI overrides, the torchrun command for one or several nodes, RUN_DIR checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from dpot_train.core.config import load_config
from dpot_train.run.launch import Topology, torchrun_command
from tests import train_runs


def test_torchrun_command_single_and_multi_node(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    one = torchrun_command(cfg, Topology(2), resume=False, checksums_verified=True)
    assert one[:3] == [sys.executable, "-m", "dpot_train.run.torchrun"]
    assert "--nproc-per-node=2" in one and "--standalone" in one
    assert one[-5:] == ["-m", "dpot_train.run.worker", "--config", str(cfg), "--checksums-verified"]
    multi = torchrun_command(cfg, Topology(8, 4, 3, "node0:29500"), resume=True, checksums_verified=False)
    for arg in ("--nproc-per-node=8", "--nnodes=4", "--node-rank=3", "--rdzv-backend=c10d",
                "--rdzv-endpoint=node0:29500", "--resume"):
        assert arg in multi
    assert "--standalone" not in multi and "--checksums-verified" not in multi
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        torchrun_command(cfg, Topology(8, 2), resume=False, checksums_verified=False)


@pytest.mark.slow
def test_yaml_config_with_cli_overrides_dry_run(fno_train_shards: Path, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "out": str(tmp_path / "run"), "steps": 50, "batch_size": 6, "model": "tiny",
        "data": {"manifests": [str(fno_train_shards)], "noise": 5e-5},
        "optim": {"lr": 5e-4, "clip_grad": 0.5},
    }))
    r = train_runs.run([sys.executable, "-m", "dpot_train", "launch", "--config", str(config), "--steps", "7",
                        "--nproc-per-node", "3", "--dry-run"])
    assert r.returncode == 0, r.stderr
    assert "dpot_train.run.torchrun --nproc-per-node=3 --standalone" in r.stderr
    printed = tmp_path / "printed.yaml"  # --dry-run prints the run config and writes nothing
    printed.write_text(r.stdout)
    saved = load_config(printed)
    assert saved.steps == 7 and saved.batch_size == 6  # CLI wins, the file fills in the rest
    assert saved.optim.lr == 5e-4 and saved.optim.clip_grad == 0.5 and saved.data.noise == 5e-5
    assert not (tmp_path / "run").exists()
    r = train_runs.run([sys.executable, "-m", "dpot_train", "launch", "--config", str(config),
                        "--nproc-per-node", "4", "--dry-run"])
    assert r.returncode == 2 and "--batch-size 6 (global) must be divisible by the 4 processes" in r.stderr
    config.write_text("steps: 3\nlearning_rate: 1.0\n")
    r = train_runs.run([sys.executable, "-m", "dpot_train", "launch", "--config", str(config), "--dry-run"])
    assert r.returncode == 2 and "unknown config key(s) learning_rate" in r.stderr
