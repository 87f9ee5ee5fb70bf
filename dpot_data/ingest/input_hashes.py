"""sha256 of an ingest's input files, on a thread of their own, from the moment their paths are known. Kept apart
from dpot_data.ingest so that the CLI can start it before that package's imports (half a second of start-up that
the hashing, a pass over every input byte, then runs beside)."""

from __future__ import annotations

import os
import stat
import threading
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path, PurePath
from typing import Any, Mapping, Sequence

from dpot_data.errors import InputError
from dpot_format.io import sha256_file

Stamp = tuple[int, int, int, int]  # (st_dev, st_ino, st_size, st_mtime_ns): which file, and which bytes
CHANGED = ("changed while this ingest read it (replaced or rewritten since the ingest started: {what}); expected "
           "the input to stay as it was until the ingest ends; nothing was published: re-run once it stays put")


def stamp(path: str | os.PathLike[str]) -> Stamp | None:
    """(device, inode, size, mtime_ns) of `path` (links followed), None when it is gone; a folder's size and mtime
    are left out (0): they change with any entry made in it, and the files inside are compared one by one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return (st.st_dev, st.st_ino, 0, 0)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _stamped_sha256(path: str, stop: threading.Event | None = None) -> tuple[str, int, Stamp | None, Stamp | None]:
    """sha256 and size of a file, with its identity (dpot_data.ingest.identity.stamp) before and after hashing:
    equal when the bytes hashed are those of the file of that identity."""
    before = stamp(path)
    digest, size = sha256_file(path, None, stop)
    return digest, size, before, stamp(path)


class InputHashes:
    """sha256 of the input files on a thread of their own, started as early as the paths are known (the CLI: before
    its imports; run_ingest: before the reader's NaN/Inf scan, a pass that waits on the disk), so that the hashing runs
    beside them rather than on the cores the blocks need. Closing it stops a hash still running (a bad input, say)."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]] = ()) -> None:
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpot-input-hash")
        self._futures: dict[str, Future] = {}
        self.add(paths)

    def add(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        """Start hashing the files among `paths` not started yet (folders are left to the reader's file list)."""
        for p in paths:
            try:
                key = str(Path(p).resolve())
            except (OSError, RuntimeError):  # a link loop: the ingest refuses it with one line, not this thread
                continue
            if key not in self._futures and Path(key).is_file():
                self._futures[key] = self._pool.submit(_stamped_sha256, key, self._stop)

    def entries(self, paths: Sequence[str | os.PathLike[str]], identity: Any = None) -> list[dict[str, Any]]:
        """The manifest's `inputs`: path, sha256 and bytes of each of `paths`, waiting for their hashes. With
        `identity` (dpot_data.ingest.identity.InputIdentity), each digest must be of the file recorded there, the
        file the blocks read: one replaced or rewritten before or while it was hashed is refused (InputError)."""
        self.add(paths)
        out = []
        for p in paths:
            key = str(Path(p).resolve())
            digest, size, before, after = (self._futures[key].result() if key in self._futures
                                           else _stamped_sha256(key))
            recorded = identity.stamp_of(key) if identity is not None else before
            if not before == after == recorded:
                raise InputError(key, CHANGED.format(what="its bytes hashed for the manifest are not those read"))
            out.append({"path": key, "sha256": digest, "bytes": size})
        return out

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "InputHashes":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _files_below(folder: str) -> list[str]:
    """Every regular file below `folder` (links not followed into folders), sorted."""
    out = []
    for parent, dirs, files in os.walk(folder):
        dirs.sort()
        out.extend(os.path.join(parent, f) for f in sorted(files) if os.path.isfile(os.path.join(parent, f)))
    return out


class _Digests:
    """sha256 of local files, each taken once (a pass over its bytes) and only when its size matches."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def same(self, path: str, entry: Mapping[str, Any]) -> bool:
        """Whether the file at `path` has the recorded input `entry`'s size and sha256."""
        if os.path.getsize(path) != entry.get("bytes"):
            return False
        if path not in self._seen:
            self._seen[path] = sha256_file(path)[0]
        return self._seen[path] == entry.get("sha256")


def _folder_root(folder: str, files: Sequence[str], rest: Sequence[Mapping[str, Any]]) -> str | None:
    """The folder the recorded inputs `rest` were read from, as `folder` mirrors it: the root under which most of
    them exist in `folder` at the same relative paths; None when none does. Linear in the files (each recorded path
    is tried at each of its depths)."""
    present = {os.path.relpath(f, folder) for f in files}
    votes: Counter[str] = Counter()
    for e in rest:
        parts = PurePath(str(e["path"])).parts
        votes.update(str(PurePath(*parts[:k])) for k in range(1, len(parts)) if os.path.join(*parts[k:]) in present)
    return max(sorted(votes), key=votes.__getitem__) if votes else None


def content_differs(inputs: Sequence[str], recorded: Sequence[Mapping[str, Any]],
                    skipped: Sequence[str] = ()) -> str | None:
    """Whether local inputs at paths a manifest does not record are, byte for byte, its recorded inputs `recorded`
    (path, sha256, bytes; those not given at their own path) copied elsewhere: None when they are, else what
    differs, naming a file. A file is matched by size, then sha256; a folder file by file at the same relative paths,
    where a file the ingest did not read must lie under one of `skipped` (the manifest's skipped items, relative to
    the folder: CFDBench's dam cases). Every recorded input must be matched."""
    rest = list(recorded)
    digests = _Digests()
    for text in inputs:
        if "://" in text:
            return f"{text} is a URL, compared by name only"
        if not os.path.exists(text):
            return f"{text}: not found"
        if os.path.isfile(text):
            match = next((e for e in rest if digests.same(text, e)), None)
            if match is None:
                return f"{text}: no recorded input has its size and sha256"
            rest.remove(match)
            continue
        files = _files_below(text) if os.path.isdir(text) else []
        root = _folder_root(text, files, rest)
        if root is None:
            return f"{text}: holds none of the recorded inputs at their relative paths"
        for e in [e for e in rest if str(e["path"]).startswith(root + os.sep)]:
            copy = os.path.join(text, os.path.relpath(str(e["path"]), root))
            if not os.path.isfile(copy):
                continue  # left in `rest`: named below
            if not digests.same(copy, e):
                return f"{copy}: differs from the recorded {e['path']} (size or sha256)"
            rest.remove(e)
        known = {str(e["path"]) for e in recorded}
        for f in files:
            rel = os.path.relpath(f, text)
            if os.path.join(root, rel) not in known and not any(
                    rel == w or rel.startswith(w.rstrip("/") + "/") for w in skipped):
                return f"{f}: not among the recorded inputs"
    if rest:
        return f"the recorded input {rest[0]['path']} has no byte-identical file among the inputs given"
    return None
