"""Atomic rank-0 training checkpoints that resume exactly, loadable with torch.load(weights_only=True).

A checkpoint is the released DPOT format (a dict whose `model` entry is the state dict, plus `config`, the model's
DPOTConfig dict, so `load_pretrained` reads it) extended with everything an exact resume needs: optimizer,
scheduler, step, the loader position, every rank's RNG states (as tensors and lists) and the run config.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import re
import stat
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpot_format.io import atomic_path, atomic_write, fsync_dir
from dpot_train.model.checkpoint import read_checkpoint, record_path, record_text

FORMAT = "dpot-train-checkpoint/1"
_NAME = re.compile(r"^step-(\d{8})\.pt$")


def training_payload(model: torch.nn.Module, train_config: dict[str, Any], optimizer: Any, scheduler: Any, step: int,
                     loader: dict[str, int], rng: list[dict[str, Any]]) -> dict[str, Any]:
    """The layout of a training checkpoint: the released format's `model` and our `config` (so `load_pretrained` and
    `--init` read it), plus the format tag and everything an exact resume needs."""
    return {"format": FORMAT, "model": model.state_dict(), "config": model.config.to_dict(),
            "train_config": train_config, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "step": step, "loader": loader, "rng": rng}


def trained_recipe(content: Any) -> str:
    """The recipe a checkpoint's run was trained with, from its content ("dpot" when it names none: released weights
    and runs from before recipes)."""
    train_config = content.get("train_config") if isinstance(content, dict) else None
    return str((train_config if isinstance(train_config, dict) else {}).get("recipe") or "dpot")


def trained_res(content: Any) -> int:
    """The grid a checkpoint's run resized windows to (its data.res), 0 when none or for released weights."""
    train_config = content.get("train_config") if isinstance(content, dict) else None
    data = (train_config if isinstance(train_config, dict) else {}).get("data")
    return int((data if isinstance(data, dict) else {}).get("res") or 0)


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


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (full disk, no permission): nothing partial is left behind."""


class _HashingWriter:
    """A file wrapper that hashes what torch.save writes, so the record costs no second read of the file."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.sha256 = fh, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def save_atomic(payload: dict[str, Any], path: Path) -> None:
    """torch.save to a temporary name in the same folder, fsync, write the sha256 record, rename: a reader never sees
    a partial file, and a file that changes afterwards no longer matches its record. On failure the temporary file is
    removed and CheckpointWriteError says why in one line."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:  # fsync, rename, folder fsync; the temporary file removed on failure
            with open(tmp, "wb") as f:
                writer = _HashingWriter(f)
                torch.save(payload, writer)
            atomic_write(record_path(path), record_text(writer.sha256.hexdigest(), path))
    except BaseException as exc:
        os_error = _os_error(exc)
        if os_error is not None:
            raise CheckpointWriteError(_write_problem(path, os_error)) from exc
        raise


def _os_error(exc: BaseException | None) -> OSError | None:
    """The OSError behind a failure (torch reports a failed write as a RuntimeError raised while handling it)."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _write_problem(path: Path, err: OSError) -> str:
    """One line for a failed checkpoint write."""
    why = f"no space left on the device holding {path.parent}" if err.errno == errno.ENOSPC else \
        (err.strerror or str(err))
    return (f"{path}: the checkpoint could not be written ({why}); no partial file was left. The checkpoints "
            "already written are intact: free space (or fix the folder) and continue with --resume")


def list_checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of complete checkpoints, oldest first (temporary files are ignored)."""
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), ckpt_dir / n) for n in os.listdir(ckpt_dir) if (m := _NAME.match(n))]
    return sorted(found)


class RunDirError(RuntimeError):
    """RUN_DIR is in a state that does not fit the request (e.g. checkpoints exist but --resume is not given)."""


class UnreadableCheckpointsError(RuntimeError):
    """RUN_DIR holds checkpoints but none of them loads: a resume would silently start over."""


def looks_complete(path: Path) -> bool:
    """A structural check that costs one read of the file's end: a regular file holding a torch zip archive with a
    pickled payload (a FIFO or device fails it without being opened).

    Truncated or overwritten files fail it; pruning never deletes a file that fails it (a damaged checkpoint is
    left for the user to inspect, and it does not count among the checkpoints kept)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
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
        record_path(p).unlink(missing_ok=True)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load one of our checkpoints safely (weights_only, a regular file, its sha256 record checked) and check its
    format tag."""
    ckpt = read_checkpoint(path)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        tag = ckpt.get("format") if isinstance(ckpt, dict) else None
        raise ValueError(f"{path}: not a dpot-train checkpoint (format tag {tag!r})")
    return ckpt


def set_aside(path: Path) -> Path:
    """Rename a damaged checkpoint (and its record) to `step-N.pt.damaged` (then `.damaged-2`, ...) so that a resume
    that redoes its step cannot overwrite it; returns the new name."""
    target = path.with_name(path.name + ".damaged")
    k = 1
    while target.exists() or target.is_symlink():
        k += 1
        target = path.with_name(f"{path.name}.damaged-{k}")
    os.replace(path, target)
    if record_path(path).exists():
        os.replace(record_path(path), record_path(target))
    fsync_dir(path.parent)
    return target


def latest_checkpoint(ckpt_dir: Path, keep_damaged: bool = True) -> tuple[Path, dict[str, Any]] | None:
    """Newest checkpoint that loads, falling back to older ones; each newer one that does not load is renamed aside
    (`set_aside`, when `keep_damaged`) and said so in one line, so the steps redone never overwrite it.

    None when there is no checkpoint; UnreadableCheckpointsError when there are some and none loads (starting over
    would overwrite a run the user may still recover); nothing is renamed then."""
    found = list_checkpoints(ckpt_dir)
    failures = []
    for _, path in reversed(found):
        try:
            ckpt = load_checkpoint(path)
        except Exception as e:  # noqa: BLE001 - any unreadable file means: try the previous one
            failures.append((path, " ".join(str(e).split())[:300]))
            continue
        for bad, why in failures if keep_damaged else []:
            print(f"warning: {bad} does not load ({why}); kept as {set_aside(bad).name}, resuming from {path.name}",
                  flush=True)
        return path, ckpt
    if found:
        names = ", ".join(f"{p.name} ({why[:80]})" for p, why in failures)
        raise UnreadableCheckpointsError(
            f"{ckpt_dir}: none of the {len(found)} checkpoints loads ({names}); nothing was changed. "
            f"Move them aside to start the run over, or restore a readable checkpoint to resume")
    return None
