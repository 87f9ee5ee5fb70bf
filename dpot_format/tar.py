"""The one reader of WebDataset shards: an index of member offsets for random access, and a stream of decoded
samples; both apply the same member rules (regular files named `s<7 digits>.<kind>`, each once, three per sample,
samples in increasing key order) and refuse anything else naming the member."""

from __future__ import annotations

import json
import os
import tarfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Iterator, Mapping

import numpy as np

from dpot_format.errors import FormatError
from dpot_format.io import open_read
from dpot_format.limits import LIMITS, Limits
from dpot_format.names import MEMBER_KINDS, key_index, parse_member
from dpot_format.npy import load_npy

_TYPE_WORDS = ((tarfile.TarInfo.issym, "a symbolic link"), (tarfile.TarInfo.islnk, "a hard link"),
               (tarfile.TarInfo.isdir, "a directory"), (tarfile.TarInfo.ischr, "a character device"),
               (tarfile.TarInfo.isblk, "a block device"), (tarfile.TarInfo.isfifo, "a FIFO"),
               (tarfile.TarInfo.issparse, "a sparse file"))


@dataclass(frozen=True)
class Member:
    """One member of a shard: its name, sample key and kind, and where its data lies in the tar file."""

    name: str
    key: str
    kind: str  # "fields.npy" | "mask.npy" | "meta.json"
    offset: int  # byte offset of the member's data in the tar file
    size: int


@dataclass(frozen=True)
class SampleIndex:
    """Where the three members of one sample lie in a shard."""

    key: str
    members: Mapping[str, Member]

    @property
    def index(self) -> int:
        """The trajectory's index in its dataset (the number in its key)."""
        return key_index(self.key)

    @property
    def fields(self) -> Member:
        return self.members["fields.npy"]

    @property
    def mask(self) -> Member:
        return self.members["mask.npy"]

    @property
    def meta(self) -> Member:
        return self.members["meta.json"]


@dataclass
class Sample:
    """One decoded trajectory: fields (time, channel, *space), mask (*space), meta.json as a dict."""

    key: str
    fields: np.ndarray
    mask: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def index(self) -> int:
        return key_index(self.key)


def member_limit(kind: str, limits: Limits) -> int:
    """Largest member of a kind a reader accepts (data plus a .npy header)."""
    if kind == "meta.json":
        return limits.max_meta_bytes
    if kind == "fields.npy":
        return limits.max_sample_bytes + limits.max_npy_header_bytes + 16
    return limits.max_grid_cells * 8 + limits.max_npy_header_bytes + 16


class _Rules:
    """The member rules, fed one tar header at a time (the index and the stream share it)."""

    def __init__(self, where: str, limits: Limits) -> None:
        self.where, self.limits = where, limits
        self.names: set[str] = set()
        self.done: set[str] = set()
        self.current: str | None = None
        self.last: str | None = None
        self.kinds: set[str] = set()

    def member(self, info: tarfile.TarInfo) -> tuple[str, str, bool]:
        """(key, kind, starts a new sample) of a member header; FormatError naming the member otherwise."""
        name = info.name
        for test, words in _TYPE_WORDS:
            if test(info):
                link = f" (to {info.linkname!r})" if info.issym() or info.islnk() else ""
                raise FormatError(self.where, f"member {name!r} is {words}{link}; expected regular files only")
        if not info.isfile():
            raise FormatError(self.where, f"member {name!r} has tar type {info.type!r}; expected regular files only")
        parsed = parse_member(name)
        if parsed is None:
            raise FormatError(self.where, f"member {name!r} does not follow the member rule "
                                          "s<7 digits>.fields.npy | .mask.npy | .meta.json")
        if name in self.names:
            raise FormatError(self.where, f"member {name!r} appears twice")
        self.names.add(name)
        if len(self.names) > self.limits.max_members_per_shard:
            raise FormatError(self.where, f"more than {self.limits.max_members_per_shard} members")
        key, kind = parsed
        if info.size > member_limit(kind, self.limits):
            raise FormatError(self.where, f"member {name!r} has {info.size} bytes, more than the limit of "
                                          f"{member_limit(kind, self.limits)} for a {kind}")
        new = key != self.current
        if new:
            self.finish()
            if key in self.done:
                raise FormatError(self.where, f"member {name!r}: the members of sample {key} are not together")
            if self.last is not None and key < self.last:
                raise FormatError(self.where, f"member {name!r}: sample {key} comes after sample {self.last}; "
                                              "expected samples in increasing key order")
            self.current = key
        self.kinds.add(kind)
        return key, kind, new

    def finish(self) -> None:
        """Close the current sample: it must hold all three members."""
        if self.current is None:
            return
        missing = [k for k in MEMBER_KINDS if k not in self.kinds]
        if missing:
            raise FormatError(self.where, f"sample {self.current} lacks {', '.join(f'{self.current}.{k}' for k in missing)}")
        self.done.add(self.current)
        self.last, self.current, self.kinds = self.current, None, set()


@contextmanager
def _opened(source: str | os.PathLike[str] | IO[bytes], where: str | None) -> Iterator[tuple[IO[bytes], str]]:
    if hasattr(source, "read"):
        yield source, where or str(getattr(source, "name", "shard"))  # type: ignore[misc]
        return
    text = os.fspath(source)  # type: ignore[arg-type]
    with open_read(text) as fh:
        yield fh, where or text


def _file_size(fh: IO[bytes]) -> int:
    here = fh.tell()
    end = fh.seek(0, os.SEEK_END)
    fh.seek(here)
    return int(end)


def index_shard(source: str | os.PathLike[str] | IO[bytes], where: str | None = None,
                limits: Limits = LIMITS) -> list[SampleIndex]:
    """Every sample of a shard (a path, URL or open seekable file) with its members' data offsets and sizes, in tar
    order, read from the member headers only (tarfile seeks over the data). FormatError naming the shard and the
    member for anything the member rules refuse, or for a file that is not a readable tar."""
    with _opened(source, where) as (fh, label):
        rules = _Rules(label, limits)
        size = _file_size(fh)
        out: list[SampleIndex] = []
        current: dict[str, Member] = {}
        try:
            with tarfile.open(fileobj=fh, mode="r:") as tar:
                for info in tar:
                    key, kind, new = rules.member(info)
                    if info.offset_data + info.size > size:
                        raise FormatError(label, f"member {info.name!r} runs past the end of the file")
                    if new and current:
                        out.append(SampleIndex(next(iter(current.values())).key, current))
                        current = {}
                    current[kind] = Member(info.name, key, kind, info.offset_data, info.size)
        except tarfile.TarError as exc:
            raise FormatError(label, f"is not a readable tar file ({exc})") from None
        rules.finish()
        if current:
            out.append(SampleIndex(next(iter(current.values())).key, current))
        return out


def _decode(label: str, key: str, parts: dict[str, bytes]) -> Sample:
    fields = load_npy(parts["fields.npy"], f"{label}: member {key}.fields.npy")
    mask = load_npy(parts["mask.npy"], f"{label}: member {key}.mask.npy")
    try:
        meta = json.loads(parts["meta.json"].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FormatError(label, f"member {key}.meta.json is not UTF-8 JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise FormatError(label, f"member {key}.meta.json holds {type(meta).__name__}, expected a JSON object")
    return Sample(key, fields, mask, meta)


def iter_samples(source: str | os.PathLike[str] | IO[bytes], where: str | None = None,
                 limits: Limits = LIMITS) -> Iterator[Sample]:
    """The decoded samples of a shard (a path, URL or open file), streamed in tar order: one sample in memory at a
    time, nothing extracted to disk, `.npy` members loaded without pickle. The same rules as `index_shard`."""
    with _opened(source, where) as (fh, label):
        rules = _Rules(label, limits)
        parts: dict[str, bytes] = {}
        key: str | None = None
        try:
            with tarfile.open(fileobj=fh, mode="r|") as tar:
                for info in tar:
                    k, kind, new = rules.member(info)
                    if new and key is not None:
                        yield _decode(label, key, parts)
                        parts = {}
                    key = k
                    handle = tar.extractfile(info)
                    data = handle.read() if handle is not None else b""
                    if len(data) != info.size:
                        raise FormatError(label, f"member {info.name!r} ends early ({len(data)} of {info.size} bytes)")
                    parts[kind] = data
        except tarfile.TarError as exc:
            raise FormatError(label, f"is not a readable tar file ({exc})") from None
        rules.finish()
        if key is not None:
            yield _decode(label, key, parts)
