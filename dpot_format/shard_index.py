"""The member index of a dataset's shards, recorded once at ingest (docs/format.md, "Shard index").

`<shard folder>/index.json` lists, per shard of the dataset, where each trajectory's three members lie (data offsets
and sizes), so that readers take a shard's `SampleIndex` list from it instead of scanning the shard's tar headers.
The manifest records the file's path, sha256 and size in the dataset's `shard_index`: one small entry per dataset,
so the manifest stays small however many shards there are, and the index of a dataset is read only when that
dataset is.

`shard_samples` is the one place a shard's member index comes from: the recorded index when there is one, else a
scan of the shard's tar headers (`dpot_format.tar.index_shard`).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from typing import IO, Any, Mapping, Sequence

from dpot_format.errors import FormatError
from dpot_format.io import file_size, read_bounded
from dpot_format.limits import LIMITS, Limits
from dpot_format.names import sample_key
from dpot_format.paths import resolve_member
from dpot_format.tar import Member, SampleIndex, index_shard, member_limit

INDEX_NAME = "index.json"
FORMAT = "dpot-shard-index/1"
_ROW = 7  # [index, fields offset, fields size, mask offset, mask size, meta offset, meta size]
_ROW_BYTES = 7 * 21  # the most one row can take in the file: seven integers of up to 20 digits and separators
_SHARD_BYTES = 512  # per shard: its path, sha256 and the keys around them

RecordedIndex = dict[str, list[SampleIndex]]  # manifest shard path -> its samples, in tar order


def row(sample: SampleIndex) -> list[int]:
    """One sample as the index file stores it."""
    return [sample.index, sample.fields.offset, sample.fields.size, sample.mask.offset, sample.mask.size,
            sample.meta.offset, sample.meta.size]


def sample_of(values: Sequence[int]) -> SampleIndex:
    """The SampleIndex a stored row describes (member names follow from the trajectory index)."""
    index, *rest = values
    key = sample_key(int(index))
    members = {kind: Member(f"{key}.{kind}", key, kind, int(rest[2 * j]), int(rest[2 * j + 1]))
               for j, kind in enumerate(("fields.npy", "mask.npy", "meta.json"))}
    return SampleIndex(key, members)


def index_document(dataset: str, shards: Sequence[tuple[str, str, Sequence[SampleIndex]]]) -> dict[str, Any]:
    """The index file's document: `shards` is (path relative to the index file's folder, sha256, samples) per
    shard, in manifest order."""
    return {"format": FORMAT, "dataset": dataset,
            "shards": [{"path": path, "sha256": sha, "samples": [row(s) for s in samples]}
                       for path, sha, samples in shards]}


def index_bytes(document: dict[str, Any]) -> bytes:
    """The file's bytes: compact JSON, one line (its sha256 is what the manifest records)."""
    return (json.dumps(document, separators=(",", ":")) + "\n").encode("utf-8")


def index_limit(entry: Mapping[str, Any]) -> int:
    """The largest index file the dataset entry can need (a larger one is refused before it is read)."""
    shards = entry.get("shards") or []
    return 4096 + sum(_SHARD_BYTES + len(s["path"]) + int(s["samples"]) * _ROW_BYTES for s in shards)


def index_location(root: str, entry: Mapping[str, Any]) -> str:
    """Path or URL of the dataset's index file (FormatError when its manifest path leaves the folder)."""
    return resolve_member(root, entry["shard_index"]["path"], where=entry["shard_index"]["path"])


def load_index(root: str, entry: Mapping[str, Any], limits: Limits = LIMITS, *,
               source: IO[bytes] | None = None) -> RecordedIndex:
    """The recorded member index of a dataset entry that has `shard_index`: the file read once (bounded), its size
    and sha256 checked against the manifest, then every row against the manifest's shards (same shards in the same
    order with their sha256 and sample counts, keys increasing, members inside the shard, in tar order, not
    overlapping, of plausible sizes). FormatError naming the index file (and the shard) otherwise."""
    ref = entry["shard_index"]
    where = ref["path"]
    location = index_location(root, entry)
    limit = index_limit(entry)
    if int(ref["bytes"]) > limit:
        raise FormatError(where, f"listed as {ref['bytes']} bytes, more than the {limit} an index of "
                                 f"{len(entry['shards'])} shards can take")
    try:
        if source is None:
            size = file_size(location)
            if size != int(ref["bytes"]):
                raise FormatError(where, f"bytes mismatch (manifest {ref['bytes']}, found {size})")
            data = read_bounded(location, limit)
        else:
            data = source.read(limit + 1)
    except FormatError as exc:
        if exc.where == where:
            raise
        raise FormatError(where, "missing (listed in the manifest)" if exc.expected == "not found"
                          else exc.expected) from None
    except OSError as exc:
        raise FormatError(where, f"unreadable ({exc.strerror or exc})") from None
    if len(data) != int(ref["bytes"]):
        raise FormatError(where, f"bytes mismatch (manifest {ref['bytes']}, found {len(data)})")
    digest = hashlib.sha256(data).hexdigest()
    if digest != ref["sha256"]:
        raise FormatError(where, f"sha256 mismatch (manifest {ref['sha256']}, found {digest})")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(where, f"is not UTF-8 JSON ({exc})") from None
    return _checked(where, doc, entry, limits)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _checked(where: str, doc: Any, entry: Mapping[str, Any], limits: Limits) -> RecordedIndex:
    """The index document checked against the manifest entry (see load_index)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("shards"), list):
        raise FormatError(where, f"expected a shard index of format {FORMAT!r} (format, dataset, shards)")
    if doc.get("dataset") != entry["name"]:
        raise FormatError(where, f"indexes dataset {doc.get('dataset')!r}, expected {entry['name']!r}")
    folder = posixpath.dirname(entry["shard_index"]["path"])
    listed = entry["shards"]
    if len(doc["shards"]) != len(listed):
        raise FormatError(where, f"indexes {len(doc['shards'])} shards, the manifest lists {len(listed)}")
    fields_bytes = int(entry["frames"]) * len(entry["channels"]) * 4
    mask_bytes = 1
    for n in entry["grid"]["shape"]:
        fields_bytes *= int(n)
        mask_bytes *= int(n)
    out: RecordedIndex = {}
    for shard, got in zip(listed, doc["shards"]):
        if not isinstance(got, dict) or not isinstance(got.get("path"), str) or \
                not isinstance(got.get("samples"), list):
            raise FormatError(where, f"entry for {shard['path']} is not {{path, sha256, samples}}")
        path = posixpath.join(folder, got["path"]) if folder else got["path"]
        if path != shard["path"] or got.get("sha256") != shard["sha256"]:
            raise FormatError(where, f"lists {path} (sha256 {got.get('sha256')}) where the manifest lists "
                                     f"{shard['path']} (sha256 {shard['sha256']})")
        rows = got["samples"]
        if len(rows) != int(shard["samples"]):
            raise FormatError(where, f"{shard['path']}: {len(rows)} samples indexed, the manifest says "
                                     f"{shard['samples']}")
        samples: list[SampleIndex] = []
        end, last = 0, -1
        for values in rows:
            if not isinstance(values, list) or len(values) != _ROW or not all(_is_int(v) for v in values) or \
                    values[0] >= 10 ** 7:
                raise FormatError(where, f"{shard['path']}: row {values!r} is not [index, fields offset, size, "
                                         "mask offset, size, meta offset, size] (non-negative integers)")
            sample = sample_of(values)
            if sample.index <= last:
                raise FormatError(where, f"{shard['path']}: sample {sample.key} after s{last:07d}; expected "
                                         "increasing keys")
            for member in (sample.fields, sample.mask, sample.meta):
                name = f"{shard['path']}:{member.name}"
                if member.offset % 512 or member.offset < end + 512:
                    raise FormatError(where, f"{name} at offset {member.offset}: expected a tar data offset (a "
                                             f"multiple of 512) after its header, past the previous member "
                                             f"(which ends at {end})")
                if member.size > member_limit(member.kind, limits):
                    raise FormatError(where, f"{name} has {member.size} bytes, more than the limit of "
                                             f"{member_limit(member.kind, limits)} for a {member.kind}")
                end = member.offset + member.size
            if end > int(shard["bytes"]):
                raise FormatError(where, f"{shard['path']}:{sample.meta.name} ends at byte {end}, past the end of "
                                         f"the shard ({shard['bytes']} bytes)")
            for member, data in ((sample.fields, fields_bytes), (sample.mask, mask_bytes)):
                if not data < member.size <= data + limits.max_npy_header_bytes:
                    raise FormatError(where, f"{shard['path']}:{member.name} has {member.size} bytes, expected "
                                             f"{data} bytes of data after a .npy header (the manifest's shape)")
            samples.append(sample)
            last = sample.index
        out[shard["path"]] = samples
    return out


def differences(recorded: Sequence[SampleIndex], scanned: Sequence[SampleIndex]) -> str | None:
    """The first way a recorded index differs from the one scanned from the shard's tar headers, in words (None
    when they agree)."""
    for a, b in zip(recorded, scanned):
        for kind in ("fields.npy", "mask.npy", "meta.json"):
            x, y = a.members[kind], b.members[kind]
            if (x.name, x.offset, x.size) != (y.name, y.offset, y.size):
                return (f"{x.name} at offset {x.offset}, {x.size} bytes, where its tar header says {y.name} at "
                        f"offset {y.offset}, {y.size} bytes")
    if len(recorded) != len(scanned):
        return f"{len(recorded)} samples indexed, the tar headers hold {len(scanned)}"
    return None


def shard_samples(location: str | os.PathLike[str] | IO[bytes], recorded: Sequence[SampleIndex] | None,
                  where: str | None = None, limits: Limits = LIMITS) -> list[SampleIndex]:
    """A shard's member index: `recorded` (from the dataset's index file) when given, nothing read; else scanned
    from the shard's tar headers under the member rules (FormatError naming the shard and member)."""
    if recorded is not None:
        return list(recorded)
    return index_shard(location, where, limits)
