"""Paths a manifest lists (shards, Zarr store and group) must name something inside the output folder: relative
POSIX paths without `..`, and, on a local disk, without symbolic links on the way."""

from __future__ import annotations

import os
import re
import stat

from dpot_format.errors import FormatError
from dpot_format.io import is_local, join, local_path

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def path_error(rel: object) -> str | None:
    """Why `rel` is not a relative POSIX path inside a folder (None when it is one); no filesystem access."""
    if not isinstance(rel, str) or not rel:
        return "expected a non-empty relative path"
    if "\\" in rel:
        return "contains a backslash; expected a relative POSIX path"
    if "\0" in rel:
        return "contains a NUL character; expected a relative POSIX path"
    if "://" in rel or _SCHEME.match(rel):
        return "is a URL or has a scheme; expected a path relative to the manifest's folder"
    if rel.startswith("/"):
        return "is absolute; expected a path relative to the manifest's folder"
    for part in rel.split("/"):
        if part == "..":
            return "contains '..'; expected a path inside the manifest's folder"
        if part in ("", "."):
            return "has an empty or '.' component; expected a plain relative path"
    return None


def resolve_member(root: str, rel: str, where: str | None = None) -> str:
    """The path or URL of `rel` inside the output folder `root`, after checking that it stays inside it.

    `rel` must be a relative POSIX path (no `..`, no empty or `.` part, no backslash, no absolute path, no scheme).
    For a local root, every existing component below the root is checked with lstat: a symbolic link is refused
    (named in the message), and the resolved path must lie inside the root. Missing components are allowed (the
    caller reports the file as missing). FormatError otherwise.
    """
    label = where or f"{rel!r}"
    problem = path_error(rel)
    if problem is not None:
        raise FormatError(label, f"path {rel!r} {problem}")
    if not is_local(root):
        return join(root, rel)
    base = local_path(root)
    current = base
    walked: list[str] = []
    for part in rel.split("/"):
        current = os.path.join(current, part)
        walked.append(part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            break
        except NotADirectoryError:
            break
        if stat.S_ISLNK(st.st_mode):
            raise FormatError(label, f"{'/'.join(walked)} is a symbolic link (to {os.readlink(current)!r}); "
                                     "expected a file or folder inside the output folder")
    # No existing component below the root is a link and `rel` has no `..` or `.` part, so the path resolves to
    # realpath(root)/rel: inside the root by construction, without a realpath per member (10^4 shards: seconds)
    return join(root, rel)
