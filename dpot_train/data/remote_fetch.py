"""Download one object from an fsspec URL into an open local file: a whole-object GET for small objects, concurrent
range GETs for large ones, each request retried a bounded number of times with jittered backoff on throttling (429),
server errors (5xx) and timeouts; the sha256 is computed in object order while the parts arrive.

Credentials come from the filesystem's own chain (environment, config files, instance roles) or fsspec's
`storage_options` configuration; nothing here reads, stores or prints them.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from dpot_train.data.datasets import DataError

_RETRY_ERRNOS = {errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE,
                 errno.ECONNREFUSED, errno.EIO}
_RETRY_WORDS = ("503", "500", "502", "504", "429", "slowdown", "service unavailable", "serviceunavailable",
                "internalerror", "throttl", "too many requests", "timeout", "timed out", "reset by peer",
                "connection", "payload", "incomplete")
_FINAL_TYPES = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class FetchError(DataError):
    """An object could not be downloaded: names the URL, the attempts made and the last error, on one line."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: `attempts` tries per request, sleeping base * 2**i (capped) times a random factor in
    [0.5, 1.5) between them, so that many clients backing off at once spread out instead of retrying together."""

    attempts: int = 6
    base_s: float = 0.2
    max_s: float = 5.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed try number `attempt` (0-based)."""
        return min(self.max_s, self.base_s * (2 ** attempt)) * (0.5 + rng.random())


def is_retryable(exc: BaseException) -> bool:
    """True for throttling, 5xx, timeouts and dropped connections; False for missing objects and refused access
    (retrying those only delays the one-line failure)."""
    if isinstance(exc, _FINAL_TYPES):
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    status = getattr(exc, "response", None)
    if isinstance(status, dict):  # botocore ClientError
        code = status.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(code, int):
            return code == 429 or code >= 500
    if isinstance(exc, OSError) and exc.errno in _RETRY_ERRNOS:
        return True
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in _RETRY_WORDS)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def with_retries(url: str, call: Callable[[], bytes], policy: RetryPolicy, rng: random.Random) -> bytes:
    """call() until it succeeds, at most policy.attempts times on retryable errors; FetchError naming `url`."""
    for attempt in range(policy.attempts):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - classified below; the last one is reported on one line
            if not is_retryable(exc):
                raise FetchError(f"{url}: download failed: {type(exc).__name__}: {_one_line(exc)}") from exc
            if attempt + 1 == policy.attempts:
                raise FetchError(f"{url}: download failed after {policy.attempts} attempts "
                                 f"(last: {type(exc).__name__}: {_one_line(exc)})") from exc
            time.sleep(policy.delay(attempt, rng))
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class FetchPlan:
    """How one object is fetched: objects above `range_from` bytes in `part` byte ranges, `concurrency` at a time."""

    part: int = 16 << 20
    range_from: int = 32 << 20
    concurrency: int = 4
    policy: RetryPolicy = RetryPolicy()

    def ranges(self, size: int) -> list[tuple[int, int]]:
        """[start, end) byte ranges covering an object of `size` bytes (one range for a small object)."""
        if size <= self.range_from:
            return [(0, size)]
        return [(a, min(a + self.part, size)) for a in range(0, size, self.part)]


def _get(fs: Any, path: str, start: int, end: int, whole: bool) -> Callable[[], bytes]:
    if whole:
        return lambda: fs.cat_file(path)
    return lambda: fs.cat_file(path, start=start, end=end)


def fetch_into(url: str, fd: int, size: int, plan: FetchPlan = FetchPlan(),
               filesystem: Callable[[str], tuple[Any, str]] | None = None) -> str:
    """Write the object at `url` ( `size` bytes, as the manifest says) into the open file `fd` from offset 0 and
    return its sha256 hex digest. FetchError (one line naming the URL) when a request keeps failing or the object
    has another size."""
    if filesystem is None:
        from dpot_format.io import filesystem
    fs, path = filesystem(url)
    ranges = plan.ranges(size)
    rng = random.Random()
    whole = len(ranges) == 1

    def job(r: tuple[int, int]) -> bytes:
        data = with_retries(url, _get(fs, path, r[0], r[1], whole), plan.policy, rng)
        if len(data) != r[1] - r[0] and not whole:
            raise FetchError(f"{url}: range [{r[0]}, {r[1]}) returned {len(data)} bytes; the object is shorter "
                             f"than the {size} bytes the manifest says")
        return data

    window = max(1, plan.concurrency)  # parts downloaded ahead of the one being written: bounds the memory held
    pending: list[Future[bytes] | None] = []
    with ThreadPoolExecutor(max_workers=min(window, len(ranges))) as pool, _Hasher() as hasher:
        pending += [pool.submit(job, r) for r in ranges[:window]]
        try:
            for i, (start, _) in enumerate(ranges):
                fut = pending[i]
                assert fut is not None
                data = fut.result()
                if i + window < len(ranges):
                    pending.append(pool.submit(job, ranges[i + window]))
                if whole and len(data) != size:
                    raise FetchError(f"{url}: holds {len(data)} bytes, the manifest says {size}")
                hasher.write(fd, data, start)
                pending[i] = None  # drop the written part
        finally:
            for fut in pending:
                if fut is not None:
                    fut.cancel()
        return hasher.hexdigest()


class _Hasher:
    """Writes parts into the file while a second thread hashes them in object order (both release the GIL), one
    slice of SLICE bytes behind, so that neither the hash nor the copy into the page cache waits for the other."""

    SLICE = 8 << 20

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpot-sha256")
        self._last: Future[None] | None = None

    def __enter__(self) -> "_Hasher":
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)

    def write(self, fd: int, data: bytes, offset: int) -> None:
        """Write `data` at `offset` and hash it after everything given before."""
        view = memoryview(data)
        for a in range(0, len(view), self.SLICE):
            part = view[a:a + self.SLICE]
            if self._last is not None:
                self._last.result()
            self._last = self._pool.submit(self.digest.update, part)
            _pwrite_all(fd, part, offset + a)

    def hexdigest(self) -> str:
        if self._last is not None:
            self._last.result()
        return self.digest.hexdigest()


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
