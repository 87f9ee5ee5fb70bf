"""fsspec helpers: every path the toolkit reads or writes may be a local path or any fsspec URL (file://, memory://,
s3://, ...). These few functions (copying inputs in, uploading an output) keep that distinction out of the rest of the
code; the path and Zarr store helpers are dpot_format.io's, re-exported here for the ingest side."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from dpot_format.io import CHUNK, atomic_path, filesystem, is_local, join, local_path, read_bounded, zarr_store  # noqa: F401
from dpot_format.limits import LIMITS


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether a file or folder exists at `path`."""
    fs, p = filesystem(path)
    return bool(fs.exists(p))


def read_json(path: str | os.PathLike[str], limit: int = LIMITS.max_manifest_bytes) -> Any:
    """Parse a JSON file at a path or URL (at most `limit` bytes; a non-regular local file is refused)."""
    return json.loads(read_bounded(path, limit).decode("utf-8"))


def localize(path: str | os.PathLike[str], cache: str | os.PathLike[str]) -> str:
    """A local path for an input: itself when local, else a streamed copy in `cache` under the same file name
    (readers parse parameters out of file names). A copy of the same size already there is reused; a folder (a Zarr
    store) is copied whole."""
    if is_local(path):
        return local_path(path)
    fsys, remote = filesystem(path)
    name = remote.rstrip("/").rsplit("/", 1)[-1]
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    target = os.path.join(os.fspath(cache), digest, name)
    if fsys.isdir(remote):  # a folder input (a Zarr store): copied whole, once
        if not os.path.isdir(target):
            fsys.get(remote.rstrip("/") + "/", target + ".part/", recursive=True)
            os.replace(target + ".part", target)
        return target
    size = fsys.size(remote)
    if os.path.isfile(target) and os.path.getsize(target) == size:
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with atomic_path(target) as tmp, fsys.open(remote, "rb") as src, open(tmp, "wb") as dst:
        while block := src.read(CHUNK):
            dst.write(block)
    return target


def upload_tree(local_root: str | os.PathLike[str], url: str, last: str = "manifest.json") -> list[str]:
    """Copy a finished local output folder to `url`, file by file under a temporary name then moved into place,
    the file `last` (the manifest) after every other one; returns the relative paths copied."""
    fsys, base = filesystem(url)
    root = os.fspath(local_root)
    rels = []
    for folder, _dirs, files in os.walk(root):
        for name in files:
            rels.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    rels.sort(key=lambda r: (r == last, r))
    for rel in rels:
        target = f"{base.rstrip('/')}/{rel}"
        parent = target.rsplit("/", 1)[0]
        fsys.makedirs(parent, exist_ok=True)
        tmp = f"{parent}/.{target.rsplit('/', 1)[1]}.part"
        with open(os.path.join(root, rel), "rb") as src, fsys.open(tmp, "wb") as dst:
            while block := src.read(CHUNK):
                dst.write(block)
        fsys.mv(tmp, target)
    return rels
