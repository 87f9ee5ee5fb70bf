"""The one rule for every file, folder and store a dpot command writes (docs/format.md, "Where dpot writes"):
predictions stores, reports, model exports, eval.json, plots, previews, dataset cards, ingest staging, checkpoints.

Checked before any work, each refusal one line naming the option, the path and what it is (OutputError):
- a target that is a symbolic link, a device, a FIFO or a socket, or a folder where a file is expected (a file where
  a folder is), is refused: nothing is written through a link or onto a special file;
- nothing is written inside an ingest output (a folder holding a dpot manifest.json) or into a run's own data
  (RUN_DIR's checkpoints/, config.yaml, eval.json, ...) but by the command that owns the place (`home`);
- what dpot replaces whole, or names by itself (a predictions store, plot files), it replaces only when it bears
  dpot's mark (a store's root attribute, a picture's metadata) and holds nothing dpot did not write.
Temporary siblings a killed write left (`.NAME.tmp-<pid>[-...]` whose process is gone) are removed by the next
write of NAME (`remove_stale`); a run's checkpoints folder is swept whole (`remove_stale_in`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Callable

from dpot_format.errors import FormatError
from dpot_format.io import file_kind
from dpot_format.names import MANIFEST_NAME

STORE_MARK = "dpot"  # root attribute of a Zarr store dpot writes: {"written_by": "<command>", ...}
MARK_HEAD = 1 << 16  # bytes of a file searched for dpot's mark (PNG text chunks and GIF comments come first)
RUN_MARKERS = (".dpot-run.lock", "launch.json", "plan.json", "checkpoints")  # with config.yaml: a RUN_DIR
RUN_ENTRIES = frozenset({"checkpoints", "config.yaml", "plan.json", "launch.json", "metrics.jsonl", "eval.json", "tb",
                         "audit", "trackers.json", "mlruns", "shard-cache", ".dpot-run.lock"})
TEMPORARY = re.compile(r"^\.(?P<stem>.+)\.tmp-(?P<pid>\d{1,10})(?:-.*)?$")
"""A writer's temporary sibling of NAME: `.NAME.tmp-<pid>` (dpot_format.io.atomic_path), or `.NAME.tmp-<pid>-...`."""


class OutputError(FormatError):
    """A target a command refuses to write; `str()` is "<option> <path>: <what it is / what was expected>"."""


def _where(path: str | os.PathLike[str], option: str | None) -> str:
    return f"{option} {os.fspath(path)}" if option else os.fspath(path)


def kind_of(path: str | os.PathLike[str]) -> str | None:
    """What is at `path`, not following a link ("a regular file", "a directory", "a character device", "a symbolic
    link (to '...')"), None when nothing is."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symbolic link (to {os.readlink(path)!r})"
        except OSError:
            return "a symbolic link"
    return file_kind(st.st_mode)


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` runs on this machine (ours counts; a pid that cannot be one does not)."""
    if pid <= 0 or pid >= 2**31:
        return False
    if pid == os.getpid() or os.name != "posix":  # elsewhere signal 0 is no probe: nothing is taken for dead
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process, or a check this system refuses: not ours to remove
    return True


def remove_entry(path: str | os.PathLike[str]) -> None:
    """Remove a file, a link (not what it points to) or a folder tree; a failure (or nothing there) leaves it."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except OSError:
        pass


def stale_temporaries(folder: str | os.PathLike[str], stem: Callable[[str], bool] | None = None) -> list[Path]:
    """The temporary names in `folder` (`.NAME.tmp-<pid>[-...]`) whose writer's process is gone, for NAMEs `stem`
    accepts (None: every NAME)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in sorted(names):
        m = TEMPORARY.match(name)
        if m and (stem is None or stem(m.group("stem"))) and not pid_alive(int(m.group("pid"))):
            found.append(Path(folder) / name)
    return found


def remove_stale_in(folder: str | os.PathLike[str], stem: Callable[[str], bool] | None = None) -> list[Path]:
    """Remove what `stale_temporaries` finds (files, links, folders); returns what was there."""
    found = stale_temporaries(folder, stem)
    for path in found:
        remove_entry(path)
    return found


def remove_stale(target: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary siblings of `target` that a killed write of it left."""
    target = Path(target)
    return remove_stale_in(target.parent if str(target.parent) else ".", lambda s: s == target.name)


def _located(path: str | os.PathLike[str]) -> Path:
    """The absolute path with its folders resolved (links, `..`) but not its last component."""
    absolute = Path(os.path.abspath(path))
    return absolute.parent.resolve() / absolute.name if absolute.name else absolute


def _is_dpot_manifest(path: Path) -> bool:
    """A manifest.json of an ingest output: a file that is not clearly another tool's JSON (a damaged one counts)."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as fh:
            data = fh.read(64 << 20)
        doc = json.loads(data)
    except (OSError, ValueError):
        return True
    return not isinstance(doc, dict) or "datasets" in doc


def _is_run_dir(folder: Path) -> bool:
    return (folder / "config.yaml").is_file() and any(os.path.lexists(folder / m) for m in RUN_MARKERS)


def owner(path: str | os.PathLike[str], home: str | os.PathLike[str] | None = None) -> str | None:
    """Why `path` is another command's to write (None when it is not): it lies inside an ingest output or is part
    of a run's own data. `home`: the folder the calling writer owns (its checks are skipped there)."""
    target = _located(path)
    skip = Path(home).resolve() if home is not None else None
    for folder in (target, *target.parents):
        if folder == skip:
            continue
        if _is_dpot_manifest(folder / MANIFEST_NAME):
            where = "is" if folder == target else "lies inside"
            return f"{where} the ingest output {folder} (it holds {MANIFEST_NAME}); expected a path outside it"
        if folder != target and _is_run_dir(folder):
            entry = target.relative_to(folder).parts[0]
            if entry in RUN_ENTRIES:
                return (f"is part of the run {folder} (its {entry}, which launch writes); expected a path outside "
                        "the run's own files")
    return None


def _parent_problem(target: Path) -> str | None:
    """The first existing folder above `target` when it is not a folder."""
    parent = next((a for a in _located(target).parents if os.path.lexists(a)), None)
    if parent is not None and not parent.is_dir():
        what = "a file" if kind_of(parent) == "a regular file" else kind_of(parent)
        return f"{parent} is {what}, not a folder; expected a path in a folder"
    return None


def check_file(path: str | os.PathLike[str], option: str | None = "--out", example: str = "eval.json",
               home: str | os.PathLike[str] | None = None) -> Path:
    """A file a command may write (a new name or a regular file it replaces), checked before any work: not a
    folder, a link, a device, a FIFO or a socket, not inside an ingest output or a run's data (but `home`); the
    temporary siblings a killed write of it left are removed. OutputError (one line) otherwise."""
    text = os.fspath(path)
    target = Path(text)
    where = _where(text, option)
    what = kind_of(target)
    if text.endswith(("/", os.sep)) or what == "a directory":
        raise OutputError(where, f"is a folder; expected the file to write (e.g. {target / example})")
    if what is not None and what != "a regular file":
        raise OutputError(where, f"is {what}; expected a regular file or a new name (dpot writes neither through "
                                 "a link nor onto a special file)")
    problem = _parent_problem(target) or owner(target, home)
    if problem:
        raise OutputError(where, problem)
    remove_stale(target)
    return target


def check_folder(path: str | os.PathLike[str], option: str | None, home: str | os.PathLike[str] | None = None,
                 owned: bool = True) -> Path:
    """A folder a command may write into (an existing folder or a new name), checked before any work: not a link
    or anything but a folder, and (`owned`) not inside an ingest output or a run's data (but `home`)."""
    target = Path(path)
    where = _where(path, option)
    what = kind_of(target)
    if what is not None and what != "a directory":
        raise OutputError(where, f"is {what}; expected a folder or a new name")
    problem = _parent_problem(target) or (owner(target, home) if owned else None)
    if problem:
        raise OutputError(where, problem)
    return target


def _head(path: Path) -> bytes:
    """The first MARK_HEAD bytes of a regular file, opened without following a link or blocking on a FIFO."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        return os.read(fd, MARK_HEAD)
    finally:
        os.close(fd)


def marked_file_problem(path: str | os.PathLike[str], mark: bytes) -> str | None:
    """Why dpot may not replace the file at `path` (None: nothing is there, or a regular file bearing `mark` in its
    first MARK_HEAD bytes, i.e. written by the command whose mark it is)."""
    what = kind_of(path)
    if what is None:
        return None
    if what != "a regular file":
        return f"is {what}, not a file dpot wrote; move it away or choose another folder"
    try:
        ours = mark in _head(Path(path))
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc}); expected a file dpot wrote"
    return None if ours else ("exists and was not written by dpot (it bears no dpot mark); move it away or choose "
                              "another folder: dpot does not overwrite it")


def check_marked(folder: str | os.PathLike[str], names: re.Pattern[str], mark: bytes,
                 option: str | None = None) -> None:
    """Every entry of `folder` named as `names` matches is a regular file bearing `mark` (OutputError naming the
    first that is not): the files a command names by itself in a folder are replaced only when it wrote them."""
    try:
        entries = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in entries:
        if names.match(name):
            problem = marked_file_problem(Path(folder) / name, mark)
            if problem:
                raise OutputError(_where(Path(folder) / name, option), problem)


def store_mark(store: str | os.PathLike[str]) -> dict | None:
    """The dpot mark in a Zarr store's root zarr.json attributes (None when there is none)."""
    path = Path(store) / "zarr.json"
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        doc = json.loads(_read_small(path))
    except (OSError, ValueError):
        return None
    mark = doc.get("attributes", {}).get(STORE_MARK) if isinstance(doc, dict) else None
    return mark if isinstance(mark, dict) else None


def _read_small(path: Path, limit: int = 64 << 20) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(limit)


def _chunk_tree_problem(folder: Path, rel: str) -> str | None:
    """A Zarr chunk folder (`c/...`) holds only folders and regular files named by digits."""
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        inner = f"{rel}/{entry.name}"
        if not entry.name.isdigit() or not (entry.is_dir(follow_symlinks=False) or
                                            entry.is_file(follow_symlinks=False)):
            return inner
        if entry.is_dir(follow_symlinks=False):
            problem = _chunk_tree_problem(Path(entry.path), inner)
            if problem:
                return problem
    return None


def foreign_entry(store: str | os.PathLike[str]) -> str | None:
    """The first entry of a Zarr v3 store that Zarr did not write (a user's file, a link, a FIFO), relative to
    it; None when the store holds only Zarr nodes (folders with zarr.json) and their chunks (`c/...`)."""
    def walk(folder: Path, rel: str) -> str | None:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
        if "zarr.json" not in {e.name for e in entries}:
            return rel or "."
        for entry in entries:
            inner = f"{rel}/{entry.name}" if rel else entry.name
            if entry.name == "zarr.json":
                if not entry.is_file(follow_symlinks=False):
                    return inner
            elif entry.name == "c" and entry.is_file(follow_symlinks=False):
                continue  # the one chunk of a 0-d array
            elif not entry.is_dir(follow_symlinks=False):
                return inner
            elif entry.name == "c":
                problem = _chunk_tree_problem(Path(entry.path), inner)
                if problem:
                    return problem
            else:
                problem = walk(Path(entry.path), inner)
                if problem:
                    return problem
        return None

    return walk(Path(store), "")


def check_store(path: str | os.PathLike[str], option: str | None, written_by: str) -> Path:
    """A Zarr store a command may (re)write whole, checked before any work: a new name outside every ingest output
    and run's data, or a store that bears the mark `written_by` and holds only what Zarr wrote; the temporary
    siblings a killed write of it left are removed. OutputError (one line) otherwise."""
    target = Path(path)
    where = _where(path, option)
    what = kind_of(target)
    if what is not None and what != "a directory":
        raise OutputError(where, f"is {what}; expected a new path or a store `{written_by}` wrote")
    problem = _parent_problem(target) or owner(target)
    if problem:
        raise OutputError(where, problem)
    if what is not None:
        mark = store_mark(target)
        if mark is None or mark.get("written_by") != written_by:
            raise OutputError(where, f"exists and is not a store `{written_by}` wrote (no dpot mark in its "
                                     "zarr.json); name a new path (only a store it wrote is replaced)")
        foreign = foreign_entry(target)
        if foreign is not None:
            raise OutputError(where, f"holds {foreign}, which `{written_by}` does not write; move it out or name "
                                     "a new path (the store is replaced whole)")
    remove_stale(target)
    return target


def temporary_name(target: str | os.PathLike[str], tag: str = "") -> Path:
    """This process's temporary sibling of `target`: `.NAME.tmp-<pid>` (`-tag` appended when given)."""
    target = Path(target)
    return target.with_name(f".{target.name}.tmp-{os.getpid()}{'-' + tag if tag else ''}")

