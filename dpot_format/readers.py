"""The readers' lock of an output folder: a training holds it shared for as long as it reads the folder, and a
publish that would delete the files of the generation being read (`dpot-data ingest --overwrite`) needs it
exclusively, so it refuses instead of pulling the shards from under a running training.

The lock is `flock` on OUT/.dpot-readers.lock, an empty file that readers leave in place and a publish removes while
it holds it exclusively (a reader that opened the removed file notices and locks the new one). A folder the reader
cannot write to is not locked (no overwrite can happen there either).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

READERS_LOCK = ".dpot-readers.lock"
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


class ReadersBusy(RuntimeError):
    """The lock is held in the other mode: readers hold it (for a publish) or a publish does (for a reader)."""


def _open(folder: Path) -> int | None:
    """A descriptor of the folder's lock file (created when missing); None where it cannot be created."""
    try:
        return os.open(Path(folder) / READERS_LOCK, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        return None


def _still_there(fd: int, folder: Path) -> bool:
    """Whether the locked descriptor is still the folder's lock file (a publish may have removed it meanwhile)."""
    try:
        return os.fstat(fd).st_ino == os.stat(Path(folder) / READERS_LOCK).st_ino
    except FileNotFoundError:
        return False


def hold_shared(folder: str | os.PathLike[str], wait_s: float = 60.0) -> int | None:
    """Take the shared lock, waiting up to `wait_s` for a publish in progress; returns the descriptor that holds it
    (close it to release; make it inheritable to keep it across exec) or None for a folder that cannot be locked.
    ReadersBusy when a publish still holds the folder after `wait_s`."""
    fd = _open(Path(folder))
    if fd is None:
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            if _still_there(fd, Path(folder)):
                return fd
            os.close(fd)
            fd = _open(Path(folder))
            if fd is None:
                return None
        except OSError as exc:
            if exc.errno not in _BUSY or time.monotonic() >= deadline:
                os.close(fd)
                if exc.errno in _BUSY:
                    raise ReadersBusy(f"{folder}: an ingest is publishing into this output; waited {wait_s:.0f} s "
                                      "for it to finish (try again when it has)") from None
                return None  # a file system without flock: nothing to coordinate with
            time.sleep(0.1)


@contextmanager
def exclusive(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the lock exclusively for the block, removing its file at the end; ReadersBusy at once when a reader
    holds it."""
    fd = _open(Path(folder))
    if fd is None:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in _BUSY:
                raise ReadersBusy(f"{folder}: a training is reading this output (it holds {READERS_LOCK})") from None
            raise
        yield
        if _still_there(fd, Path(folder)):
            os.unlink(Path(folder) / READERS_LOCK)
    finally:
        os.close(fd)
