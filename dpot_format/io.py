"""File access for the format, local paths and fsspec URLs alike: joining, atomic writes, refusing non-regular
files before they are opened, bounded reads, and the one streamed sha256 of files and of arrays."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
from concurrent.futures import CancelledError
from typing import IO, Any, Iterable, Iterator

import numpy as np

from dpot_format.errors import FormatError

CHUNK = 8 << 20  # bytes per read when hashing or copying a file
ARRAY_BLOCK_BYTES = 64 << 20  # bytes per block when hashing an array


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for "proto://..." paths, False for plain local paths."""
    return "://" in str(path)


def is_local(path: str | os.PathLike[str]) -> bool:
    """Plain paths and file:// URLs are local; every other protocol is remote."""
    return not is_url(path) or str(path).startswith("file://")


def local_path(path: str | os.PathLike[str]) -> str:
    """The local filesystem path of a plain path or file:// URL."""
    text = os.fspath(path)
    return text[len("file://"):] if text.startswith("file://") else text


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """Join path parts onto a local path or a URL with "/"; parts never start a new root."""
    text = os.fspath(base)
    out = text.rstrip("/") if text not in ("/", "") else text
    for part in parts:
        part = str(part).strip("/")
        if part:
            out = part if not out else (f"{out}{part}" if out.endswith("/") else f"{out}/{part}")
    return out


def filesystem(path: str | os.PathLike[str]) -> tuple[Any, str]:
    """The fsspec filesystem serving `path` and the path as that filesystem names it."""
    from fsspec.core import url_to_fs

    return url_to_fs(os.fspath(path))


def zarr_store(path: str | os.PathLike[str], read_only: bool = True) -> Any:
    """A Zarr v3 store for a local folder, a file:// URL or any other fsspec URL."""
    import zarr.storage

    text = os.fspath(path)
    if is_local(text):
        return zarr.storage.LocalStore(local_path(text), read_only=read_only)
    return zarr.storage.FsspecStore.from_url(text, read_only=read_only)


def drop_cached(fd: int) -> None:
    """Let the page cache forget a written file's pages once they are on disk (Linux fadvise DONTNEED; a no-op
    elsewhere): bulk output that is not read back stops crowding out the machine's other cached files, and its
    memory goes to the writes that follow (on VMs, writing into memory the guest has not touched before is several
    times slower than into memory it just freed)."""
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a folder so that renames inside it are durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _refuse_special_target(target: str) -> None:
    """A device, FIFO or socket is never replaced by a rename onto it (FormatError): what a writer of files may
    replace is a regular file (or a link, itself, never what it points to)."""
    try:
        mode = os.lstat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        raise FormatError(target, f"is {file_kind(mode)}; expected a regular file or a new name")


def _create_temporary(tmp: str) -> None:
    """Create the temporary file as a new regular file, never through a link at its name: whatever a killed writer
    of the same pid left there (a file, a link) is removed first."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, 0o666)
    except FileExistsError:
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o666)
    os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """`with atomic_path(p) as tmp:` write the file at `tmp` (by any means: a stream, scipy, h5py); on leaving the
    block it is fsynced and renamed to `p`, and the folder fsynced, so that a reader sees the old file or the whole
    new one, never a part. The temporary file (`.<name>.tmp-<pid>` beside `p`) is created new, never through a link,
    and removed when anything fails; a device, FIFO or socket at `p` is refused (FormatError), never replaced.
    The one atomic write of the project: `atomic_write` and every writer of whole files go through it."""
    target = local_path(os.fspath(path))
    folder, name = os.path.split(target)
    tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}")
    _refuse_special_target(target)
    _create_temporary(tmp)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(folder or ".")


def atomic_write(path: str | os.PathLike[str], data: bytes) -> str:
    """Write `data` to `path` so that a reader sees the old file or the whole new one, never a part.

    Local: `atomic_path` (a temporary name in the same folder, fsync, rename, fsync of the folder). URL: the
    temporary name, then a move. The temporary file is removed when anything fails. Returns the path written.
    """
    text = os.fspath(path)
    if is_local(text):
        with atomic_path(text) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(data)
        return text
    fsys, target = filesystem(text)
    parent, _, name = target.rstrip("/").rpartition("/")
    tmp = f"{parent}/.{name}.tmp-{os.getpid()}"
    try:
        with fsys.open(tmp, "wb") as fh:
            fh.write(data)
        fsys.mv(tmp, target)
    except BaseException:
        try:
            if fsys.exists(tmp):
                fsys.rm(tmp)
        except Exception:  # noqa: BLE001 - the original failure matters more than the cleanup's
            pass
        raise
    return text


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def file_kind(mode: int) -> str:
    """What a stat mode describes, in words ("a regular file", "a FIFO (named pipe)", ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((words for test, words in _KINDS if test(mode)), "not a regular file")


def _refuse_non_regular(where: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise FormatError(where, f"is {file_kind(mode)}, expected a regular file")


def _regular_stat(text: str) -> os.stat_result:
    """stat of the local file at `text` (a path or file:// URL); FormatError when it is missing or not regular."""
    try:
        st = os.stat(local_path(text))
    except (FileNotFoundError, NotADirectoryError):
        raise FormatError(text, "not found") from None
    _refuse_non_regular(text, st.st_mode)
    return st


def _remote_file(text: str) -> tuple[Any, str, dict[str, Any]]:
    """(filesystem, its path, info) of the file at a URL; FormatError when it is missing or a directory."""
    fsys, remote = filesystem(text)
    try:
        info = fsys.info(remote)
    except FileNotFoundError:
        raise FormatError(text, "not found") from None
    if info.get("type") == "directory":
        raise FormatError(text, "is a directory, expected a regular file")
    return fsys, remote, info


def open_read(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open a file for binary reading; a local path that is not a regular file (directory, FIFO, device, socket) is
    refused with a FormatError before it is opened, so that reading it can neither hang nor run forever."""
    text = os.fspath(path)
    if is_local(text):
        _regular_stat(text)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
        fd = os.open(local_path(text), flags)  # non-blocking: a FIFO swapped in since the stat does not block it
        try:
            _refuse_non_regular(text, os.fstat(fd).st_mode)
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")
    fsys, remote, _ = _remote_file(text)
    return fsys.open(remote, "rb")


def file_size(path: str | os.PathLike[str]) -> int:
    """Size in bytes of the regular file at a path or URL (FormatError when missing or not a regular file)."""
    text = os.fspath(path)
    if is_local(text):
        return int(_regular_stat(text).st_size)
    return int(_remote_file(text)[2].get("size") or 0)


def sha256_file(path: str | os.PathLike[str], expected_bytes: int | None = None,
                cancel: threading.Event | None = None) -> tuple[str, int]:
    """(hex sha256, bytes read) of a file at a path or URL, streamed in CHUNK pieces.

    Non-regular local files are refused before they are opened (FormatError). With `expected_bytes`, at most
    expected_bytes + 1 bytes are read: a longer file shows as a size of expected_bytes + 1 (and a digest of that
    prefix), so that a file that grew, or never ends, is not read to its end. A set `cancel` event stops the read
    between pieces (concurrent.futures.CancelledError).
    """
    limit = None if expected_bytes is None else int(expected_bytes) + 1
    digest = hashlib.sha256()
    size = 0
    with open_read(path) as fh:
        while True:
            want = CHUNK if limit is None else min(CHUNK, limit - size)
            if want <= 0:
                break
            if cancel is not None and cancel.is_set():
                raise CancelledError(f"{os.fspath(path)}: hashing cancelled")
            block = fh.read(want)
            if not block:
                break
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def read_bounded(path: str | os.PathLike[str], limit: int) -> bytes:
    """The whole content of a file at a path or URL, refused (FormatError) when it is larger than `limit` bytes or
    not a regular file; never reads more than limit + 1 bytes."""
    text = os.fspath(path)
    with open_read(text) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise FormatError(text, f"larger than the limit of {limit} bytes")
    return data


class ArrayHasher:
    """Incremental sha256 of an array's C-order bytes, fed with consecutive blocks along axis 0."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def update(self, block: np.ndarray) -> None:
        """Add the next block (the rows that follow the previous block along axis 0)."""
        self._digest.update(memoryview(np.ascontiguousarray(block)).cast("B"))  # the C-order bytes, not copied

    def hexdigest(self) -> str:
        """Hex digest of everything added so far."""
        return self._digest.hexdigest()


def _row_blocks(shape: tuple[int, ...], itemsize: int, chunk_rows: int | None) -> Iterable[slice]:
    """Slices along axis 0 of about ARRAY_BLOCK_BYTES each (a multiple of the chunk rows when known)."""
    if not shape:
        yield slice(None)
        return
    row = max(1, int(np.prod(shape[1:], dtype=np.int64)) * itemsize)
    step = max(1, ARRAY_BLOCK_BYTES // row)
    if chunk_rows:
        step = max(chunk_rows, step // chunk_rows * chunk_rows)
    for start in range(0, shape[0], step):
        yield slice(start, min(start + step, shape[0]))


def sha256_array(array: Any) -> str:
    """sha256 of an array's uncompressed C-order bytes (numpy, zarr or dask), read block by block along axis 0.

    The digest depends on dtype (including byte order), shape and values only, not on chunking or codecs, so the
    same data stored as Zarr with any compressor hashes the same. Numeric and bool arrays only.
    """
    dtype = np.dtype(array.dtype)
    if dtype.kind not in "biuf":
        raise TypeError(f"sha256_array hashes numeric/bool arrays, not {dtype}")
    shape = tuple(array.shape)
    chunks = getattr(array, "chunks", None)
    chunk_rows = chunks[0] if chunks and isinstance(chunks[0], int) else None
    hasher = ArrayHasher()
    for rows in _row_blocks(shape, dtype.itemsize, chunk_rows):
        block = array[rows] if shape else array[()]
        hasher.update(np.asarray(block, dtype=dtype))
    return hasher.hexdigest()
