"""Verified once, trusted after: each local output's record of the shards and Zarr arrays its sha256 pass hashed.

`launch` (and `evaluate`'s and the trainer's own data check) hash every local shard against its manifest sha256. At
corpus scale that is minutes to hours of reading on every launch; the record keeps, per file or array (by its path
inside the output), the stat it had when it was hashed (size, inode, mtime_ns, ctime_ns; for a Zarr array those of
every file its digest depends on) with the sha256 found and when. A later pass skips what is unchanged since:

* a shard or array is read again when it is missing from the record, when any of its stat values differs (bytes
  rewritten in place change mtime and ctime, and ctime cannot be set back), when the manifest now lists another
  sha256 than the one recorded, or when it was hashed within RACY_NS of its last change (a change in the same
  timestamp tick would not show; it is hashed once more, later);
* only sha256s equal to the manifest's are recorded, and only when the stat did not change while hashing;
* `--verify-checksums always` hashes everything (and rewrites the record), `never` hashes nothing.

Where it lives (docs/training.md, "The record of verified shards"): `OUT/.dpot-verified.json` beside the data when
this user may write OUT (every node and run reading that folder shares it), else
`CACHE/verified/<sha256 of OUT's absolute path>.json` in the cache folder the user named (`--cache-dir`,
`$DPOT_CACHE_DIR`, or for `launch` its `RUN_DIR/shard-cache`); with none of these nothing is recorded (a full pass).
It holds no absolute path. It is never written anywhere else.

The file is JSON with its own sha256 (over the canonical JSON of the rest) and a schema name: a record that fails
either (cut short, edited, another version) is set aside with one warning line and everything is hashed. Writes go
through `dpot_format.io.atomic_write` under an exclusive lock on `<record>.lock` (dpot_format.lock): the entries on
disk are read again, this pass's merged in, and the whole file replaced, so two launches at once on a node lose
nothing and never leave a part-written record. A long pass saves every SAVE_EVERY_S seconds: a job preempted while
hashing keeps what it verified. Only local outputs have a record (object storage goes through the shard cache, which
checks every download).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection, Iterable

from dpot_format.errors import FormatError
from dpot_format.io import atomic_write, is_local, local_path
from dpot_format.lock import FileLock, LockBusy
from dpot_format.validate import Item, Problem

CACHE_ENV = "DPOT_CACHE_DIR"  # the node's cache folder when --cache-dir is not given (dpot_train.data.cached_reader)
RECORD_NAME = ".dpot-verified.json"  # beside the data: OUT/.dpot-verified.json
CACHE_FOLDER = "verified"  # in a cache folder: CACHE/verified/<sha256 of OUT's absolute path>.json
SCHEMA = "dpot-verified/1"
RACY_NS = 2 * 10**9  # a file hashed within 2 s of its last change is hashed again next time (1-2 s timestamp ticks)
SAVE_EVERY_S = 30.0  # a long pass writes what it verified this often
LOCK_WAIT_S = 30.0  # a writer waits this long for another's write of the same record
MAX_RECORD_BYTES = 1 << 30  # about 4 million entries; anything larger is not a record of ours
_STAT = ("size", "inode", "mtime_ns", "ctime_ns")
_ARRAY_STAT = _STAT + ("files", "listing")
_KINDS = ("shard", "zarr")
_HEX = frozenset("0123456789abcdef")

Stamp = dict[str, int]


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def file_stamp(path: str) -> Stamp | None:
    """size, inode, mtime_ns and ctime_ns of a regular file (not following a link); None when it is none."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return {"size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


def array_stamp(store: str, group: str, array: str) -> Stamp | None:
    """The stat of a local Zarr array: every file its digest depends on (the store's and the group's own metadata
    files, everything under the array's folder) folded into one stamp; None when the folder is not there."""
    base = local_path(store)
    group_dir = os.path.join(base, *[p for p in group.split("/") if p])
    folder = os.path.join(group_dir, array)
    try:
        top = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(top.st_mode):
        return None
    rows: list[tuple[str, int, int, int, int]] = []

    def add(path: str) -> None:
        try:
            st = os.lstat(path)
        except OSError:
            return
        if stat.S_ISREG(st.st_mode):
            rows.append((os.path.relpath(path, base), st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))

    for meta in dict.fromkeys((base, group_dir)):  # metadata of the store and group: one level, no chunk folders
        try:
            names = sorted(os.listdir(meta))
        except OSError:
            return None
        for name in names:
            add(os.path.join(meta, name))
    for sub, dirs, files in os.walk(folder, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            add(os.path.join(sub, name))
    listing = hashlib.sha256(json.dumps(rows).encode()).hexdigest()
    return {"size": sum(r[1] for r in rows), "inode": top.st_ino,
            "mtime_ns": max([top.st_mtime_ns, *(r[3] for r in rows)]),
            "ctime_ns": max([top.st_ctime_ns, *(r[4] for r in rows)]),
            "files": len(rows), "listing": int(listing[:15], 16)}


def item_stamp(item: Item) -> Stamp | None:
    """The stamp of a validator item on local disk (a shard file or a Zarr array); None for object storage."""
    if not is_local(item.location):
        return None
    if item.kind == "shard":
        return file_stamp(local_path(item.location))
    return array_stamp(item.location, item.group, item.array)


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def encode(entries: dict[str, dict[str, Any]]) -> bytes:
    """The record file's bytes: schema, entries and the sha256 of their canonical JSON."""
    body = {"schema": SCHEMA, "entries": entries}
    return _canonical({**body, "sha256": hashlib.sha256(_canonical(body)).hexdigest()}) + b"\n"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _entry_problem(key: Any, entry: Any) -> str | None:
    """What is wrong with one entry, else None."""
    if not isinstance(key, str) or not key or not isinstance(entry, dict):
        return "an entry that is not a path and an object"
    if set(entry) != {"kind", "stat", "sha256", "hashed_ns"} or entry["kind"] not in _KINDS:
        return f"entry {key!r} holds other fields"
    want = _STAT if entry["kind"] == "shard" else _ARRAY_STAT
    st = entry["stat"]
    if not isinstance(st, dict) or set(st) != set(want) or not all(_is_int(v) for v in st.values()):
        return f"entry {key!r} has no valid stat"
    digest = entry["sha256"]
    if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
        return f"entry {key!r} has no valid sha256"
    if not _is_int(entry["hashed_ns"]):
        return f"entry {key!r} has no valid hashed_ns"
    return None


def read_record(path: Path) -> tuple[dict[str, dict[str, Any]], str | None]:
    """(entries, None) of the record at `path` ({} when there is none), or ({}, what is wrong) for a damaged one."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return {}, None
    except OSError as exc:
        return {}, f"cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode):
        return {}, "is not a regular file"
    if st.st_size > MAX_RECORD_BYTES:
        return {}, f"holds {st.st_size} bytes, more than a record of ours ({MAX_RECORD_BYTES})"
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(MAX_RECORD_BYTES + 1).decode("utf-8"))
    except OSError as exc:
        return {}, f"cannot be read ({exc.strerror or exc})"
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {}, "is not UTF-8 JSON (cut short or overwritten)"
    if not isinstance(doc, dict) or set(doc) != {"schema", "entries", "sha256"}:
        return {}, f"is not a record of schema {SCHEMA}"
    if doc["schema"] != SCHEMA:
        return {}, f"has schema {str(doc['schema'])[:40]!r}, expected {SCHEMA}"
    body = {"schema": doc["schema"], "entries": doc["entries"]}
    if not isinstance(doc["entries"], dict) or doc["sha256"] != hashlib.sha256(_canonical(body)).hexdigest():
        return {}, "its content does not match its sha256 (edited or damaged)"
    for key, entry in doc["entries"].items():
        problem = _entry_problem(key, entry)
        if problem is not None:
            return {}, problem
    return doc["entries"], None


def record_path(output: str, cache_root: str | None) -> Path | None:
    """Where the record of the local output folder `output` lives: OUT/.dpot-verified.json when this user may write
    OUT, else CACHE/verified/<sha256 of OUT's absolute path>.json under a cache folder the user named; None: none."""
    folder = os.path.abspath(local_path(output))
    if os.path.isdir(folder) and os.access(folder, os.W_OK | os.X_OK):
        return Path(folder) / RECORD_NAME
    if cache_root:
        key = hashlib.sha256(os.fsencode(folder)).hexdigest()
        return Path(os.path.abspath(os.path.expanduser(cache_root))) / CACHE_FOLDER / f"{key}.json"
    return None


def _racy(entry: dict[str, Any]) -> bool:
    """Hashed within RACY_NS of the file's last change: a later change in the same timestamp tick would not show."""
    st = entry["stat"]
    return max(st["mtime_ns"], st["ctime_ns"]) >= entry["hashed_ns"] - RACY_NS


class Record:
    """The record of one local output: consulted by the validator through `digest` (its `DigestMemo`), merged into
    the file on disk by `save`."""

    def __init__(self, output: str, path: Path | None, consult: bool, write: bool) -> None:
        self.output = output
        self.path = path
        self.consult = consult and path is not None
        self.write = write and path is not None
        self.entries: dict[str, dict[str, Any]] = {}
        self.problem: str | None = None
        if self.consult and path is not None:
            self.entries, self.problem = read_record(path)
        self.updates: dict[str, dict[str, Any] | None] = {}  # this pass: new entries, and None for entries dropped
        self.served: set[str] = set()  # keys whose sha256 came from the record
        self.hashed = 0
        self.listed: tuple[Collection[str], Collection[str]] | None = None  # (keys, kinds) the pass checked whole
        self.failed = False
        self._lock = threading.Lock()
        self._saving = threading.Lock()
        self._saved_at = time.monotonic()

    def vouches(self, key: str, stamp: Stamp | None, sha256: str) -> bool:
        """Whether the record holds `key` with this stamp and this sha256, hashed well after its last change."""
        entry = self.entries.get(key) if self.consult and stamp is not None else None
        return entry is not None and entry["stat"] == stamp and entry["sha256"] == sha256 and not _racy(entry)

    def digest(self, item: Item, compute: Callable[[], str]) -> str:
        """The validator's DigestMemo: the recorded sha256 when the record vouches for the item as it is now (nothing
        is read), else compute(), recorded when it equals the manifest's and the item did not change meanwhile."""
        stamp = item_stamp(item)
        if self.vouches(item.what, stamp, item.sha256):
            with self._lock:
                self.served.add(item.what)
            return item.sha256
        started = time.time_ns()
        digest = compute()
        after = item_stamp(item) if stamp is not None and self.write else None
        with self._lock:
            self.hashed += 1
            if self.write and stamp is not None:
                good = digest == item.sha256 and after == stamp
                self.updates[item.what] = {"kind": item.kind, "stat": stamp, "sha256": digest,
                                           "hashed_ns": started} if good else None
        if self.write and time.monotonic() - self._saved_at >= SAVE_EVERY_S and self._saving.acquire(blocking=False):
            try:  # a long pass keeps what it verified so far (a preempted job's next launch starts from there)
                self._save()
            finally:
                self._saving.release()
        return digest

    def save(self) -> None:
        """Merge this pass's entries into the record on disk (under its lock) and replace it atomically; with
        `listed` set, entries of the checked kinds the manifest no longer lists are dropped. A failure to write is
        one warning line (the next launch then hashes these again), never an error."""
        if self.write:
            with self._saving:
                self._save()

    def _save(self) -> None:
        assert self.path is not None
        with self._lock:
            updates = dict(self.updates)
        if not updates and self.listed is None:
            self._saved_at = time.monotonic()
            return
        lock = FileLock(self.path.with_name(self.path.name.removesuffix(".json") + ".lock"), remove=True,
                        busy=f"{self.path}: another process is writing it")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)  # a cache folder's verified/ (OUT exists)
            held = _acquire(lock)
            try:
                current, _ = read_record(self.path)  # another launch's entries are kept; a damaged file is replaced
                merged = dict(current)
                for key, entry in updates.items():
                    if entry is None:
                        merged.pop(key, None)
                    else:
                        merged[key] = entry
                if self.listed is not None:
                    keys, kinds = self.listed
                    merged = {k: e for k, e in merged.items() if k in keys or e["kind"] not in kinds}
                if merged != current or not self.path.exists():
                    atomic_write(self.path, encode(merged))
            finally:
                if held:
                    lock.release()
        except (OSError, FormatError, LockBusy) as exc:
            if not self.failed:
                self.failed = True
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                _warn(f"{self.path}: the record of verified shards cannot be written ({reason}); the next launch "
                      "hashes them again")
        self._saved_at = time.monotonic()


def _acquire(lock: FileLock) -> bool:
    """Take `lock`, waiting up to LOCK_WAIT_S for another writer; False where the file system has no flock (the
    atomic rename alone then keeps the record whole). LockBusy after the wait."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            lock.acquire()
            return True
        except LockBusy:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.02)
        except OSError:  # no flock here (some network file systems)
            return False


@dataclass(frozen=True)
class RecordPolicy:
    """How a sha256 pass uses the records: `consult` them (--verify-checksums auto; False: always), `write` what it
    verified (False: a dry run), and the cache folder the user named, for outputs this user may not write."""

    consult: bool = True
    write: bool = True
    cache_root: str | None = None


def named_cache(given: str | None) -> str | None:
    """The cache folder the user named for a check outside launch: --cache-dir, else $DPOT_CACHE_DIR; else None (the
    default ~/.cache/dpot/shards is not written to for a record)."""
    return given or os.environ.get(CACHE_ENV) or None


def _folder(path: str) -> str:
    """The output folder of a --manifest path (a folder or its manifest.json), absolute."""
    text = local_path(path).rstrip("/") or "/"
    return os.path.abspath(os.path.dirname(text) if text.endswith(".json") else text)


def listed_keys(doc: dict[str, Any], part: str) -> tuple[set[str], tuple[str, ...]]:
    """(keys, kinds) of every shard ("shards") or Zarr array ("zarr") the manifest document lists: what a pass over
    the whole output checks."""
    if part == "zarr":
        keys = {f"{e['zarr']['path']}/{e['zarr']['group']}/{a}" for e in doc["datasets"] if e.get("zarr")
                for a in e["zarr"]["arrays"]}
        return keys, ("zarr",)
    return {s["path"] for e in doc["datasets"] for s in e["shards"]}, ("shard",)


class Records:
    """The records of the local outputs one sha256 pass checks (`with Records(policy) as records:`): each is saved
    when the block ends, whatever way it ends (what was verified stays verified). `policy` None: no record."""

    def __init__(self, policy: RecordPolicy | None) -> None:
        self.policy = policy
        self.by_output: dict[str, Record] = {}

    def record(self, path: str, doc: dict[str, Any] | None = None, part: str = "shards") -> Record | None:
        """The record of the output at `path` (a folder or its manifest.json; None for object storage or without a
        policy), opened once; a damaged one is named in one warning line. `doc`: the manifest, when the pass checks
        the whole output (entries it no longer lists are then dropped)."""
        if self.policy is None or not is_local(path):
            return None
        folder = _folder(path)
        found = self.by_output.get(folder)
        if found is None:
            p = self.policy
            found = Record(folder, record_path(folder, p.cache_root), p.consult, p.write)
            self.by_output[folder] = found
            if found.problem is not None:
                then = "every one is hashed" + (" and the record rewritten" if found.write else "")
                _warn(f"{found.path}: damaged record of verified shards ({found.problem}); {then}")
        if doc is not None:
            found.listed = listed_keys(doc, part)
        return found

    def to_hash(self, outputs: Iterable[tuple[str, list[dict[str, Any]]]], part: str,
                splits: Collection[str] | None = None) -> tuple[int, int]:
        """(bytes, items) the pass will read over these (output path, dataset entries): hash_pool.to_hash less the
        shards the records vouch for (one lstat each)."""
        from dpot_train.data.hash_pool import to_hash

        left: list[dict[str, Any]] = []
        for path, entries in outputs:
            record = self.record(path)
            if record is None or not record.consult:
                left += entries
                continue
            base = _folder(path)
            for e in entries:
                if part == "shards":
                    left.append({**e, "shards": [s for s in e["shards"] if not record.vouches(
                        s["path"], file_stamp(os.path.join(base, *s["path"].split("/"))), s["sha256"])]})
                    continue
                z = e.get("zarr")
                store = os.path.join(base, *z["path"].split("/")) if z else ""
                arrays = {a: d for a, d in (z["arrays"] if z else {}).items() if not record.vouches(
                    f"{z['path']}/{z['group']}/{a}", array_stamp(store, z["group"], a), d)}
                left.append({**e, "zarr": {**z, "arrays": arrays} if arrays else None})
        return to_hash(left, part, splits)

    def progress(self, path: str, bar: Callable[[Item, list[Problem]], None] | None
                 ) -> Callable[[Item, list[Problem]], None] | None:
        """The validator's progress callback for `bar`, leaving out the items the record served (not in its total)."""
        record = self.record(path)
        if bar is None or record is None:
            return bar

        def step(item: Item, problems: list[Problem]) -> None:
            if item.what not in record.served:
                bar(item, problems)

        return step

    def summary(self, part: str) -> str | None:
        """The line a launch says when the records served any sha256 (None when none): how many, from where, how
        many were hashed."""
        served = sum(len(r.served) for r in self.by_output.values())
        if not served:
            return None
        hashed = sum(r.hashed for r in self.by_output.values())
        used = [r for r in self.by_output.values() if r.served]
        where = str(used[0].path) if len(used) == 1 else f"the records of {len(used)} outputs"
        noun = "Zarr arrays" if part == "zarr" else "shards"
        return (f"note: sha256 of {served} of {served + hashed} {noun} taken from {where} (unchanged since they were "
                f"hashed), {hashed} hashed; --verify-checksums always hashes every one")

    def __enter__(self) -> "Records":
        return self

    def __exit__(self, *exc: object) -> None:
        for record in self.by_output.values():
            if exc[0] is not None:
                record.listed = None  # a pass cut short: drop nothing it did not get to
            record.save()
