"""Names the format fixes: schema version, manifest and shard file names, sample keys, tar member names, and the
temporary names the toolkit and Zarr leave behind while writing (so a validator can tell leftovers from data)."""

from __future__ import annotations

import re

SCHEMA_VERSION = 2  # 2: Zarr chunks blosc-lz4 with byte shuffle (was zstd level 3), `zarr.codec` recorded
MANIFEST_NAME = "manifest.json"
SPLITS = ("train", "valid", "test")
SHARDS_FOLDER = "shards"
ZARR_PATH = "data.zarr"

DATASET_NAME = re.compile(r"^[a-z0-9_-]+$")
"""A dataset name: lower-case letters, digits, `_` and `-` (it names a folder and a Zarr group)."""
MAX_DATASET_NAME = 128
"""Characters of a dataset name an ingest writes: it names folders (`shards/<name>/`, `.staging-<name>`), whose names a
file system bounds (255 bytes on most)."""

KEY_DIGITS = 7
MEMBER_KINDS = ("fields.npy", "mask.npy", "meta.json")
MEMBER_NAME = re.compile(r"^(s\d{7})\.(fields\.npy|mask\.npy|meta\.json)$")
"""A shard member: `s<7 digits>.fields.npy`, `.mask.npy` or `.meta.json`, nothing else (no folders, no dots)."""

SHARD_FILE = re.compile(r"^(train|valid|test)-(\d{6})\.tar$")
"""A shard file's own name: `<split>-NNNNNN.tar` (it lives in `shards/<dataset>/`)."""

_TEMPORARY = (
    re.compile(r"^\..+\.tmp.*$"),  # shard writer `.<name>.tmp`, manifest/checkpoint `.<name>.tmp-<pid>`
    re.compile(r"^.+\.partial$"),  # zarr LocalStore: `<stem>.<uuid>.partial` before its rename
    re.compile(r"^.+\.part$"),  # upload to a URL `.<name>.part`, localised input copies `<name>.part`
    re.compile(r"^\.staging-.+$"),  # ingest staging folder `.staging-<dataset>` (journal, lock, staged files)
)


def manifest_name(name: str) -> str:
    """Map a catalog name to a manifest dataset name: "." becomes "p" (0.01 -> 0p01); refuses anything else odd."""
    out = name.lower().replace(".", "p")
    if not DATASET_NAME.match(out):
        raise ValueError(f"dataset name {name!r} cannot be written as a manifest name ([a-z0-9_-]+)")
    return out


def sample_key(index: int) -> str:
    """WebDataset key of trajectory `index` of a dataset: "s" + the index zero-padded to 7 digits (no dots)."""
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < 10**KEY_DIGITS:
        raise ValueError(f"trajectory index must be an integer in [0, {10**KEY_DIGITS}), got {index!r}")
    return f"s{index:0{KEY_DIGITS}d}"


def key_index(key: str) -> int:
    """The trajectory index a sample key names (`s0000042` -> 42); ValueError for anything else."""
    if not re.fullmatch(r"s\d{7}", key):
        raise ValueError(f"expected a sample key s<7 digits>, got {key!r}")
    return int(key[1:])


def parse_member(name: str) -> tuple[str, str] | None:
    """(key, kind) of a shard member name that follows the rule, else None."""
    match = MEMBER_NAME.match(name)
    return (match.group(1), match.group(2)) if match else None


def shard_file(split: str, number: int) -> str:
    """`<split>-NNNNNN.tar`: the name of shard `number` of a split."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return f"{split}-{number:06d}.tar"


def is_temporary(name: str) -> bool:
    """Whether a file or folder name (one path component) is a temporary name a writer uses before its rename:
    `.<name>.tmp*`, `*.partial`, `*.part`, `.staging-*`."""
    return any(p.match(name) for p in _TEMPORARY)
