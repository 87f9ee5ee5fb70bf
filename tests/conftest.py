"""Shared test fixtures: the `../shared/` folder beside the project root (skipped with a reason when absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared folder not found at {SHARED}: real-format fixtures and reference checkpoints live there")
    return SHARED


@pytest.fixture(scope="session")
def raw_fixtures(shared_dir: Path) -> Path:
    path = shared_dir / "fixtures" / "raw"
    if not path.is_dir():
        pytest.skip(f"raw fixtures not found at {path}")
    return path


@pytest.fixture(scope="session")
def reference_dir(shared_dir: Path) -> Path:
    path = shared_dir / "reference"
    if not path.is_dir():
        pytest.skip(f"reference checkpoints not found at {path}")
    return path
