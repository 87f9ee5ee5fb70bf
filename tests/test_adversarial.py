"""The adversarial run's quick subset (benchmarks/adversarial.py --quick): bad raw files, HDF5 links out of the input,
outputs onto FIFOs/devices/dataset stores, hostile eval.json files and arguments, all through the real CLIs. Every
case ends refused with one line or as a clean success; none ends in a traceback, a hang, a lost or changed planted
file, a sentinel read from outside the input, a write outside the output, or an exit 0 on input bad by construction."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_quick_adversarial_run_is_clean(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "adversarial.py"), "--out", str(tmp_path / "adv"),
                           "--quick"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    counts = result["counts"]
    assert result["cases"] >= 20
    for kind in ("traceback", "hang", "lost", "outside read", "outside write", "accepted wrongly", "other"):
        assert counts[kind] == 0, (kind, result["not_clean"])
    assert counts["refused"] >= 15 and counts["ingested"] >= 2, counts
