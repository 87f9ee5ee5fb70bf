"""The `dpot-data ingest` process's start-up (`dpot_data.ingest.startup`): dask.array without its optional scipy
imports, the start-up objects frozen out of the collector while the ingest runs, and the same output."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from dpot_data.ingest.startup import ingest_process
from dpot_data.synth import pdebench as synth_bench

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str) -> str:
    """Run `code` in a fresh interpreter (nothing imported yet) and return its stdout."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_dask_array_is_imported_without_scipy_which_stays_importable() -> None:
    out = _python("""
        import sys
        import numpy as np
        from dpot_data.ingest.startup import import_dask_array
        print(import_dask_array(), "scipy" in sys.modules, "numpy.f2py" in sys.modules)
        import dask.array as da
        print(int(da.from_array(np.arange(10), chunks=3).sum().compute()))
        from dpot_data.transform import resample_fields
        print(resample_fields(np.ones((1, 1, 1, 8, 8), np.float32), (4, 4), "fourier").shape, "scipy" in sys.modules)
        print(import_dask_array())
    """).split("\n")
    assert out[:4] == ["True False False", "45", "(1, 1, 1, 4, 4) True", "False"], out


def test_the_ingest_command_imports_no_scipy_for_a_native_grid(tmp_path: Path) -> None:
    path = synth_bench.write_cfd(tmp_path / "raw", n=4, frames=3, res=16)
    out = _python(f"""
        import sys
        from dpot_data.cli import app
        try:
            app(["ingest", "pdebench", {str(path)!r}, "--out", {str(tmp_path / "out")!r}, "--resolution", "0",
                 "--no-progress"])
        except SystemExit as exc:
            assert not exc.code, exc.code
        print("scipy" in sys.modules, "pandas" in sys.modules)
    """)
    assert out.splitlines()[-1] == "False True", out
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["datasets"][0]["splits"]


def test_ingest_process_freezes_for_its_body_and_leaves_the_collector_as_it_was() -> None:
    assert gc.get_freeze_count() == 0
    enabled = gc.isenabled()
    with ingest_process("pdebench"):
        assert gc.get_freeze_count() > 0 and gc.isenabled() == enabled
        assert "dpot_data.sources.pdebench" in sys.modules and "dpot_data.ingest.pipeline" in sys.modules
    assert gc.get_freeze_count() == 0 and gc.isenabled() == enabled
    gc.freeze()  # someone else's freeze is left alone
    try:
        frozen = gc.get_freeze_count()
        with ingest_process("no-such-source"):
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
