"""Ingest from and to fsspec URLs (s3://, gs://, memory://, file://, ...) through a local working folder.

HDF5 and MAT readers need seekable local files and the writers need rename and fsync, so a remote job runs as:
inputs copied (streamed) into a local cache → the ordinary local ingest, resumable, into a local folder → the finished
folder uploaded file by file, each under a temporary name then moved, the manifest last. Until the manifest is there,
readers of the URL see no output; an interrupted upload is redone by a re-run, which finds the local output complete.
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
from dpot_data.manifest import MANIFEST_NAME


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
    filesystem, base = fs.filesystem(out)
    base = base.rstrip("/")
    if filesystem.exists(f"{base}/{MANIFEST_NAME}"):
        filesystem.rm(f"{base}/{MANIFEST_NAME}")  # never a manifest over a half-replaced output
    for rel in ("data.zarr", "shards"):
        if filesystem.exists(f"{base}/{rel}"):
            filesystem.rm(f"{base}/{rel}", recursive=True)
    fs.upload_tree(staged.out, out, last=MANIFEST_NAME)
    manifest_url = fs.join(out, MANIFEST_NAME)
    manifest = fs.read_json(manifest_url)
    _cleanup(staged.workdir)
    return replace(outcome, manifest=manifest, path=manifest_url, notes=list(outcome.notes) + [f"uploaded to {out}"])


def _record_input_urls(manifest_path: Path, urls: Sequence[str | os.PathLike[str]], local: Sequence[str]) -> None:
    """Name remote inputs in the manifest by their URL instead of the local cache copy (same bytes and sha256)."""
    mapping = {str(Path(p).resolve()): str(u) for u, p in zip(urls, local) if not fs.is_local(u)}
    doc = json.loads(manifest_path.read_text(encoding="utf-8"))
    for entry in doc["datasets"]:
        for item in entry.get("inputs", []):
            item["path"] = mapping.get(item["path"], item["path"])
    from dpot_data.manifest import write

    write(manifest_path.parent, doc)


def _cleanup(work: Path) -> None:
    """Remove the local working folder (input copies, local output) once the output is in place."""
    shutil.rmtree(work, ignore_errors=True)
