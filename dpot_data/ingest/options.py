"""What an ingest is asked to do (`IngestOptions`), what it reports back (`IngestOutcome`), and their parsing."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dpot_data.errors import InputError
from dpot_data.writers.wds_shards import DEFAULT_SHARD_BYTES

FORMATS = ("zarr", "wds")
CONVENTIONS = ("dpot-reference", "canonical")
MODEL_LAYOUTS = ("xy", "yx")
NONFINITE = ("skip", "raise")  # IngestOptions.nonfinite -> the readers' check_finite: True (scan) or "raise"
NOT_OUTPUT_OPTIONS = frozenset({"overwrite", "progress", "workers", "scheduler", "command", "card", "max_abs"})
# --max-abs: the largest magnitude a stored value may have. Field values of the public PDE datasets stay below 1e10
# (The Well's, in code units, too); a damaged chunk (LZF and uncompressed HDF5 chunks carry no checksum) decodes to
# bytes whose exponents are random, so of its thousands of values some exceed any such bound.
MAX_ABS = 1e15
PER_SOURCE = "per-source"


@dataclass
class IngestOptions:
    """How to turn a ReadResult into shards. `split`: train fraction, or (train, valid) fractions, rest is test."""

    # target grid: one size for every spatial axis, or one per axis in the stored order ((y, x), (z, y, x)); None
    # or 0 keeps the native grid; PER_SOURCE (the default) is the reference's choice for the data
    # (`default_resolution`: 128 for the paper's 2D sources, the native grid for 3D data and own data)
    resolution: int | tuple[int, ...] | str | None = PER_SOURCE
    channels: int | None = None  # pad to this many channels; None: 4, or the native count when larger (3D CNS: 5)
    fill: float = 1.0
    resample: str = "auto"  # auto | fourier | bilinear | bilinear-antialias | bicubic
    mask_resample: str = "nearest"  # nearest | area-threshold
    formats: tuple[str, ...] = FORMATS
    # None: the convention's split (the reference's rule where the reader knows it), else seeded 0.9; a value given
    # here replaces a reader's split with the seeded rule (recorded as a deviation from the convention)
    split: tuple[float, ...] | None = None
    convention: str = "dpot-reference"  # dpot-reference: what the released DPOT checkpoints saw; canonical: ours
    seed: int = 0
    name: str | None = None
    shard_size: int = DEFAULT_SHARD_BYTES
    segment: int | None = None  # frames per piece; defaults to the reader's when trajectories differ in length
    block: int | None = None  # trajectories per task, passed to readers that take `block` (tasks follow dask chunks)
    # trajectories holding NaN/Inf: "skip" (found by a scan when the files are opened, left out and listed) or
    # "raise" (no scan: checked in the block read, the ingest stops naming the trajectory)
    nonfinite: str = "skip"
    max_abs: float = MAX_ABS  # a stored value beyond this magnitude refuses the ingest (file, trajectory, value)
    overwrite: bool = False
    progress: bool = False
    stats: bool = True
    workers: int | None = None
    scheduler: str | None = None
    command: str | None = None  # recorded in the manifest; default: this process's command line
    card: bool = False  # write the dataset card (dpot_data.card) beside the manifest once it is published

    def identity(self) -> dict[str, Any]:
        """The fields that shape the output (not how or where it runs): part of the resume fingerprint."""
        return {k: v for k, v in asdict(self).items() if k not in NOT_OUTPUT_OPTIONS}


@dataclass
class IngestOutcome:
    """The manifest of OUT, where it is, and whether this call wrote it (False: an existing one was left alone)."""

    manifest: dict[str, Any]
    path: Path | str
    written: bool
    notes: list[str] = field(default_factory=list)
    source: str = ""  # the reader used
    entry: Any = None  # the catalog dataset the files were compared with (dpot_data.catalog.Entry), if any
    warnings: list[str] = field(default_factory=list)  # where the files differ from that catalog dataset


def default_resolution(resolution: int | tuple[int, ...] | str | None, space_dims: int,
                       source: str | None = None) -> int | tuple[int, ...] | None:
    """The target size per axis (or the sizes, one per stored axis, as given), None for the native grid. PER_SOURCE
    follows the reference DPOT for the paper's sources: 2D data is resized to 128 (what it pre-trains on), 3D data
    keeps its native grid (finetune3d.py resizes each sample at train time), so a small or 3D grid is never blown up
    by default; every other source (own data, The Well: not in `dpot_format.conventions.PAPER_SOURCES`, the reference
    never saw them) keeps its native grid, whatever its aspect. `source` None: the paper's rule."""
    if resolution == PER_SOURCE:
        from dpot_format.conventions import PAPER_SOURCES

        return 128 if space_dims == 2 and (source is None or source in PAPER_SOURCES) else None
    if isinstance(resolution, (tuple, list)):
        return parse_resolution(",".join(map(str, resolution)))
    if resolution is not None and (isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 0):
        raise InputError("--resolution", f"expected a grid size >= 0, one size per axis (H,W or D,H,W) or "
                                         f"{PER_SOURCE!r}, got {resolution!r}")
    return resolution or None


def parse_resolution(text: str) -> int | tuple[int, ...] | None:
    """`--resolution` as typed: "128" (every axis), "48,64" (H,W = y, x) or "16,24,32" (D,H,W = z, y, x); "0" is
    the native grid (None). InputError in one line otherwise."""
    from dpot_format.grid import parse_grid

    try:
        return parse_grid(text, "--resolution") or None
    except ValueError:
        raise InputError("--resolution", "expected a grid size >= 0 (0: the native grid) or one size per axis, H,W "
                                         f"(D,H,W for 3D), each a whole number of at least 1, got {text!r}") from None


def parse_split(text: str | float | Sequence[float]) -> tuple[float, ...]:
    """"0.9" → (0.9,) train/test; "0.8,0.1" → train/valid, rest test. Fractions in [0, 1] summing to at most 1."""
    if isinstance(text, str):
        try:
            values = tuple(float(v) for v in text.split(",") if v.strip())
        except ValueError:
            raise InputError("--split", f"expected a train fraction or 'train,valid' fractions, got {text!r}") from None
    elif isinstance(text, (int, float)):
        values = (float(text),)
    else:
        values = tuple(float(v) for v in text)
    if not 1 <= len(values) <= 2 or any(v < 0 or v > 1 for v in values) or sum(values) > 1 + 1e-9:
        raise InputError("--split", f"expected 1 or 2 fractions in [0, 1] summing to at most 1, got {values}")
    return values


def check_options(opts: IngestOptions) -> tuple[str, ...]:
    """Refuse options no dataset could satisfy (one line naming the option); returns the formats, de-duplicated."""
    from dpot_data.transform import MASK_METHODS

    formats = tuple(dict.fromkeys(opts.formats))
    if not formats or any(f not in FORMATS for f in formats):
        raise InputError("--format", f"expected a comma list of {', '.join(FORMATS)}, got {','.join(opts.formats)}")
    if opts.convention not in CONVENTIONS:
        raise InputError("--convention", f"expected one of {', '.join(CONVENTIONS)}, got {opts.convention!r}")
    if opts.mask_resample not in MASK_METHODS:
        raise InputError("--mask-resample", f"expected one of {', '.join(MASK_METHODS)}, got {opts.mask_resample!r}")
    if opts.nonfinite not in NONFINITE:
        raise InputError("--nonfinite", f"expected one of {', '.join(NONFINITE)}, got {opts.nonfinite!r}")
    default_resolution(opts.resolution, 2)  # a bad --resolution is refused before anything is read
    if not math.isfinite(float(opts.fill)):
        raise InputError("--fill", f"expected a finite value for padded channels, got {opts.fill}")
    if opts.shard_size < 1:
        raise InputError("--shard-size", f"expected a positive byte count, got {opts.shard_size}")
    if not float(opts.max_abs) > 0:  # NaN too
        raise InputError("--max-abs", f"expected a magnitude above 0 (inf: no bound), got {opts.max_abs}")
    if opts.workers is not None and (isinstance(opts.workers, bool) or not isinstance(opts.workers, int)
                                     or opts.workers < 1):
        raise InputError("--workers", f"expected a number of threads of at least 1, got {opts.workers!r}")
    if opts.scheduler is not None and not str(opts.scheduler).strip():
        raise InputError("--scheduler", "expected a dask.distributed scheduler address such as tcp://host:8786")
    return formats
