"""The reader contract every raw source follows, so that `dpot_data.ingest` stays source-agnostic.

A source is a module `dpot_data.sources.<name>` exposing

    read(paths: Sequence[str | Path], **options) -> ReadResult

It opens the raw files lazily (dask-backed, nothing loaded whole) and returns a `ReadResult`:

- `data`: an `xarray.Dataset`, the canonical trajectory of DESIGN.md, at native resolution and native channels:
    * `fields` float32, dims (sample, time, channel, y, x); 3D: (sample, time, channel, z, y, x); dask-backed,
      chunked along `sample` only (a chunk is a block of whole trajectories);
    * `mask` uint8, dims (sample, y, x); 3D: (sample, z, y, x); 1 = fluid/valid cell, 0 = solid; all ones when the
      source has no geometry;
    * coordinates: `sample` (str, stable id "<raw file name>#<index in that file>"), `time` (float, physical time
      where known, else the frame index), `channel` (str, native channel names), `y`, `x` (and `z`) (float);
    * attrs: `source` (module name, e.g. "fno"), `dataset` (default dataset name, `[a-z0-9_-]+`),
      `boundary` ("periodic" | "non-periodic"), `parameters` (JSON-able dict of PDE parameters shared by all
      samples), `dt` (float time step between frames, or None), `provenance` (JSON-able dict: reader, reader_version,
      and per input file what the reader saw, e.g. container and dtype); optionally `time_is_index` (True when the
      source states no times and `time` holds frame indices: ingest then leaves `dt` null instead of inferring 1).
- `split`: None, or a numpy str array (one of "train" | "valid" | "test" per sample) when the source fixes the split
  (e.g. PDEArena's file split); ingest then keeps it instead of drawing one.
- `lengths`: None, or an int array per sample of valid frames when trajectories differ in length (e.g. CFDBench);
  `fields` is then NaN-padded past each length, and ingest cuts every trajectory into pieces of `segment` frames
  AFTER the split (so all pieces of one trajectory share its split); piece ids are "<sample id>/seg<k>".
- `segment`: the source's default piece length in frames for `lengths` (IngestOptions.segment overrides it).
- `sample_params`: per-sample parameters, {name: numpy array with one value per sample} (e.g. PDEArena `buo_y`).
- `skipped`: [(what, reason)] raw files or trajectories left out (a corrupt file among many, for instance).
- `inputs`: the raw file paths actually read (ingest hashes each one into the manifest).

Bad input raises `dpot_data.errors.InputError(path, "what was expected")`, nothing else; the CLI prints it as one
line "<file>: <what was expected>" and exits with code 2 before anything is written.

Sizes a raw file declares (array shapes in HDF5/MAT/npy headers) are never trusted: before any data is read, every
reader checks the shapes it will read against the limits below and against the bytes actually stored
(`dpot_data.sources._blocks.check_stored`, `check_sizes`), and refuses a file beyond them with one InputError line
naming the file, the key and the declared and allowed sizes (docs/sources.md, "Bad input").
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Protocol, Sequence

import numpy as np
import xarray as xr

from dpot_format.names import DATASET_NAME, SPLITS  # noqa: F401 - the format's rules, re-exported for the readers

BOUNDARIES = ("periodic", "non-periodic")

# ------------------------------------------------------------------------------------------------------------------
# Limits on what a raw file may declare. The published sets stay far below them (the largest: 10 000 trajectories in
# a file, 101 frames, a 512² grid, 0.9 GB per trajectory for 3D compressible NS at 128³); a file beyond them is
# refused before anything is read, so a few-KB file that declares petabytes cannot make ingest allocate or run
# without bound.
MAX_TRAJECTORIES = 1_000_000  # trajectories (samples, groups, cases) in one input file
MAX_FRAMES = 100_000  # frames of one trajectory
MAX_GRID_SIDE = 16_384  # points along any spatial axis
MAX_TRAJECTORY_BYTES = 4 << 30  # one trajectory, all channels, as float32: a block holds at least one
# Declared (uncompressed) bytes of an array against the bytes actually stored for it on disk: refused beyond
# MAX_INFLATION times the stored bytes plus INFLATION_SLACK_BYTES. Compression of real float32/float64 PDE fields is
# well under 10x (1.0-1.2x for the published lzf files); unwritten HDF5 chunks, a sparse file or a zlib bomb give
# ratios of 10^3 to 10^12. The slack lets small, very compressible files (constant test fields) through.
MAX_INFLATION = 100
INFLATION_SLACK_BYTES = 64 << 20
MAX_JSON_BYTES = 1 << 20  # a CFDBench case.json (published ones hold ~200 bytes)


@dataclass
class ReadResult:
    """What a source reader hands to ingest: the lazy canonical dataset plus per-sample side information."""

    data: xr.Dataset
    split: np.ndarray | None = None
    lengths: np.ndarray | None = None
    segment: int | None = None
    sample_params: dict[str, np.ndarray] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    inputs: list[Path] = field(default_factory=list)

    @property
    def n_samples(self) -> int:
        """Number of trajectories (before any segmenting)."""
        return int(self.data.sizes["sample"])

    @property
    def spatial_dims(self) -> tuple[str, ...]:
        """("y", "x") for 2D, ("z", "y", "x") for 3D."""
        return tuple(self.data["fields"].dims[3:])


class Reader(Protocol):
    """The callable each source module exposes as `read`."""

    def __call__(self, paths: Sequence[str | Path], **options: object) -> ReadResult: ...


def load_source(name: str) -> ModuleType:
    """Import `dpot_data.sources.<name>` (a module with a `read` function); ValueError for an unknown source."""
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"invalid source name {name!r}")
    try:
        module = importlib.import_module(f"dpot_data.sources.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"dpot_data.sources.{name}":
            raise ValueError(f"unknown source {name!r}") from None
        raise
    if not callable(getattr(module, "read", None)):
        raise ValueError(f"source module dpot_data.sources.{name} has no read() function")
    return module


def check_result(result: ReadResult) -> None:
    """Assert that a reader's output follows the contract above (a programming error, not bad input, if not)."""
    ds = result.data
    if "fields" not in ds or "mask" not in ds:
        raise ValueError("ReadResult.data needs variables 'fields' and 'mask'")
    f, m = ds["fields"], ds["mask"]
    if f.dims not in (("sample", "time", "channel", "y", "x"), ("sample", "time", "channel", "z", "y", "x")):
        raise ValueError(f"fields dims must be (sample,time,channel,[z,]y,x), got {f.dims}")
    if m.dims != ("sample",) + f.dims[3:]:
        raise ValueError(f"mask dims must be {('sample',) + f.dims[3:]}, got {m.dims}")
    if f.dtype != np.float32 or m.dtype != np.uint8:
        raise ValueError(f"fields must be float32 and mask uint8, got {f.dtype} and {m.dtype}")
    for key in ("source", "dataset", "boundary", "parameters"):
        if key not in ds.attrs:
            raise ValueError(f"ReadResult.data.attrs lacks {key!r}")
    if ds.attrs["boundary"] not in BOUNDARIES:
        raise ValueError(f"boundary must be one of {BOUNDARIES}, got {ds.attrs['boundary']!r}")
    if not DATASET_NAME.match(ds.attrs["dataset"]):
        raise ValueError(f"dataset name {ds.attrs['dataset']!r} does not match [a-z0-9_-]+")
    n = result.n_samples
    ids = ds["sample"].values
    if len(set(ids.tolist())) != n:
        raise ValueError("sample ids must be unique")
    if result.split is not None:
        if len(result.split) != n or not set(np.asarray(result.split).tolist()) <= set(SPLITS):
            raise ValueError(f"split must hold one of {SPLITS} per sample")
    if result.lengths is not None:
        lengths = np.asarray(result.lengths)
        if len(lengths) != n or lengths.min(initial=1) < 1 or lengths.max(initial=0) > ds.sizes["time"]:
            raise ValueError("lengths must hold 1..time frames per sample")
    for name, values in result.sample_params.items():
        if len(values) != n:
            raise ValueError(f"sample_params[{name!r}] needs one value per sample")
