"""The readers' lock of an output folder: a training holds it shared for as long as it reads the folder, and a
publish that would delete the files of the generation being read (`dpot-data ingest --overwrite`) needs it
exclusively, so it refuses instead of pulling the shards from under a running training.

The lock is `flock` on OUT/.dpot-readers.lock, an empty file that readers leave in place and a publish removes while
it holds it exclusively (a reader that opened the removed file notices and locks the new one). A folder the reader
cannot write to is not locked (no overwrite can happen there either).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dpot_format.errors import FormatError
from dpot_format.lock import FileLock, LockBusy

READERS_LOCK = ".dpot-readers.lock"


class ReadersBusy(RuntimeError):
    """The lock is held in the other mode: readers hold it (for a publish) or a publish does (for a reader)."""


def hold_shared(folder: str | os.PathLike[str], wait_s: float = 60.0) -> int | None:
    """Take the shared lock, waiting up to `wait_s` for a publish in progress; returns the descriptor that holds it
    (close it to release; make it inheritable to keep it across exec) or None for a folder that cannot be locked.
    ReadersBusy when a publish still holds the folder after `wait_s`."""
    lock = FileLock(Path(folder) / READERS_LOCK, shared=True,
                    busy=f"{folder}: an ingest is publishing into this output; waited {wait_s:.0f} s for it to finish "
                         "(try again when it has)")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return lock.acquire().fd
        except LockBusy as exc:
            if time.monotonic() >= deadline:
                raise ReadersBusy(str(exc)) from None
            time.sleep(0.1)
        except (OSError, FormatError):  # a folder it cannot write to, or without flock: nothing to coordinate
            return None


@contextmanager
def exclusive(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the lock exclusively for the block, removing its file at the end; ReadersBusy at once when a reader
    holds it."""
    lock = FileLock(Path(folder) / READERS_LOCK, remove=True,
                    busy=f"{folder}: a training is reading this output (it holds {READERS_LOCK})")
    try:
        lock.acquire()
    except LockBusy as exc:
        raise ReadersBusy(str(exc)) from None
    except (OSError, FormatError):  # cannot be locked: no reader can hold it either
        yield
        return
    try:
        yield
    finally:
        lock.release()
