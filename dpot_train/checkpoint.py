"""Atomic rank-0 training checkpoints that resume exactly, loadable with torch.load(weights_only=True).

A checkpoint is the released DPOT format (a dict whose `model` entry is the state dict, plus `config`, the model's
DPOTConfig dict, so `load_pretrained` reads it) extended with everything an exact resume needs: optimizer,
scheduler, step, the loader position, every rank's RNG states (as tensors and lists) and the run config.
"""

from __future__ import annotations

import os
import random
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpot_format.io import fsync_dir

FORMAT = "dpot-train-checkpoint/1"
_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_path(ckpt_dir: Path, step: int) -> Path:
    """checkpoints/step-00000042.pt."""
    return Path(ckpt_dir) / f"step-{step:08d}.pt"


def rng_state() -> dict[str, Any]:
    """This process's RNG states (python, numpy, torch CPU and CUDA) as tensors and plain lists."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "python": [py_state[0], list(py_state[1]), py_state[2]],
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Inverse of rng_state()."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npst = state["numpy"]
    np.random.set_state(("MT19937", npst["keys"].numpy().astype(np.uint32), npst["pos"], npst["has_gauss"],
                         npst["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_atomic(payload: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary name in the same folder, fsync, rename: a reader never sees a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of complete checkpoints, oldest first (temporary files are ignored)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), ckpt_dir / n) for n in os.listdir(ckpt_dir) if (m := _NAME.match(n))]
    return sorted(found)


class UnreadableCheckpointsError(RuntimeError):
    """RUN_DIR holds checkpoints but none of them loads: a resume would silently start over."""


def looks_complete(path: Path) -> bool:
    """A structural check that costs one read of the file's end: a torch zip archive with a pickled payload.

    Truncated or overwritten files fail it; pruning never deletes a file that fails it (a damaged checkpoint is
    left for the user to inspect, and it does not count among the checkpoints kept)."""
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def prune(ckpt_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (keep <= 0 keeps all); damaged files are never deleted."""
    if keep <= 0:
        return
    complete = [p for _, p in list_checkpoints(ckpt_dir) if looks_complete(p)]
    for p in complete[:-keep]:
        p.unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load one of our checkpoints safely (weights_only) and check its format tag."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        tag = ckpt.get("format") if isinstance(ckpt, dict) else None
        raise ValueError(f"{path}: not a dpot-train checkpoint (format tag {tag!r})")
    return ckpt


def latest_checkpoint(ckpt_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """Newest checkpoint that loads; a damaged newest one is skipped with a warning, falling back to the previous.

    None when there is no checkpoint; UnreadableCheckpointsError when there are some and none loads (starting over
    would overwrite a run the user may still recover)."""
    found = list_checkpoints(ckpt_dir)
    failures = []
    for _, path in reversed(found):
        try:
            return path, load_checkpoint(path)
        except Exception as e:  # noqa: BLE001 - any unreadable file means: try the previous one
            print(f"warning: skipping unreadable checkpoint {path}: {e}", flush=True)
            failures.append(f"{path.name} ({type(e).__name__})")
    if found:
        raise UnreadableCheckpointsError(
            f"{ckpt_dir}: none of the {len(found)} checkpoints loads ({', '.join(failures)}); nothing was changed. "
            f"Move them aside to start the run over, or restore a readable checkpoint to resume")
    return None
