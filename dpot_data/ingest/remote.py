"""Ingest from and to fsspec URLs (s3://, gs://, memory://, file://, ...) through a local working folder.

HDF5 and MAT readers need seekable local files and the writers need rename and fsync, so a remote job runs as:
inputs copied (streamed) into a local cache → the ordinary local ingest, resumable, into a local folder → the finished
folder uploaded file by file, each under a temporary name then moved, the manifest last. Until the manifest is there,
readers of the URL see no output; an interrupted upload is redone by a re-run, which finds the local output complete.
Replacing an output (--overwrite) uploads the new store and shard folders beside the old ones, under names the old
manifest does not use, and removes the old ones only after the new manifest is in place: the URL holds the old
output, complete, until then.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dpot_data import fs
from dpot_data.errors import InputError
from dpot_data.manifest_io import MANIFEST_NAME
from dpot_format.errors import FormatError
from dpot_format.manifest import read_manifest, write_manifest
from dpot_format.names import OUTPUT_FOLDER, is_temporary


def default_workdir(out: str) -> Path:
    """A stable local working folder for an output URL, so that a re-run finds what an interrupted one left."""
    digest = hashlib.sha256(str(out).encode("utf-8")).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "dpot-work" / digest


@dataclass
class Staged:
    """A job's local side: local input paths, the local output folder, and the remote output URL (None: local)."""

    inputs: list[str]
    out: str
    remote: str | None
    workdir: Path
    input_urls: list[str] = field(default_factory=list)  # as given, aligned with `inputs`
    existing: Any = None  # IngestOutcome of a complete remote output left alone, else None


def prepare(paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], overwrite: bool = False,
            workdir: str | os.PathLike[str] | None = None) -> Staged:
    """Localise the inputs and choose the local output folder of a job whose paths may be URLs."""
    from dpot_data.ingest.publish import existing_outcome

    out = str(out)
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(out).decode("utf-8", "backslashreplace")
        raise InputError(shown, "expected an output folder name that is valid UTF-8 (it is recorded in the manifest "
                                "and printed); rename it") from None
    work = Path(workdir) if workdir is not None else default_workdir(out)
    staged = Staged([], fs.local_path(out), None, work, [str(p) for p in paths])
    staged.existing = existing_outcome(out, overwrite)
    if staged.existing is not None:  # complete: read nothing
        return staged
    if not fs.is_local(out):
        staged.remote, staged.out = out, str(work / "out")
    staged.inputs = [fs.localize(p, work / "inputs") for p in paths]
    return staged


def publish(staged: Staged, outcome: Any) -> Any:
    """After the local ingest: name remote inputs by URL, upload a remote output (manifest last), clean up."""
    from dataclasses import replace

    local_manifest = Path(staged.out) / MANIFEST_NAME
    if any(not fs.is_local(u) for u in staged.input_urls) and outcome.written:
        _record_input_urls(local_manifest, staged.input_urls, staged.inputs)
    if staged.remote is None:
        _cleanup(staged.workdir)
        if any(not fs.is_local(u) for u in staged.input_urls) and outcome.written:
            return replace(outcome, manifest=json.loads(local_manifest.read_text()))
        return outcome
    out = staged.remote
    manifest = upload(Path(staged.out), out)
    _cleanup(staged.workdir)
    return replace(outcome, manifest=manifest, path=fs.join(out, MANIFEST_NAME),
                   notes=list(outcome.notes) + [f"uploaded to {out}"])


def upload(local: Path, url: str) -> dict[str, Any]:
    """Upload the complete local output `local` to `url`, beside the output already there: its store and shard
    folders under names the current manifest at `url` does not use, then the manifest (the commit point: one move),
    then the folders no manifest names any more are removed. Returns the manifest written."""
    from dpot_data.ingest.publish import free_name, referenced_tops, relocated

    fsys, base = fs.filesystem(url)
    base = base.rstrip("/")
    current = _remote_manifest(url)
    _remove_remote_leftovers(fsys, base, referenced_tops(current))  # an interrupted upload's folders and temporaries
    manifest = json.loads((local / MANIFEST_NAME).read_text(encoding="utf-8"))
    taken = set(referenced_tops(current))
    names: dict[str, str] = {}
    for top in sorted(referenced_tops(manifest)):
        names[top] = free_name(*(("data", ".zarr") if top.endswith(".zarr") else ("shards", "")), taken)
        taken.add(names[top])
        fs.upload_tree(local / top, fs.join(url, names[top]))
    manifest = {**manifest, "datasets": [relocated(e, names) for e in manifest["datasets"]]}
    write_manifest(url, manifest)  # validated, under a temporary name, then moved into place
    _remove_remote_leftovers(fsys, base, referenced_tops(manifest))
    return manifest


def _remote_manifest(url: str) -> dict[str, Any] | None:
    """The manifest at an output URL (None when there is none); InputError when one is there but broken."""
    path = fs.join(url, MANIFEST_NAME)
    if not fs.exists(path):
        return None
    try:
        return read_manifest(path)
    except FormatError as exc:
        raise InputError(exc.where or path, exc.expected) from None


def _remove_remote_leftovers(fsys: Any, base: str, used: set[str]) -> None:
    """Remove, at the top of a remote output, store and shard folders that `used` does not name and temporary files."""
    try:
        children = fsys.ls(base, detail=False)
    except FileNotFoundError:
        return
    for child in children:
        name = str(child).rstrip("/").rsplit("/", 1)[-1]
        if (OUTPUT_FOLDER.match(name) and name not in used) or is_temporary(name):
            fsys.rm(str(child), recursive=True)


def _record_input_urls(manifest_path: Path, urls: Sequence[str | os.PathLike[str]], local: Sequence[str]) -> None:
    """Name remote inputs in the manifest by their URL instead of the local cache copy (same bytes and sha256)."""
    mapping = {str(Path(p).resolve()): str(u) for u, p in zip(urls, local) if not fs.is_local(u)}
    doc = json.loads(manifest_path.read_text(encoding="utf-8"))
    for entry in doc["datasets"]:
        for item in entry.get("inputs", []):
            item["path"] = mapping.get(item["path"], item["path"])
    from dpot_data.manifest_io import write

    write(manifest_path.parent, doc)


def _cleanup(work: Path) -> None:
    """Remove the local working folder (input copies, local output) once the output is in place."""
    shutil.rmtree(work, ignore_errors=True)
