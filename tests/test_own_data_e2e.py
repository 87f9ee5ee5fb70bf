"""A researcher's own data end to end with no flags beyond the paths (`benchmarks/own_data.py --smoke`): a kelvin field
on a 48x64 grid with a NaN obstacle is ingested on its native grid with its units, no stored or scored fluid value
leaves the source's fluid range, `launch` normalises it and says so, and the pictures name `temperature [K]`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_own_data_with_no_flags_is_right_by_default(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "own_data.py"), "--out", str(tmp_path / "b"),
                        "--smoke"], capture_output=True, text=True, timeout=1200, cwd=ROOT,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    stored = result["stored"]
    assert stored["grid"] == [48, 64] and stored["convention"] == "own-data"  # the native grid, no stretching
    assert stored["outside"] == 0  # no stored fluid value outside the source's fluid range
    assert stored["zarr_units"] == {"fields": ["K", "1", "1", "1"], "time": "s", "y": "m", "x": "m"}
    assert result["card_says_temperature_K"]
    default, raw = result["runs"]["default"], result["runs"]["normalize none"]
    assert default["normalise_line"] and "per channel from its manifest's train statistics" in \
        default["normalise_line"][0] and " K std " in default["normalise_line"][0]
    assert raw["normalise_line"] and "none" in raw["normalise_line"][0]
    assert default["units"] == {"temperature": "K"} and default["scored_outside"] == 0
    assert "temperature [K]" in default["colour_bars"]
    # the same persistence in both runs: the scores are of the same data, in kelvin
    assert default["persistence"] == raw["persistence"]
