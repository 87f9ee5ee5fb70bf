"""The README's "Released DPOT checkpoints" block, run verbatim in a fresh folder without a network: `dpot:Ti` and
`hf://hzk17/DPOT/model_S.pth@main` come from a Hugging Face cache laid out as huggingface_hub lays it out
(HF_HUB_CACHE, HF_HUB_OFFLINE=1), `corpus/pdebench-dr` is a small synthetic PDEBench diffusion-reaction ingest the
golden checkpoint fits (32x32, 4 channels, 10 input frames), and the fine-tune is shortened the way the README's
blocks are (`STEPS` in the environment)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dpot_train.core.checkpoint import file_sha256
from dpot_train.integrations.hub import DPOT_REPO, RELEASED
from tests.test_hub import DPOT_FILE, MAIN, put_hub_file
from tests.test_readme_path import README, bash_blocks

SECTION = "Released DPOT checkpoints"
STEPS = 4  # the fine-tune's optimiser steps (the README's default is 2000)


def _block() -> str:
    blocks = bash_blocks(README.read_text(encoding="utf-8"), SECTION)
    assert len(blocks) == 1, f"README.md, {SECTION!r}: expected one bash block, found {len(blocks)}"
    return blocks[0]


def _pdebench_dr(folder: Path) -> Path:
    """`folder/corpus/pdebench-dr`: 10 diffusion-reaction trajectories of 12 frames at 32x32 (u, v padded to 4
    channels), the reference's index split (9 train, 1 test), made through dpot_data's library API."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.pdebench import write_diff_react

    raw = write_diff_react(folder / "raw", n=10, frames=12, res=32, seed=0)
    out = folder / "corpus" / "pdebench-dr"
    ingest_files("pdebench", [raw], out, IngestOptions(resolution=32))
    return out


def test_the_block_fine_tunes_a_released_checkpoint_for_steps_from_the_environment() -> None:
    block = _block()
    for step in ("model info dpot:Ti", "evaluate dpot:Ti --manifest corpus/pdebench-dr --out eval.json",
                 "launch --manifest corpus/pdebench-dr --init dpot:Ti --steps ${STEPS:-2000} --out runs/ft-dr",
                 "model info hf://hzk17/DPOT/model_S.pth@main"):
        assert step in block, f"the README block lost its {step!r} step"


@pytest.mark.slow
def test_readme_hub_block_runs_verbatim(tmp_path: Path) -> None:
    cache = tmp_path / "hf-cache"
    for filename in (RELEASED["Ti"], RELEASED["S"]):  # the golden DPOT file stands for both released files
        put_hub_file(cache, DPOT_REPO, MAIN, filename, DPOT_FILE.read_bytes(), ref="main")
    work = tmp_path / "work"
    _pdebench_dr(work)
    (work / ".venv").symlink_to(Path(sys.executable).parent.parent)  # `.venv/bin/...` as in a checkout
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1",
                "STEPS": str(STEPS), "MPLBACKEND": "Agg", "COLUMNS": "160"})
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + _block()], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]

    pinned = f"hf://{DPOT_REPO}/{RELEASED['Ti']}@{MAIN}"
    sha = file_sha256(DPOT_FILE)
    assert f"hub: {pinned} (commit {MAIN}), sha256 {sha}" in output  # model info dpot:Ti
    assert f"hub: hf://{DPOT_REPO}/{RELEASED['S']}@{MAIN} (commit {MAIN}), sha256 {sha}" in output  # ... model_S@main
    scores = json.loads((work / "eval.json").read_text())
    assert scores["checkpoint"] == pinned
    assert scores["hub"]["reference"] == "dpot:Ti" and scores["hub"]["revision"] == MAIN
    assert scores["hub"]["sha256"] == sha
    assert list(scores["datasets"]) == ["pdebench-dr"]

    import yaml

    run = work / "runs" / "ft-dr"
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["init"] == pinned and config["init_sha256"] == sha
    assert config["steps"] == STEPS
    assert (run / "checkpoints" / f"step-{STEPS:08d}.pt").is_file() and (run / "eval.json").is_file()
    assert re.search(rf"--init {re.escape(pinned)}: loaded patch_embed", output)  # the workers took the file
