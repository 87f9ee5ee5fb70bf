"""Download one object from an fsspec URL into an open local file: a whole-object GET for small objects, concurrent
range GETs for large ones, each request retried a bounded number of times with jittered backoff on throttling (429),
server errors (5xx) and timeouts; the sha256 is computed in object order while the parts arrive.

Every request is bounded in time (connect, wait and read together: $DPOT_FETCH_TIMEOUT_S, default 60 s, on fsspec's
asynchronous filesystems: s3fs, gcsfs, http), and so is each request with all its retries ($DPOT_FETCH_BUDGET_S,
default 300 s): an object store that never answers ends in one line naming the URL, not in a silent hang.

Credentials come from the filesystem's own chain (environment, config files, instance roles) or fsspec's
`storage_options` configuration; nothing here reads, stores or prints them.
"""

from __future__ import annotations

import errno
import hashlib
import math
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
TIMEOUT_ENV = "DPOT_FETCH_TIMEOUT_S"  # seconds one request may take (connect, wait for and read the answer)
BUDGET_ENV = "DPOT_FETCH_BUDGET_S"  # seconds one request may take with all its retries and backoff sleeps
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_BUDGET_S = 300.0


class FetchError(DataError):
    """An object could not be downloaded: names the URL, the attempts made and the last error, on one line."""


def _seconds(env: str, default: float) -> float:
    """The positive number of seconds in $`env`, else `default`; FetchError naming the variable otherwise."""
    text = os.environ.get(env, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise FetchError(f"${env}: expected a number of seconds > 0, got {text!r}")
    return value


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: `attempts` tries per request, sleeping base * 2**i (capped) times a random factor in
    [0.5, 1.5) between them, so that many clients backing off at once spread out instead of retrying together.
    Each try may take `timeout_s` and a request with all its tries `budget_s` (None: $DPOT_FETCH_TIMEOUT_S and
    $DPOT_FETCH_BUDGET_S, read when a download starts, else 60 s and 300 s)."""

    attempts: int = 6
    base_s: float = 0.2
    max_s: float = 5.0
    timeout_s: float | None = None
    budget_s: float | None = None

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed try number `attempt` (0-based)."""
        return min(self.max_s, self.base_s * (2 ** attempt)) * (0.5 + rng.random())

    def limits(self) -> tuple[float, float]:
        """(seconds per try, seconds per request with its retries), from the fields or the environment."""
        timeout = self.timeout_s if self.timeout_s is not None else _seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)
        budget = self.budget_s if self.budget_s is not None else _seconds(BUDGET_ENV, DEFAULT_BUDGET_S)
        return timeout, budget


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


def _describe(exc: BaseException, timeout: float) -> str:
    """`Type: message` of a failed try; a timeout without a message says how long it waited."""
    if isinstance(exc, TimeoutError) and not str(exc).strip():
        return f"{type(exc).__name__}: no answer within {timeout:.3g} s"
    return f"{type(exc).__name__}: {_one_line(exc)}"


def with_retries(url: str, call: Callable[[float], bytes], policy: RetryPolicy, rng: random.Random) -> bytes:
    """call(seconds it may take) until it succeeds, at most policy.attempts times on retryable errors and within the
    policy's budget; FetchError naming `url` on one line."""
    timeout, budget = policy.limits()
    start = time.monotonic()
    for attempt in range(policy.attempts):
        allowed = max(0.01, min(timeout, budget - (time.monotonic() - start)))
        try:
            return call(allowed)
        except Exception as exc:  # noqa: BLE001 - classified below; the last one is reported on one line
            if not is_retryable(exc):
                raise FetchError(f"{url}: download failed: {_describe(exc, allowed)}") from exc
            if attempt + 1 == policy.attempts:
                raise FetchError(f"{url}: download failed after {policy.attempts} attempts "
                                 f"(last: {_describe(exc, allowed)})") from exc
            pause = policy.delay(attempt, rng)
            spent = time.monotonic() - start
            if spent + pause >= budget:
                raise FetchError(f"{url}: download failed: no success within the budget of {budget:g} s "
                                 f"({attempt + 1} attempts, {spent:.1f} s; last: {_describe(exc, allowed)}); "
                                 f"${BUDGET_ENV} and ${TIMEOUT_ENV} (per try, now {timeout:g} s) change it") from exc
            time.sleep(pause)
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


def _get(fs: Any, path: str, start: int, end: int, whole: bool) -> Callable[[float], bytes]:
    """One GET of the object (whole) or of [start, end), given the seconds it may take. On fsspec's asynchronous
    filesystems the limit cancels the request (fsspec's `timeout`, FSTimeoutError); others have no such hook and
    rely on their own client's timeouts."""
    from fsspec.asyn import AsyncFileSystem

    bounded = isinstance(fs, AsyncFileSystem) and not getattr(fs, "asynchronous", False)

    def call(seconds: float) -> bytes:
        limit = {"timeout": seconds} if bounded else {}
        if whole:
            return fs.cat_file(path, **limit)
        return fs.cat_file(path, start=start, end=end, **limit)

    return call


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
