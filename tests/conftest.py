"""Shared test fixtures: the `../shared/` folder beside the project root (skipped with a reason when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


SHARED_WHAT = ("reference fixtures (the shared/ folder beside the checkout: raw files in the published layouts, the "
               "reference DPOT checkpoint and its golden outputs)")


def require_shared(folder: Path) -> Path:
    """`folder` when it exists; else the test is skipped with a reason that says what the folder is."""
    if not folder.is_dir():
        pytest.skip(f"{SHARED_WHAT} not found at {folder}; the golden-reference tests need it")
    return folder


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    return require_shared(SHARED)


def _existing(path: Path, what: str) -> Path:
    """`path` when it is a folder; the test is skipped, saying what is missing, otherwise."""
    if not path.is_dir():
        pytest.skip(f"{what} not found at {path} (in the shared/ folder beside the checkout); the golden-reference "
                    "tests need it")
    return path


@pytest.fixture(scope="session")
def raw_fixtures(shared_dir: Path) -> Path:
    return _existing(shared_dir / "fixtures" / "raw", "raw fixtures")


@pytest.fixture(scope="session")
def reference_dir(shared_dir: Path) -> Path:
    return _existing(shared_dir / "reference", "reference checkpoints")


@pytest.fixture(scope="session")
def inputs_dir(reference_dir: Path) -> Path:
    """The reference pipeline's golden model inputs per source (raw files, official.npz, official_eval.json)."""
    return _existing(reference_dir / "inputs", "reference model inputs")


@pytest.fixture(scope="session")
def fno_train_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small FNO Navier-Stokes shards for training tests, made through dpot_data's library API (synth + ingest).

    16 trajectories of 13 frames (u only: the dpot-reference convention leaves out a) at 32x32 (1 valid channel
    padded to 4): 12 train, 2 valid, 2 test.
    """
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.fno import synth_fno

    base = tmp_path_factory.mktemp("fno_train")
    files = synth_fno(base / "raw", n=16, frames=13, viscosity=1e-3, seed=0, resolution=32)
    out = base / "shards"
    ingest_files("fno", [files[0]], out, IngestOptions(resolution=32, split=(0.75, 0.125), seed=0))
    return out


@pytest.fixture(scope="session")
def fno_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny FNO Navier-Stokes solution (4 trajectories, 4 frames, 64x64) written as MAT v5 and as MAT v7.3."""
    from dpot_data.synth.fno import synth_fno

    folder = tmp_path_factory.mktemp("fno_pair")
    v5, v73 = synth_fno(folder, n=4, frames=4, viscosity=1e-3, seed=1, resolution=64)
    return {"dir": folder, "v5": v5, "v73": v73}


@pytest.fixture(scope="module")
def cluster():
    """An in-process dask.distributed cluster of two single-thread workers (the tests' `--scheduler`)."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as c:
        yield c
