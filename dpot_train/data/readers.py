"""Random access to whole trajectories (or a window of frames) in WebDataset tar shards or the Zarr store.

WebDataset tars are indexed once by scanning their member headers (tarfile seeks over the data), so that a
window of frames is read with one seek into `{key}.fields.npy` (or copied from a map of the shard, `_Handles`)
without loading the trajectory or the shard.
This is what lets an epoch be a global, exactly partitioned shuffle of trajectories rather than a shuffle
buffer over a sequential stream.
"""

from __future__ import annotations

import functools
import mmap
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from dpot_format.errors import FormatError
from dpot_format.io import is_local, local_path, open_read
from dpot_format.npy import load_npy, read_npy_header
from dpot_format.shard_index import shard_samples
from dpot_format.tar import SampleIndex
from dpot_train.data.datasets import DataError, DatasetInfo, Shard

ShardIndex = Mapping[str, Sequence[SampleIndex]]  # shard url -> its member index, as dpot_format's validator read it
Window = Callable[[tuple[int, ...]], np.ndarray]  # (T, C, *S) -> a writable C-contiguous float32 array of that shape
MaskSlot = Callable[[tuple[int, ...]], np.ndarray]  # stored mask shape -> the array the mask is copied into (cast)


@dataclass(frozen=True)
class TrajRef:
    """Where one trajectory lives: a shard member set (webdataset) or a row of the Zarr arrays."""

    dataset: str
    index: int  # the trajectory's index in its dataset (the `s0000042` key)
    url: str  # shard url, or zarr store url
    fields_offset: int  # byte offset of fields.npy inside the tar (-1 for zarr)
    mask_offset: int
    mask_size: int
    row: int  # row in the zarr arrays (-1 for webdataset)

    @property
    def id(self) -> str:
        """Stable id used in audits: dataset name and trajectory index."""
        return f"{self.dataset}:{self.index}"


class TrajectoryReader(Protocol):
    """Reads frames [t0, t0 + length) of a trajectory as float32 (length, C, [Z,] Y, X) and its uint8 mask
    ([Z,] Y, X)."""

    def refs(self, ds: DatasetInfo, split: str, index: ShardIndex | None = None) -> list[TrajRef]:
        """Every trajectory of `split`, sorted by index; `index`: shard member indexes already read (not again)."""

    def read(self, ref: TrajRef, t0: int, length: int) -> tuple[np.ndarray, np.ndarray]: ...


class _Handles:
    """Small LRUs of open files, one per thread of one process; never pickled, and dropped in a forked child.

    A forked DataLoader worker inherits the parent's descriptors, which share one file offset with the parent: seeking
    in both would interleave their reads. Threads of one process would share a handle's offset the same way. So a
    thread only ever reads through handles it opened itself, in this process.

    Beside each file on a local filesystem, a read-only memory map of it (`mapped`), made at its first window and
    closed with the file: a window is then one copy from the page cache's pages, without a read() call's copy
    through the kernel (2.6x less CPU per 2.9 MB window on a freshly written shard, `benchmarks/RESULTS.md`).
    """

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self._local = threading.local()

    def _state(self) -> Any:
        st = self._local
        if getattr(st, "pid", None) != os.getpid():  # new thread, or inherited through fork: open our own
            st.files, st.maps, st.pid = OrderedDict(), {}, os.getpid()
        return st

    @property
    def files(self) -> OrderedDict[str, Any]:
        """The calling thread's open files by url (most recently used last)."""
        return self._state().files

    @property
    def pid(self) -> int:
        """The process that opened the calling thread's files."""
        return self._state().pid

    @pid.setter
    def pid(self, value: int) -> None:
        self._state().pid = value

    def get(self, url: str) -> Any:
        st = self._state()
        f = st.files.pop(url, None)
        if f is None:
            f = open_read(url)
        st.files[url] = f
        while len(st.files) > self.size:
            old_url, old = st.files.popitem(last=False)
            _unmap(st.maps.pop(old_url, None))
            old.close()
        return f

    def mapped(self, url: str) -> mmap.mmap | None:
        """A read-only map of the calling thread's open file `url` (after `get`); None for a file that is not
        mapped: remote, empty, or not on a local filesystem (`on_local_fs`)."""
        st = self._state()
        if url not in st.maps:
            st.maps[url] = None
            if is_local(url) and on_local_fs(local_path(url)):
                try:
                    st.maps[url] = mmap.mmap(st.files[url].fileno(), 0, access=mmap.ACCESS_READ)
                except (AttributeError, OSError, ValueError):  # no descriptor, empty, or not mappable
                    pass
        return st.maps[url]

    def close(self) -> None:
        """Close the calling thread's files (other threads' files close when their thread ends)."""
        st = self._state()
        for m in st.maps.values():
            _unmap(m)
        for f in st.files.values():
            f.close()
        st.files.clear()
        st.maps.clear()


LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs", "tmpfs", "ramfs", "overlay"})


def filesystem_type(path: str, mounts: str) -> str:
    """The type of the filesystem holding the absolute path `path`, from a /proc/self/mounts text (the longest
    mount point above it; "" when none is)."""
    best, found = "", ""
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[1])  # \040 is a space
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, found = point, parts[2]
    return found


@functools.lru_cache(maxsize=1024)
def on_local_fs(path: str) -> bool:
    """Whether a file lies on a local filesystem (LOCAL_FILESYSTEMS, per /proc/self/mounts). Only those are
    mapped: a page fault on a map that meets an I/O error (a network filesystem's timeout) kills the process with
    SIGBUS, where read() raises an OSError that the loader reports."""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = f.read()
    except OSError:
        return False
    return filesystem_type(os.path.realpath(path), mounts) in LOCAL_FILESYSTEMS


def _unmap(m: mmap.mmap | None) -> None:
    """Close a map unless an array still views it (it is then unmapped when the last view goes)."""
    if m is not None:
        try:
            m.close()
        except BufferError:
            pass


class WebDatasetReader:
    """Reads trajectories from tar shards through a member index built from tar headers."""

    def __init__(self, map_files: bool = True) -> None:
        self._handles = _Handles()
        self.map_files = map_files  # copy windows from a map of each local shard (False: read() them)
        self._members: dict[tuple[str, int], _Member] = {}  # headers parsed from maps, by (url, fields offset)

    def __getstate__(self) -> dict[str, Any]:
        return {"map_files": self.map_files}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._handles = _Handles()
        self.map_files = state.get("map_files", True)
        self._members = {}

    def refs(self, ds: DatasetInfo, split: str, index: ShardIndex | None = None) -> list[TrajRef]:
        """Every trajectory of `split` (sorted by index), from `index` where it holds a shard (the recorded index, or
        what the validator read), else from the shard's tar headers, read here under dpot_format's member rules
        (links, odd names, duplicates refused)."""
        out: list[TrajRef] = []
        for shard in ds.shards_of(split):
            try:
                samples = shard_samples(shard.url, (index or {}).get(shard.url))
            except FormatError as e:
                raise DataError(f"shard {e}") from None
            out += shard_refs(ds, shard, samples)
        out.sort(key=lambda r: r.index)
        return out

    def read(self, ref: TrajRef, t0: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Seek to frame t0 of fields.npy and read `length` frames; read the mask whole."""
        return self.read_into(ref, t0, length, lambda shape: np.empty(shape, np.float32))

    def read_into(self, ref: TrajRef, t0: int, length: int, into: Window, mask_into: MaskSlot | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
        """`read`, with the frames read straight into `into(shape)` (a slot of the caller's batch buffer) and, with
        `mask_into`, the mask copied into `mask_into(shape)` (cast as `np.copyto(..., casting="unsafe")` casts the
        uint8 mask `read` returns). From a mapped shard the two .npy headers are parsed once per trajectory
        (`_Member`) and compared with the map's bytes on every read; anything unusual (a cut file, a changed
        header, frames out of range) goes through `read_window`, which reports it as before."""
        handles = self._handles
        f = handles.get(ref.url)
        mapped = handles.mapped(ref.url) if self.map_files else None
        if mapped is not None:
            got = read_mapped(f, mapped, ref, t0, length, self._members, into, mask_into)
            if got is not None:
                return got
        fields, mask = read_window(f, ref, t0, length, into, mapped)
        return fields, mask_to(mask, mask_into)


def mask_to(mask: np.ndarray, mask_into: MaskSlot | None) -> np.ndarray:
    """A read window's uint8 `mask`, copied into `mask_into(shape)` when given (cast: nonzero is True in a bool
    slot), else itself."""
    if mask_into is None:
        return mask
    out = mask_into(mask.shape)
    np.copyto(out, mask, casting="unsafe")
    return out


def shard_refs(ds: DatasetInfo, shard: Shard, samples: Sequence[SampleIndex]) -> list[TrajRef]:
    """The trajectories of one indexed shard of `ds`; DataError when it holds another count than the manifest."""
    if len(samples) != shard.samples:
        raise DataError(f"shard {shard.url}: holds {len(samples)} trajectories, the manifest says {shard.samples}")
    return [TrajRef(ds.name, s.index, shard.url, s.fields.offset, s.mask.offset, s.mask.size, -1) for s in samples]


def indexed_refs(ds: DatasetInfo, split: str, index: ShardIndex) -> list[TrajRef] | None:
    """Every trajectory of `split` from `index` alone (sorted by index), reading nothing; None when `index` lacks
    one of the split's shards."""
    shards = ds.shards_of(split)
    if not shards or any(s.url not in index for s in shards):
        return None
    return sorted((r for s in shards for r in shard_refs(ds, s, index[s.url])), key=lambda r: r.index)


def indexed_trajectories(datasets: Sequence[DatasetInfo], split: str, index: ShardIndex) -> dict[str, list[TrajRef]]:
    """Per dataset, its `split` trajectories from `index` alone (nothing is read), for the datasets whose shards of
    that split it all holds."""
    found = {d.name: indexed_refs(d, split, index) for d in datasets}
    return {name: refs for name, refs in found.items() if refs is not None}


def read_window(f: Any, ref: TrajRef, t0: int, length: int, into: Window | None = None,
                mapped: mmap.mmap | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Frames [t0, t0 + length) of `ref`'s fields.npy and its mask, from the open shard file `f`. `into`: gives
    the array the frames are read into (a slot of a batch buffer: one copy from the file, none after); default a
    new array. `mapped`: a read-only map of `f`, the frames then copied from it (where the file still holds them:
    a shorter file is read, and reported, as without it)."""
    f.seek(ref.fields_offset)
    try:
        shape, fortran, dtype, offset = read_npy_header(f, f"{ref.url}: {ref.id} fields.npy")
    except FormatError as e:
        raise DataError(str(e)) from None
    if fortran or dtype != np.float32 or len(shape) not in (4, 5):
        raise DataError(f"{ref.url}: {ref.id} fields.npy must be float32 C-order (T, C, Y, X) or (T, C, Z, Y, X), "
                        f"got {dtype} shape {shape} fortran={fortran}")
    if t0 < 0 or t0 + length > shape[0]:
        raise DataError(f"{ref.url}: {ref.id} has {shape[0]} frames, asked for [{t0}, {t0 + length})")
    frame = int(np.prod(shape[1:]))
    start = ref.fields_offset + offset + t0 * frame * 4
    fields = np.empty((length, *shape[1:]), dtype=np.float32) if into is None else into((length, *shape[1:]))
    if mapped is not None and start + fields.nbytes <= min(len(mapped), os.fstat(f.fileno()).st_size):
        # one copy from the page cache, GIL released; the size check: a map of a file cut since reads past its end
        np.copyto(fields.reshape(-1).view(np.uint8), np.frombuffer(mapped, np.uint8, fields.nbytes, start))
        got = fields.nbytes
    else:
        f.seek(start)
        got = f.readinto(memoryview(fields).cast("B"))  # straight into the output array, no intermediate copy
    if got != fields.nbytes:
        raise DataError(f"{ref.url}: {ref.id} fields.npy ends early: read {got} of {fields.nbytes} bytes "
                        f"for frames [{t0}, {t0 + length})")
    f.seek(ref.mask_offset)
    try:
        mask = load_npy(f.read(ref.mask_size), f"{ref.url}: {ref.id} mask.npy")
    except FormatError as e:
        raise DataError(str(e)) from None
    return fields, mask.astype(np.uint8, copy=False)


class _Member:
    """A trajectory's two .npy headers in its shard, parsed once from the shard's map: the fields' shape and where
    frame 0 starts, the mask's dtype, shape and data, and the raw header bytes they were parsed from."""

    __slots__ = ("shape", "data", "frame_bytes", "fields_header", "mask_header", "mask_dtype", "mask_shape",
                 "mask_order", "mask_count", "mask_data", "mask_end", "plain_mask")

    def __init__(self, mapped: mmap.mmap, ref: TrajRef, size: int) -> None:
        """Parse from the first `size` bytes of the map (the file's size now); _Unusual for anything `read_window`
        would refuse or report (it then does, with its own message)."""
        try:
            header = read_npy_header(_MapFile(mapped, ref.fields_offset, size))
            mask = read_npy_header(_MapFile(mapped, ref.mask_offset, size))
        except FormatError:
            raise _Unusual from None
        shape = header.shape
        if header.fortran or header.dtype != np.float32 or len(shape) not in (4, 5):
            raise _Unusual
        if mask.data_offset + mask.nbytes != ref.mask_size or ref.mask_offset + ref.mask_size > size:
            raise _Unusual
        self.shape, self.frame_bytes = shape, int(np.prod(shape[1:])) * 4
        self.data = ref.fields_offset + header.data_offset
        self.fields_header = mapped[ref.fields_offset:self.data]
        self.mask_header = mapped[ref.mask_offset:ref.mask_offset + mask.data_offset]
        self.mask_dtype, self.mask_shape = mask.dtype, mask.shape
        self.mask_order = "F" if mask.fortran else "C"
        self.mask_count = mask.nbytes // mask.dtype.itemsize
        self.mask_data = ref.mask_offset + mask.data_offset
        self.mask_end = ref.mask_offset + ref.mask_size
        # uint8 and bool masks are copied as they are; others go through astype(uint8) first, as `read` does
        self.plain_mask = mask.dtype in (np.dtype(np.uint8), np.dtype(np.bool_))

    def unchanged(self, mapped: mmap.mmap, ref: TrajRef) -> bool:
        """Whether the map still holds the header bytes this was parsed from (call within the file's size)."""
        fields, mask = ref.fields_offset, ref.mask_offset
        return (mapped[fields:fields + len(self.fields_header)] == self.fields_header
                and mapped[mask:mask + len(self.mask_header)] == self.mask_header)


class _Unusual(Exception):
    """A member the mapped fast path leaves to `read_window` (which reports what is wrong with it)."""


class _MapFile:
    """The file-like `read(n)` that `read_npy_header` needs, over the first `size` bytes of a map, from `pos`."""

    def __init__(self, mapped: mmap.mmap, pos: int, size: int) -> None:
        self.mapped, self.pos, self.size = mapped, pos, size

    def read(self, n: int) -> bytes:
        data = self.mapped[self.pos:max(self.pos, min(self.pos + n, self.size))]
        self.pos += len(data)
        return data


def read_mapped(f: Any, mapped: mmap.mmap, ref: TrajRef, t0: int, length: int,
                members: dict[tuple[str, int], _Member], into: Window | None = None,
                mask_into: MaskSlot | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """`read_window` from the map of the open shard `f` with its headers parsed once (`members`, the reader's
    cache): the same arrays, without a read() call, a header parse or a mask array per window. None when the
    read is unusual (a header `read_window` refuses or that changed since it was parsed, a file shorter than the
    window or the mask, frames out of range): `read_window` then reads and reports it. Nothing past the file's
    size now is touched (a map of a file cut since faults with SIGBUS there)."""
    size = min(len(mapped), os.fstat(f.fileno()).st_size)
    key = (ref.url, ref.fields_offset)
    member = members.get(key)
    if member is None:
        try:
            member = members[key] = _Member(mapped, ref, size)
        except _Unusual:
            return None
    start = member.data + t0 * member.frame_bytes
    nbytes = length * member.frame_bytes
    if (t0 < 0 or t0 + length > member.shape[0] or start + nbytes > size or member.mask_end > size
            or not member.unchanged(mapped, ref)):
        members.pop(key, None)
        return None
    shape = (length, *member.shape[1:])
    fields = np.empty(shape, dtype=np.float32) if into is None else into(shape)
    np.copyto(fields.reshape(-1).view(np.uint8), np.frombuffer(mapped, np.uint8, nbytes, start))
    stored = np.frombuffer(mapped, member.mask_dtype, member.mask_count, member.mask_data).reshape(
        member.mask_shape, order=member.mask_order)
    if mask_into is None:
        return fields, stored.astype(np.uint8)  # an array of its own, as `read_window`'s
    mask = mask_into(member.mask_shape)
    np.copyto(mask, stored if member.plain_mask else stored.astype(np.uint8), casting="unsafe")
    return fields, mask


class ZarrReader:
    """Reads trajectories from the dataset's group in the Zarr store (one trajectory per chunk)."""

    def __init__(self) -> None:
        self._groups: dict[str, Any] = {}
        self._arrays: dict[tuple[str, str], Any] = {}
        self._pid = os.getpid()
        self._lock = threading.RLock()  # opening is serialised; reading an opened array is safe from any thread

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._groups, self._arrays, self._pid = {}, {}, os.getpid()
        self._lock = threading.RLock()

    def _group(self, url: str, group: str) -> Any:
        if self._pid != os.getpid():  # opened in a parent process before a fork: reopen in this one
            self._groups, self._arrays, self._pid, self._lock = {}, {}, os.getpid(), threading.RLock()
        key = f"{url}::{group}"
        with self._lock:
            if key not in self._groups:
                import zarr

                self._groups[key] = zarr.open_group(url, mode="r", path=group)
            return self._groups[key]

    def refs(self, ds: DatasetInfo, split: str, index: ShardIndex | None = None) -> list[TrajRef]:
        """Rows whose `split` entry matches; the row number is the trajectory index (`index`: unused, no shards)."""
        if ds.zarr_url is None or ds.zarr_group is None:
            raise DataError(f"{ds.manifest}: dataset {ds.name!r} has no Zarr store; use the webdataset backend")
        g = self._group(ds.zarr_url, ds.zarr_group)
        splits = np.array([str(v) for v in np.asarray(g["split"][:]).ravel()])  # zarr 3 strings -> plain str
        return [TrajRef(ds.name, int(i), f"{ds.zarr_url}::{ds.zarr_group}", -1, -1, -1, int(i))
                for i in np.flatnonzero(splits == split)]

    def _array(self, url: str, name: str) -> Any:
        """Array `name` of the group at `url` ("store::group"), opened once per process (opening reads metadata)."""
        key = (url, name)
        if self._pid != os.getpid():
            self._groups, self._arrays, self._pid, self._lock = {}, {}, os.getpid(), threading.RLock()
        with self._lock:
            if key not in self._arrays:
                self._arrays[key] = self._group(*url.split("::", 1))[name]
            return self._arrays[key]

    def read(self, ref: TrajRef, t0: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Slice frames [t0, t0 + length) of row `ref.row`."""
        fields = np.asarray(self._array(ref.url, "fields")[ref.row, t0:t0 + length], dtype=np.float32)
        mask = np.asarray(self._array(ref.url, "mask")[ref.row], dtype=np.uint8)
        return fields, mask


def make_reader(backend: str) -> TrajectoryReader:
    """'webdataset' or 'zarr'."""
    if backend == "webdataset":
        return WebDatasetReader()
    if backend == "zarr":
        return ZarrReader()
    raise DataError(f"unknown data backend {backend!r}; expected 'webdataset' or 'zarr'")
