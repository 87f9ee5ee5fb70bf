"""Publishing an ingest output: one writer per output folder, and a manifest that at every instant names a complete,
durable set of files.

- `OutputLock`: an exclusive lock on OUT for the whole ingest; a second ingest into the same OUT is refused at once.
- `publish`: the staged Zarr store and shard folder move in under names neither the current manifest nor anything
  else in OUT uses, the new manifest replaces the old one in one atomic rename (the commit point), and only then are
  the old files removed. A crash or a full disk at any step leaves the old output valid and readable (or, after the
  rename, the new one); the next ingest removes what is left over.
- What is left over is only ever what this tool wrote and recorded: before the staged folders move in, their names
  and the old output's are written to the publish record `OUT/.dpot-publish.json`; a later ingest removes the recorded
  names no manifest uses. A file or folder of the user's in OUT is never removed, whatever its name.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable

from dpot_data import fs
from dpot_data import manifest_io as mf
from dpot_data.errors import InputError
from dpot_data.ingest.options import IngestOutcome
from dpot_data.ingest.journal import remove_stale_staging
from dpot_format.errors import FormatError
from dpot_format.io import atomic_write
from dpot_format.lock import FileLock, LockBusy
from dpot_format.names import SHARDS_FOLDER, ZARR_PATH
from dpot_format.readers import ReadersBusy, exclusive

LOCK_NAME = ".dpot-ingest.lock"
RECORD_NAME = ".dpot-publish.json"  # the names a publish in progress put (or is putting) into OUT
MANIFEST_TEMP = re.compile(r"^\.manifest\.json\.tmp-\d+$")  # dpot_format.io.atomic_write's name for the manifest
BUSY = "another ingest is writing into this folder; wait for it to finish (or choose another --out)"


class OutputLock:
    """An exclusive, non-blocking lock on an output folder, held for the whole ingest; removed when released, with
    OUT itself when this lock created it and nothing was written into it."""

    def __init__(self, out: Path, shown: str | None = None) -> None:
        self.out = Path(out)
        self.shown = shown or str(out)  # how the user named OUT (a URL, for the local side of a remote output)
        self.created = False
        self._lock = FileLock(self.out / LOCK_NAME, busy=f"{self.shown}: {BUSY}", remove=True)

    def __enter__(self) -> "OutputLock":
        if self.out.exists() and not self.out.is_dir():
            raise InputError(self.shown, "is a file, expected an output folder (or a path that does not exist yet)")
        self.created = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except LockBusy as exc:
            self._forget()
            raise InputError(self.shown, BUSY) from exc
        except FormatError as exc:
            raise InputError(exc.where, exc.expected) from None
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        self._forget()

    def _forget(self) -> None:
        """Remove OUT when this lock created it and it stayed empty (a refused or failed first ingest)."""
        if self.created:
            try:
                self.out.rmdir()
            except OSError:
                pass


def existing_manifest(out: str | Path) -> dict[str, Any] | None:
    """The valid manifest already in OUT, None when there is none; InputError when one is there but broken."""
    path = Path(out) / mf.MANIFEST_NAME
    if not path.exists():
        return None
    return mf.read(path)


def existing_outcome(out: str | Path, overwrite: bool) -> Any:
    """The IngestOutcome of an OUT (local path or URL) that already holds a complete manifest and is to be left
    alone; None when there is none or `overwrite` is set. The one place that decides "complete: leave it alone"."""
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


def owned_leftovers(record: Iterable[str], manifest: dict[str, Any] | None) -> set[str]:
    """The recorded names a manifest does not use: what an interrupted or finished publish leaves to remove."""
    return set(record) - referenced_tops(manifest)


def read_record(out: Path) -> list[str]:
    """The names the publish record of OUT lists (none when there is no record, or one cut short)."""
    try:
        names = json.loads((out / RECORD_NAME).read_text(encoding="utf-8"))["names"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [n for n in names if isinstance(n, str) and n and "/" not in n and n not in (".", "..")]


def write_record(out: Path, names: Iterable[str]) -> None:
    """Record, durably, the top-level names a publish owns in OUT (before it moves anything in)."""
    atomic_write(out / RECORD_NAME, json.dumps({"names": sorted(set(names))}).encode("utf-8"))


def remove_leftovers(out: Path, manifest: dict[str, Any] | None, keep_staging: str | None = None,
                     spent_only: bool = False) -> None:
    """Remove what this tool wrote into OUT and no manifest names: the recorded folders of an unfinished or finished
    publish, a manifest's temporary file, stale staging folders of other jobs (the caller holds the output lock, so
    no other ingest is writing them; `spent_only`: only those whose output was moved out, a resumable one is kept).
    Nothing else is touched, whatever its name."""
    for name in owned_leftovers(read_record(out), manifest):
        _remove(out / name)
    (out / RECORD_NAME).unlink(missing_ok=True)
    for child in out.iterdir():
        if MANIFEST_TEMP.match(child.name) and child.is_file():
            child.unlink()
    remove_stale_staging(out, keep=keep_staging, spent_only=spent_only)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


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
    if entry.get("shard_index"):  # beside the shards: it moves with their folder
        entry["shard_index"] = {**entry["shard_index"], "path": move(entry["shard_index"]["path"])}
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
            taken = referenced_tops(old) | {child.name for child in out.iterdir()}
            names = {ZARR_PATH: free_name("data", ".zarr", taken),
                     SHARDS_FOLDER: free_name(SHARDS_FOLDER, "", taken)}
            manifest = mf.build([relocated(entry, names)], command)  # validated before anything moves
            write_record(out, [*referenced_tops(old), *names.values()])
            _move_into_place(out, staging, names)
            mf.write(out, manifest)  # the commit point: one atomic rename
            shutil.rmtree(staging, ignore_errors=True)  # ours, spent (its lock goes with the journal)
            remove_leftovers(out, manifest)
            mf.fsync_dir(out)
    except ReadersBusy as exc:
        raise InputError(out, f"{str(exc).split(': ', 1)[1]}; --overwrite would delete the files it reads. Nothing "
                              f"was changed; the staged output stays in {staging.name} for a re-run of the same "
                              "command once the training has ended") from None
    return manifest
