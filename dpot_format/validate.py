"""The validator of an output folder (local or URL): everything docs/format.md promises, checked against the files,
every problem named by file, member or array instead of raised, so that one run lists them all."""

from __future__ import annotations

import functools
import json
import math
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Iterator, Protocol

import numpy as np

from dpot_format.errors import FormatError
from dpot_format.io import file_kind, filesystem, is_local, local_path, open_read, sha256_array, sha256_file, \
    zarr_store
from dpot_format.limits import LIMITS, Limits
from dpot_format.manifest import load_json, manifest_path, validation_errors
from dpot_format.names import MANIFEST_NAME, SHARDS_FOLDER, SPLITS, is_temporary
from dpot_format.npy import NpyHeader, read_npy_header
from dpot_format.paths import resolve_member
from dpot_format.shard_index import differences, load_index, shard_samples
from dpot_format.tar import SampleIndex

WARNING_KINDS = frozenset({"unlisted", "temporary"})
PARTS = ("shards", "zarr")
MAX_PROBLEMS_PER_ITEM = 20  # a shard broken throughout reports this many, then one line counting the rest
_FLOAT32 = np.dtype("<f4")
_UINT8 = np.dtype("|u1")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an output: `what` (path relative to the output, `<shard>:<member>` for a tar member, or
    `<store>/<group>/<array>` for Zarr), `kind`, what was expected and found, and whether it is fatal (unlisted
    files and temporary leftovers are warnings)."""

    what: str
    kind: str  # manifest schema path missing type bytes sha256 member samples keys npy meta zarr index unreadable unlisted temporary
    expected: str = ""
    actual: str = ""
    fatal: bool | None = None  # None: decided by kind (a bool after construction)
    dataset: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.fatal is None:
            object.__setattr__(self, "fatal", self.kind not in WARNING_KINDS)

    def __str__(self) -> str:
        if self.kind == "missing":
            return f"{self.what}: missing (listed in the manifest)"
        if self.kind == "unlisted":
            return f"{self.what}: not listed in the manifest (warning)"
        if self.kind == "temporary":
            return f"{self.what}: temporary file left by an interrupted write (warning)"
        if self.kind in ("bytes", "sha256"):
            return f"{self.what}: {self.kind} mismatch (manifest {self.expected}, found {self.actual})"
        return f"{self.what}: {self.actual}" + (f" (expected {self.expected})" if self.expected else "")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (what, kind, expected, actual, fatal)."""
        return {"what": self.what, "kind": self.kind, "expected": self.expected, "actual": self.actual,
                "fatal": self.fatal}


class Runner(Protocol):
    """Anything that maps a function over items in order (dpot_data.ingest.scheduler.Runner, for one)."""

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]: ...


class DigestMemo(Protocol):
    """Remembers sha256s taken before (dpot_train.data.verified, launch's record of what it verified):
    `digest(item, compute)` is the item's sha256 as recorded when the memo vouches that the file or array is
    unchanged since it was hashed, else compute(), which reads it. Called on the item's own (pool) thread."""

    def digest(self, item: "Item", compute: Callable[[], str]) -> str: ...


@dataclass(frozen=True)
class Item:
    """One unit of checking work: a shard file, or a Zarr array, with what the manifest says it should be."""

    what: str
    kind: str  # "shard" | "zarr"
    location: str  # shard path/URL, or the Zarr store path/URL
    dataset: str
    sha256: str
    rehash: bool
    bytes: int = 0
    samples: int = 0
    split: str = ""
    frames: int = 0
    channels: int = 0
    grid: tuple[int, ...] = ()
    group: str = ""
    array: str = ""
    limits: Limits = LIMITS
    recorded: tuple[SampleIndex, ...] | None = None  # the shard's samples in the dataset's index file, when recorded
    index_path: str = ""  # that index file (relative to the output)
    trust_index: bool = False  # take the members from `recorded` instead of reading the shard's headers
    stat_remote: bool = True  # with trust_index: a shard in object storage is still asked for its size (a HEAD)


@dataclass
class ItemResult:
    """What checking an item found: its problems, and for a shard the sample indices and meta ids it holds."""

    problems: list[Problem]
    keys: list[int] | None = None  # None: the shard's structure was not read (a size, sha256 or member problem)
    ids: list[str] = field(default_factory=list)
    samples: list[SampleIndex] | None = None  # a shard's member index, as read from its tar headers


def _shape(shape: Iterable[int]) -> str:
    """A shape as Python writes a tuple: "(5, 16, 16)", "(5,)"."""
    return str(tuple(int(s) for s in shape))


def _npy_differences(header: NpyHeader, size: int, dtype: np.dtype, shape: tuple[int, ...]) -> tuple[str, str] | None:
    """(expected, found) for a .npy header that differs from what the manifest implies, else None."""
    found = []
    if header.dtype != dtype:
        found.append(f"dtype {header.dtype.str} ({header.dtype})")
    if header.fortran:
        found.append("Fortran order")
    if tuple(header.shape) != tuple(shape):
        found.append(f"shape {_shape(header.shape)}")
    if not found and header.data_offset + header.nbytes != size:
        found.append(f"{size - header.data_offset} bytes of data after the header, which announces {header.nbytes}")
    if not found:
        return None
    want = f"{dtype} ({dtype.str}) C-order, shape {_shape(shape)}"
    return want, "; ".join(found)


def _stat_problem(item: Item) -> tuple[list[Problem], int | None]:
    """Missing, not a regular file, or a symbolic link; else the file's size."""
    if is_local(item.location):
        path = local_path(item.location)
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return [Problem(item.what, "missing", dataset=item.dataset)], None
        except OSError as exc:
            return [Problem(item.what, "unreadable", "a readable file", _short(exc), dataset=item.dataset)], None
        if stat.S_ISLNK(st.st_mode):
            return [Problem(item.what, "path", "a regular file inside the output folder",
                            f"a symbolic link (to {os.readlink(path)!r})", dataset=item.dataset)], None
        if not stat.S_ISREG(st.st_mode):
            return [Problem(item.what, "type", "a regular file", file_kind(st.st_mode), dataset=item.dataset)], None
        return [], int(st.st_size)
    fsys, remote = filesystem(item.location)
    try:
        info = fsys.info(remote)
    except FileNotFoundError:
        return [Problem(item.what, "missing", dataset=item.dataset)], None
    if info.get("type") != "file":
        return [Problem(item.what, "type", "a regular file", str(info.get("type")), dataset=item.dataset)], None
    return [], int(info.get("size") or 0)


def _check_samples(item: Item, fh: Any, samples: list[SampleIndex]) -> ItemResult:
    """The members of every sample: .npy headers against the manifest, meta.json against the shard."""
    out: list[Problem] = []
    keys: list[int] = []
    ids: list[str] = []
    fields_shape = (item.frames, item.channels, *item.grid)

    def add(what: str, kind: str, expected: str, actual: str) -> None:
        out.append(Problem(what, kind, expected, actual, dataset=item.dataset))

    for s in samples:
        keys.append(s.index)
        for member, dtype, shape in ((s.fields, _FLOAT32, fields_shape), (s.mask, _UINT8, tuple(item.grid))):
            where = f"{item.what}:{member.name}"
            fh.seek(member.offset)
            try:
                header = read_npy_header(fh, where, item.limits.max_npy_header_bytes)
            except FormatError as exc:
                add(where, "npy", "a plain .npy array", exc.expected)
                continue
            diff = _npy_differences(header, member.size, dtype, shape)
            if diff is not None:
                add(where, "npy", *diff)
        where = f"{item.what}:{s.meta.name}"
        fh.seek(s.meta.offset)
        data = fh.read(s.meta.size)
        try:
            meta = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            add(where, "meta", "a UTF-8 JSON object", f"unparsable ({exc})")
            continue
        if not isinstance(meta, dict):
            add(where, "meta", "a UTF-8 JSON object", type(meta).__name__)
            continue
        for name, want in (("index", s.index), ("split", item.split), ("dataset", item.dataset)):
            if meta.get(name) != want or isinstance(meta.get(name), bool):
                add(where, "meta", f"{name} {want!r}", f"{name} {meta.get(name)!r}")
        ids.append(str(meta.get("id")))
    return ItemResult(out, keys, ids)


def _file_sha256(item: Item, memo: DigestMemo | None) -> str:
    """The shard's sha256: read (at most its listed bytes + 1), or from `memo` when it vouches for the file."""
    def compute() -> str:
        return sha256_file(item.location, expected_bytes=item.bytes)[0]

    return compute() if memo is None else memo.digest(item, compute)


def _recorded_shard(item: Item, memo: DigestMemo | None = None) -> ItemResult:
    """A shard whose member index is recorded and trusted: no header is read. The shard is still a regular file
    of the listed size (lstat, or a HEAD in object storage), and of the listed sha256 when rehashing; with
    `stat_remote` False a shard in object storage is not contacted at all unless rehashing (launch: the shard cache
    checks its size and sha256 as it downloads it)."""
    problems: list[Problem] = []
    if is_local(item.location) or item.rehash or item.stat_remote:
        problems, size = _stat_problem(item)
        if size is None:
            return ItemResult(problems)
        if size != item.bytes:
            problems.append(Problem(item.what, "bytes", str(item.bytes), str(size), dataset=item.dataset))
    if item.rehash and not problems:
        try:
            digest = _file_sha256(item, memo)
        except (FormatError, OSError) as exc:
            return ItemResult([Problem(item.what, "unreadable", "a readable file", str(exc), dataset=item.dataset)])
        if digest != item.sha256:
            problems.append(Problem(item.what, "sha256", item.sha256, digest, dataset=item.dataset))
    if problems:
        return ItemResult(problems)
    samples = list(item.recorded or ())
    return ItemResult([], [s.index for s in samples], samples=samples)


def check_shard(item: Item, memo: DigestMemo | None = None) -> ItemResult:
    """One shard: a regular file (not a link) of the listed size and sha256 (when rehashing), whose members follow
    the rules, with the listed sample count, .npy headers matching the manifest, and meta.json matching the shard;
    and, when the dataset records its member index, that index equal to the shard's tar headers. With
    `trust_index` and a recorded index, no header is read (`_recorded_shard`). `memo`: sha256s taken before."""
    if item.trust_index and item.recorded is not None:
        return _recorded_shard(item, memo)
    problems, size = _stat_problem(item)
    if size is None:
        return ItemResult(problems)
    if size != item.bytes:
        problems.append(Problem(item.what, "bytes", str(item.bytes), str(size), dataset=item.dataset))
    if item.rehash:
        try:
            digest = _file_sha256(item, memo)
        except (FormatError, OSError) as exc:
            return ItemResult(problems + [Problem(item.what, "unreadable", "a readable file", str(exc),
                                                  dataset=item.dataset)])
        if digest != item.sha256:
            problems.append(Problem(item.what, "sha256", item.sha256, digest, dataset=item.dataset))
    if problems:
        return ItemResult(problems)
    try:
        with open_read(item.location) as fh:
            try:
                samples = shard_samples(fh, None, item.what, item.limits)  # the tar headers themselves
            except FormatError as exc:
                return ItemResult([Problem(item.what, "member", actual=exc.expected, dataset=item.dataset)])
            result = _check_samples(item, fh, samples)
            result.samples = samples
            differs = differences(item.recorded, samples) if item.recorded is not None else None
            if differs is not None:
                result.problems.insert(0, Problem(item.index_path, "index", actual=f"{item.what}:{differs}",
                                                  dataset=item.dataset))
    except (FormatError, OSError) as exc:
        return ItemResult([Problem(item.what, "unreadable", "a readable file", str(exc), dataset=item.dataset)])
    if len(samples) != item.samples:
        result.problems.insert(0, Problem(item.what, "samples", f"{item.samples} samples (the manifest)",
                                          f"{len(samples)} samples", dataset=item.dataset))
    if len(result.problems) > MAX_PROBLEMS_PER_ITEM:
        rest = len(result.problems) - MAX_PROBLEMS_PER_ITEM
        result.problems = result.problems[:MAX_PROBLEMS_PER_ITEM] + [
            Problem(item.what, "member", actual=f"{rest} more problem(s) in this shard", dataset=item.dataset)]
    return result


def _short(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= 300 else text[:300] + "..."


def check_zarr_array(item: Item, memo: DigestMemo | None = None) -> ItemResult:
    """One listed Zarr array: present, and (when rehashing) of the listed sha256 over its uncompressed C-order
    bytes (or as `memo` recorded it); a chunk that does not decode is a problem naming the array, not an
    exception."""
    import zarr

    try:
        store = zarr_store(item.location, read_only=True)
        group = zarr.open_group(store, mode="r", path=item.group)
        if item.array not in group:
            return ItemResult([Problem(item.what, "missing", dataset=item.dataset)])
        array = group[item.array]
        if not item.rehash:
            return ItemResult([])
        digest = sha256_array(array) if memo is None else memo.digest(item, lambda: sha256_array(array))
    except Exception as exc:  # noqa: BLE001 - a codec, store or metadata failure is a problem of this array
        return ItemResult([Problem(item.what, "unreadable", "readable chunks and metadata", _short(exc),
                                   dataset=item.dataset)])
    if digest != item.sha256:
        return ItemResult([Problem(item.what, "sha256", item.sha256, digest, dataset=item.dataset)])
    return ItemResult([])


def run_item(item: Item, memo: DigestMemo | None = None) -> ItemResult:
    """Check one item (what a runner runs; module level so that it pickles for a dask.distributed worker)."""
    return check_shard(item, memo) if item.kind == "shard" else check_zarr_array(item, memo)


@dataclass
class _Plan:
    """Everything to check, found from the manifest before any data file is read."""

    items: list[Item] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)  # found while planning (paths, Zarr metadata)
    labels: dict[str, np.ndarray] = field(default_factory=dict)  # dataset -> Zarr split label per trajectory
    listed: set[str] = field(default_factory=set)


def _exists(location: str) -> bool:
    """Whether anything (a link included) is at a local path or URL."""
    if is_local(location):
        return os.path.lexists(local_path(location))
    fsys, remote = filesystem(location)
    return bool(fsys.exists(remote))


def _scan_store(root: str, rel: str, dataset: str) -> list[Problem]:
    """Symbolic links and non-regular files under a local Zarr store (reading them could leave the folder or hang)."""
    if not is_local(root):
        return []
    base = os.path.join(local_path(root), *rel.split("/"))
    out: list[Problem] = []
    for folder, dirs, files in os.walk(base, followlinks=False):
        for name in sorted(dirs + files):
            full = os.path.join(folder, name)
            try:
                mode = os.lstat(full).st_mode
            except OSError:
                continue
            where = os.path.relpath(full, local_path(root)).replace(os.sep, "/")
            if stat.S_ISLNK(mode):
                out.append(Problem(where, "path", "no symbolic links inside the Zarr store",
                                   f"a symbolic link (to {os.readlink(full)!r})", dataset=dataset))
            elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                out.append(Problem(where, "type", "a regular file", file_kind(mode), dataset=dataset))
    return out


def _array_shapes(entry: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype | None, tuple[int, ...] | None]]:
    """(shape, dtype, chunks) the manifest implies for each array of a dataset's Zarr group (None: not fixed)."""
    n, frames, c = int(entry["trajectories"]), int(entry["frames"]), len(entry["channels"])
    grid = tuple(int(s) for s in entry["grid"]["shape"])
    wants: dict[str, tuple[tuple[int, ...], np.dtype | None, tuple[int, ...] | None]] = {
        "fields": ((n, frames, c, *grid), _FLOAT32, (1, frames, c, *grid)), "mask": ((n, *grid), _UINT8, (1, *grid)),
        "channel_valid": ((c,), None, None), "channel": ((c,), None, None), "time": ((frames,), None, None),
        "split": ((n,), None, None), "sample": ((n,), None, None)}
    wants.update({dim: ((size,), None, None) for dim, size in zip(entry["grid"]["dims"], grid)})
    return wants


def _metadata_problem(name: str, arr: Any, entry: dict[str, Any]) -> tuple[str, str] | None:
    """(expected, found) when the metadata of array `name` disagrees with the manifest, else None. Checked before
    anything is read: metadata is covered by no digest, and a declared shape alone decides how much is read."""
    shape = tuple(int(s) for s in arr.shape)
    want = _array_shapes(entry).get(name)
    if want is None:  # an array the format does not name: never larger than the dataset's fields
        limit = math.prod(_array_shapes(entry)["fields"][0])
        return None if math.prod(shape) <= limit else (f"at most {limit} elements (the size of fields)",
                                                        f"shape {_shape(shape)}")
    want_shape, dtype, chunks = want
    if dtype is None:
        return None if shape == want_shape else (f"shape {_shape(want_shape)}", f"shape {_shape(shape)}")
    found = (shape, np.dtype(arr.dtype), tuple(arr.chunks))
    if found == want:
        return None
    return (f"{dtype} shape {_shape(want_shape)} chunks {_shape(chunks or ())}",
            f"{found[1]} shape {_shape(shape)} chunks {_shape(found[2])}")


def _zarr_metadata(plan: _Plan, entry: dict[str, Any], store: str) -> set[str]:
    """Check the metadata of the group's `fields`, `mask`, `split` and every listed array against the manifest,
    and read `split`; returns the arrays whose metadata is wrong or unreadable (they are not read further)."""
    import zarr

    z, name = entry["zarr"], entry["name"]
    base = f"{z['path']}/{z['group']}"
    try:
        group = zarr.open_group(zarr_store(store, read_only=True), mode="r", path=z["group"])
    except Exception as exc:  # noqa: BLE001
        plan.problems.append(Problem(base, "zarr", "a readable Zarr v3 group", _short(exc), dataset=name))
        return {"fields", "mask", "split", *z["arrays"]}
    bad: set[str] = set()
    for array in ["fields", "mask", *sorted(set(z["arrays"]) - {"fields", "mask", "split"}), "split"]:
        try:
            if array not in group:
                if array in ("fields", "mask") and array not in z["arrays"]:
                    plan.problems.append(Problem(f"{base}/{array}", "missing", dataset=name))
                continue
            problem = _metadata_problem(array, group[array], entry)
        except Exception as exc:  # noqa: BLE001
            plan.problems.append(Problem(f"{base}/{array}", "zarr", "readable array metadata", _short(exc),
                                         dataset=name))
            bad.add(array)
            continue
        if problem is not None:
            plan.problems.append(Problem(f"{base}/{array}", "zarr", *problem, dataset=name))
            bad.add(array)
    if "split" in group and "split" not in bad:
        try:
            plan.labels[name] = np.array([str(v) for v in np.asarray(group["split"][:]).ravel().tolist()],
                                         dtype=object)
        except Exception as exc:  # noqa: BLE001
            plan.problems.append(Problem(f"{base}/split", "unreadable", "readable chunks", _short(exc),
                                         dataset=name))
    return bad


def _recorded(plan: _Plan, root: str, entry: dict[str, Any], limits: Limits) -> dict[str, list[SampleIndex]]:
    """The dataset's recorded member index (shard path -> samples), read and checked against the manifest once;
    empty when it records none, or when its index file is refused (one problem naming the file: the shards are then
    checked from their own headers)."""
    if not entry.get("shard_index"):
        return {}
    try:
        return load_index(root, entry, limits)
    except FormatError as exc:
        plan.problems.append(Problem(exc.where or entry["shard_index"]["path"], "index", actual=exc.expected,
                                     dataset=entry["name"]))
        return {}


def _plan(root: str, manifest: dict[str, Any], rehash: bool, limits: Limits, datasets: Collection[str] | None,
          splits: Collection[str] | None, parts: Collection[str], trust_index: bool = False,
          stat_remote: bool = True) -> _Plan:
    """The items to check and the problems visible from the manifest and metadata alone (no shard is opened)."""
    plan = _Plan()
    scanned: set[str] = set()
    for entry in manifest["datasets"]:
        name = entry["name"]
        plan.listed.update(s["path"] for s in entry["shards"])
        if entry.get("shard_index"):
            plan.listed.add(entry["shard_index"]["path"])
        if datasets is not None and name not in datasets:
            continue
        grid = tuple(int(s) for s in entry["grid"]["shape"])
        if "shards" in parts:
            recorded = _recorded(plan, root, entry, limits)
            for shard in entry["shards"]:
                if splits is not None and shard["split"] not in splits:
                    continue
                try:
                    location = resolve_member(root, shard["path"], where=shard["path"])
                except FormatError as exc:
                    plan.problems.append(Problem(shard["path"], "path", actual=exc.expected, dataset=name))
                    continue
                samples = recorded.get(shard["path"])
                plan.items.append(Item(shard["path"], "shard", location, name, shard["sha256"], rehash,
                                       int(shard["bytes"]), int(shard["samples"]), shard["split"], int(entry["frames"]),
                                       len(entry["channels"]), grid, limits=limits,
                                       recorded=tuple(samples) if samples is not None else None,
                                       index_path=(entry.get("shard_index") or {}).get("path", ""),
                                       trust_index=trust_index, stat_remote=stat_remote))
        z = entry["zarr"]
        if "zarr" in parts and z:
            base = f"{z['path']}/{z['group']}"
            try:
                store = resolve_member(root, z["path"], where=f"zarr.path of {name}")
                group_location = resolve_member(root, base, where=f"zarr.group of {name}")
            except FormatError as exc:
                plan.problems.append(Problem(base, "path", actual=exc.expected, dataset=name))
                continue
            if not _exists(group_location):
                plan.problems.append(Problem(base, "missing", dataset=name))
                continue
            found = _scan_store(root, z["path"], name) if z["path"] not in scanned else []
            scanned.add(z["path"])
            plan.problems += found
            if any(p.kind in ("path", "type") and p.what.startswith(z["path"] + "/") for p in plan.problems):
                continue  # a link or a FIFO under the store: reading it could leave the folder or block forever
            bad = _zarr_metadata(plan, entry, store)
            for array, digest in sorted(z["arrays"].items()):
                if array not in bad:  # a wrong shape would decide how much is read: named above, not hashed
                    plan.items.append(Item(f"{base}/{array}", "zarr", store, name, digest, rehash, group=z["group"],
                                           array=array, limits=limits))
    return plan


def _key_problems(manifest: dict[str, Any], plan: _Plan, results: dict[str, ItemResult],
                  splits: Collection[str] | None) -> list[Problem]:
    """Across the shards of each split: keys are the split's trajectory indices in order, meta ids its listed ids."""
    out: list[Problem] = []
    checked = {i.what for i in plan.items if i.kind == "shard"}
    for entry in manifest["datasets"]:
        name = entry["name"]
        labels = plan.labels.get(name)
        seen: dict[int, str] = {}
        for split in SPLITS:
            if splits is not None and split not in splits:
                continue
            shards = [s["path"] for s in entry["shards"] if s["split"] == split]
            if not shards or any(p not in checked or results[p].keys is None for p in shards):
                continue
            keys = [(k, p) for p in shards for k in results[p].keys]  # type: ignore[union-attr]
            ids = [(i, p) for p in shards for i in results[p].ids]
            if labels is not None:
                want = [int(i) for i in np.flatnonzero(labels == split)]
            else:  # no Zarr labels: increasing, inside the dataset, no index in two splits
                want = sorted(set(k for k, _ in keys))
                want = [k for k in want if 0 <= k < int(entry["trajectories"])]
            got = [k for k, _ in keys]
            if got != want:
                at = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                shard = keys[min(at, len(keys) - 1)][1] if keys else shards[0]
                out.append(Problem(shard, "keys", f"the {split} trajectory indices in order "
                                   f"({', '.join(map(str, want[at:at + 3]))}{', ...' if len(want) > at + 3 else ''})",
                                   f"{', '.join(f's{k:07d}' for k in got[at:at + 3])}" or "no more samples",
                                   dataset=name))
            for k, p in keys:
                if k in seen and seen[k] != split:
                    out.append(Problem(p, "keys", "each trajectory in one split",
                                       f"s{k:07d} is also in a {seen[k]} shard", dataset=name))
                    break
                seen[k] = split
            listed = (entry["splits"].get("ids") or {}).get(split)
            if listed is not None and len(listed) == len(ids):
                bad = next(((j, i, p) for j, (i, p) in enumerate(ids) if i != listed[j]), None)
                if bad is not None:
                    j, i, p = bad
                    out.append(Problem(f"{p}:s{keys[j][0]:07d}.meta.json", "meta", f"id {listed[j]!r} (splits.ids)",
                                       f"id {i!r}", dataset=name))
    return out


def _walk(root: str) -> Iterator[tuple[str, bool]]:
    """(relative path, is a folder) of everything under the output, not following links; a temporary folder is
    listed but not entered."""
    if is_local(root):
        base = local_path(root)
        for folder, dirs, files in os.walk(base, followlinks=False):
            rel_folder = os.path.relpath(folder, base).replace(os.sep, "/")
            prefix = "" if rel_folder == "." else rel_folder + "/"
            for d in sorted(dirs):
                yield prefix + d, True
            dirs[:] = sorted(d for d in dirs if not is_temporary(d))
            for f in sorted(files):
                yield prefix + f, False
        return
    fsys, base = filesystem(root)
    base = base.rstrip("/")
    try:
        found = fsys.find(base, withdirs=True, detail=True)
    except FileNotFoundError:
        return
    for path, info in sorted(found.items()):
        rel = path[len(base) + 1:] if path.startswith(base + "/") else path.lstrip("/")
        if rel and not any(is_temporary(part) for part in rel.split("/")[:-1]):
            yield rel, info.get("type") == "directory"


def leftover_problems(root: str, listed: Collection[str]) -> list[Problem]:
    """Warnings: temporary names anywhere under the output, and files under `shards/` no dataset lists."""
    out: list[Problem] = []
    for rel, is_dir in _walk(root):
        name = rel.rsplit("/", 1)[-1]
        if is_temporary(name):
            out.append(Problem(rel + ("/" if is_dir else ""), "temporary"))
        elif not is_dir and rel.startswith(SHARDS_FOLDER + "/") and rel not in listed:
            out.append(Problem(rel, "unlisted"))
    return out


def _manifest_link(path: str) -> str | None:
    """The target of a local manifest.json that is a symbolic link, else None (URLs have no links)."""
    if not is_local(path):
        return None
    try:
        return os.readlink(local_path(path))
    except OSError:  # not a link, or missing (load_json says so)
        return None


def validate_output(root: str | os.PathLike[str], *, rehash: bool = True, runner: Runner | None = None,
                    progress: Callable[[Item, list[Problem]], None] | None = None, limits: Limits = LIMITS,
                    datasets: Collection[str] | None = None, splits: Collection[str] | None = None,
                    parts: Collection[str] = PARTS, scan: bool = True, manifest: dict[str, Any] | None = None,
                    indexes: dict[str, list[SampleIndex]] | None = None,
                    trust_index: bool = False, stat_remote: bool = True,
                    memo: DigestMemo | None = None) -> list[Problem]:
    """Every problem of the output folder (or URL, or its manifest.json) `root` against docs/format.md, never
    stopping at the first.

    The manifest (size, UTF-8 JSON, schema, semantic rules, limits); every listed path (inside the folder, no links);
    every shard (regular file, size, sha256, member rules, sample count, .npy headers, meta.json, keys in split
    order); the Zarr store (no links, `fields`/`mask` metadata, every listed array's digest, undecodable chunks);
    and, as warnings, unlisted files under `shards/` and temporary leftovers. `rehash=False` is the cheap mode: no
    sha256 of shards or arrays. Item checks run on `runner` (`imap(fn, items)`) when given, else in this thread;
    `progress(item, problems)` is called after each. `datasets`, `splits` and `parts` ("shards", "zarr") narrow
    what is checked; `scan=False` skips the leftover scan. `manifest`: the document, already read and validated by
    `dpot_format.manifest.read_manifest` (it is not read again). `indexes`, when given, receives the member index
    of every shard whose headers were read (shard path or URL -> samples), so a reader need not read them again.

    A dataset that records its member index (`shard_index`, docs/format.md) has the index file checked (size,
    sha256, agreement with the manifest) and, shard by shard, compared with the tar headers. `trust_index` (what
    launch, evaluate, preview and plain inspect use): where the index is recorded, it stands in for the shards'
    headers, and no tar header, .npy header or meta.json is read (see `_recorded_shard`); `indexes` then receives
    the recorded index. `stat_remote=False` (launch through the shard cache) also leaves shards in object storage
    uncontacted: no request per shard. `memo` (launch's record of what it verified, dpot_train.data.verified)
    stands in for the sha256 of every file or array it vouches for: those are not read.
    """
    root = os.fspath(root)
    path = manifest_path(root)
    if root.endswith(".json"):  # the manifest file itself was given: its folder is the output
        root = root.rstrip("/").rsplit("/", 1)[0] if "/" in root.rstrip("/") else "."
    if manifest is None:
        try:
            manifest = load_json(path, limits)
        except FormatError as exc:
            return [Problem(MANIFEST_NAME, "manifest", actual=exc.expected)]
        errors = validation_errors(manifest, limits)
        if errors:
            return [Problem(MANIFEST_NAME, "schema", actual=line) for line in errors]
    link = _manifest_link(path)
    if link is not None:  # its content may come from anywhere: the listed digests would then vouch for nothing
        return [Problem(MANIFEST_NAME, "manifest", actual=f"is a symbolic link (to {link!r}), expected the manifest "
                                                          "file itself inside the output folder")]
    plan = _plan(root, manifest, rehash, limits, datasets, splits, tuple(parts), trust_index, stat_remote)
    problems = list(plan.problems)
    results: dict[str, ItemResult] = {}
    check = run_item if memo is None else functools.partial(run_item, memo=memo)
    outcomes = runner.imap(check, plan.items) if runner is not None else map(check, plan.items)
    for item, result in zip(plan.items, outcomes):
        if progress is not None:
            progress(item, result.problems)
        results[item.what] = result
        problems.extend(result.problems)
        if indexes is not None and result.samples is not None:
            indexes[item.location] = result.samples
    problems.extend(_key_problems(manifest, plan, results, splits))
    if scan:
        problems.extend(leftover_problems(root, plan.listed))
    return problems


def summarise(problems: list[Problem], checked: int | None = None) -> tuple[int, list[str]]:
    """Exit code (1 when any problem is fatal) and the lines to print: one per problem, then a verdict."""
    lines = [str(p) for p in problems]
    fatal = [p for p in problems if p.fatal]
    if fatal:
        lines.append(f"FAILED: {len(fatal)} problem(s)")
        return 1, lines
    lines.append("OK" if checked is None else f"OK: {checked} item(s) match the manifest")
    return 0, lines


def as_json(problems: list[Problem]) -> list[dict[str, Any]]:
    """Problems as JSON-able dicts (for --json output)."""
    return [p.to_dict() for p in problems]
