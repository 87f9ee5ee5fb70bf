"""Re-exports of dpot_format's manifest model for the ingest side (build with this package's version, write, and
read with InputError for the CLI's exit code 2). The rules themselves live in dpot_format.manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dpot_data
from dpot_data.errors import InputError
from dpot_format import manifest as _fmt
from dpot_format.errors import FormatError
from dpot_format.io import fsync_dir  # noqa: F401 - re-export
from dpot_format.manifest import command_line  # noqa: F401 - re-export
from dpot_format.names import MANIFEST_NAME  # noqa: F401 - re-export


def build(datasets: list[dict[str, Any]], command: str | None = None, created: str | None = None) -> dict[str, Any]:
    """A complete manifest around the given dataset entries, validated (dpot_format.manifest.build)."""
    return _fmt.build(datasets, command, created, tool_version=dpot_data.__version__)


def write(folder: str | Path, manifest: dict[str, Any]) -> Path:
    """Validate and atomically write FOLDER/manifest.json; returns its path."""
    return Path(_fmt.write_manifest(folder, manifest))


def read(folder_or_file: str | Path) -> dict[str, Any]:
    """Read and validate a manifest (a folder holding manifest.json, or the file); InputError when absent or invalid."""
    try:
        return _fmt.read_manifest(str(folder_or_file))
    except FormatError as exc:
        raise InputError(exc.where or str(folder_or_file), exc.expected) from None
