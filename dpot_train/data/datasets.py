"""The datasets a run reads: DatasetInfo from dpot shard manifests (docs/format.md) through dpot_format, and the
checks of their shards before any training step."""

from __future__ import annotations

import glob
import os
import posixpath
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable

from dpot_format.errors import FormatError
from dpot_format.manifest import manifest_path, read_manifest as read_manifest_doc
from dpot_format.paths import resolve_member
from dpot_format.shard_index import load_index
from dpot_format.tar import SampleIndex
from dpot_format.validate import Problem, validate_output
from dpot_train.data.hash_pool import HashProgress, hash_runner
from dpot_train.data.verified import RecordPolicy, Records


class DataError(FormatError):
    """Bad training input: names the manifest, dataset or shard and what was expected (a FormatError, so that
    format problems found by dpot_format and the trainer's own checks are caught alike)."""


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


def manifest_url(path: str) -> str:
    """Accept a folder holding manifest.json or the manifest file itself."""
    return manifest_path(str(path))


def _as_data_error(exc: FormatError) -> DataError:
    return exc if isinstance(exc, DataError) else DataError(str(exc))


def read_manifest(path: str) -> list[DatasetInfo]:
    """Load one manifest through dpot_format (schema, semantic rules, limits, paths inside the folder) and return
    its datasets; DataError naming the file otherwise."""
    url = manifest_url(path)
    try:
        doc = read_manifest_doc(url)
    except FormatError as exc:
        raise _as_data_error(exc) from None
    return datasets_of(url, doc)


def read_manifest_docs(paths: list[str]) -> dict[str, dict[str, Any]]:
    """manifest url -> its document (read and validated once), for every output the paths name."""
    if not paths:
        raise DataError("no manifest given: pass --manifest DIR (a folder written by `dpot-data ingest`)")
    docs = {}
    for p in [m for path in paths for m in expand_outputs(path)]:
        url = manifest_url(p)
        if url in docs:  # the same output named twice: every dataset of it would be trained twice
            names = [d["name"] for d in docs[url]["datasets"]]
            raise DataError(f"dataset {names[0] if names else '?'!r} appears in two manifests: {url} and {url} "
                            "(named twice)")
        try:
            docs[url] = read_manifest_doc(url)
        except FormatError as exc:
            raise _as_data_error(exc) from None
    return docs


def datasets_of_docs(docs: dict[str, dict[str, Any]]) -> list[DatasetInfo]:
    """The datasets of manifests already read (`read_manifest_docs`); names must be unique across them."""
    seen: dict[str, str] = {}
    out: list[DatasetInfo] = []
    for url, doc in docs.items():
        for ds in datasets_of(url, doc):
            if ds.name in seen:
                raise DataError(f"dataset {ds.name!r} appears in two manifests: {seen[ds.name]} and {ds.manifest}")
            seen[ds.name] = ds.manifest
            out.append(ds)
    return out


def datasets_of(url: str, doc: dict[str, Any]) -> list[DatasetInfo]:
    """The datasets of a manifest document read from `url` (no file is read); DataError for a path that leaves the
    folder."""
    root = posixpath.dirname(url)
    out = []
    for d in doc["datasets"]:
        z = d.get("zarr")
        try:
            shards = [Shard(resolve_member(root, s["path"], where=f"{url}: shard {s['path']!r}"), s["split"],
                            s["sha256"], int(s["bytes"]), int(s["samples"])) for s in d["shards"]]
            zarr_url = None
            if z:
                zarr_url = resolve_member(root, z["path"], where=f"{url}: zarr.path of {d['name']!r}")
                resolve_member(root, f"{z['path']}/{z['group']}", where=f"{url}: zarr.group of {d['name']!r}")
        except FormatError as exc:
            raise _as_data_error(exc) from None
        out.append(DatasetInfo(
            name=d["name"], manifest=url, root=root, channels=list(d["channels"]),
            channel_valid=[bool(v) for v in d["channel_valid"]], shape=tuple(d["grid"]["shape"]),
            dims=list(d["grid"]["dims"]), frames=int(d["frames"]), shards=shards,
            zarr_url=zarr_url, zarr_group=z["group"] if z else None,
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
    return datasets_of_docs(read_manifest_docs(paths))


MAX_REPORTED = 3  # problems named in one DataError; `dpot-data verify` lists them all


def without_split(datasets: list[DatasetInfo], split: str) -> str:
    """The datasets with no trajectory in `split`, named for a one-line refusal: "'a' (PATH: train 8, test 2), ..."
    ("" when every dataset has some)."""
    return ", ".join(f"{d.name!r} ({d.manifest}: "
                     f"{', '.join(f'{k} {v}' for k, v in d.split_counts.items() if v) or 'no trajectories'})"
                     for d in datasets if d.split_counts.get(split, 0) <= 0)


def problem_message(ds: DatasetInfo, problem: Problem) -> str:
    """One problem of a dataset's files as the trainer words it (the shard's URL, the manifest's figure)."""
    where = f"{ds.manifest}: dataset {ds.name!r}"
    url = posixpath.join(ds.root, problem.what) if problem.what.endswith(".tar") else problem.what
    if problem.kind == "missing":
        if url.endswith(".tar"):
            return f"{where}: shard missing: {url}"
        return f"{where}: Zarr store missing: {posixpath.join(ds.root, problem.what)}"
    if problem.kind == "bytes":
        return f"{where}: shard {url} has {problem.actual} bytes, the manifest says {problem.expected}"
    if problem.kind == "sha256":
        what = f"shard {url}" if url.endswith(".tar") else f"Zarr array {url}"
        return (f"{where}: checksum mismatch for {what}: sha256 {problem.actual}, the manifest says "
                f"{problem.expected} (re-ingest, or pass --no-verify-checksums to skip this check)")
    return f"{where}: {problem}"


def note_scanned(entries: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """One line on stderr per dataset entry (with its manifest url) that lists shards but records no shard index
    (an output written before `index.json`): its shards' tar headers are read once instead."""
    for manifest, entry in entries:
        if entry["shards"] and not entry.get("shard_index"):
            print(f"note: {manifest}: dataset {entry['name']!r} records no shard index (written before index.json); "
                  "its shards' tar headers were scanned (`dpot-data ingest --overwrite` records one)",
                  file=sys.stderr, flush=True)


def recorded_index(datasets: list[DatasetInfo], split: str) -> dict[str, list[SampleIndex]]:
    """Shard url -> its member index, for the `split` shards of every dataset that records one (its index file read
    once, its sha256 and rows checked against the manifest; no shard is read). DataError naming the index file."""
    out: dict[str, list[SampleIndex]] = {}
    for ds in datasets:
        if not ds.entry.get("shard_index"):
            continue
        try:
            recorded = load_index(ds.root, ds.entry)
        except FormatError as exc:
            raise DataError(f"{ds.manifest}: dataset {ds.name!r}: {posixpath.join(ds.root, str(exc))}") from None
        for listed, shard in zip(ds.entry["shards"], ds.shards):
            if shard.split == split:
                out[shard.url] = recorded[listed["path"]]
    return out


def verify_shards(datasets: list[DatasetInfo], split: str, backend: str = "webdataset",
                  checksums: bool = True, indexes: dict[str, list[SampleIndex]] | None = None,
                  record: RecordPolicy | None = None) -> None:
    """Check the data of `split` with dpot_format's validator before training: for the webdataset backend every
    shard of the split (regular file, size, members, .npy headers, meta.json, keys; sha256 unless disabled), for
    the zarr backend the store (metadata; array digests unless disabled). DataError naming the first problems.
    `indexes` receives each shard's member index (shard url -> samples): the dataset's recorded index where it has
    one (no tar header is read), else as the validator scanned it. `record`: each local output's record of verified
    shards (dpot_train.data.verified, launch's) serves the sha256 of what is unchanged since and is updated."""
    by_root: dict[str, list[DatasetInfo]] = {}
    for ds in datasets:
        if backend == "zarr":
            if ds.zarr_url is None:
                raise DataError(f"{ds.manifest}: dataset {ds.name!r} has no Zarr store (zarr: null); "
                                "use the webdataset backend")
        elif not ds.shards_of(split):
            raise DataError(f"{ds.manifest}: dataset {ds.name!r} has no {split!r} shards "
                            f"(splits: {ds.split_counts})")
        by_root.setdefault(ds.manifest, []).append(ds)
    part = "zarr" if backend == "zarr" else "shards"
    records = Records(record if checksums else None)
    size, count = records.to_hash([(root, [ds.entry for ds in group]) for root, group in by_root.items()], part,
                                  {split})
    with records, hash_runner(checksums and count > 0, part) as runner, \
            HashProgress(size, count, part, checksums) as bar:
        for root, group in by_root.items():  # the sha256 pass on every core (hash_pool), problems in manifest order
            named = {ds.name: ds for ds in group}
            problems = [p for p in validate_output(root, rehash=checksums, datasets=set(named), splits={split},
                                                   parts=(part,), scan=False, indexes=indexes, trust_index=True,
                                                   runner=runner, progress=records.progress(root, bar) if checksums
                                                   else None, memo=records.record(root))
                        if p.fatal]
            if problems:
                lines = [problem_message(named[p.dataset], p) if p.dataset in named else f"{group[0].manifest}: {p}"
                         for p in problems[:MAX_REPORTED]]
                more = (f" (and {len(problems) - MAX_REPORTED} more problem(s); `dpot-data verify "
                        f"{group[0].root}` lists them)" if len(problems) > MAX_REPORTED else "")
                raise DataError("; ".join(lines) + more)
            if part == "shards":
                note_scanned((ds.manifest, ds.entry) for ds in group)
    # no note of the record here (evaluate, the trainer's own check): only `launch` says what it took from it


def check_compatible(datasets: list[DatasetInfo], t_in: int, t_out: int, split: str,
                     res: int | list[int] = 0) -> None:
    """Datasets trained together must share dimension, channel count and the grid the model sees (any stored grid
    when each window is resized to `res`: N per axis, or one side per stored axis), and hold enough frames per
    window."""
    from dpot_format.grid import grid_text
    from dpot_train.data.windows import run_grid

    first = datasets[0]
    other = next((ds for ds in datasets if len(ds.dims) != len(first.dims)), None)
    if other is not None:  # before any per-dataset check: the one line names the mix
        raise DataError(f"2D and 3D datasets in one run: dataset {other.name!r} ({other.manifest}) is "
                        f"{len(other.dims)}D, dataset {first.name!r} ({first.manifest}) is {len(first.dims)}D; "
                        "train them separately")
    for ds in datasets:
        if len(ds.dims) not in (2, 3):
            raise DataError(f"{ds.manifest}: dataset {ds.name!r} has dims {ds.dims}; the trainer reads 2D and 3D "
                            "data")
        if len(ds.channels) != len(first.channels):
            raise DataError(f"mismatched channel counts: dataset {ds.name!r} ({ds.manifest}) has {len(ds.channels)} "
                            f"channels {ds.channels}, dataset {first.name!r} ({first.manifest}) has "
                            f"{len(first.channels)} {first.channels}; ingest them with the same --channels")
        try:
            grid, first_grid = (run_grid(d.shape, d.model_layout, res, d.dims) for d in (ds, first))
        except ValueError as exc:
            raise DataError(f"{exc} (dataset {ds.name!r} ({ds.manifest}) has dims {ds.dims})") from None
        if grid != first_grid and not res:
            raise DataError(f"mismatched grids: dataset {ds.name!r} is {list(ds.shape)}, dataset {first.name!r} is "
                            f"{list(first.shape)}; ingest them to the same grid, or resize both with --res")
        if grid != first_grid:  # one --res, two orientations of the model's axes (docs/conventions.md)
            raise DataError(f"--res {grid_text(res)}: dataset {ds.name!r} becomes {grid_text(grid)} in the model's "
                            f"axes and dataset {first.name!r} {grid_text(first_grid)} (their model_layout differs); "
                            "train them separately, or give one side for every axis")
        if ds.frames < t_in + t_out:
            raise DataError(f"dataset {ds.name!r} has {ds.frames} frames per trajectory, fewer than "
                            f"t_in + t_out = {t_in + t_out}")
        if ds.split_counts.get(split, 0) <= 0:
            raise DataError(f"dataset {ds.name!r} ({ds.manifest}) has no {split!r} trajectories "
                            f"(splits: {ds.split_counts})")
