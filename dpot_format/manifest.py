"""The manifest: its packaged JSON Schema plus the rules a schema cannot say (counts that must add up, paths that
must stay inside the folder, sizes within limits), and the one way to build, write and read it."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shlex
import sys
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

import jsonschema

import dpot_format
from dpot_format.errors import FormatError
from dpot_format.io import atomic_write, file_size, is_local, join, local_path, read_bounded
from dpot_format.limits import LIMITS, Limits, limit_error
from dpot_format.names import MANIFEST_NAME, SCHEMA_VERSION, SHARD_FILE, SPLITS
from dpot_format.paths import path_error

GRID_DIMS = (["y", "x"], ["z", "y", "x"])
_MAX_MESSAGE = 300  # characters of one schema message (they quote the offending value)


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The packaged JSON Schema (dpot_format/schema/manifest.schema.json)."""
    text = resources.files("dpot_format").joinpath("schema/manifest.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def _short(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "..."


def schema_errors(manifest: Any) -> list[str]:
    """Every JSON Schema violation as "<json path>: <message>" (empty when the schema is met)."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path)))
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {_short(e.message)}" for e in errors]


def _limit_errors(where: str, entry: dict[str, Any], limits: Limits) -> list[str]:
    """The first limit a dataset entry exceeds (one line at most: a huge grid is one problem, not three)."""
    shape = [int(s) for s in entry["grid"]["shape"]]
    cells = 1
    for s in shape:
        cells *= s
    checks = [(f"{where}/grid/shape", "cells along an axis", max(shape), limits.max_grid_side),
              (f"{where}/grid/shape", "cells per frame", cells, limits.max_grid_cells),
              (f"{where}/channels", "channels", len(entry["channels"]), limits.max_channels),
              (f"{where}/frames", "frames per trajectory", int(entry["frames"]), limits.max_frames),
              (f"{where}/trajectories", "trajectories", int(entry["trajectories"]), limits.max_trajectories),
              (f"{where}/grid/shape", "bytes of one trajectory's fields",
               int(entry["frames"]) * len(entry["channels"]) * cells * 4, limits.max_sample_bytes)]
    for key, what, value, limit in checks:
        line = limit_error(key, what, value, limit)
        if line is not None:
            return [line]
    return []


def limit_problems(where: str, entry: dict[str, Any], limits: Limits = LIMITS) -> list[str]:
    """The first of the format's limits a dataset entry (name, grid, channels, frames, trajectories) exceeds, or
    that it falls short of (an empty grid or no frame), as one "<where>/<key>: <what>" line; empty when within."""
    shape = [int(s) for s in entry["grid"]["shape"]]
    if not shape or min(shape) < 1:
        return [f"{where}/grid/shape: expected at least one cell along every axis, got {shape}"]
    if int(entry["frames"]) < 1:
        return [f"{where}/frames: expected at least one frame per trajectory, got {int(entry['frames'])}"]
    return _limit_errors(where, entry, limits)


def _dataset_errors(i: int, entry: dict[str, Any], limits: Limits) -> list[str]:
    """The rules of one dataset entry that the schema cannot express."""
    at = f"datasets/{i}"
    out: list[str] = []
    grid = entry["grid"]
    if list(grid["dims"]) not in GRID_DIMS:
        out.append(f"{at}/grid/dims: {grid['dims']} is not one of {GRID_DIMS}")
    if not len(grid["dims"]) == len(grid["shape"]) == len(grid["native_shape"]):
        out.append(f"{at}/grid: dims, shape and native_shape have {len(grid['dims'])}, {len(grid['shape'])} and "
                   f"{len(grid['native_shape'])} entries, expected one per axis")
    out += _limit_errors(at, entry, limits)
    if not math.isfinite(float(entry["fill_value"])):
        out.append(f"{at}/fill_value: {entry['fill_value']} is not a finite number, expected the value of padded "
                   "channels")
    if len(entry["channels"]) != len(entry["channel_valid"]):
        out.append(f"{at}/channel_valid: {len(entry['channel_valid'])} entries, expected one per channel "
                   f"({len(entry['channels'])})")
    counts = entry["splits"]["counts"]
    for split in counts:
        if split not in SPLITS:
            out.append(f"{at}/splits/counts: unknown split {split!r}, expected one of {list(SPLITS)}")
    if sum(counts.values()) != entry["trajectories"]:
        out.append(f"{at}/splits/counts: add up to {sum(counts.values())}, expected the {entry['trajectories']} "
                   "trajectories")
    for split, ids in (entry["splits"].get("ids") or {}).items():
        if len(ids) != counts.get(split, 0):
            out.append(f"{at}/splits/ids/{split}: {len(ids)} ids, expected {counts.get(split, 0)} (the split's count)")
    out += _shard_errors(at, entry, limits)
    ref = entry.get("shard_index")
    if ref is not None:
        problem = path_error(ref["path"])
        if problem is not None:
            out.append(f"{at}/shard_index/path: {ref['path']!r} {problem}")
        elif not entry["shards"]:
            out.append(f"{at}/shard_index: an index of no shards, expected none without shards")
        elif ref["path"] in {s["path"] for s in entry["shards"]}:
            out.append(f"{at}/shard_index/path: {ref['path']!r} is a shard's path, expected the index file's own")
    z = entry["zarr"]
    if z is not None:
        for key in ("path", "group"):
            problem = path_error(z[key])
            if problem is not None:
                out.append(f"{at}/zarr/{key}: {z[key]!r} {problem}")
        for name in ("fields", "mask"):
            if name not in z["arrays"]:
                out.append(f"{at}/zarr/arrays: no digest of {name!r}, expected one for fields and mask")
    return out


def _shard_errors(at: str, entry: dict[str, Any], limits: Limits) -> list[str]:
    """The rules of a dataset entry's shard list: paths, file names, splits, sizes, and samples per split."""
    out: list[str] = []
    counts = entry["splits"]["counts"]
    seen: set[str] = set()
    per_split = dict.fromkeys(SPLITS, 0)
    for j, shard in enumerate(entry["shards"]):
        where = f"{at}/shards/{j}"
        problem = path_error(shard["path"])
        if problem is not None:
            out.append(f"{where}/path: {shard['path']!r} {problem}")
        elif shard["path"] in seen:
            out.append(f"{where}/path: {shard['path']!r} is listed twice")
        seen.add(shard["path"])
        name = str(shard["path"]).rsplit("/", 1)[-1]
        match = SHARD_FILE.match(name)
        if shard["split"] not in SPLITS:
            out.append(f"{where}/split: unknown split {shard['split']!r}, expected one of {list(SPLITS)}")
        else:
            per_split[shard["split"]] += shard["samples"]
            if match is None or match.group(1) != shard["split"]:
                out.append(f"{where}/path: file name {name!r}, expected {shard['split']}-NNNNNN.tar")
        line = limit_error(f"{where}/samples", "samples in one shard", 3 * int(shard["samples"]),
                           limits.max_members_per_shard)
        if line is not None:
            out.append(line.replace("samples in one shard", "members (3 per sample) in one shard"))
    if entry["shards"]:
        for split, n in per_split.items():
            if n != counts.get(split, 0):
                out.append(f"{at}/shards: hold {n} {split!r} samples, expected the split's count "
                           f"{counts.get(split, 0)}")
    return out


def validation_errors(manifest: Any, limits: Limits = LIMITS) -> list[str]:
    """Every violation as "<json path>: <message>": the JSON Schema first, then (only when it is met) the semantic
    rules: channel counts, split counts adding up, shards' samples per split, listed paths, limits."""
    errors = schema_errors(manifest)
    if errors:
        return errors
    out: list[str] = []
    names: dict[str, int] = {}
    for i, entry in enumerate(manifest["datasets"]):
        if entry["name"] in names:
            out.append(f"datasets/{i}/name: {entry['name']!r} is also dataset {names[entry['name']]}; "
                       "expected unique names")
        names.setdefault(entry["name"], i)
        out += _dataset_errors(i, entry, limits)
    return out


def validate(manifest: Any, limits: Limits = LIMITS) -> None:
    """FormatError naming the first violation (and how many more) when the manifest breaks the format."""
    errors = validation_errors(manifest, limits)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise FormatError("manifest", f"expected a manifest following schema version {SCHEMA_VERSION}: "
                                      f"{errors[0]}{more}")


def command_line(argv: Sequence[str] | None = None) -> str:
    """The exact command line as a shell-quoted string (program name reduced to its base name)."""
    args = list(sys.argv if argv is None else argv)
    if args:
        args[0] = os.path.basename(args[0])
    return shlex.join(args)


def build(datasets: list[dict[str, Any]], command: str | None = None, created: str | None = None,
          tool_version: str | None = None) -> dict[str, Any]:
    """A complete manifest around the given dataset entries, validated (FormatError when it breaks the format)."""
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "dpot", "version": tool_version or dpot_format.__version__},
        "created": created or _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z"),
        "command": command if command is not None else command_line(),
        "datasets": datasets,
    }
    validate(manifest)
    return manifest


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """The bytes written for a manifest: indented JSON in key order as given, one trailing newline."""
    return (json.dumps(manifest, indent=2, sort_keys=False) + "\n").encode("utf-8")


def write_manifest(folder: str | os.PathLike[str], manifest: dict[str, Any]) -> str:
    """Validate and atomically write FOLDER/manifest.json (path or URL); returns where it was written."""
    validate(manifest)
    return atomic_write(join(os.fspath(folder), MANIFEST_NAME), manifest_bytes(manifest))


def manifest_path(folder_or_file: str | os.PathLike[str]) -> str:
    """The manifest of an output: the argument itself when it names a .json file, else FOLDER/manifest.json."""
    text = os.fspath(folder_or_file)
    return text if text.endswith(".json") else join(text, MANIFEST_NAME)


def refuse_outside_link(path: str) -> None:
    """A local manifest that is a symbolic link to a file outside its folder is refused (FormatError), like every
    path a manifest names: an output folder holds its own files."""
    if not is_local(path):
        return
    local = local_path(path)
    if not os.path.islink(local):
        return
    folder = os.path.realpath(os.path.dirname(os.path.abspath(local)))
    real = os.path.realpath(local)
    if os.path.isfile(real) and os.path.commonpath([folder, real]) != folder:  # others: load_json names their kind
        raise FormatError(path, f"is a symbolic link to {real}, outside the output folder {folder}; expected the "
                                "manifest file itself")


def load_json(path: str, limits: Limits = LIMITS) -> Any:
    """The parsed JSON of a manifest file, not yet validated; one-line FormatError naming the path when it is
    missing, a folder or other non-regular file, over the size limit, empty, not UTF-8 or not JSON."""
    try:
        size = file_size(path)
    except FormatError as exc:
        if exc.expected == "not found":
            raise FormatError(path, "expected a manifest.json written by `dpot-data ingest` (none found)") from None
        raise FormatError(path, f"{exc.expected.replace('a regular file', 'the manifest file')}") from None
    if size > limits.max_manifest_bytes:
        raise FormatError(path, f"{size} bytes, more than the limit of {limits.max_manifest_bytes} for a manifest")
    data = read_bounded(path, limits.max_manifest_bytes)
    if not data.strip():
        raise FormatError(path, "is empty, expected a JSON manifest")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(path, f"is not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 1]!r}), "
                                "expected a JSON manifest") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(path, f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}), "
                                "expected a JSON manifest") from None
    except RecursionError:
        raise FormatError(path, "is nested too deeply, expected a JSON manifest") from None


def read_manifest(folder_or_file: str | os.PathLike[str], limits: Limits = LIMITS) -> dict[str, Any]:
    """Read and validate a manifest (an output folder, the file, or a URL of either); one-line FormatError naming the
    file when it is missing, unreadable, too large, not UTF-8 JSON, or breaks the schema or the format's rules."""
    path = manifest_path(folder_or_file)
    refuse_outside_link(path)
    doc = load_json(path, limits)
    errors = validation_errors(doc, limits)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise FormatError(path, f"expected a manifest following schema version {SCHEMA_VERSION}: {errors[0]}{more}")
    return doc
