"""A node-shared, size-bounded cache of whole shards on local disk, shared by every rank and loader worker of a node.

Layout under the cache folder (docs/training.md, "Training from object storage"):

* ``data/<sha256>.tar``: a complete, checked shard, named by the sha256 its manifest lists (so a re-ingested shard
  is a new entry, never a stale one); its mtime is its last use (the LRU order). Each process hashes an entry again
  before its first read of it: an entry damaged on disk is never read, it is fetched anew (one warning line).
* ``part/<sha256>.<pid>.<random>.part``: a download in progress, created at its full size so that the bytes it will
  take are counted from the start; renamed into ``data/`` only after its sha256 matched the manifest.
* ``index/<sha256>.json``: the shard's member index (trajectory keys and byte offsets), written once per node; one
  that is damaged, or differs from the member index the manifest records (sha256-checked), is rebuilt from the
  checked shard (one warning line).
* ``lock/<sha256>.get`` (held exclusively while downloading or repairing: one download per shard per node),
  ``lock/<sha256>.index`` (held exclusively while the member index is written), ``lock/<sha256>.use`` (held shared
  while a process reads the entry; eviction and repair need it exclusively, so no entry is deleted under a reader)
  and ``lock/cache`` (held exclusively while space is reserved or freed and while a download is renamed into
  ``data/``, shared while the usage is measured: the bytes counted under it are the bytes on disk).

Locks are flock(2) locks: the kernel drops them when their process dies, so a killed run leaves no lock behind, and a
part file whose ``.get`` lock nobody holds is a dead download that the next process removes.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from dpot_format.errors import FormatError
from dpot_format.io import sha256_file
from dpot_train.data.datasets import DataError, Shard
from dpot_train.data.remote_fetch import FetchError, FetchPlan, fetch_into

DEFAULT_LIMIT = 100 << 30  # bytes: the cache's default size bound
PREFETCH_SHARDS = 2  # shards one process keeps ready: the one being read and the next one in stream order
WAIT_S = 600.0  # how long a read waits for space held by other readers before giving up
_POLL_S = 0.05
_TOUCH_S = 1.0  # an entry's mtime (its LRU age) is refreshed at most this often per process
_FOLDERS = ("data", "part", "index", "lock")
_INDEX_KEYS = ("index", "fields", "mask", "mask_size")  # what each entry of index/<sha256>.json holds (integers)


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
    repaired: int = 0  # damaged entries (sha256 mismatch) fetched anew by this process


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


def _warn(text: str) -> None:
    """One warning line on stderr (the run goes on)."""
    print(f"warning: {text}", file=sys.stderr, flush=True)


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
        self._verified: set[str] = set()  # entries hashed by this process (or downloaded by it) since they appeared
        self._verifying: dict[str, threading.Lock] = {}  # one hash of an entry at a time among this process's threads
        self._damaged: dict[str, tuple[int, int, int]] = {}  # (inode, mtime, size) of entries found damaged here
        self._guard = threading.Lock()
        for sub in _FOLDERS:
            try:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CacheError(f"--cache-dir {self.root}: cannot create it ({exc.strerror})") from None

    def entry(self, shard: Shard) -> Path:
        """Where the checked copy of `shard` lives (present or not)."""
        return self.root / "data" / f"{shard.sha256}.tar"

    def _lock(self, shard: Shard, kind: str) -> Path:
        return self.root / "lock" / f"{shard.sha256}.{kind}"

    @contextlib.contextmanager
    def _folder_errors(self, shard: Shard | None = None) -> Iterator[None]:
        """OSErrors of the cache folder as one CacheError line naming it: a folder deleted or made read-only under a
        run, a full disk (with what to do about it)."""
        try:
            yield
        except (CacheError, FetchError):
            raise
        except OSError as exc:
            raise self._folder_error(exc, shard) from None

    def _folder_error(self, exc: OSError, shard: Shard | None) -> CacheError:
        what = f" while caching {shard.url}" if shard is not None else ""
        detail = f"{exc.strerror or type(exc).__name__}: {exc.filename}" if exc.filename else exc.strerror
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return CacheError(f"--cache-dir {self.root}: the disk is full{what} ({exc.strerror}); free space there, "
                              f"or lower --cache-limit (now {self.settings.limit} bytes) below its free space")
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return CacheError(f"--cache-dir {self.root}: not writable{what} ({detail}); the cache "
                              "needs a folder this user can write (locks, downloads, indexes)")
        if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not all((self.root / sub).is_dir() for sub in _FOLDERS):
            return CacheError(f"--cache-dir {self.root}: the cache folder, or one of its folders {', '.join(_FOLDERS)}, "
                              f"was removed during the run{what}; start it again (the cache is created anew)")
        return CacheError(f"--cache-dir {self.root}: cannot use it{what} ({detail or type(exc).__name__})")

    def _present(self, shard: Shard) -> bool:
        try:
            return self.entry(shard).stat().st_size == shard.bytes
        except FileNotFoundError:
            return False

    def _checked(self, shard: Shard) -> bool:
        """Whether the present entry holds the bytes the manifest's sha256 names: hashed on this process's first use
        of it (a damaged disk, or a file changed by hand, is never read), known afterwards. Called under the entry's
        use lock, so that it is not replaced while hashed."""
        if shard.sha256 in self._verified:
            return True
        with self._guard:
            lock = self._verifying.setdefault(shard.sha256, threading.Lock())
        with lock:
            if shard.sha256 in self._verified:
                return True
            try:
                st = self.entry(shard).stat()
                if self._damaged.get(shard.sha256) == (st.st_ino, st.st_mtime_ns, st.st_size):
                    return False  # already hashed by this process, unchanged since
                digest, size = sha256_file(self.entry(shard), expected_bytes=shard.bytes)
            except FileNotFoundError:
                return False
            except FormatError as exc:  # not a regular file
                raise CacheError(f"--cache-dir {self.root}: {exc}") from None
            if digest != shard.sha256 or size != shard.bytes:
                self._damaged[shard.sha256] = (st.st_ino, st.st_mtime_ns, st.st_size)
                return False
            self._verified.add(shard.sha256)
            return True

    def _touch(self, shard: Shard) -> None:
        now = time.monotonic()
        if now - self._touched.get(shard.sha256, -_TOUCH_S) >= _TOUCH_S:
            self._touched[shard.sha256] = now
            with contextlib.suppress(FileNotFoundError):
                os.utime(self.entry(shard))

    @contextlib.contextmanager
    def open(self, shard: Shard) -> Iterator[Path]:
        """The local path of `shard`'s checked copy, downloaded first if absent and fetched anew if damaged; it is not
        evicted or replaced inside the block."""
        while True:
            with self._folder_errors(shard):
                use = os.open(self._lock(shard, "use"), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                with self._folder_errors(shard):
                    fcntl.flock(use, fcntl.LOCK_SH)
                    present = self._present(shard)
                    ready = present and self._checked(shard)
                    if ready:
                        self.stats.hits += 1
                        self._touch(shard)
                if ready:
                    yield self.entry(shard)
                    return
            finally:
                os.close(use)  # releases the use lock
            if present:  # damaged
                self._repair(shard)
            else:
                self.ensure(shard, wait=True)  # then read it under the use lock (it may be evicted in between: retry)

    def ensure(self, shard: Shard, wait: bool = True) -> bool:
        """Make `shard` present (one download per node: others wait for it). wait=False (prefetch): give up, False,
        when another process is fetching it or it would not fit without evicting another shard."""
        with self._folder_errors(shard):
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

    def _repair(self, shard: Shard) -> None:
        """Replace a damaged entry (its bytes do not hash to the manifest's sha256) by a fresh download, once per node:
        under the download lock, once no process reads it. One warning line names the URL and the cache file."""
        with self._folder_errors(shard), _flock(self._lock(shard, "get"), fcntl.LOCK_EX):
            with _flock(self._lock(shard, "use"), fcntl.LOCK_SH):
                if not self._present(shard) or self._checked(shard):
                    return  # evicted, or repaired by another process meanwhile
            entry = self.entry(shard)
            use = self._wait_exclusive(shard)
            try:
                with _flock(self.root / "lock" / "cache", fcntl.LOCK_EX):
                    entry.unlink(missing_ok=True)
            finally:
                os.close(use)
            _warn(f"cached shard {entry} does not match the sha256 of {shard.url} (damaged on disk); fetching it "
                  "again")
            self._download(shard, wait=True)
            self.stats.repaired += 1

    def _wait_exclusive(self, shard: Shard) -> int:
        """A descriptor holding the entry's use lock exclusively, taken once no process reads it (polled, so that
        this process's own readers, which block on the download lock it holds, are not waited for)."""
        deadline = time.monotonic() + WAIT_S
        while True:
            fd = _try_flock(self._lock(shard, "use"), fcntl.LOCK_EX)
            if fd is not None:
                return fd
            if time.monotonic() > deadline:
                raise CacheError(f"--cache-dir {self.root}: {self.entry(shard)} is damaged and still read by another "
                                 f"process after {WAIT_S:.0f} s; stop the runs using this cache and delete the file")
            time.sleep(_POLL_S)

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
            with _flock(self.root / "lock" / "cache", fcntl.LOCK_EX):  # usage measured under it sees part or entry
                os.rename(part, self.entry(shard))
                self._verified.add(shard.sha256)
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
        """Bytes the cache holds now: checked entries plus downloads in progress (counted at full size), measured
        under the cache lock, so that no eviction, reservation or rename is seen halfway."""
        with self._folder_errors(), _flock(self.root / "lock" / "cache", fcntl.LOCK_SH):
            return self._usage()

    def _usage(self) -> int:
        """usage() for a caller holding the cache lock."""
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
        free = self.settings.limit - self._usage()
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
                self._verified.discard(sha)
            finally:
                os.close(fd)
            self.stats.evicted += 1
            free += size
            if free >= need:
                return True
        return False

    def index(self, shard: Shard, build: Callable[[Path], list[dict[str, Any]]],
              expected: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The shard's member index, built once per node by build(local copy) and kept in ``index/``. A file there
        is checked before it is trusted: against `expected` (the entries of the member index the manifest records,
        whose sha256 it lists) when given, else for entries that could describe the shard (one per trajectory, in
        order, inside the shard, not overlapping). One that is not such an index, or does not match, is rebuilt
        from the checked copy of the shard, with one warning line naming it."""
        path = self.root / "index" / f"{shard.sha256}.json"
        with self._folder_errors(shard):
            found = self._read_index(path)
        if found is not None and index_problem(found, shard, expected) is None:
            return found
        with self.open(shard) as local:  # downloads it if needed; hashed before this process trusts it
            with self._folder_errors(shard), _flock(self._lock(shard, "index"), fcntl.LOCK_EX):
                found = self._read_index(path)
                problem = "is damaged" if found is None else index_problem(found, shard, expected)
                if problem is not None:
                    if path.exists():
                        _warn(f"cached index {path} of {shard.url} {problem}; rebuilt from the cached shard")
                    found = build(local)
                    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                    try:
                        tmp.write_text(json.dumps(found), encoding="utf-8")
                        os.replace(tmp, path)
                    finally:
                        tmp.unlink(missing_ok=True)
        return found

    @staticmethod
    def _read_index(path: Path) -> list[dict[str, Any]] | None:
        """The member index in `path`: a JSON list of objects with integer index, fields, mask and mask_size; None
        when the file is absent or holds anything else."""
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            return None
        except (UnicodeDecodeError, ValueError, RecursionError):
            return None
        if not isinstance(data, list) or not all(
                isinstance(e, dict) and set(e) == set(_INDEX_KEYS)
                and all(isinstance(e[k], int) and not isinstance(e[k], bool) and e[k] >= 0 for k in _INDEX_KEYS)
                for e in data):
            return None
        return data


def index_problem(entries: list[dict[str, Any]], shard: Shard, expected: list[dict[str, Any]] | None) -> str | None:
    """Why a cached member index cannot be the shard's, in words (None when it can): not the `expected` entries
    (the manifest's recorded index) when given; else not one entry per trajectory, in increasing keys, each member
    on a tar data offset after the previous one and inside the shard (entries all pointing at one trajectory's
    bytes, or none, are caught so)."""
    if expected is not None:
        if entries == expected:
            return None
        first = next((k for k, (a, b) in enumerate(zip(entries, expected)) if a != b), min(len(entries),
                                                                                             len(expected)))
        return (f"does not match the member index its manifest records (entry {first}: "
                f"{entries[first] if first < len(entries) else 'missing'}, recorded "
                f"{expected[first] if first < len(expected) else 'none'})")
    if len(entries) != shard.samples:
        return f"lists {len(entries)} trajectories where the manifest says {shard.samples}"
    end, last = 0, -1
    for e in entries:
        if e["index"] <= last or e["fields"] % 512 or e["fields"] < end + 512 or e["mask"] <= e["fields"] \
                or e["mask"] % 512 or e["mask"] + e["mask_size"] > shard.bytes:
            return (f"holds entry {e}, which cannot follow the previous one in the shard (keys increasing, members "
                    f"on tar data offsets after it, inside the shard's {shard.bytes} bytes)")
        end, last = e["mask"] + e["mask_size"], e["index"]
    return None


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
