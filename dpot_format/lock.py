"""The one file lock of the project: a non-blocking `flock` on a lock file, exclusive (one writer) or shared (many
readers, dpot_format.readers). The kernel releases it when its holder dies, so a lock left by a killed process is
never stale: the next holder simply takes it."""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from dpot_format.errors import FormatError

BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)


class LockBusy(Exception):
    """Another live process holds the lock; `str()` is the holder's message ("<path>: <what to do>")."""


class FileLock:
    """`with FileLock(path, busy="..."):` holds an exclusive lock on the file at `path` (created when missing).

    `busy` is the message of the LockBusy raised when another process holds it in a conflicting mode; `shared` takes
    it shared (any number of shared holders, no exclusive one). With `remove` the lock file is unlinked on release (a
    holder that opened the file just before is detected and retries on the new one). A path that is not a regular
    file (a directory, a FIFO) is refused with a FormatError naming it."""

    def __init__(self, path: str | os.PathLike[str], busy: str = "", remove: bool = False,
                 shared: bool = False) -> None:
        self.path = os.fspath(path)
        self.busy = busy or f"{self.path}: held by another process"
        self.remove = remove
        self.mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        self.fd = -1

    def acquire(self) -> "FileLock":
        """Take the lock now or raise LockBusy."""
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, self.mode | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in BUSY:
                    raise LockBusy(self.busy) from None
                raise
            if self._still_linked(fd):
                self.fd = fd
                return self
            os.close(fd)  # a holder before us removed the file after we opened it: lock the one on disk

    def release(self) -> None:
        """Give the lock back (unlinking the file first when `remove`); a no-op when not held."""
        if self.fd < 0:
            return
        try:
            if self.remove:
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
        finally:
            os.close(self.fd)  # closing releases the lock
            self.fd = -1

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path, flags, 0o644)
        except IsADirectoryError:
            raise FormatError(self.path, "is a directory, expected the lock file (a regular file); remove it") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO):
                raise FormatError(self.path, "is a symbolic link or a special file, expected the lock file (a "
                                             "regular file); remove it") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise FormatError(self.path, "is not a regular file, expected the lock file; remove it")
        return fd

    def _still_linked(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def is_held(path: str | os.PathLike[str]) -> bool:
    """Whether a live process holds the lock at `path` (False when the file is missing)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in BUSY
    finally:
        os.close(fd)
    return False
