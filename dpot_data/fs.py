"""fsspec helpers: every path the toolkit reads or writes may be a local path or any fsspec URL (file://, memory://,
s3://, ...). These few functions keep that distinction out of the rest of the code."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterator

import fsspec
from fsspec.core import url_to_fs

CHUNK = 8 << 20


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for "proto://..." paths, False for plain local paths."""
    return "://" in str(path)


def join(base: str | os.PathLike[str], *parts: str) -> str:
    """Join path parts onto a local path or a URL with "/"; parts never start a new root."""
    out = str(base).rstrip("/") if str(base) not in ("/", "") else str(base)
    for part in parts:
        part = str(part).strip("/")
        if part:
            out = f"{out}/{part}" if not out.endswith("/") else f"{out}{part}"
    return out


def filesystem(path: str | os.PathLike[str]) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem serving `path` and the path as that filesystem names it."""
    return url_to_fs(str(path))


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether a file or folder exists at `path`."""
    fs, p = filesystem(path)
    return bool(fs.exists(p))


def read_json(path: str | os.PathLike[str]) -> Any:
    """Parse a JSON file at a path or URL."""
    with fsspec.open(str(path), "r", encoding="utf-8") as f:
        return json.load(f)


def iter_bytes(path: str | os.PathLike[str], chunk: int = CHUNK) -> Iterator[bytes]:
    """Read a file at a path or URL in chunks of `chunk` bytes (never whole in memory)."""
    with fsspec.open(str(path), "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return
            yield block


def sha256_of(path: str | os.PathLike[str]) -> tuple[str, int]:
    """sha256 hex digest and byte size of a file at a path or URL, streamed."""
    digest = hashlib.sha256()
    size = 0
    for block in iter_bytes(path):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def zarr_store(path: str | os.PathLike[str], read_only: bool = True) -> Any:
    """A Zarr v3 store for a local folder or an fsspec URL."""
    import zarr.storage

    if is_url(path):
        proto = str(path).split("://", 1)[0]
        if proto == "file":
            return zarr.storage.LocalStore(str(path).split("://", 1)[1], read_only=read_only)
        return zarr.storage.FsspecStore.from_url(str(path), read_only=read_only)
    return zarr.storage.LocalStore(str(path), read_only=read_only)


def is_local(path: str | os.PathLike[str]) -> bool:
    """Plain paths and file:// URLs are local; every other protocol is remote."""
    return not is_url(path) or str(path).startswith("file://")


def local_path(path: str | os.PathLike[str]) -> str:
    """The local filesystem path of a plain path or file:// URL."""
    text = str(path)
    return text[len("file://"):] if text.startswith("file://") else text


def localize(path: str | os.PathLike[str], cache: str | os.PathLike[str]) -> str:
    """A local path for an input: itself when local, else a streamed copy in `cache` under the same file name
    (readers parse parameters out of file names). A copy of the same size already there is reused."""
    if is_local(path):
        return local_path(path)
    fsys, remote = filesystem(path)
    name = remote.rstrip("/").rsplit("/", 1)[-1]
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    target = os.path.join(os.fspath(cache), digest, name)
    size = fsys.size(remote)
    if os.path.isfile(target) and os.path.getsize(target) == size:
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = target + ".part"
    with fsys.open(remote, "rb") as src, open(tmp, "wb") as dst:
        while block := src.read(CHUNK):
            dst.write(block)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, target)
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
