"""The paths a command is given: local ones made absolute for workers elsewhere, and the ingest outputs a folder
holds (itself, or the dataset folders of an `ingest corpus`). Light: imported before the ingest machinery."""

from __future__ import annotations

import os
from pathlib import Path


def absolute_path(path: str | Path) -> str:
    """A local path made absolute, so that dask workers with another working directory find it; URLs are kept.
    Symbolic links are kept as given (errors name the file the user named; a link loop is refused by the ingest)."""
    text = str(path)
    return text if "://" in text else os.path.abspath(Path(text).expanduser())


def output_roots(folder: str) -> list[str]:
    """The ingest outputs at `folder`: itself when it holds manifest.json, else (an `ingest corpus` folder) every
    sub-folder holding one, sorted; itself again when there is neither (the command then says what is missing)."""
    if "://" in folder or (Path(folder) / "manifest.json").exists():
        return [folder]
    subs = sorted(str(p.parent) for p in Path(folder).glob("*/manifest.json"))
    return subs or [folder]
