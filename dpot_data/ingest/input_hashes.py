"""sha256 of an ingest's input files, on a thread of their own, from the moment their paths are known. Kept apart
from dpot_data.ingest so that the CLI can start it before that package's imports (half a second of start-up that
the hashing, a pass over every input byte, then runs beside)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

from dpot_format.io import sha256_file


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
                self._futures[key] = self._pool.submit(sha256_file, key, None, self._stop)

    def entries(self, paths: Sequence[str | os.PathLike[str]]) -> list[dict[str, Any]]:
        """The manifest's `inputs`: path, sha256 and bytes of each of `paths`, waiting for their hashes."""
        self.add(paths)
        out = []
        for p in paths:
            key = str(Path(p).resolve())
            digest, size = self._futures[key].result() if key in self._futures else sha256_file(key)
            out.append({"path": key, "sha256": digest, "bytes": size})
        return out

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "InputHashes":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
