"""The manifest model: build the top-level object, validate it against the packaged JSON Schema, read and write it."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import sys
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import jsonschema

import dpot_data
from dpot_data.errors import InputError

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The packaged JSON Schema (dpot_data/schema/manifest.schema.json)."""
    text = resources.files("dpot_data").joinpath("schema/manifest.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def validate(manifest: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when the manifest does not follow the schema."""
    jsonschema.Draft202012Validator(schema()).validate(manifest)


def validation_errors(manifest: dict[str, Any]) -> list[str]:
    """Every schema violation as "<json path>: <message>" (empty when valid)."""
    validator = jsonschema.Draft202012Validator(schema())
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
            for e in sorted(validator.iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path)))]


def command_line(argv: Sequence[str] | None = None) -> str:
    """The exact command line as a shell-quoted string (program name reduced to its base name)."""
    args = list(sys.argv if argv is None else argv)
    if args:
        args[0] = os.path.basename(args[0])
    return shlex.join(args)


def build(datasets: list[dict[str, Any]], command: str | None = None, created: str | None = None) -> dict[str, Any]:
    """A complete manifest around the given dataset entries, validated."""
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "dpot", "version": dpot_data.__version__},
        "created": created or _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "command": command if command is not None else command_line(),
        "datasets": datasets,
    }
    validate(manifest)
    return manifest


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write bytes under a temporary name in the same folder, fsync, then rename onto `path` (and fsync the folder)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    """fsync a folder so that renames inside it are durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write(folder: str | Path, manifest: dict[str, Any]) -> Path:
    """Validate and atomically write FOLDER/manifest.json; returns its path."""
    validate(manifest)
    path = Path(folder) / MANIFEST_NAME
    write_atomic(path, (json.dumps(manifest, indent=2, sort_keys=False) + "\n").encode("utf-8"))
    return path


def read(folder_or_file: str | Path) -> dict[str, Any]:
    """Read and validate a manifest (a folder holding manifest.json, or the file); InputError when absent or invalid."""
    path = Path(folder_or_file)
    if path.is_dir():
        path = path / MANIFEST_NAME
    if not path.is_file():
        raise InputError(path, "expected a manifest.json written by `dpot-data ingest` (none found)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, f"expected a JSON manifest, could not parse it: {exc}") from None
    errors = validation_errors(manifest)
    if errors:
        raise InputError(path, f"expected a manifest following schema version {SCHEMA_VERSION}: {errors[0]}")
    return manifest


def find_dataset(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    """The dataset entry called `name`; KeyError listing the names present otherwise."""
    for entry in manifest["datasets"]:
        if entry["name"] == name:
            return entry
    raise KeyError(f"dataset {name!r} not in manifest (has: {', '.join(d['name'] for d in manifest['datasets'])})")
