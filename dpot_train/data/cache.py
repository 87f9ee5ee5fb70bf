"""A node-shared, size-bounded cache of whole shards on local disk, shared by every rank and loader worker of a node.

Layout under the cache folder (docs/training.md, "Training from object storage"):

* ``data/<sha256>.tar``: a complete, checked shard, named by the sha256 its manifest lists (so a re-ingested shard
  is a new entry, never a stale one); its mtime is its last use (the LRU order).
* ``part/<sha256>.<pid>.<random>.part``: a download in progress, created at its full size so that the bytes it will
  take are counted from the start; renamed into ``data/`` only after its sha256 matched the manifest.
* ``index/<sha256>.json``: the shard's member index (trajectory keys and byte offsets), written once per node.
* ``lock/<sha256>.get`` (held exclusively while downloading or indexing: one download per shard per node),
  ``lock/<sha256>.use`` (held shared while a process reads the entry; eviction needs it exclusively, so no entry is
  deleted under a reader) and ``lock/cache`` (held while space is reserved or freed).

Locks are flock(2) locks: the kernel drops them when their process dies, so a killed run leaves no lock behind, and a
part file whose ``.get`` lock nobody holds is a dead download that the next process removes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from dpot_train.data.datasets import DataError, Shard
from dpot_train.data.remote_fetch import FetchError, FetchPlan, fetch_into

DEFAULT_LIMIT = 100 << 30  # bytes: the cache's default size bound
PREFETCH_SHARDS = 2  # shards one process keeps ready: the one being read and the next one in stream order
WAIT_S = 600.0  # how long a read waits for space held by other readers before giving up
_POLL_S = 0.05
_TOUCH_S = 1.0  # an entry's mtime (its LRU age) is refreshed at most this often per process


class CacheError(DataError):
    """The cache cannot do what was asked: names the cache folder or option and what was expected."""


@dataclass(frozen=True)
class CacheSettings:
    """Where the cache lives and how large it may grow (picklable: loader worker processes rebuild the cache)."""

    root: str
    limit: int = DEFAULT_LIMIT
    prefetch: int = PREFETCH_SHARDS
    plan: FetchPlan = FetchPlan()


@dataclass
class CacheStats:
    """What this process did through the cache."""

    hits: int = 0
    downloads: int = 0
    waited: int = 0  # misses served by another process's download
    evicted: int = 0
    downloaded_bytes: int = 0


def parse_size(text: str | int, option: str = "--cache-limit") -> int:
    """'200GiB', '64MiB', '1GB', '1048576' -> bytes; CacheError naming the option otherwise."""
    if isinstance(text, int):
        return text
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
             "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000**4, "tib": 1 << 40}
    value = str(text).strip().lower()
    number = value.rstrip("kmgtib")
    try:
        out = int(float(number) * units[value[len(number):]])
    except (ValueError, KeyError):
        raise CacheError(f"{option}: expected a byte size such as 200GiB, got {text!r}") from None
    if out <= 0:
        raise CacheError(f"{option}: expected a positive byte size, got {text!r}")
    return out


def check_limit(settings: CacheSettings, shards: list[Shard]) -> None:
    """Refuse a limit below what one step needs: the largest shard times the prefetch depth."""
    if not shards:
        return
    big = max(shards, key=lambda s: s.bytes)
    need = big.bytes * settings.prefetch
    if settings.limit < need:
        raise CacheError(f"--cache-limit {settings.limit} bytes: below what one step needs, the largest shard "
                         f"({big.url}, {big.bytes} bytes) x prefetch depth {settings.prefetch} = {need} bytes")


@contextlib.contextmanager
def _flock(path: Path, mode: int) -> Iterator[int]:
    """Hold flock `mode` on `path` (created if absent) for the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode)
        yield fd
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _try_flock(path: Path, mode: int) -> int | None:
    """A descriptor holding `mode` (non-blocking) on `path`, or None when another holder conflicts."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


class ShardCache:
    """Whole shards fetched once per node, read in place, evicted least recently used first under `limit`."""

    def __init__(self, settings: CacheSettings, fetch: Callable[..., str] = fetch_into) -> None:
        self.settings = settings
        self.root = Path(settings.root)
        self._fetch = fetch
        self.stats = CacheStats()
        self._touched: dict[str, float] = {}
        for sub in ("data", "part", "index", "lock"):
            try:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CacheError(f"--cache-dir {self.root}: cannot create it ({exc.strerror})") from None

    def entry(self, shard: Shard) -> Path:
        """Where the checked copy of `shard` lives (present or not)."""
        return self.root / "data" / f"{shard.sha256}.tar"

    def _lock(self, shard: Shard, kind: str) -> Path:
        return self.root / "lock" / f"{shard.sha256}.{kind}"

    def _present(self, shard: Shard) -> bool:
        try:
            return self.entry(shard).stat().st_size == shard.bytes
        except FileNotFoundError:
            return False

    def _touch(self, shard: Shard) -> None:
        now = time.monotonic()
        if now - self._touched.get(shard.sha256, -_TOUCH_S) >= _TOUCH_S:
            self._touched[shard.sha256] = now
            with contextlib.suppress(FileNotFoundError):
                os.utime(self.entry(shard))

    @contextlib.contextmanager
    def open(self, shard: Shard) -> Iterator[Path]:
        """The local path of `shard`'s checked copy, downloaded first if absent; it is not evicted inside the block."""
        while True:
            with _flock(self._lock(shard, "use"), fcntl.LOCK_SH):
                if self._present(shard):
                    self.stats.hits += 1
                    self._touch(shard)
                    yield self.entry(shard)
                    return
            self.ensure(shard, wait=True)  # then read it under the use lock (it may be evicted in between: retry)

    def ensure(self, shard: Shard, wait: bool = True) -> bool:
        """Make `shard` present (one download per node: others wait for it). wait=False (prefetch): give up, False,
        when another process is fetching it or it would not fit without evicting another shard."""
        if self._present(shard):
            return True
        mode = fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB
        try:
            with _flock(self._lock(shard, "get"), mode):
                if self._present(shard):
                    self.stats.waited += 1
                    return True
                return self._download(shard, wait)
        except BlockingIOError:
            return False

    def _download(self, shard: Shard, wait: bool) -> bool:
        """Fetch `shard` into a part file, check its sha256, rename it into place (the caller holds its .get lock)."""
        for old in (self.root / "part").glob(f"{shard.sha256}.*.part"):  # dead downloads of this shard
            old.unlink(missing_ok=True)
        part = self._reserve(shard, wait)
        if part is None:
            return False
        try:
            fd = os.open(part, os.O_RDWR)
            try:
                digest = self._fetch(shard.url, fd, shard.bytes, self.settings.plan)
                if digest != shard.sha256:
                    raise FetchError(f"{shard.url}: downloaded sha256 {digest}, the manifest says {shard.sha256}; "
                                     "the object changed after ingest (re-ingest, or point --manifest at its copy)")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(part, self.entry(shard))
        finally:
            part.unlink(missing_ok=True)
        self.stats.downloads += 1
        self.stats.downloaded_bytes += shard.bytes
        self._touched.pop(shard.sha256, None)
        return True

    def _reserve(self, shard: Shard, wait: bool) -> Path | None:
        """A part file of the shard's full size, created once evicting idle entries made room under the limit."""
        deadline = time.monotonic() + WAIT_S
        while True:
            with _flock(self.root / "lock" / "cache", fcntl.LOCK_EX):
                if self._make_room(shard.bytes, keep=shard.sha256, evict=wait):
                    part = self.root / "part" / f"{shard.sha256}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
                    with open(part, "wb") as f:
                        f.truncate(shard.bytes)
                    return part
            if not wait:
                return None
            if time.monotonic() > deadline:
                raise CacheError(f"--cache-limit {self.settings.limit} bytes: no room for {shard.url} "
                                 f"({shard.bytes} bytes) after {WAIT_S:.0f} s; the cache at {self.root} is full of "
                                 "shards being read (raise --cache-limit)")
            time.sleep(_POLL_S)

    def usage(self) -> int:
        """Bytes the cache holds now: checked entries plus downloads in progress (counted at full size)."""
        return sum(_size(p) for sub in ("data", "part") for p in _files(self.root / sub))

    def _make_room(self, need: int, keep: str, evict: bool = True) -> bool:
        """Under the cache lock: drop dead part files, then (if `evict`) idle entries oldest first, until `need` more
        bytes fit. A prefetch does not evict: in a full cache it would push out shards the stream reads sooner."""
        for part in _files(self.root / "part"):
            sha = part.name.split(".", 1)[0]
            fd = _try_flock(self.root / "lock" / f"{sha}.get", fcntl.LOCK_EX)
            if fd is not None:  # nobody is downloading it: its writer died
                part.unlink(missing_ok=True)
                os.close(fd)
        free = self.settings.limit - self.usage()
        if free >= need or not evict:
            return free >= need
        entries = sorted(_files(self.root / "data"), key=lambda p: _mtime(p))
        for path in entries:
            sha = path.name.split(".", 1)[0]
            if sha == keep:
                continue
            fd = _try_flock(self.root / "lock" / f"{sha}.use", fcntl.LOCK_EX)
            if fd is None:  # being read
                continue
            try:
                size = _size(path)
                path.unlink(missing_ok=True)
            finally:
                os.close(fd)
            self.stats.evicted += 1
            free += size
            if free >= need:
                return True
        return False

    def index(self, shard: Shard, build: Callable[[Path], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """The shard's member index, built once per node by build(local copy) and kept in ``index/``."""
        path = self.root / "index" / f"{shard.sha256}.json"
        if path.exists():
            return json.loads(path.read_text(encoding="utf-8"))
        with self.open(shard) as local:  # downloads it if needed
            with _flock(self._lock(shard, "get"), fcntl.LOCK_EX):
                if not path.exists():
                    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                    tmp.write_text(json.dumps(build(local)), encoding="utf-8")
                    os.replace(tmp, path)
        return json.loads(path.read_text(encoding="utf-8"))


def _files(folder: Path) -> list[Path]:
    try:
        return [folder / n for n in os.listdir(folder)]
    except FileNotFoundError:
        return []


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0
