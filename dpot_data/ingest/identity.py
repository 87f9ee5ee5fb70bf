"""The identity of an ingest's inputs, recorded once when the job is resolved and compared wherever a file is read
again: by every block task after its read (block tasks reopen the input by name), when the input hashes are taken,
and once more before publishing. An input replaced (`mv new.nc a.nc`, `cp`) or rewritten while the ingest reads it
would otherwise mix trajectories of two files under the sha256 of one; a mismatch is refused in one line naming the
file, and nothing is published.

A file's identity is (device, inode, size, mtime in ns); a folder (a Zarr store, a folder of inputs) is its own
identity plus that of every file below it. Block tasks, which may run on a cluster worker that sees the shared
filesystem under another device number, compare (inode, size, mtime) of the inputs named and of the folders
themselves; the check before publishing compares everything, the files inside folders too.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from dpot_data.errors import InputError
from dpot_data.ingest.input_hashes import CHANGED, Stamp, stamp


def _key(path: str | os.PathLike[str]) -> str:
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):  # a link loop: recorded as given, refused by the reader
        return os.path.abspath(path)


def _files_below(folder: str, exclude: Sequence[str] = ()) -> dict[str, Stamp | None]:
    """Every entry below a folder (links not followed into) but those under `exclude` (the ingest's own output
    inside an input folder), by path: their stamps."""
    out: dict[str, Stamp | None] = {}
    for parent, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if os.path.join(parent, d) not in exclude]
        for name in (*dirs, *files):
            path = os.path.join(parent, name)
            try:
                st = os.lstat(path)
            except OSError:
                out[path] = None
                continue
            if stat.S_ISLNK(st.st_mode):
                out[path] = stamp(path)
            elif not stat.S_ISDIR(st.st_mode):
                out[path] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return out


ZARR_MARKS = (".zarray", ".zgroup", "zarr.json")


def _in_zarr_store(path: str, roots: Sequence[str]) -> bool:
    """Whether `path` lies in a Zarr store below one of `roots` (a chunk that appears there changes its data)."""
    folder = os.path.dirname(path)
    while any(folder == r or folder.startswith(r + os.sep) for r in roots):
        if any(os.path.exists(os.path.join(folder, m)) for m in ZARR_MARKS):
            return True
        folder = os.path.dirname(folder)
    return False


def _differs(old: Stamp | None, new: Stamp | None, local: bool) -> str | None:
    """What changed between two stamps, None when nothing did (`local` False: the device number is not compared)."""
    if old == new or (not local and old is not None and new is not None and old[1:] == new[1:]):
        return None
    if new is None:
        return "it is gone"
    if old is None:
        return "it appeared"
    if old[1] != new[1] or (local and old[0] != new[0]):
        return "another file now has its name"
    if old[2] != new[2]:
        return f"{old[2]} bytes then, {new[2]} now"
    return "modified since"


@dataclass(frozen=True)
class InputIdentity:
    """The stamps of the inputs (`tops`: each path as given to the reader, resolved) and of every file inside the
    folders among them (`inside`). Picklable: block tasks carry it to the workers."""

    tops: Mapping[str, Stamp | None] = field(default_factory=dict)
    inside: Mapping[str, Stamp | None] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()

    @classmethod
    def of(cls, paths: Iterable[str | os.PathLike[str]],
           exclude: Iterable[str | os.PathLike[str] | None] = ()) -> "InputIdentity":
        """Record the inputs as they are now (URLs are not recorded: they were copied into a local working folder,
        whose copy is what is read); `exclude`: folders (the output) whose files are not inputs."""
        skip = tuple(_key(e) for e in exclude if e is not None)
        tops: dict[str, Stamp | None] = {}
        inside: dict[str, Stamp | None] = {}
        for p in paths:
            text = os.fspath(p)
            if "://" in str(text):
                continue
            key = _key(text)
            tops[key] = stamp(key)
            if os.path.isdir(key):
                inside.update(_files_below(key, skip))
        return cls(tops, inside, skip)

    def covering(self, paths: Sequence[str | os.PathLike[str]]) -> "InputIdentity":
        """This identity extended by `paths` (the files a reader found inside the folders given): each is taken from
        the stamps recorded inside a folder when there is one, else recorded now."""
        tops = dict(self.tops)
        for p in paths:
            key = _key(p)
            if key not in tops:
                tops[key] = self.inside[key] if key in self.inside else stamp(key)
        return InputIdentity(tops, self.inside, self.exclude)

    def check(self, local: bool = True, full: bool = False) -> None:
        """Refuse (InputError naming the file) when an input is not what was recorded: the inputs themselves, and with
        `full` every file inside the folders among them. `local` False: the device number is left out (a worker)."""
        for path, old in self.tops.items():
            why = _differs(old, stamp(path), local)
            if why is not None:
                raise InputError(path, CHANGED.format(what=why))
        if not full:
            return
        roots = [p for p, s in self.tops.items() if s is not None and os.path.isdir(p)]
        now: dict[str, Stamp | None] = {}
        for root in roots:
            now.update(_files_below(root, self.exclude))
        for path in sorted(set(self.inside) | set(now)):
            if path not in self.inside and not _in_zarr_store(path, roots):
                continue  # a file made in a folder of inputs after the reader listed them: not read
            why = _differs(self.inside.get(path), now.get(path), local)
            if why is not None:
                raise InputError(path, CHANGED.format(what=why))

    def stamp_of(self, path: str | os.PathLike[str]) -> Stamp | None:
        """The recorded stamp of an input file (None when it was not recorded)."""
        key = _key(path)
        return self.tops.get(key, self.inside.get(key))
