"""Tell which source a set of raw files (or folders) comes from, by name first and by content when names are silent.

Used by `dpot-data ingest auto` and `dpot-data ingest --dataset`: FNO `.mat` files, PDEBench, PDEArena and The Well
HDF5 files, CFDBench case trees. A folder is expanded to the raw files inside it (a CFDBench tree stays a folder).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import h5py

from dpot_data.errors import InputError

RAW_SUFFIXES = (".mat", ".h5", ".hdf5")
_NAME_RULES = (
    (re.compile(r"^NavierStokes2D_(train|valid|test)_"), "pdearena"),
    (re.compile(r"^[23]D_CFD_(Rand|Turb)_"), "pdebench"),
    (re.compile(r"^2D_(diff-react|rdb)_"), "pdebench"),
    (re.compile(r"\.mat$", re.IGNORECASE), "fno"),
    (re.compile(r"^(u|v)\.npy$|^case\.json$"), "cfdbench"),
)


@dataclass(frozen=True)
class Detected:
    """The source of a set of inputs and the inputs to hand to its reader."""

    source: str
    paths: tuple[Path, ...]
    how: str  # "name" or "content"


def _is_cfdbench_tree(folder: Path) -> bool:
    return any(q.parent.name.startswith("case") for q in folder.rglob("case.json"))


def expand(paths: Sequence[str | Path]) -> list[Path]:
    """Files as given; folders replaced by the raw files inside (sorted), except CFDBench trees, kept whole."""
    out: list[Path] = []
    for p in (Path(os.fsdecode(q)) for q in paths):
        if not p.exists():
            raise InputError(p, "not found")
        if p.is_dir() and not _is_cfdbench_tree(p):
            found = sorted(q for q in p.rglob("*") if q.is_file() and q.suffix.lower() in RAW_SUFFIXES)
            if not found:
                raise InputError(p, f"expected raw files ({', '.join(RAW_SUFFIXES)}) or a CFDBench case tree inside")
            out.extend(found)
        else:
            out.append(p)
    return out


def source_of(path: Path) -> tuple[str | None, str]:
    """(source, how) for one path: by name, else by looking inside an HDF5 file; (None, why) if it cannot tell."""
    if path.is_dir():
        return ("cfdbench", "name") if _is_cfdbench_tree(path) else (None, "a folder without CFDBench cases")
    for rule, source in _NAME_RULES:
        if rule.search(path.name):
            return source, "name"
    if path.suffix.lower() in (".h5", ".hdf5"):
        from dpot_data.sources._blocks import check_h5_contained

        try:
            with h5py.File(path, "r") as f:
                check_h5_contained(path, f)  # nothing behind a link to another file is looked at
                keys = set(f.keys())
                if keys & {"train", "valid", "test"}:
                    group = f[sorted(keys & {"train", "valid", "test"})[0]]
                    if isinstance(group, h5py.Group) and {"u", "vx", "vy"} <= set(group.keys()):
                        return "pdearena", "content"
                if {"dimensions", "t0_fields", "t1_fields"} <= keys:
                    return "the_well", "content"
                if "density" in keys or any(isinstance(f[k], h5py.Group) and "data" in f[k] for k in keys):
                    return "pdebench", "content"
        except OSError:
            return None, "an HDF5 file that cannot be opened, with a name no source uses"
    return None, "a name and content no source uses"


def detect(paths: Sequence[str | Path]) -> Detected:
    """The one source all inputs belong to; InputError naming the odd file when they disagree or none fits.

    Files whose content cannot be read (truncated) still count by their name, so the reader can skip and report
    them.
    """
    files = expand(paths)
    if not files:
        raise InputError("<no files>", "expected raw files to ingest")
    found: dict[str, list[Path]] = {}
    how = "name"
    for p in files:
        source, why = source_of(p)
        if source is None:
            raise InputError(p, f"cannot tell its source ({why}); expected FNO .mat, PDEBench or PDEArena HDF5 "
                                "files, or a CFDBench case tree; name the source: dpot-data ingest <source> FILES")
        if why == "content":
            how = "content"
        found.setdefault(source, []).append(p)
    if len(found) > 1:
        sample = {s: ps[0].name for s, ps in found.items()}
        raise InputError(files[0], f"inputs come from several sources {sample}: ingest each source separately")
    (source, members), = found.items()
    if source == "cfdbench":
        members = [p.parent if p.is_file() else p for p in members]
        members = list(dict.fromkeys(members))
    return Detected(source, tuple(members), how)
