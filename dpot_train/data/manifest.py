"""Read and validate dpot shard manifests (docs/format.md) and check shards before any training step."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any

import fsspec
import jsonschema

from dpot_data.manifest import validate as validate_manifest


class DataError(ValueError):
    """Bad training input: names the manifest, dataset or shard and what was expected."""


@dataclass(frozen=True)
class Shard:
    """One WebDataset tar shard as listed in a manifest (url resolved against the manifest's folder)."""

    url: str
    split: str
    sha256: str
    bytes: int
    samples: int


@dataclass
class DatasetInfo:
    """One dataset entry of a manifest, with the fields the trainer needs."""

    name: str
    manifest: str
    root: str
    channels: list[str]
    channel_valid: list[bool]
    shape: tuple[int, ...]
    dims: list[str]
    frames: int
    shards: list[Shard]
    zarr_url: str | None
    zarr_group: str | None
    split_counts: dict[str, int]
    entry: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def convention(self) -> dict[str, Any]:
        """The manifest's convention entry; a manifest written before conventions existed is canonical, "xy"."""
        return self.entry.get("convention") or {"name": "canonical", "model_layout": "xy", "deviations": {}}

    @property
    def model_layout(self) -> str:
        """"xy": the model's (H, W) is the stored (x, y); "yx": the stored (y, x) (docs/conventions.md)."""
        return str(self.convention.get("model_layout", "xy"))

    @property
    def pred_channels(self) -> int:
        """Channels the dataset's evaluation scores (the reference's pred_channels; else its native channels)."""
        return int(self.convention.get("pred_channels", sum(self.channel_valid)))

    def shards_of(self, split: str) -> list[Shard]:
        """Shards of one split, in manifest order."""
        return [s for s in self.shards if s.split == split]


def _join(root: str, rel: str) -> str:
    return posixpath.join(root.rstrip("/"), rel)


def manifest_url(path: str) -> str:
    """Accept a folder holding manifest.json or the manifest file itself."""
    p = str(path)
    return p if p.endswith(".json") else _join(p, "manifest.json")


def read_manifest(path: str) -> list[DatasetInfo]:
    """Load one manifest, validate it against the packaged JSON Schema, return its datasets."""
    url = manifest_url(path)
    fs, fpath = fsspec.core.url_to_fs(url)
    if not fs.exists(fpath):
        raise DataError(f"manifest not found: {url} (pass the folder written by `dpot-data ingest`)")
    with fs.open(fpath, "rb") as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise DataError(f"{url}: not valid JSON: {e}") from e
    try:
        validate_manifest(doc)
    except jsonschema.ValidationError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        raise DataError(f"{url}: does not follow the manifest schema at {where}: {e.message}") from e
    root = posixpath.dirname(url)
    out = []
    for d in doc["datasets"]:
        if len(d["channels"]) != len(d["channel_valid"]):
            raise DataError(f"{url}: dataset {d['name']!r} has {len(d['channels'])} channels but "
                            f"{len(d['channel_valid'])} channel_valid entries")
        z = d.get("zarr")
        out.append(DatasetInfo(
            name=d["name"], manifest=url, root=root, channels=list(d["channels"]),
            channel_valid=[bool(v) for v in d["channel_valid"]], shape=tuple(d["grid"]["shape"]),
            dims=list(d["grid"]["dims"]), frames=int(d["frames"]),
            shards=[Shard(_join(root, s["path"]), s["split"], s["sha256"], int(s["bytes"]), int(s["samples"]))
                    for s in d["shards"]],
            zarr_url=_join(root, z["path"]) if z else None, zarr_group=z["group"] if z else None,
            split_counts=dict(d["splits"]["counts"]), entry=d,
        ))
    return out


def expand_outputs(path: str) -> list[str]:
    """An ingest output as given, or, for a local folder without manifest.json (an `ingest corpus` folder), every
    sub-folder that holds one, sorted."""
    p = str(path)
    if "://" in p or p.endswith(".json") or os.path.exists(os.path.join(p, "manifest.json")):
        return [p]
    subs = sorted(os.path.dirname(m) for m in glob.glob(os.path.join(glob.escape(p), "*", "manifest.json")))
    return subs or [p]


def read_manifests(paths: list[str]) -> list[DatasetInfo]:
    """Load several manifests; dataset names must be unique across them."""
    if not paths:
        raise DataError("no manifest given: pass --manifest DIR (a folder written by `dpot-data ingest`)")
    seen: dict[str, str] = {}
    out: list[DatasetInfo] = []
    for p in [m for path in paths for m in expand_outputs(path)]:
        for ds in read_manifest(p):
            if ds.name in seen:
                raise DataError(f"dataset {ds.name!r} appears in two manifests: {seen[ds.name]} and {ds.manifest}")
            seen[ds.name] = ds.manifest
            out.append(ds)
    return out


def sha256_of(url: str, chunk: int = 1 << 22) -> str:
    """Streaming sha256 of a file (local path or fsspec URL)."""
    h = hashlib.sha256()
    with fsspec.open(url, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_shards(datasets: list[DatasetInfo], split: str, backend: str = "webdataset",
                  checksums: bool = True) -> None:
    """Check that every shard of `split` exists with its recorded size (and sha256 unless disabled)."""
    for ds in datasets:
        if backend == "zarr":
            if ds.zarr_url is None:
                raise DataError(f"{ds.manifest}: dataset {ds.name!r} has no Zarr store (zarr: null); "
                                "use the webdataset backend")
            fs, p = fsspec.core.url_to_fs(ds.zarr_url)
            if not fs.exists(p):
                raise DataError(f"{ds.manifest}: dataset {ds.name!r}: Zarr store missing: {ds.zarr_url}")
            continue
        shards = ds.shards_of(split)
        if not shards:
            raise DataError(f"{ds.manifest}: dataset {ds.name!r} has no {split!r} shards "
                            f"(splits: {ds.split_counts})")
        for s in shards:
            fs, p = fsspec.core.url_to_fs(s.url)
            if not fs.exists(p):
                raise DataError(f"{ds.manifest}: dataset {ds.name!r}: shard missing: {s.url}")
            size = fs.size(p)
            if size != s.bytes:
                raise DataError(f"{ds.manifest}: dataset {ds.name!r}: shard {s.url} has {size} bytes, "
                                f"the manifest says {s.bytes}")
            if checksums:
                got = sha256_of(s.url)
                if got != s.sha256:
                    raise DataError(f"{ds.manifest}: dataset {ds.name!r}: checksum mismatch for shard {s.url}: "
                                    f"sha256 {got}, the manifest says {s.sha256} (re-ingest, or pass "
                                    "--no-verify-checksums to skip this check)")


def check_compatible(datasets: list[DatasetInfo], t_in: int, t_out: int, split: str) -> None:
    """Datasets trained together must share channel count and grid, and hold enough frames per window."""
    first = datasets[0]
    for ds in datasets:
        if len(ds.dims) != 2:
            raise DataError(f"{ds.manifest}: dataset {ds.name!r} is {len(ds.dims)}D (dims {ds.dims}); "
                            "the trainer reads 2D datasets")
        if len(ds.channels) != len(first.channels):
            raise DataError(f"mismatched channel counts: dataset {ds.name!r} ({ds.manifest}) has {len(ds.channels)} "
                            f"channels {ds.channels}, dataset {first.name!r} ({first.manifest}) has "
                            f"{len(first.channels)} {first.channels}; ingest them with the same --channels")
        if ds.shape != first.shape:
            raise DataError(f"mismatched grids: dataset {ds.name!r} is {list(ds.shape)}, dataset {first.name!r} is "
                            f"{list(first.shape)}; ingest them to the same grid")
        if ds.frames < t_in + t_out:
            raise DataError(f"dataset {ds.name!r} has {ds.frames} frames per trajectory, fewer than "
                            f"t_in + t_out = {t_in + t_out}")
        if ds.split_counts.get(split, 0) <= 0:
            raise DataError(f"dataset {ds.name!r} ({ds.manifest}) has no {split!r} trajectories "
                            f"(splits: {ds.split_counts})")
