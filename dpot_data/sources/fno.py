"""FNO Navier–Stokes reader: MATLAB v5 and v7.3 files with `a` (N,x,y), `u` (N,x,y,T), `t` (1,T), read lazily.

Both containers are opened as "MATLAB column-major seen from C", i.e. with all axes reversed: `u` becomes
(T, y, x, N) and `a` (y, x, N). For v7.3 that is what h5py shows; for v5 the numeric data element is
memory-mapped with the reversed shape (a zlib-compressed element is first inflated to a temporary file). A block of
trajectories is then `u[..., n0:n1]`, so nothing is read whole. The generator's grid is meshgrid(indexing="ij"):
axis 1 of `a` is x and axis 2 is y, so the reversed view already is the canonical (y, x) order and stored frames
are `a[n].T`, `u[n, ..., k].T` (the reader never swaps physics axes by accident).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import re
import struct
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import dask.array as da
import h5py
import numpy as np
import xarray as xr

from dpot_data.errors import InputError
from dpot_data.sources._blocks import (READ_ERRORS, SampleBlocks, all_finite, allowed_bytes, as_path,
                                        check_file_total, check_h5_contained, check_sizes, check_stored, checked,
                                        distinct_files, file_token, frames_ok, nonfinite_error, on_disk_bytes,
                                        read_error, text_path, require_file, to_dask, unique_names)
from dpot_data.sources.base import INFLATION_SLACK_BYTES, MAX_INFLATION, ReadResult

READER_VERSION = "1"
# check_finite="raise" refuses, with a TrajectoryError, every trajectory that check_finite=True leaves out (NaN/Inf,
# unreadable data): the ingest reads with "raise" first and scans only when a block read meets one (`ingest.pipeline`)
SCAN_IN_BLOCK_READS = True
DEFAULT_BLOCK = 8  # trajectories per dask chunk: ~7 MB raw, ~110 MB once resampled to 128x128x4 (T=50)
_VISC = re.compile(r"_V(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(?=_|\.mat$)")

# MAT v5 data types (element tags) and numeric array classes
_MI_DTYPES = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 9: "f8", 12: "i8", 13: "u8"}
_MI_MATRIX, _MI_COMPRESSED = 14, 15
_MX_NUMERIC = {6: "double", 7: "single", 8: "int8", 9: "uint8", 10: "int16", 11: "uint16", 12: "int32", 13: "uint32",
               14: "int64", 15: "uint64"}
_TEMP_FILES: list[str] = []


def format_viscosity(nu: float) -> str:
    """Viscosity as the published file names write it: 1e-3, 1e-5, 1.5e-4."""
    mantissa, exponent = f"{nu:e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def dataset_name(nu: float) -> str:
    """Default dataset name for a viscosity: fno-ns-v1e-3 (dots become 'p' to fit [a-z0-9_-])."""
    return f"fno-ns-v{format_viscosity(nu)}".lower().replace(".", "p").replace("+", "")


def parse_viscosity(path: str | Path) -> float | None:
    """The viscosity written in a file name such as NavierStokes_V1e-3_N1200_T20.mat, or None."""
    match = _VISC.search(Path(path).name)
    return float(match.group(1)) if match else None


@dataclass
class _Var:
    """Where one numeric MAT variable lives: a file, byte offset, MATLAB dims, on-disk dtype (v5) or h5 path (v7.3)."""

    file: str
    dims: tuple[int, ...]
    dtype: str
    offset: int | None = None  # v5: byte offset of the raw data in `file`
    h5name: str | None = None  # v7.3: dataset name
    stored: int | None = None  # bytes of it stored on disk (v7.3: in the file, compressed; v5: all of it)

    def read(self, index: tuple = (...,)) -> np.ndarray:
        """Read `index` of the variable with all axes reversed (MATLAB column-major seen from C), then close."""
        shape = tuple(reversed(self.dims))
        if self.h5name is None:
            view = np.memmap(self.file, dtype=np.dtype(self.dtype), mode="r", offset=self.offset, shape=shape)
            out = np.array(view[index])
            del view
            return out
        with h5py.File(self.file, "r") as h5:
            return np.asarray(h5[self.h5name][index])


@dataclass
class _MatFile:
    path: Path
    container: str  # "mat-v5" | "mat-v7.3"
    variables: dict[str, _Var] = field(default_factory=dict)
    compressed: bool = False


def _tag(buf: bytes, pos: int, endian: str) -> tuple[int, int, int]:
    """(data type, byte count, data offset) of the element tag at pos, handling the 4-byte small-element form."""
    mdtype, nbytes = struct.unpack_from(endian + "II", buf, pos)
    if mdtype >> 16:
        return mdtype & 0xFFFF, mdtype >> 16, pos + 4
    return mdtype, nbytes, pos + 8


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def _parse_matrix(path: Path, file: str, head: bytes, base: int, endian: str, size: int) -> tuple[str, _Var | None]:
    """Parse an miMATRIX element body (head = its first bytes, base = file offset of the body) into (name, var); a
    header whose sub-element sizes point past its bytes (a damaged file) is an InputError."""
    try:
        return _parse_matrix_head(path, file, head, base, endian, size)
    except struct.error:
        raise InputError(path, f"the variable header at offset {base} is damaged (its element sizes point past its "
                               f"{len(head)} bytes); expected a MAT v5 matrix element") from None


def _parse_matrix_head(path: Path, file: str, head: bytes, base: int, endian: str, size: int
                       ) -> tuple[str, _Var | None]:
    """The parse of _parse_matrix; struct.error where the header is shorter than its sizes say."""
    mtype, n, off = _tag(head, 0, endian)
    flags = struct.unpack_from(endian + "I", head, off)[0]
    mclass, complex_ = flags & 0xFF, bool(flags & 0x0800)
    pos = off + _pad8(n)
    mtype, n, off = _tag(head, pos, endian)
    dims = struct.unpack_from(endian + f"{n // 4}i", head, off)
    if any(d < 0 for d in dims):
        raise InputError(path, f"a variable declares negative dimensions {tuple(dims)}")
    pos = off + (4 if off == pos + 4 else _pad8(n))
    mtype, n, off = _tag(head, pos, endian)
    name = head[off:off + n].decode("ascii", "replace")
    pos = off + (4 if off == pos + 4 else _pad8(n))
    if mclass not in _MX_NUMERIC or complex_:
        return name, None
    mtype, n, off = _tag(head, pos, endian)
    if mtype not in _MI_DTYPES:
        return name, None
    dtype = np.dtype(_MI_DTYPES[mtype]).newbyteorder("<" if endian == "<" else ">")
    need = math.prod(dims) * dtype.itemsize
    if n != need:
        raise InputError(path, f"variable {name!r}: data holds {n} bytes, expected {need} for dims {dims}")
    if off == pos + 4:  # small element: data inside the tag
        return name, None
    if base + off + need > size:
        raise InputError(path, f"file is truncated: variable {name!r} needs {need} bytes at offset {base + off}, "
                               f"the file ends at byte {size}")
    return name, _Var(file=file, dims=tuple(dims), dtype=dtype.str, offset=base + off, stored=need)


_INFLATED = re.compile(r"^dpot-mat5-(\d+)-.+\.bin$")  # an inflated variable, named by the pid of its process


def reclaim_inflated(folder: str | None = None) -> list[str]:
    """Remove the inflated-variable files that processes no longer alive left in the temporary folder (a kill
    while a compressed MAT v5 file was open leaves the whole inflated `u` there); returns what was removed."""
    folder = folder or tempfile.gettempdir()
    removed = []
    with os.scandir(folder) as entries:
        for entry in entries:
            match = _INFLATED.match(entry.name)
            if match and not _alive(int(match.group(1))) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(entry.path)
    return removed


def _alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _inflate(path: Path, fh, start: int, length: int, budget: int) -> tuple[str, int]:
    """Inflate a zlib-compressed element into a temporary file (streamed, bounded memory and disk: at most
    base.MAX_INFLATION times its compressed bytes plus base.INFLATION_SLACK_BYTES, and at most `budget`, what is left
    of the file's allowance); returns its path and size."""
    reclaim_inflated()
    fd, tmp = tempfile.mkstemp(prefix=f"dpot-mat5-{os.getpid()}-", suffix=".bin")
    _TEMP_FILES.append(tmp)
    inflater = zlib.decompressobj()
    fh.seek(start)
    left = length
    limit, written = min(allowed_bytes(length), budget), 0
    try:
        with os.fdopen(fd, "wb") as out:
            while left > 0 or inflater.unconsumed_tail:
                if inflater.unconsumed_tail:
                    chunk = inflater.unconsumed_tail
                else:
                    chunk = fh.read(min(left, 1 << 22))
                    if not chunk:
                        break
                    left -= len(chunk)
                piece = inflater.decompress(chunk, 1 << 24)
                written += len(piece)
                if written > limit:
                    raise InputError(path, f"the compressed variable at offset {start} ({length} bytes) inflates to "
                                           f"more than {limit} bytes (at most {MAX_INFLATION}x its bytes + "
                                           f"{INFLATION_SLACK_BYTES}, and {MAX_INFLATION}x + {INFLATION_SLACK_BYTES}"
                                           " for the whole file, dpot_data.sources.base.MAX_INFLATION): not what a "
                                           ".mat file holds")
                out.write(piece)
                if inflater.eof:
                    break
            out.write(inflater.flush())
    except zlib.error as exc:
        raise InputError(path, f"corrupt compressed variable at offset {start}: {exc}") from None
    return tmp, written


def _open_v5(path: Path, header: bytes) -> _MatFile:
    """Index the numeric variables of a MAT v5 file (offsets and dims only, no data read)."""
    endian = "<" if header[126:128] == b"IM" else ">"
    size = path.stat().st_size
    budget = allowed_bytes(on_disk_bytes(path))  # all compressed elements together inflate to at most this
    mat = _MatFile(path=path, container="mat-v5")
    with open(path, "rb") as fh:
        pos = 128
        while pos + 8 <= size:
            fh.seek(pos)
            mdtype, nbytes, _ = _tag(fh.read(8), 0, endian)
            if pos + 8 + nbytes > size:
                raise InputError(path, f"file is truncated: element at offset {pos} needs {nbytes} bytes, "
                                       f"the file ends at byte {size}")
            if mdtype == _MI_MATRIX:
                name, var = _parse_matrix(path, str(path), fh.read(min(nbytes, 4096)), pos + 8, endian, size)
            elif mdtype == _MI_COMPRESSED:
                mat.compressed = True
                tmp, inflated = _inflate(path, fh, pos + 8, nbytes, budget)
                budget -= inflated
                with open(tmp, "rb") as inner:
                    head = inner.read(4096 + 8)
                inner_type, _, _ = _tag(head, 0, endian)
                if inner_type != _MI_MATRIX:
                    raise InputError(path, f"compressed element at offset {pos} does not hold a matrix")
                name, var = _parse_matrix(path, tmp, head[8:], 8, endian, os.path.getsize(tmp))
            else:
                name, var = "", None
            if var is not None:
                mat.variables[name] = var
            pos += 8 + nbytes
            if mdtype == _MI_MATRIX:
                pos = 128 + _pad8(pos - 128)
    return mat


def _open_v73(path: Path) -> _MatFile:
    """Index the datasets of a MAT v7.3 (HDF5) file; dims are MATLAB's, i.e. h5py's shape reversed. A file holding
    anything stored outside it (an external link, a virtual or externally stored dataset) is refused first
    (`check_h5_contained`, the check of every HDF5 input)."""
    try:
        h5 = h5py.File(path, "r")
    except OSError as exc:
        raise InputError(path, f"expected a readable MAT v7.3 (HDF5) file; it is truncated or corrupt ({exc})") from None
    mat = _MatFile(path=path, container="mat-v7.3")
    with h5:
        check_h5_contained(path, h5)
        for name, obj in h5.items():
            if isinstance(obj, h5py.Dataset) and obj.dtype.kind in "fiu":
                mat.variables[name] = _Var(file=str(path), dims=tuple(reversed(obj.shape)), dtype=obj.dtype.str,
                                           h5name=name, stored=obj.id.get_storage_size())
                mat.compressed |= obj.compression is not None
    return mat


def open_mat(path: str | Path) -> _MatFile:
    """Recognise a .mat file by its header (v5 or v7.3) and index its numeric variables; InputError otherwise."""
    path = as_path(path)
    expected = "expected a MATLAB .mat file (v5, or v7.3/HDF5) with variables a (N,x,y), u (N,x,y,T), t (1,T)"
    if path.suffix.lower() != ".mat":
        raise InputError(path, f"{expected}; the name does not end in .mat")
    require_file(path)
    with open(path, "rb") as fh:
        header = fh.read(128)
    if len(header) < 128:
        raise InputError(path, f"file is truncated: {len(header)} bytes, shorter than the 128-byte MAT header")
    version = header[124:126]
    if header.startswith(b"MATLAB") and header[126:128] in (b"IM", b"MI"):
        major = version[1] if header[126:128] == b"IM" else version[0]
        if major == 2:
            return _open_v73(path)
        if major == 1:
            return _open_v5(path, header)
    if h5py.is_hdf5(path):
        return _open_v73(path)
    raise InputError(path, f"{expected}; found no MAT v5/v7.3 header")


def _check(mat: _MatFile) -> tuple[int, int, int, int]:
    """Validate shapes of u and a; returns (N, x, y, T) in MATLAB order."""
    v = mat.variables
    if "u" not in v:
        found = ", ".join(sorted(v)) or "no numeric variables"
        raise InputError(mat.path, f"expected variable 'u' (N, x, y, T) in the .mat file; found {found}")
    if len(v["u"].dims) != 4:
        raise InputError(mat.path, f"expected 'u' to be 4-D (N, x, y, T), found shape {v['u'].dims}")
    n, nx, ny, nt = v["u"].dims
    if "a" not in v:
        raise InputError(mat.path, "expected variable 'a' (N, x, y), the vorticity at t=0, beside 'u'")
    if v["a"].dims != (n, nx, ny):
        raise InputError(mat.path, f"expected 'a' of shape (N, x, y) = {(n, nx, ny)} to match 'u' {v['u'].dims}, "
                                   f"found {v['a'].dims}")
    check_sizes(mat.path, "u", trajectories=n, frames=nt + 1, space=(ny, nx))
    for key in ("u", "a"):
        var = v[key]
        if np.dtype(var.dtype).kind != "f":  # MATLAB logical arrays are stored as uint8
            raise InputError(mat.path, f"expected '{key}' of floating-point values (single or double), found "
                                       f"{np.dtype(var.dtype).name}")
        check_stored(mat.path, key, var.dims, np.dtype(var.dtype).itemsize, var.stored or 0)
    check_file_total(mat.path, sum(math.prod(v[k].dims) * np.dtype(v[k].dtype).itemsize for k in ("u", "a")),
                     "the variables u and a")
    return n, nx, ny, nt


class _Trajectories(SampleBlocks):
    """Lazy (N, T+1, 1, y, x) float32 view of one file: frame 0 = a, frames 1..T = u; read in sample blocks, each
    read checked for NaN/Inf (`checks`) before it is copied, trajectory axis first, into the output block."""

    def __init__(self, path: Path, a: _Var, u: _Var) -> None:
        self.path, self.a, self.u = path, a, u
        n, nx, ny, nt = u.dims
        self.shape = (n, nt + 1, 1, ny, nx)

    def _raw(self, key: str, n0: int, n1: int) -> np.ndarray:
        """`a` (y, x, b) or `u` (T, y, x, b) of trajectories n0..n1-1, as stored (sample axis last)."""
        try:
            return getattr(self, key).read((Ellipsis, slice(n0, n1)))
        except READ_ERRORS as exc:
            raise read_error(self.path, key, f"{n0}..{n1 - 1}" if n1 - n0 > 1 else n0, exc) from None

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        """Trajectories n0..n1-1 as float32 (b, T+1, 1, y, x)."""
        check = self.checks if check is None else check
        out = np.empty((n1 - n0, self.shape[1], 1, self.shape[3], self.shape[4]), dtype=np.float32)
        for key, frames in (("a", 0), ("u", slice(1, None))):
            raw = self._raw(key, n0, n1)
            if check and not all_finite(raw):
                j = next(j for j in range(n1 - n0) if not all_finite(raw[..., j]))
                one = raw[..., j] if key == "u" else raw[None, ..., j]
                raise nonfinite_error(self.path, key, n0 + j, one)
            with np.errstate(over="ignore"):
                out[:, frames, 0] = np.moveaxis(raw, -1, 0)
        return out

    def finite_frames(self, n0: int, n1: int) -> np.ndarray:
        ok = np.empty((n1 - n0, self.shape[1]), dtype=bool)
        ok[:, 0] = frames_ok(np.moveaxis(self._raw("a", n0, n1), -1, 0)[:, None])[:, 0]
        ok[:, 1:] = frames_ok(np.moveaxis(self._raw("u", n0, n1), -1, 0))
        return ok


def _times(mat: _MatFile, nt: int) -> np.ndarray | None:
    """Physical times of frames 1..T from `t` when present and of the right length."""
    t = mat.variables.get("t")
    if t is None:
        return None
    if math.prod(t.dims) != nt:
        raise InputError(mat.path, f"expected 't' to hold one time per frame of 'u' ({nt}), found shape {t.dims}")
    return t.read().astype(np.float64).reshape(-1)


# dpot-reference split: trajectories at index >= this in their file are test (docs/conventions.md: 1e-3 data[4800:];
# 1e-5 and 1e-4 train on their first 1000 / 9800, the last 200 of the published files being the test set)
REFERENCE_TEST_FROM = {1e-5: 1000, 1e-4: 9800, 1e-3: 4800}
REFERENCE_T_TEST = {1e-5: 10, 1e-4: 20, 1e-3: 20}  # frames the reference evaluates after the 10 input frames


def reference_split(ids: Sequence[str], nu: float) -> tuple[np.ndarray | None, str | None]:
    """The reference's index-based split of trajectories "<file>#<index>" for a published viscosity (else None)."""
    first = next((v for k, v in REFERENCE_TEST_FROM.items() if np.isclose(k, nu, rtol=1e-6)), None)
    if first is None:
        return None, None
    index = np.array([int(i.rsplit("#", 1)[1]) for i in ids])
    rule = (f"dpot-reference: by index in the file, trajectories 0..{first - 1} train, {first}.. test "
            f"(the reference DPOT split for viscosity {format_viscosity(nu)})")
    return np.where(index < first, "train", "test").astype(str), rule


def _open_inputs(paths: Sequence[str | Path]) -> list[_MatFile]:
    """Index the given .mat files, each once, after checking that the paths are text and name distinct files."""
    if not paths:
        raise InputError("<no files>", "expected at least one FNO .mat file")
    for p in paths:
        text_path(p)
    files = distinct_files([as_path(p) for p in paths])
    unique_names([p for p in files if p.exists()])
    return [open_mat(p) for p in files]


def _viscosities(mats: Sequence[_MatFile], viscosity: float | None) -> list[float]:
    """The viscosity of each file: `viscosity` when given, else the one its name carries (InputError without)."""
    nus = []
    for m in mats:
        nu = viscosity if viscosity is not None else parse_viscosity(m.path)
        if nu is None:
            raise InputError(m.path, "expected the viscosity in the file name, as in NavierStokes_V1e-3_N1200_T20.mat")
        nus.append(nu)
    return nus


def _check_alike(mats: Sequence[_MatFile], shapes: Sequence[tuple[int, int, int, int]], nus: Sequence[float]) -> None:
    """Refuse files whose viscosity, grid or frame count differ from the first file's: they are other datasets."""
    first = mats[0]
    for m, shape, nu in zip(mats[1:], shapes[1:], nus[1:]):
        if nu != nus[0]:
            raise InputError(m.path, f"expected viscosity {format_viscosity(nus[0])} like {first.path.name} "
                                     f"(ingest each viscosity as its own dataset), found {format_viscosity(nu)}")
        if shape[1:] != shapes[0][1:]:
            raise InputError(m.path, f"expected grid {shapes[0][1:3]} and {shapes[0][3]} frames like "
                                     f"{first.path.name}, found {shape[1:3]} and {shape[3]}")


def _lazy_fields(mats: Sequence[_MatFile], shapes: Sequence[tuple[int, int, int, int]], block: int,
                 check_finite: bool | str) -> tuple[da.Array, list[str], list[tuple[str, str]]]:
    """All files' usable trajectories as one lazy (N, T+1, 1, y, x) array, with their ids and what was skipped."""
    parts, ids, skipped = [], [], []
    for m, (n, *_rest) in zip(mats, shapes):
        file_ids = [f"{m.path.name}#{i}" for i in range(n)]
        traj, keep, bad = checked(_Trajectories(m.path, m.variables["a"], m.variables["u"]), block, file_ids,
                                  m.path.name, check_finite)
        skipped.extend(bad)
        if keep.size:
            parts.append(to_dask(traj, block, "fno", file_token(m.path), keep.tolist()))
            ids.extend(file_ids[i] for i in keep)
    if not parts:
        raise InputError(mats[0].path, "no usable trajectory in the inputs: "
                                       + "; ".join(f"{w}: {r}" for w, r in skipped[:3]))
    fields = da.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    return fields, ids, skipped


def _time_axis(first: _MatFile, nt: int, reference: bool) -> tuple[np.ndarray, float | None]:
    """Frame times (frame 0 = `a` at 0 unless the reference convention leaves it out) and dt when `t` is uniform."""
    t = _times(first, nt)
    time = np.concatenate([[0.0], t]) if t is not None else np.arange(nt + 1, dtype=np.float64)
    if reference:  # u only: frames 1..T
        time = time[1:]
    steps = np.diff(time)
    dt = float(steps[0]) if t is not None and len(steps) and np.allclose(steps, steps[0], rtol=1e-5) else None
    return time, dt


def _provenance(mats: Sequence[_MatFile], shapes: Sequence[tuple[int, int, int, int]]) -> dict[str, object]:
    """What the reader saw in each file (container, dtype, compression, sizes), for the manifest."""
    return {
        "reader": "dpot_data.sources.fno",
        "reader_version": READER_VERSION,
        "files": {
            m.path.name: {
                "container": m.container,
                "dtype": np.dtype(m.variables["u"].dtype).name,
                "compressed": m.compressed,
                "trajectories": s[0],
                "frames": s[3] + 1,
                "time_from_file": _times(m, s[3]) is not None,
            }
            for m, s in zip(mats, shapes)
        },
    }


def _dataset(fields: da.Array, mask: da.Array, ids: Sequence[str], time: np.ndarray,
             attrs: dict[str, object]) -> xr.Dataset:
    """The canonical dataset of one vorticity channel on the unit-square (y, x) grid."""
    ny, nx = mask.shape[1:]
    return xr.Dataset(
        {
            "fields": (("sample", "time", "channel", "y", "x"), fields),
            "mask": (("sample", "y", "x"), mask),
        },
        coords={
            "sample": np.array(ids, dtype=str),
            "time": time,
            "channel": np.array(["vorticity"]),
            "y": np.arange(ny) / ny,
            "x": np.arange(nx) / nx,
        },
        attrs=attrs,
    )


def read(
    paths: Sequence[str | Path], *, viscosity: float | None = None, block: int = DEFAULT_BLOCK, name: str | None = None,
    check_finite: bool | str = True, convention: str = "dpot-reference",
) -> ReadResult:
    """Open FNO Navier–Stokes .mat files lazily as one canonical dataset (all files must share viscosity, grid, T).

    With `check_finite=True` (one streamed pass when opened, before anything is written), trajectories holding NaN
    or Inf are left out and listed in `skipped` by id, as the other readers do; with "raise" nothing is scanned when
    opened and a block read meeting NaN or Inf raises InputError naming the file, the variable and the trajectory;
    False keeps them. Declared shapes beyond the limits of dpot_data.sources.base, or beyond the bytes on disk
    (v7.3 unwritten chunks, v5 compressed elements inflating past base.MAX_INFLATION), are refused.

    Stored axes: y = the MATLAB array's second spatial axis (d2), x = the first (d1), so a stored frame is
    `u[n, :, :, t].T`. Under the "dpot-reference" convention the trajectory is `u` alone (t = 1..T: the reference
    never shows the model `a`), the model's (H, W) is (y, x) (`model_layout` "yx", the reference's orientation), and
    the split is the reference's by index. Under "canonical", frame 0 is `a` and the model sees (x, y).
    """
    mats = _open_inputs(paths)
    shapes = [_check(m) for m in mats]
    nus = _viscosities(mats, viscosity)
    _check_alike(mats, shapes, nus)
    _, nx, ny, nt = shapes[0]
    fields, ids, skipped = _lazy_fields(mats, shapes, max(1, int(block)), check_finite)
    mask = da.ones((fields.shape[0], ny, nx), dtype=np.uint8, chunks=(fields.chunks[0], ny, nx))
    reference = convention == "dpot-reference"
    time, dt = _time_axis(mats[0], nt, reference)
    if reference:  # u only: frames 1..T
        fields = fields[:, 1:]
    data = _dataset(fields, mask, ids, time, {
        "source": "fno",
        "dataset": name or dataset_name(nus[0]),
        "boundary": "periodic",
        "parameters": {"viscosity": nus[0]},
        "dt": dt,
        "provenance": _provenance(mats, shapes),
        "model_layout": "yx" if reference else "xy",
        "frames_left_out": int(reference),
    })
    split, rule = reference_split(ids, nus[0]) if reference else (None, None)
    if rule is not None:
        data.attrs["split_rule"] = rule
    t_test = next((v for k, v in REFERENCE_T_TEST.items() if np.isclose(k, nus[0], rtol=1e-6)), None)
    if reference and t_test is not None:
        data.attrs["t_test"] = t_test
    return ReadResult(data=data, split=split, skipped=skipped, inputs=[m.path for m in mats])


@atexit.register
def _cleanup() -> None:
    """Remove the temporary files that inflated compressed v5 variables."""
    for tmp in _TEMP_FILES:
        try:
            os.unlink(tmp)
        except OSError:
            pass
