"""Zarr v3 writer of one dataset group: `fields` one trajectory per chunk, `mask`, `channel_valid`, coordinates and
CF-style attributes, written block by block with fixed codec settings so the same data gives the same bytes."""

from __future__ import annotations

import contextlib
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import zarr
from numcodecs import Blosc, Zstd
from zarr.codecs import BloscCodec, ZstdCodec

from dpot_format.io import ArrayHasher, drop_cached, fsync_dir, sha256_array

# Chunk codecs by the name the manifest records: (the Zarr codec in the array metadata, the numcodecs encoder that
# gives the same stored bytes for a chunk). blosc-lz4 with byte shuffle is the default since schema version 2: it
# encodes about 3x faster than zstd level 3, decodes faster, and stores less on PDE fields (benchmarks/codecs.py,
# benchmarks/RESULTS.md "Zarr chunk codec").
CODECS: dict[str, tuple[Any, Any]] = {
    "blosc-lz4-shuffle": (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
                          Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0)),
    "zstd-3": (ZstdCodec(level=3, checksum=False), Zstd(level=3)),  # schema version 1
}
CODEC_NAME = "blosc-lz4-shuffle"
# chunk files named "c.<row>.0.0..." beside the array's zarr.json: one file per trajectory and no folder per chunk
CHUNK_KEYS = {"name": "default", "separator": "."}


class StagedDataLost(RuntimeError):
    """A staged store does not hold what its resume state says it holds (a power cut lost written chunks)."""


@dataclass
class EncodedRows:
    """The stored chunks of consecutive trajectories, one per trajectory; None for a chunk holding only the fill
    value, which Zarr does not store (its absence reads as the fill value)."""

    fields: list[bytes | None]
    mask: list[bytes | None]


def encode_rows(fields: np.ndarray, mask: np.ndarray, codec: str) -> EncodedRows:
    """Encode each trajectory's `fields` and `mask` chunk as the store's codec does. Runs in the block tasks, so that
    compression uses every worker instead of the one thread that writes."""
    encoder = CODECS[codec][1]
    return EncodedRows([_encode(encoder, np.ascontiguousarray(r, dtype="<f4"), np.isnan) for r in fields],
                       [_encode(encoder, np.ascontiguousarray(r, dtype=np.uint8), np.logical_not) for r in mask])


def _encode(encoder: Any, chunk: np.ndarray, is_fill: Any) -> bytes | None:
    if is_fill(chunk.flat[0]) and is_fill(chunk).all():
        return None
    return bytes(encoder.encode(chunk))


def chunk_path(array_dir: str | Path, row: int, ndim: int) -> str:
    """The chunk file of trajectory `row` in the folder of an array of `ndim` dimensions chunked one trajectory per
    chunk: c.<row>.0.0... (CHUNK_KEYS)."""
    return os.path.join(array_dir, ".".join(["c", str(row)] + ["0"] * (ndim - 1)))


def put_chunk(array_dir: str | Path, row: int, ndim: int, data: bytes | None) -> None:
    """Store the chunk of trajectory `row` (`chunk_path`), or remove it for a fill-value chunk (None: Zarr reads an
    absent chunk as the fill value)."""
    path = chunk_path(array_dir, row, ndim)
    if data is None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    with open(path, "wb") as fh:
        fh.write(data)


def write_rows(group_dir: str | Path, first_row: int, encoded: EncodedRows, space_dims: int) -> None:
    """Store encoded trajectories first_row, first_row + 1, ... of a group's `fields` and `mask` arrays: what a block
    task does when it can write into the staged store itself (the writer then only hashes them)."""
    for k, (f, m) in enumerate(zip(encoded.fields, encoded.mask)):
        put_chunk(os.path.join(group_dir, "fields"), first_row + k, 3 + space_dims, f)
        put_chunk(os.path.join(group_dir, "mask"), first_row + k, 1 + space_dims, m)

LONG_NAMES = {
    "fields": "physical fields per trajectory, frame and channel on the target grid",
    "mask": "geometry mask (1 = fluid/valid cell, 0 = solid)",
    "channel_valid": "true for data channels, false for padded channels",
    "sample": "stable trajectory id: <raw file name>#<index>[/seg<k>]",
    "split": "split of the trajectory (train, valid or test)",
    "time": "time of each frame",
    "channel": "channel name",
    "x": "x coordinate of cell",
    "y": "y coordinate of cell",
    "z": "z coordinate of cell",
}


@dataclass
class ZarrLayout:
    """Everything about a dataset group that is known before the data: shapes, coordinates, per-sample labels."""

    group: str
    frames: int
    channels: list[str]
    channel_valid: np.ndarray
    fill_value: float
    coords: dict[str, np.ndarray]  # spatial coordinates by dim name, in (z,) y, x order
    time: np.ndarray
    samples: np.ndarray  # str ids, one per stored trajectory
    splits: np.ndarray  # str, one per stored trajectory
    sample_params: dict[str, np.ndarray] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    codec: str = field(default_factory=lambda: CODEC_NAME)  # a key of CODECS
    # CF `units` by array name, and "channel_units" (one per channel) for `fields` (dpot_data.units.array_units)
    units: dict[str, Any] = field(default_factory=dict)

    @property
    def spatial_dims(self) -> list[str]:
        return list(self.coords)

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.coords.values())


class ZarrDatasetWriter:
    """Creates the group's arrays up front, then takes consecutive blocks of trajectories; hashes them as it goes."""

    def __init__(self, store_path: str | Path, layout: ZarrLayout) -> None:
        """A writer of `layout` into the store at `store_path`; `create()` starts it, `load_state_dict` resumes it."""
        self.store_path = Path(store_path)
        self.layout = layout
        self.n = len(layout.samples)
        self.written = 0
        self._hash = {"fields": ArrayHasher(), "mask": ArrayHasher()}
        self.group: Any = None
        self._syncer: ThreadPoolExecutor | None = None  # syncs a block's chunk files while the block is hashed

    def create(self) -> "ZarrDatasetWriter":
        """Create the group, its arrays and every per-sample and coordinate array (the data arrays stay empty)."""
        layout = self.layout
        root = zarr.open_group(str(self.store_path), mode="a", zarr_format=3)
        root.attrs.update(_root_attrs(root.attrs.asdict(), layout.group))
        self.group = root.create_group(layout.group, overwrite=True, attributes=_json_safe(layout.attrs))
        space = layout.spatial_dims
        shape = layout.spatial_shape
        c = len(layout.channels)
        self.fields = self._array("fields", (self.n, layout.frames, c, *shape), (1, layout.frames, c, *shape),
                                  "float32", ["sample", "time", "channel", *space], np.nan,
                                  {"coordinates": " ".join(["split", "channel_valid", *layout.sample_params]),  # labels
                                   "pad_fill_value": layout.fill_value,
                                   **({"channel_units": layout.units["channel_units"]}
                                      if "channel_units" in layout.units else {})})
        self.mask = self._array("mask", (self.n, *shape), (1, *shape), "uint8", ["sample", *space], 0,
                                {"flag_values": [0, 1], "flag_meanings": "solid fluid"})
        self._put("channel_valid", np.asarray(layout.channel_valid, dtype=bool), ["channel"])
        self._put("channel", np.asarray(layout.channels, dtype=str), ["channel"])
        self._put("sample", np.asarray(layout.samples, dtype=str), ["sample"])
        self._put("split", np.asarray(layout.splits, dtype=str), ["sample"])
        self._put("time", np.asarray(layout.time, dtype=np.float64), ["time"])
        for dim, values in layout.coords.items():
            self._put(dim, np.asarray(values, dtype=np.float64), [dim])
        for name, values in layout.sample_params.items():
            self._put(name, np.asarray(values), ["sample"], {"long_name": f"per-trajectory parameter {name}"})
        return self

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs: how many trajectories are written (rows after them are rewritten), and the
        digests of `fields` and `mask` so far, which the resumed run checks the store against."""
        return {"rows": int(self.written), "digests": {k: h.hexdigest() for k, h in self._hash.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Reopen the staged group without touching its data, and hash rows [0, rows) as `write_block` would have;
        StagedDataLost when they do not hash to the state's digests (chunks lost to a power cut after the journal
        recorded them: the store is not what the journal says)."""
        rows = int(state["rows"])
        self.group = zarr.open_group(str(self.store_path), mode="r+")[self.layout.group]
        self.fields, self.mask = self.group["fields"], self.group["mask"]
        self._hash = {"fields": ArrayHasher(), "mask": ArrayHasher()}
        step = max(1, (64 << 20) // max(1, int(np.prod(self.fields.shape[1:])) * 4))
        for i in range(0, rows, step):
            j = min(rows, i + step)
            self._hash["fields"].update(np.asarray(self.fields[i:j], dtype=np.float32))
            self._hash["mask"].update(np.asarray(self.mask[i:j], dtype=np.uint8))
        self.written = rows
        expected = state.get("digests")
        found = {k: h.hexdigest() for k, h in self._hash.items()}
        if expected is not None and found != expected:
            raise StagedDataLost(f"{self.store_path}: the first {rows} trajectories of the staged store do not hash "
                                 "to what the journal recorded for them")

    def _array(self, name: str, shape: tuple, chunks: tuple, dtype: str, dims: list[str], fill: Any,
               extra: Mapping[str, Any] | None = None) -> zarr.Array:
        units = self.layout.units.get(name) if np.dtype(dtype).kind in "biuf" else None
        attrs = {"long_name": LONG_NAMES.get(name, name), **({"units": units} if units else {}), **(extra or {})}
        return self.group.create_array(name, shape=shape, chunks=chunks, dtype=dtype,
                                       compressors=CODECS[self.layout.codec][0], chunk_key_encoding=CHUNK_KEYS,
                                       fill_value=fill, dimension_names=dims, attributes=_json_safe(attrs))

    def _put(self, name: str, values: np.ndarray, dims: list[str], extra: Mapping[str, Any] | None = None) -> None:
        shape = tuple(values.shape)
        chunks = tuple(max(1, s) for s in shape)
        dtype = str if values.dtype.kind in "UO" else values.dtype
        fill = "" if dtype is str else (False if values.dtype == bool else 0)
        arr = self._array(name, shape, chunks, dtype, dims, fill, extra)
        if values.size:
            arr[...] = values

    def write_block(self, fields: np.ndarray, mask: np.ndarray, encoded: EncodedRows | None = None,
                    stored: bool = False) -> None:
        """Write the next consecutive trajectories: fields (b, time, channel, *space) float32, mask (b, *space) uint8,
        given already encoded (`encode_rows`) or not, or already `stored` by the task that made them
        (`write_rows`: only hashed here). Chunk files are written straight into the local store, the same bytes
        Zarr writes. When the call returns they are on disk (`_settle`), so that a resume point recorded after it
        holds even through a power cut. The sync (waiting on the disk) runs on a helper thread while the block is
        hashed (CPU): both release the GIL, so a block costs the longer of the two, not their sum."""
        b = fields.shape[0]
        if self.written + b > self.n:
            raise ValueError(f"block of {b} overruns the {self.n} trajectories of {self.layout.group}")
        fields = np.ascontiguousarray(fields, dtype=np.float32)
        mask = np.ascontiguousarray(mask, dtype=np.uint8)
        if not stored:
            encoded = encoded if encoded is not None else encode_rows(fields, mask, self.layout.codec)
            write_rows(self.store_path / self.layout.group, self.written, encoded, len(self.layout.coords))
        if self._syncer is None:
            self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpot-zarr-sync")
        settled = self._syncer.submit(self._settle, range(self.written, self.written + b))
        try:
            self._hash["fields"].update(fields)
            self._hash["mask"].update(mask)
        finally:
            settled.result()  # on disk before the call returns, whatever the hashing did
        self.written += b

    def _settle(self, rows: range) -> None:
        """Put the chunk files of these rows and their folder entries on disk (fdatasync, folder fsync), then let the
        page cache forget them (fadvise DONTNEED): the ingest never reads them back, and on the page-cache memory
        they free, the next writes run several times faster than on memory never touched before (benchmarks/
        RESULTS.md). What `close` syncs at the end is then little more than the metadata."""
        for name, arr in (("fields", self.fields), ("mask", self.mask)):
            folder = self.store_path / self.layout.group / name
            for row in rows:
                try:
                    fd = os.open(chunk_path(folder, row, len(arr.shape)), os.O_RDONLY)
                except FileNotFoundError:  # a fill-value chunk: not stored
                    continue
                try:
                    os.fdatasync(fd)
                    drop_cached(fd)
                finally:
                    os.close(fd)
            fsync_dir(folder)

    def close(self) -> dict[str, str]:
        """Check completeness, consolidate metadata, fsync every file; returns {array name: sha256} of numeric arrays."""
        if self._syncer is not None:
            self._syncer.shutdown(wait=True)
            self._syncer = None
        if self.written != self.n:
            raise ValueError(f"{self.layout.group}: wrote {self.written} of {self.n} trajectories")
        digests = {"fields": self._hash["fields"].hexdigest(), "mask": self._hash["mask"].hexdigest()}
        for name in ["channel_valid", "time", *self.layout.coords]:
            digests[name] = sha256_array(self.group[name])
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            zarr.consolidate_metadata(str(self.store_path))
        fsync_tree(self.store_path)
        return digests


def _root_attrs(existing: Mapping[str, Any], group: str) -> dict[str, Any]:
    """Attributes of the store's root group: it holds no arrays, so it names its dataset groups and how to open one
    (`xarray.open_zarr(store)` without `group=` shows these)."""
    datasets = sorted({*existing.get("datasets", []), group})
    return {"title": "dpot Zarr store: one group per dataset (docs/format.md)", "datasets": datasets,
            "open_with": f"xarray.open_dataset(STORE, engine='zarr', group='{datasets[0]}')"}


def fsync_tree(root: str | Path) -> None:
    """Make every file and folder under root durable before it is renamed into place: one syncfs(2) of the
    filesystem on Linux (one journal commit instead of one per chunk file), else fsync of each file and folder."""
    if _syncfs(root):
        return
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as fh:
                os.fsync(fh.fileno())
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _syncfs(path: str | Path) -> bool:
    """syncfs(2) on the filesystem holding path; False where it is not available."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name or not hasattr(os, "O_DIRECTORY"):
        return False
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return syncfs(fd) == 0
    finally:
        os.close(fd)


def _json_safe(value: Any) -> Any:
    """Convert numpy scalars/arrays inside attributes to plain JSON types."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return _json_safe(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    return value
