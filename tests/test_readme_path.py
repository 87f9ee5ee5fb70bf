"""The README's own step-by-step path, run verbatim in a fresh folder: synth -> ingest -> inspect/verify/stats ->
train -> resume -> evaluate -> export -> fine-tune -> evaluate released weights -> preview -> evaluate with
predictions, pictures and video -> report beside the paper, each command exiting 0 with no traceback. Steps are reduced only the way the README says (`STEPS=20` in the environment)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTIONS = ("Ingest, step by step", "Dataset cards", "Train and evaluate", "Evaluate and compare")


def bash_blocks(text: str, heading: str) -> list[str]:
    """The ```bash blocks under `## heading`, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"README.md has no section {heading!r}"
    return re.findall(r"```bash\n(.*?)```", match.group(1), flags=re.S)


def test_the_sections_hold_the_whole_path() -> None:
    text = README.read_text(encoding="utf-8")
    script = "\n".join(b for h in SECTIONS for b in bash_blocks(text, h))
    for step in ("synth fno", "ingest fno", "inspect shards", "verify shards", "stats shards", "launch --manifest",
                 "--resume", "evaluate run/", "model export", "--init dpot_tiny.pth", "evaluate dpot_tiny.pth",
                 "preview", "--predictions", "report eval.json"):
        assert step in script, f"the README path lost its {step!r} step"


@pytest.mark.slow
def test_readme_path_runs_verbatim(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    blocks = [b for h in SECTIONS for b in bash_blocks(text, h)]
    bin_dir = Path(sys.executable).parent
    (tmp_path / ".venv").symlink_to(bin_dir.parent)  # `.venv/bin/...` as in a checkout
    script = "set -euo pipefail\n" + "\n".join(blocks)
    env = {**os.environ, "STEPS": "20", "MPLBACKEND": "Agg", "COLUMNS": "160"}
    proc = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)  # the path plus "Evaluate and compare" (its pictures and GIF)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert (tmp_path / "run" / "eval.json").is_file() and (tmp_path / "ft" / "eval.json").is_file()
    assert (tmp_path / "run" / "checkpoints" / "step-00000020.pt").is_file()
    assert "only the final evaluation is repeated" in output  # the resume of a finished run
    assert f"tensorboard --logdir {os.path.join('run', 'tb')}" in output  # launch's closing lines
    assert (tmp_path / "frames.png").stat().st_size > 0 and (tmp_path / "x.npy").is_file()
    assert (tmp_path / "plots" / "fno-ns-v1e-3_rollout.gif").stat().st_size > 0
    assert "prediction" in output and "FNO-nu 1e-3" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report.html").read_text().count("data:image/") == 4
