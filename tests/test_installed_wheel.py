"""The built wheel works outside the checkout: the catalog and mixtures are package data, and synth -> ingest ->
inspect -> a few training steps run from another directory with only the installed package on the path."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, " ".join(args) + "\n" + r.stdout[-2000:] + r.stderr[-2000:]
    return r


@pytest.mark.slow
def test_wheel_installs_and_runs_outside_the_checkout(tmp_path: Path) -> None:
    wheels, site, work = tmp_path / "wheels", tmp_path / "site", tmp_path / "work"
    work.mkdir()
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
          str(ROOT)], tmp_path, dict(os.environ))
    (wheel,) = wheels.glob("dpot-*.whl")
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], tmp_path,
         dict(os.environ))
    # the installed package first on the path; its dependencies come from this interpreter's environment
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1"}
    env.pop("DPOT_CATALOG", None)
    where = _run([sys.executable, "-c", "import dpot_data, dpot_train; print(dpot_data.__file__, dpot_train.__file__)"],
                 work, env).stdout
    assert where.count(str(site)) == 2, where
    assert (site / "dpot_format" / "schema" / "manifest.schema.json").is_file()
    assert (site / "dpot_data" / "manifests" / "catalog.yaml").is_file()
    assert (site / "dpot_data" / "manifests" / "mixtures" / "dpot-pretrain-ti.yaml").is_file()
    assert (site / "dpot_train" / "configs" / "pretrain-ti.yaml").is_file()
    data = [sys.executable, "-m", "dpot_data"]
    _run([*data, "synth", "fno", "--out", "raw", "--n", "8", "--frames", "12", "--seed", "0"], work, env)
    raw = sorted((work / "raw").glob("NavierStokes_*.mat"))[0]
    _run([*data, "ingest", "--dataset", "fno-ns-v1e-3", str(raw), "--out", "shards", "--resolution", "32",
          "--split", "0.75", "--no-progress"], work, env)
    assert "fno-ns-v1e-3" in _run([*data, "inspect", "shards"], work, env).stdout
    _run([sys.executable, "-m", "dpot_train", "launch", "--manifest", "shards", "--model", "tiny", "--steps", "3",
          "--batch-size", "2", "--ckpt-every", "3", "--log-every", "1", "--no-progress", "--device", "cpu",
          "--out", "run"], work, env)
    assert (work / "run" / "checkpoints" / "step-00000003.pt").is_file() and (work / "run" / "eval.json").is_file()
    # the shipped run configs are found by name, outside the checkout (importlib.resources of the installed package)
    printed = _run([sys.executable, "-m", "dpot_train", "launch", "--config", "pretrain-ti", "--manifest", "shards",
                    "--steps", "20", "--out", "run-ti", "--dry-run"], work, env).stdout  # the run config, nothing written
    assert "batch_size: 160" in printed and not (work / "run-ti").exists()
    assert _run([sys.executable, "-m", "dpot_train", "--version"], work, env).stdout.startswith("dpot-train ")
