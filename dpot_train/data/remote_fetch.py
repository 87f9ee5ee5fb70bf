"""Download one object from an fsspec URL into an open local file: a whole-object GET for small objects, concurrent
range GETs for large ones, each request retried a bounded number of times with jittered backoff on throttling (429),
server errors (5xx), timeouts and dropped connections (a retried range resumes after its last written byte). Received
chunks go straight into the file; the sha256 follows the file's contiguous written prefix in object order while the
ranges arrive, so it is ready when the last byte is written.

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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from dpot_train.data.datasets import DataError

T = TypeVar("T")

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
CHUNK = 1 << 20  # most bytes taken from a response stream at once


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


def with_retries(url: str, call: Callable[[float], T], policy: RetryPolicy, rng: random.Random) -> T:
    """call(seconds it may take) until it succeeds, at most policy.attempts times on retryable errors and within the
    policy's budget; FetchError naming `url` on one line."""
    timeout, budget = policy.limits()
    start = time.monotonic()
    for attempt in range(policy.attempts):
        allowed = max(0.01, min(timeout, budget - (time.monotonic() - start)))
        try:
            return call(allowed)
        except FetchError:  # already one line about the object itself (its size): retrying cannot change it
            raise
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
    """How one object is fetched: objects above `range_from` bytes in `part` byte ranges, `concurrency` at a time.
    A range streams into the file (it is never held in memory whole, and a retry resumes after its written bytes),
    so a part's size costs neither memory nor work lost to a retry: parts are as large as the parallelism allows,
    since every GET costs the store a request (and a round trip before its first byte). A default 256 MiB shard is 8
    parts, 4 streaming at a time."""

    part: int = 32 << 20
    range_from: int = 32 << 20
    concurrency: int = 4
    policy: RetryPolicy = RetryPolicy()

    def ranges(self, size: int) -> list[tuple[int, int]]:
        """[start, end) byte ranges covering an object of `size` bytes (one range for a small object)."""
        if size <= self.range_from:
            return [(0, size)]
        return [(a, min(a + self.part, size)) for a in range(0, size, self.part)]


Write = Callable[[int, bytes], None]  # write(offset in the object, bytes received there)
Stream = Callable[[int, int, float, Write], None]  # stream(start, end, seconds, write): one GET of [start, end)


def _stream(fs: Any, url: str, path: str, size: int, whole: bool) -> Stream:
    """stream(start, end, seconds, write): one GET of bytes [start, end) of the object, each received chunk given to
    write(offset, chunk) as it arrives. On s3fs the response body is read in chunks of at most CHUNK bytes (no copy
    of the whole range is ever held); other filesystems answer a range with one `cat_file`. On fsspec's asynchronous
    filesystems `seconds` cancels the request (fsspec's `timeout`, FSTimeoutError); others rely on their own
    client's timeouts. An object of another size than `size` is a FetchError (not retried)."""
    from fsspec.asyn import AsyncFileSystem, sync

    bounded = isinstance(fs, AsyncFileSystem) and not getattr(fs, "asynchronous", False)
    if bounded and hasattr(fs, "_call_s3") and hasattr(fs, "split_path"):
        bucket, key, version = fs.split_path(path)
        extra = {"VersionId": version} if version else {}

        async def get(start: int, end: int, write: Write) -> None:
            ask = {} if (whole and start == 0) or end == start else {"Range": f"bytes={start}-{end - 1}"}
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra, **ask)
            body = resp["Body"]
            try:
                total = _object_size(url, resp, ask)
                if total is not None and total != size:
                    raise FetchError(f"{url}: holds {total} bytes, the manifest says {size}")
                at = start
                while at < end:
                    chunk = await body.read(min(CHUNK, end - at))
                    if not chunk:
                        raise ConnectionError(f"the connection closed at byte {at} of [{start}, {end})")
                    write(at, chunk)
                    at += len(chunk)
            finally:
                body.close()

        return lambda start, end, seconds, write: sync(fs.loop, get, start, end, write, timeout=seconds)

    def call(start: int, end: int, seconds: float, write: Write) -> None:
        limit = {"timeout": seconds} if bounded else {}
        data = fs.cat_file(path, **limit) if whole else fs.cat_file(path, start=start, end=end, **limit)
        if whole and len(data) != size:
            raise FetchError(f"{url}: holds {len(data)} bytes, the manifest says {size}")
        if len(data) != end - start:
            raise FetchError(f"{url}: range [{start}, {end}) returned {len(data)} bytes; the object is shorter "
                             f"than the {size} bytes the manifest says")
        write(start, data)

    return call


def _object_size(url: str, resp: dict[str, Any], ask: dict[str, str]) -> int | None:
    """The object's size an S3 GET answer states: Content-Range's total for a range, Content-Length otherwise. A
    range answered without Content-Range (a store that ignores Range sends the object from its first byte) is a
    FetchError: its bytes would land at the wrong offsets."""
    if ask:
        text = str(resp.get("ContentRange") or "")
        if not text:
            raise FetchError(f"{url}: the store answered the range request {ask['Range']} without a Content-Range; "
                             "it needs a store that serves byte ranges")
        total = text.rsplit("/", 1)[-1]
        return int(total) if total.isdigit() else None
    length = resp.get("ContentLength")
    return int(length) if isinstance(length, int) else None


def fetch_into(url: str, fd: int, size: int, plan: FetchPlan = FetchPlan(),
               filesystem: Callable[[str], tuple[Any, str]] | None = None) -> str:
    """Write the object at `url` ( `size` bytes, as the manifest says) into the open file `fd` from offset 0 and
    return its sha256 hex digest. Received bytes go straight into the file; the sha256 follows the file's written
    prefix in object order (StreamHasher). A retried range resumes after its last written byte, so no byte is
    written twice and none is hashed before it is written. FetchError (one line naming the URL) when a request keeps
    failing or the object has another size."""
    if filesystem is None:
        from dpot_format.io import filesystem
    fs, path = filesystem(url)
    ranges = plan.ranges(size)
    rng = random.Random()
    stream = _stream(fs, url, path, size, whole=len(ranges) == 1)

    with StreamHasher(url, fd, ranges) as hasher:
        def job(i: int) -> None:
            def attempt(seconds: float) -> None:
                start, write = hasher.resume(i)
                stream(start, ranges[i][1], seconds, write)

            with_retries(url, attempt, plan.policy, rng)

        with ThreadPoolExecutor(max_workers=max(1, min(plan.concurrency, len(ranges)))) as pool:
            futures = [pool.submit(job, i) for i in range(len(ranges))]
            try:
                for fut in futures:
                    fut.result()
            finally:
                for fut in futures:
                    fut.cancel()
        return hasher.hexdigest()


class StreamHasher:
    """The sha256 of a file being written by concurrent range downloads, computed while they run: each range
    reports how far it has written (a contiguous prefix of it), and one thread hashes the file's contiguous written
    prefix in object order, reading it back from the page cache into one reusable buffer of BLOCK bytes. A failed
    request leaves its written bytes in place; its retry resumes after them (`resume`), so a byte is hashed only
    once it is written and never rewritten afterwards."""

    BLOCK = 4 << 20

    def __init__(self, url: str, fd: int, ranges: list[tuple[int, int]]) -> None:
        self.url, self.fd, self.ranges = url, fd, ranges
        self.size = ranges[-1][1] if ranges else 0
        self._done = [a for a, _ in ranges]  # per range: the end of its written prefix
        self._tries = [0] * len(ranges)
        self._locks = [threading.Lock() for _ in ranges]  # one per range: a write and its try's check together
        self._first = 0  # the first range not completely written
        self._hashed = 0
        self._digest = hashlib.sha256()
        self._cond = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dpot-sha256", daemon=True)
        self._thread.start()

    def __enter__(self) -> "StreamHasher":
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def resume(self, i: int) -> tuple[int, Write]:
        """(where range `i` continues, write(offset, data) for this try of it): the bytes go into the file at
        `offset`, which must continue the range's written prefix. A new try of the range supersedes the writer of
        the one before (a request cut off by its timeout may still be running: its bytes are dropped)."""
        lo, hi = self.ranges[i]
        with self._locks[i]:
            self._tries[i] += 1
            token, start = self._tries[i], self._done[i]

        def write(offset: int, data: bytes) -> None:
            with self._locks[i]:
                if self._tries[i] != token:
                    raise _Superseded(f"range [{lo}, {hi}): a later try took over")
                if offset != self._done[i] or offset + len(data) > hi:
                    raise FetchError(f"{self.url}: bytes [{offset}, {offset + len(data)}) do not continue the range "
                                     f"[{lo}, {hi}) written up to {self._done[i]}")
                _pwrite_all(self.fd, data, offset)
                with self._cond:
                    self._done[i] = offset + len(data)
                    self._cond.notify_all()

        return start, write

    def _prefix(self) -> int:
        """The end of the file's contiguous written prefix (under the condition's lock)."""
        while self._first < len(self.ranges) and self._done[self._first] == self.ranges[self._first][1]:
            self._first += 1
        return self.size if self._first == len(self.ranges) else self._done[self._first]

    def _run(self) -> None:
        buf = memoryview(bytearray(self.BLOCK))
        try:
            while True:
                with self._cond:
                    while not self._closed and self._prefix() == self._hashed:
                        self._cond.wait()
                    if self._closed:  # done, or the download was abandoned
                        return
                    start, end = self._hashed, self._prefix()
                while start < end:
                    n = os.preadv(self.fd, [buf[:min(self.BLOCK, end - start)]], start)
                    if n <= 0:
                        raise OSError(errno.EIO, f"the download file ended at byte {start} of {end} while hashed")
                    self._digest.update(buf[:n])
                    start += n
                with self._cond:
                    self._hashed = end
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 - reported by hexdigest()
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def hexdigest(self) -> str:
        """The sha256 of the whole file, once every range is written and hashed."""
        with self._cond:
            while self._error is None and self._hashed < self.size:
                if self._prefix() < self.size:
                    raise FetchError(f"{self.url}: bytes [{self._prefix()}, {self.size}) were never written")
                self._cond.wait()
            if self._error is not None:
                raise self._error
            return self._digest.hexdigest()


class _Superseded(Exception):
    """Raised into a timed-out request that still delivers bytes after its retry started."""


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
