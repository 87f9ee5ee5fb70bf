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
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from dpot_data import fs
from dpot_data.manifest import MANIFEST_NAME


def default_workdir(out: str) -> Path:
    """A stable local working folder for an output URL, so that a re-run finds what an interrupted one left."""
    digest = hashlib.sha256(str(out).encode("utf-8")).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "dpot-work" / digest


def run_ingest_anywhere(source: str, paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str],
                        options: Any = None, workdir: str | os.PathLike[str] | None = None,
                        **reader_options: Any) -> Any:
    """`ingest.run_ingest` for local paths or URLs on either side; returns its IngestOutcome (path: the manifest)."""
    from dpot_data.ingest import IngestOptions, IngestOutcome, run_ingest

    opts = options or IngestOptions()
    out = str(out)
    remote_inputs = [str(p) for p in paths if not fs.is_local(p)]
    work = Path(workdir) if workdir is not None else default_workdir(out)
    local_inputs = [fs.localize(p, work / "inputs") for p in paths]
    if fs.is_local(out):
        outcome = run_ingest(source, local_inputs, fs.local_path(out), opts, **reader_options)
        if remote_inputs and outcome.written:
            _record_input_urls(Path(outcome.path), paths, local_inputs)
        _cleanup(work, keep_inputs=False)
        return outcome

    manifest_url = fs.join(out, MANIFEST_NAME)
    if fs.exists(manifest_url) and not opts.overwrite:
        return IngestOutcome(fs.read_json(manifest_url), manifest_url, False,
                             [f"{out}: already holds a complete manifest; left alone (use --overwrite to replace it)"])
    local_out = work / "out"
    outcome = run_ingest(source, local_inputs, local_out, opts, **reader_options)
    if remote_inputs:
        _record_input_urls(local_out / MANIFEST_NAME, paths, local_inputs)
    filesystem, base = fs.filesystem(out)
    if filesystem.exists(f"{base.rstrip('/')}/{MANIFEST_NAME}"):
        filesystem.rm(f"{base.rstrip('/')}/{MANIFEST_NAME}")  # never a manifest over a half-replaced output
    for rel in ("data.zarr", "shards"):
        if filesystem.exists(f"{base.rstrip('/')}/{rel}"):
            filesystem.rm(f"{base.rstrip('/')}/{rel}", recursive=True)
    fs.upload_tree(local_out, out, last=MANIFEST_NAME)
    manifest = fs.read_json(manifest_url)
    _cleanup(work, keep_inputs=False)
    return IngestOutcome(manifest, manifest_url, True, outcome.notes + [f"uploaded to {out}"])


def _record_input_urls(manifest_path: Path, urls: Sequence[str | os.PathLike[str]], local: Sequence[str]) -> None:
    """Name remote inputs in the manifest by their URL instead of the local cache copy (same bytes and sha256)."""
    mapping = {str(Path(p).resolve()): str(u) for u, p in zip(urls, local) if not fs.is_local(u)}
    doc = json.loads(manifest_path.read_text(encoding="utf-8"))
    for entry in doc["datasets"]:
        for item in entry.get("inputs", []):
            item["path"] = mapping.get(item["path"], item["path"])
    from dpot_data.manifest import write

    write(manifest_path.parent, doc)


def _cleanup(work: Path, keep_inputs: bool) -> None:
    """Remove the local working folder once the output is in place."""
    if keep_inputs:
        shutil.rmtree(work / "out", ignore_errors=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
