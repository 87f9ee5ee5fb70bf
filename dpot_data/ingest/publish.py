"""Publishing an ingest output: one writer per output folder, and a manifest that at every instant names a complete,
durable set of files.

- `OutputLock`: an exclusive lock on OUT for the whole ingest; a second ingest into the same OUT is refused at once.
- `publish`: the staged Zarr store and shard folder move in under names the current manifest does not use, the new
  manifest replaces the old one in one atomic rename (the commit point), and only then are the old files removed.
  A crash or a full disk at any step leaves the old output valid and readable (or, after the rename, the new one);
  the next ingest removes what is left over.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from pathlib import Path
from typing import Any

from dpot_data import manifest as mf
from dpot_data.errors import InputError
from dpot_data.journal import STAGING_PREFIX
from dpot_format.names import OUTPUT_FOLDER, is_temporary
from dpot_format.readers import ReadersBusy, exclusive

LOCK_NAME = ".dpot-ingest.lock"


class OutputLock:
    """An exclusive, non-blocking lock on an output folder, held for the whole ingest; removed when released."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = self.out / LOCK_NAME
        self.fd = -1

    def __enter__(self) -> "OutputLock":
        self.out.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise InputError(self.out, "another ingest is writing into this folder; wait for it to finish "
                                               "(or choose another --out)") from None
                raise
            try:  # the holder before us may have removed the file after we opened it: lock the one on disk
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            try:
                self.path.unlink(missing_ok=True)
            finally:
                os.close(self.fd)  # closing releases the lock
                self.fd = -1


def existing_manifest(out: str | Path) -> dict[str, Any] | None:
    """The valid manifest already in OUT, None when there is none; InputError when one is there but broken."""
    path = Path(out) / mf.MANIFEST_NAME
    if not path.exists():
        return None
    return mf.read(path)


def existing_outcome(out: str | Path, overwrite: bool) -> Any:
    """The IngestOutcome of an OUT (local path or URL) that already holds a complete manifest and is to be left
    alone; None when there is none or `overwrite` is set. The one place that decides "complete: leave it alone"."""
    from dpot_data import fs
    from dpot_data.ingest.options import IngestOutcome

    if overwrite:
        return None
    path = fs.join(out, mf.MANIFEST_NAME)
    if not fs.exists(path):
        return None
    manifest = mf.read(fs.local_path(path)) if fs.is_local(path) else fs.read_json(path)
    return IngestOutcome(manifest, Path(fs.local_path(path)) if fs.is_local(path) else path, False,
                         [left_alone_note(out)])


def left_alone_note(out: str | Path) -> str:
    """What an ingest says when OUT is complete and --overwrite was not given."""
    return f"{out}: already holds a complete manifest; left alone (use --overwrite to replace it)"


def referenced_tops(manifest: dict[str, Any] | None) -> set[str]:
    """The top-level names under OUT that a manifest's files live in (its Zarr store and shard folder)."""
    if manifest is None:
        return set()
    tops = set()
    for entry in manifest["datasets"]:
        if entry.get("zarr"):
            tops.add(entry["zarr"]["path"].split("/", 1)[0])
        tops.update(s["path"].split("/", 1)[0] for s in entry["shards"])
    return tops


def free_name(base: str, suffix: str, taken: set[str]) -> str:
    """`base+suffix` unless taken, else `base.<k>+suffix` for the smallest free k ≥ 1."""
    name, k = base + suffix, 0
    while name in taken:
        k += 1
        name = f"{base}.{k}{suffix}"
    return name


def remove_leftovers(out: Path, manifest: dict[str, Any] | None, keep_staging: str | None = None) -> None:
    """Remove what no manifest names: store and shard folders of an unfinished publish, temporary files, staging
    folders of other jobs (the caller holds the output lock, so no other ingest is writing them)."""
    used = referenced_tops(manifest)
    for child in out.iterdir():
        stale_data = OUTPUT_FOLDER.match(child.name) and child.name not in used
        stale_staging = child.name.startswith(STAGING_PREFIX) and child.name != keep_staging
        if stale_data or stale_staging:
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        elif child.is_file() and is_temporary(child.name):
            child.unlink()


def _move_into_place(out: Path, staging: Path, names: dict[str, str]) -> None:
    """Rename the staged store and shard folder to their published names, durably."""
    for staged, final in names.items():
        if (staging / staged).exists():
            os.replace(staging / staged, out / final)
    mf.fsync_dir(out)


def relocated(entry: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """A manifest entry with the first component of its store and shard paths renamed by `names` (the staged or
    uploaded folder -> the name it is published under)."""
    def move(rel: str) -> str:
        top, sep, rest = rel.partition("/")
        return names.get(top, top) + sep + rest

    entry = {**entry, "shards": [{**s, "path": move(s["path"])} for s in entry["shards"]]}
    if entry.get("zarr"):
        entry["zarr"] = {**entry["zarr"], "path": move(entry["zarr"]["path"])}
    return entry


def publish(out: Path, staging: Path, entry: dict[str, Any], command: str, overwrite: bool) -> dict[str, Any]:
    """Make the staged output the output of OUT (caller holds the OutputLock); returns the manifest written."""
    old = existing_manifest(out)
    if old is not None and not overwrite:  # written by someone else while this ingest ran
        raise InputError(out, "now holds a complete manifest that this ingest did not write; left alone (the "
                              f"staged output stays in {staging.name} for a re-run with --overwrite)")
    try:  # replacing an output deletes the files of the old one: not while a training reads them
        with exclusive(out) if old is not None else contextlib.nullcontext():
            remove_leftovers(out, old, keep_staging=staging.name)
            taken = referenced_tops(old)
            names = {"data.zarr": free_name("data", ".zarr", taken), "shards": free_name("shards", "", taken)}
            _move_into_place(out, staging, names)
            manifest = mf.build([relocated(entry, names)], command)
            mf.write(out, manifest)  # the commit point: one atomic rename
            remove_leftovers(out, manifest)
            mf.fsync_dir(out)
    except ReadersBusy as exc:
        raise InputError(out, f"{str(exc).split(': ', 1)[1]}; --overwrite would delete the files it reads. Nothing "
                              f"was changed; the staged output stays in {staging.name} for a re-run of the same "
                              "command once the training has ended") from None
    return manifest
