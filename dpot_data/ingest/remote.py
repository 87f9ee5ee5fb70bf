"""Ingest to an fsspec URL output (s3://, gs://, memory://, local://, ...) through a local working folder.

HDF5 and MAT readers need seekable local files and the writers need rename and fsync, so a remote job runs as:
inputs copied (streamed) into the job's local working folder → the ordinary local ingest, resumable, into a local
folder → the finished folder uploaded file by file, each under a temporary name then moved, the manifest last. Until
the manifest is there, readers of the URL see no output; an interrupted upload is redone by a re-run of the same job,
which finds its local output complete. One ingest at a time writes into a URL (a lock in the local working root,
held until the upload ends), and the manifest at the URL is checked again just before the commit: an output
committed there by someone else since the job was resolved is never replaced. Replacing an output (--overwrite)
uploads the new store and shard folders beside the old ones, under names nothing at the URL uses, and removes the
old ones only after the new manifest is in place: the URL holds the old output, complete, until then. As locally,
only names this tool recorded (the publish record) are ever removed at the URL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpot_data import fs
from dpot_data.errors import InputError
from dpot_data.ingest.job import manifest_digest, url_key, work_root
from dpot_data.ingest.publish import (BUSY, MANIFEST_TEMP, RECORD_NAME, free_name, owned_leftovers, referenced_tops,
                                      relocated)
from dpot_data.manifest_io import MANIFEST_NAME
from dpot_format.errors import FormatError
from dpot_format.io import atomic_write
from dpot_format.lock import FileLock, LockBusy
from dpot_format.manifest import read_manifest, write_manifest
from dpot_format.names import SHARDS_FOLDER


def url_lock(out: str) -> FileLock:
    """The lock of an output URL, in the local working root: two ingests into one URL from this machine (or any
    sharing its $TMPDIR) never run at once; the second is refused with one line, as for a local folder."""
    folder = work_root() / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    return _RefusingLock(folder / f"{url_key(out)}.lock", out)


class _RefusingLock(FileLock):
    """A FileLock whose refusal is the ingest's one line (InputError naming the URL)."""

    def __init__(self, path: Path, out: str) -> None:
        super().__init__(path, busy=f"{out}: {BUSY}")
        self.out = out

    def acquire(self) -> "FileLock":
        try:
            return super().acquire()
        except LockBusy:
            raise InputError(self.out, BUSY) from None
        except FormatError as exc:
            raise InputError(exc.where, exc.expected) from None


def publish(job: Any, outcome: Any) -> Any:
    """Upload the job's finished local output to its URL (manifest last); the outcome names the URL."""
    from dataclasses import replace

    out = job.target.remote
    manifest = upload(job.target.local, out, job.target.seen)
    return replace(outcome, manifest=manifest, path=fs.join(out, MANIFEST_NAME), written=True,
                   notes=list(outcome.notes) + [f"uploaded to {out}"])


def upload(local: Path, url: str, seen: str | None) -> dict[str, Any]:
    """Upload the complete local output `local` to `url`, beside the output already there: its store and shard
    folders under names nothing at `url` uses, then the manifest (the commit point: one move), then the folders no
    manifest names any more are removed. `seen`: the digest of the manifest at `url` when the job was resolved; a
    different one now (another writer committed) refuses the upload. Returns the manifest written."""
    fsys, base = fs.filesystem(url)
    base = base.rstrip("/")
    current = _current(url, seen)
    _remove_owned(fsys, base, current)  # an interrupted upload's folders and temporaries
    manifest = json.loads((local / MANIFEST_NAME).read_text(encoding="utf-8"))
    taken = referenced_tops(current) | set(_children(fsys, base))
    names: dict[str, str] = {}
    for top in sorted(referenced_tops(manifest)):
        names[top] = free_name(*(("data", ".zarr") if top.endswith(".zarr") else (SHARDS_FOLDER, "")), taken)
        taken.add(names[top])
    fsys.makedirs(base, exist_ok=True)
    atomic_write(fs.join(url, RECORD_NAME), json.dumps({"names": sorted({*referenced_tops(current),
                                                                         *names.values()})}).encode("utf-8"))
    uploaded: dict[str, dict[str, tuple[str, ...]]] = {}
    for top, name in names.items():
        fs.upload_tree(local / top, fs.join(url, name))
        uploaded[name] = _listing(fsys, f"{base}/{name}")  # what this job put there, as the store reports it
    manifest = {**manifest, "datasets": [relocated(e, names) for e in manifest["datasets"]]}
    _current(url, seen)  # the last look before the commit
    write_manifest(url, manifest)  # validated, under a temporary name, then moved into place
    _check_committed(fsys, base, url, local, names, uploaded)
    _remove_owned(fsys, base, manifest)
    return manifest


def _object_id(info: dict[str, Any]) -> tuple[str, ...]:
    """What tells one stored object from another written under the same name: its size and the store's own
    version of it (S3 ETag, else the modification time, creation time or inode the backend reports)."""
    keys = ("size", "ETag", "etag", "VersionId", "md5", "mtime", "LastModified", "created", "ino")
    return tuple(str(info.get(k)) for k in keys)


def _listing(fsys: Any, root: str) -> dict[str, tuple[str, ...]]:
    """Every object below `root` (relative name -> `_object_id`), listed afresh; empty when there is none."""
    fsys.invalidate_cache(root)  # a cached listing would not show what another machine removed
    try:
        found = fsys.find(root, detail=True)
    except FileNotFoundError:
        return {}
    prefix = root.rstrip("/") + "/"
    return {str(path)[len(prefix):]: _object_id(info) for path, info in found.items()
            if info.get("type") != "directory" and str(path).startswith(prefix)}


def _check_committed(fsys: Any, base: str, url: str, local: Path, names: dict[str, str],
                     uploaded: dict[str, dict[str, tuple[str, ...]]]) -> None:
    """After the commit: every file of the local output is at the URL under its published folder, as this job
    uploaded it. Object stores have no compare-and-swap, so an ingest into the same URL from another machine (its
    lock is local) can remove or replace a folder this job uploaded before the manifest naming it was committed;
    that output is then broken, and said so in one line (InputError) instead of reported as written."""
    for top, name in names.items():
        root = local / top
        mine = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()
        now = _listing(fsys, f"{base}/{name}")
        lost = sorted(rel for rel in mine if rel not in now or now[rel] != uploaded[name].get(rel))
        if lost:
            raise InputError(url, f"the output committed there lost {len(lost)} of the {len(mine)} files this "
                                  f"ingest uploaded into {name}/ (first: {lost[0]}): another ingest into the same "
                                  "URL, from another machine, removed or replaced them; the manifest there names "
                                  "files that are not this ingest's: re-run with --overwrite, and give each machine "
                                  "its own output URL")


def _current(url: str, seen: str | None) -> dict[str, Any] | None:
    """The manifest at `url` (None when there is none), refused when it is not the one the job saw."""
    if manifest_digest(url) != seen:
        raise InputError(url, "now holds a manifest that this ingest did not see when it started (another ingest "
                              "committed there meanwhile); left alone: re-run to ingest against what it holds now")
    return _remote_manifest(url)


def _children(fsys: Any, base: str) -> list[str]:
    try:
        return [str(c).rstrip("/").rsplit("/", 1)[-1] for c in fsys.ls(base, detail=False)]
    except FileNotFoundError:
        return []


def _remote_manifest(url: str) -> dict[str, Any] | None:
    """The manifest at an output URL (None when there is none); InputError when one is there but broken."""
    path = fs.join(url, MANIFEST_NAME)
    if not fs.exists(path):
        return None
    try:
        return read_manifest(path)
    except FormatError as exc:
        raise InputError(exc.where or path, exc.expected) from None


def _remove_owned(fsys: Any, base: str, manifest: dict[str, Any] | None) -> None:
    """Remove, at the top of a remote output, what this tool recorded and `manifest` does not name, the record
    itself and the manifest's temporary files; nothing else, whatever its name."""
    record = f"{base}/{RECORD_NAME}"
    try:
        names = json.loads(fsys.cat_file(record).decode("utf-8"))["names"] if fsys.exists(record) else []
    except (ValueError, KeyError, TypeError, OSError):
        names = []
    for name in owned_leftovers([n for n in names if isinstance(n, str) and n and "/" not in n], manifest):
        if fsys.exists(f"{base}/{name}"):
            fsys.rm(f"{base}/{name}", recursive=True)
    for name in _children(fsys, base):
        if name == RECORD_NAME or MANIFEST_TEMP.match(name):
            fsys.rm(f"{base}/{name}")
