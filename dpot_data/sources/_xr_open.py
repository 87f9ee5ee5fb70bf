"""Opening one input of the generic `xarray` source as an `xarray.Dataset`, lazily: NetCDF (h5netcdf or scipy),
HDF5 written by h5py (h5netcdf with phony dimensions, named with `--axes`), a Zarr store, or a `.npy`/`.npz` array
with a stated axis order. An `Opener` is a small picklable recipe, so that every block task (on a thread or a dask
worker) opens the file itself and reads only its own trajectories.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import h5py
import numpy as np
import xarray as xr

from dpot_data.errors import InputError
from dpot_format.npy import read_npy_header
from dpot_data.sources._blocks import (READ_ERRORS, check_h5_contained, check_h5_dataset, check_sizes, check_stored,
                                       npy_info, on_disk_bytes)
from dpot_data.sources.base import MAX_FRAMES, MAX_GRID_SIDE, MAX_TRAJECTORIES
from dpot_format.io import file_kind
from dpot_format.limits import LIMITS

NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".cdf")
HDF5_SUFFIXES = (".h5", ".hdf5", ".he5")
NUMPY_SUFFIXES = (".npy", ".npz")
AXIS_LETTERS = {"N": "sample", "T": "time", "C": "channel", "Z": "z", "Y": "y", "X": "x"}
# What one input may declare before it is opened (xarray reads every array's metadata, and every index coordinate
# whole, when it opens a file, and a block task opens it again): arrays in all, points along any axis, and bytes of
# one Zarr metadata file. Each is far above what gridded PDE data holds, far below what makes an open run for minutes.
MAX_ARRAYS = 2 * LIMITS.max_channels
MAX_AXIS = max(MAX_TRAJECTORIES, MAX_FRAMES, MAX_GRID_SIDE)
MAX_ZARR_META_BYTES = 16 << 20
ZARR_META = (".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json")


def kind_of(path: Path) -> str | None:
    """"zarr", "netcdf", "hdf5", "npy" or "npz" from a path's name or layout; None when nothing tells."""
    suffix = path.suffix.lower()
    if path.is_dir():
        marks = ("zarr.json", ".zgroup", ".zattrs", ".zmetadata")
        return "zarr" if suffix == ".zarr" or any((path / m).exists() for m in marks) else None
    if suffix in NETCDF_SUFFIXES:
        return "netcdf"
    if suffix in HDF5_SUFFIXES:
        return "hdf5"
    if suffix in NUMPY_SUFFIXES:
        return suffix[1:]
    return None


def parse_axes(axes: str | None, where: str = "--axes") -> tuple[str, ...] | None:
    """"NTYXC" -> ("sample", "time", "y", "x", "channel"); each letter at most once, T, Y and X required."""
    if axes is None:
        return None
    letters = axes.strip().upper()
    if not letters or set(letters) - set(AXIS_LETTERS) or len(set(letters)) != len(letters) \
            or not {"T", "Y", "X"} <= set(letters):
        raise InputError(where, f"expected axis letters from {''.join(AXIS_LETTERS)} each at most once, with T, Y "
                                f"and X (e.g. NTYXC or TZYX), got {axes!r}")
    return tuple(AXIS_LETTERS[c] for c in letters)


@dataclass(frozen=True)
class Opener:
    """How to open one input: its path, its kind, the axis names of `--axes` and the channel names for a C axis."""

    path: str
    kind: str
    axes: tuple[str, ...] | None = None
    names: tuple[str, ...] = ()

    def __call__(self) -> xr.Dataset:
        if self.kind == "zarr":  # consolidated metadata when the store has it; none asked for (no warning) otherwise
            return xr.open_zarr(self.path, chunks=None, consolidated=_consolidated(Path(self.path)),
                                decode_times=False, decode_coords="all")
        if self.kind in ("netcdf", "hdf5"):
            ds = xr.open_dataset(self.path, engine="h5netcdf" if _is_hdf5(self.path) else None, chunks=None,
                                 decode_times=False, decode_coords="all",  # CF bounds and grid mappings: coordinates
                                 **({"phony_dims": "sort"} if _is_hdf5(self.path) else {}))
            return _named_axes(ds, self.axes, self.names) if self.axes else ds
        if self.kind == "npy":
            data = np.load(self.path, mmap_mode="r", allow_pickle=False)
            return _split_channels(_numpy_arrays({"data": data}, self.axes), self.names, single=True, where=self.path)
        with np.load(self.path, allow_pickle=False) as npz:
            return _split_channels(_numpy_arrays({k: npz[k] for k in npz.files}, self.axes), self.names, single=False,
                                   where=self.path)


def _is_hdf5(path: str) -> bool:
    """Whether a file starts with the HDF5 signature (NetCDF-4 files do; NetCDF-3 classic files do not)."""
    with open(path, "rb") as fh:
        return fh.read(8) == b"\x89HDF\r\n\x1a\n"


def _named_axes(ds: xr.Dataset, axes: tuple[str, ...], names: tuple[str, ...] = ()) -> xr.Dataset:
    """The variables of an HDF5 file without dimension names whose rank is len(axes), their axes named by --axes
    (a C axis split into one variable per component, "<name>_<k>")."""
    arrays = {str(k): v.reset_coords(drop=True).rename(dict(zip(v.dims, axes)))
              for k, v in ds.data_vars.items() if v.ndim == len(axes)}
    if not arrays:
        found = {str(k): tuple(v.shape) for k, v in ds.data_vars.items()}
        raise InputError(ds.encoding.get("source", "<file>"), f"expected datasets of {len(axes)} axes "
                                                              f"({', '.join(axes)}) as --axes says; found {found}")
    return _split_channels(arrays, names, single=False, where=ds.encoding.get("source", "<file>"))


def _split_channels(arrays: dict[str, xr.DataArray], names: tuple[str, ...], single: bool,
                    where: str = "<input>") -> xr.Dataset:
    """The arrays as variables; a "channel" axis split into one variable per component (named by `names`, else
    "c<k>" for a lone .npy, "<key>_<k>" otherwise). Views only: nothing is read."""
    out: dict[str, xr.DataArray] = {}
    for key, arr in arrays.items():
        if "channel" not in arr.dims:
            out[names[0] if single and names else key] = arr
            continue
        if arr.sizes["channel"] > LIMITS.max_channels:
            raise InputError(where, f"{key}: declares {arr.sizes['channel']} channels (the C axis of --axes); at most "
                                  f"{LIMITS.max_channels} allowed (dpot_format.limits.LIMITS.max_channels)")
        for k in range(arr.sizes["channel"]):
            label = names[k] if k < len(names) else (f"c{k}" if single else f"{key}_{k}")
            out[label] = arr.isel(channel=k, drop=True)
    return xr.Dataset(out)


def _numpy_arrays(arrays: dict[str, np.ndarray], axes: tuple[str, ...] | None) -> dict[str, xr.DataArray]:
    """Arrays of rank len(axes) as DataArrays with the --axes dims (others are left out)."""
    return {k: xr.DataArray(a, dims=axes) for k, a in arrays.items() if axes is not None and a.ndim == len(axes)}


def check_numpy_file(path: Path, kind: str, axes: tuple[str, ...] | None) -> None:
    """A .npy/.npz input before it is opened: --axes given, header rank equal to it, declared sizes within the
    limits and backed by bytes on disk (npy)."""
    if axes is None:
        raise InputError(path, "a .npy/.npz array has no axis names; expected --axes giving its axis order, e.g. "
                               "NTYXC (N sample, T time, C channel, Z, Y, X space)")
    if kind == "npz":
        _check_npz(path, axes)
        return
    try:
        shape, dtype, _offset = npy_info(path)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(path, f"cannot read the .npy header: {exc}") from None
    if len(shape) != len(axes):
        raise InputError(path, f"expected {len(axes)} axes ({''.join(a[0].upper() for a in axes)} from --axes), "
                               f"found shape {shape}")
    if dtype.kind not in "fiu":
        raise InputError(path, f"expected numeric data, found dtype {dtype}")
    size = dict(zip(axes, shape))
    check_sizes(path, "data", trajectories=size.get("sample"), frames=size["time"],
                space=[size[a] for a in ("z", "y", "x") if a in size], channels=size.get("channel", 1))
    check_stored(path, "data", shape, dtype.itemsize, on_disk_bytes(path), "on disk")


def _check_npz(path: Path, axes: tuple[str, ...]) -> None:
    """Every member of an .npz from its zip entry and .npy header alone: a zip archive, numbers, sizes within the
    limits and backed by the compressed bytes (numpy inflates a member whole when it is read: a bomb is refused)."""
    require_regular(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if m.filename.endswith(".npy")]
            if len(members) > MAX_ARRAYS:
                raise InputError(path, f"holds {len(members)} arrays; at most {MAX_ARRAYS} allowed "
                                       "(dpot_data.sources._xr_open.MAX_ARRAYS)")
            for member in members:
                with archive.open(member) as fh:
                    shape, _fortran, dtype, _offset = read_npy_header(fh, f"{path}: {member.filename}")
                key = member.filename[:-4]
                if dtype.hasobject or dtype.kind not in "fiub":
                    raise InputError(path, f"{key}: expected numeric data, found dtype {dtype}")
                check_stored(path, key, shape, dtype.itemsize, member.compress_size, "compressed for it in the archive")
                if len(shape) == len(axes):
                    size = dict(zip(axes, shape))
                    check_sizes(path, key, trajectories=size.get("sample"), frames=size["time"],
                                space=[size[a] for a in ("z", "y", "x") if a in size], channels=size.get("channel", 1))
    except InputError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, *READ_ERRORS) as exc:
        raise InputError(path, f"cannot read as .npz (a zip archive of .npy arrays): {type(exc).__name__}: "
                               f"{_first_line(exc)}; the file is truncated or not an .npz") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else ""


def require_regular(path: str | os.PathLike[str], what: str = "a file") -> os.stat_result:
    """The stat of `path` (links followed) when it is a regular file, else InputError: a FIFO, device or socket is
    never opened (opening a FIFO blocks until someone writes into it)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror}); expected {what}") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(path, f"is {file_kind(st.st_mode)}, expected {what} (a regular file)")
    return st


def check_input(path: Path, kind: str) -> None:
    """The one check every input of the generic source goes through before anything opens it (and that the Well
    reader's files go through, `check_hdf5`): a regular file, or for a Zarr store a folder of regular files; nothing
    it holds stored outside it (HDF5 external links, external raw storage, virtual datasets; Zarr chunks or
    folders that are links leading out of the store); no array declaring far more than it stores, or an axis or a
    count of arrays beyond the limits. One InputError line naming the file and the key otherwise."""
    if kind == "zarr":
        check_zarr(path)
        return
    require_regular(path)
    if kind in ("netcdf", "hdf5") and _is_hdf5(str(path)):
        check_hdf5(path)


def check_hdf5(path: Path) -> None:
    """An HDF5 (or NetCDF-4) file, from its metadata alone: a regular file; at most MAX_ARRAYS datasets; nothing
    stored outside it (`_blocks.check_h5_contained`, the check every HDF5 reader makes: no external link, no
    virtual dataset, no external raw storage); every dataset declaring at most base.MAX_INFLATION times what it
    stores, no axis longer than MAX_AXIS."""
    require_regular(path)
    try:
        with h5py.File(path, "r") as f:
            datasets: list[str] = []
            f.visititems(lambda name, obj: datasets.append(name) if isinstance(obj, h5py.Dataset) and len(
                datasets) <= MAX_ARRAYS else None)  # (visits follow hard links only)
            if len(datasets) > MAX_ARRAYS:
                raise InputError(path, f"holds more than {MAX_ARRAYS} datasets; at most {MAX_ARRAYS} allowed "
                                       "(dpot_data.sources._xr_open.MAX_ARRAYS)")
            check_h5_contained(path, f)
            for name in datasets:
                dset = f[name]
                check_h5_dataset(path, name, dset)
                check_axes(path, name, dset.shape or ())
    except InputError:
        raise
    except READ_ERRORS as exc:
        raise InputError(path, f"cannot open as HDF5 (truncated or corrupt): {_first_line(exc)}") from None


def check_axes(where: str | Path, key: str, shape: Any) -> None:
    """No axis of an array longer than MAX_AXIS (xarray reads an index coordinate whole when it opens a file)."""
    for side in shape:
        if int(side) > MAX_AXIS:
            raise InputError(where, f"{key}: declares an axis of {int(side)} points (shape "
                                    f"{tuple(int(v) for v in shape)}); at most {MAX_AXIS} allowed "
                                    "(dpot_data.sources._xr_open.MAX_AXIS)")


def _zarr_json(path: str, where: Path) -> Any:
    """A Zarr metadata file, bounded in size and depth, as JSON."""
    st = require_regular(path, "a Zarr metadata file")
    if st.st_size > MAX_ZARR_META_BYTES:
        raise InputError(path, f"a Zarr metadata file of {st.st_size} bytes; at most {MAX_ZARR_META_BYTES} allowed")
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read().decode("utf-8"))
    except RecursionError:
        raise InputError(path, "Zarr metadata nested too deeply to parse; expected the JSON of a Zarr store") from None
    except (ValueError, OSError) as exc:
        raise InputError(path, f"cannot read as Zarr metadata (JSON): {_first_line(exc)}") from None


def _zarr_arrays(meta: Any, folder: str, name: str) -> dict[str, tuple[Any, Any]]:
    """(shape, dtype) of the arrays a metadata file declares, by their folder: `.zarray` and a v3 array's
    `zarr.json` for their own folder; consolidated metadata (`.zmetadata`, a v3 `consolidated_metadata`) for
    every array it lists."""
    out: dict[str, tuple[Any, Any]] = {}
    if not isinstance(meta, dict):
        return out
    if name == ".zarray" or (name == "zarr.json" and meta.get("node_type") == "array"):
        out[folder] = (meta.get("shape"), meta.get("dtype", meta.get("data_type")))
    listed = meta.get("metadata") if name == ".zmetadata" else (meta.get("consolidated_metadata") or {}).get(
        "metadata") if name == "zarr.json" and isinstance(meta.get("consolidated_metadata"), dict) else None
    for key, value in (listed or {}).items() if isinstance(listed, dict) else ():
        if not isinstance(value, dict):
            continue
        if key.endswith("/.zarray") or key == ".zarray":
            out[os.path.join(folder, key[:-len(".zarray")].rstrip("/"))] = (value.get("shape"), value.get("dtype"))
        elif name == "zarr.json" and value.get("node_type") == "array":
            out[os.path.join(folder, key)] = (value.get("shape"), value.get("data_type"))
    return out


def _itemsize(dtype: Any) -> int:
    try:
        return np.dtype(dtype if not isinstance(dtype, dict) else dtype.get("name")).itemsize
    except (TypeError, ValueError):
        return 1


def check_zarr(store: Path) -> None:
    """A Zarr store folder, before zarr or xarray reads it: every entry a regular file or a folder (a FIFO chunk
    would block the read), no link leading out of the store (its chunks would be another file's bytes), metadata
    files bounded in size and depth, and every array declaring at most base.MAX_INFLATION times the bytes of its
    chunk files, no axis longer than MAX_AXIS, at most MAX_ARRAYS arrays."""
    root = os.path.realpath(store)
    arrays: dict[str, tuple[Any, Any]] = {}
    sizes: dict[str, int] = {}
    for parent, dirs, files in os.walk(store):
        for name in (*dirs, *files):
            full = os.path.join(parent, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                real = os.path.realpath(full)
                if real != root and not real.startswith(root + os.sep):
                    raise InputError(full, f"a link to {real}, outside the Zarr store {store}; expected the store's "
                                           "chunks and metadata inside it (links leading out are not followed)")
                try:
                    st = os.stat(full)
                except OSError as exc:
                    raise InputError(full, f"a link that cannot be followed ({exc.strerror}); expected a chunk "
                                           "file inside the store") from None
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                raise InputError(full, f"is {file_kind(st.st_mode)} inside the Zarr store {store}; expected regular "
                                       "chunk and metadata files")
            sizes[full] = min(st.st_size, st.st_blocks * 512) if hasattr(st, "st_blocks") else st.st_size
            if name in ZARR_META:
                arrays.update(_zarr_arrays(_zarr_json(full, store), parent, name))
    if len(arrays) > MAX_ARRAYS:
        raise InputError(store, f"holds {len(arrays)} arrays; at most {MAX_ARRAYS} allowed "
                                "(dpot_data.sources._xr_open.MAX_ARRAYS)")
    for folder, (shape, dtype) in sorted(arrays.items()):
        key = os.path.relpath(folder, store)
        if not isinstance(shape, list) or not all(isinstance(v, int) and v >= 0 for v in shape):
            raise InputError(store, f"{key}: declares the shape {shape!r}; expected a list of sizes")
        check_axes(store, key, shape)
        stored = sum(n for f, n in sizes.items() if f.startswith(folder + os.sep))
        check_stored(store, key, shape, _itemsize(dtype), stored, "stored in its chunk files")


def _consolidated(store: Path) -> bool:
    """Whether a Zarr store has consolidated metadata (v2 `.zmetadata`, or v3 `consolidated_metadata` in its root
    `zarr.json`): opened with it, or without asking for it (no warning about its absence)."""
    if (store / ".zmetadata").is_file():
        return True
    root = store / "zarr.json"
    if not root.is_file():
        return False
    try:
        return isinstance(_zarr_json(str(root), store).get("consolidated_metadata"), dict)
    except (InputError, AttributeError):
        return False


@contextlib.contextmanager
def read_errors(path: str, key: str) -> Iterator[None]:
    """Reading the values of `key` in the input `path`: a read error (a damaged chunk, a file cut short after it was
    opened) becomes one InputError line naming the file and the variable."""
    try:
        yield
    except InputError:
        raise
    except (*READ_ERRORS, TypeError, IndexError, zipfile.BadZipFile) as exc:
        raise InputError(path, f"{key}: cannot read its values ({type(exc).__name__}: {_first_line(exc)}); "
                               "expected readable data: the input is damaged (a corrupt chunk, a file cut short)"
                         ) from None


def open_checked(opener: Opener) -> xr.Dataset:
    """`opener()`, with what goes wrong opening it as one InputError line naming the file."""
    try:
        return opener()
    except InputError:
        raise
    except (OSError, ValueError, TypeError, KeyError, IndexError, RuntimeError, RecursionError,
            zipfile.BadZipFile) as exc:  # IndexError: scipy's NetCDF-3 parser on a file cut short in its header
        what = {"zarr": "a Zarr store", "netcdf": "NetCDF", "hdf5": "HDF5", "npy": ".npy", "npz": ".npz"}[opener.kind]
        raise InputError(opener.path, f"cannot open as {what} with xarray ({type(exc).__name__}: "
                                      f"{str(exc).splitlines()[0] if str(exc) else ''}); expected NetCDF, HDF5, a "
                                      "Zarr store, or .npy/.npz with --axes") from None


def file_bytes(path: Path) -> int:
    """Bytes of a file, or of every file below a folder (a Zarr store)."""
    if path.is_file():
        return path.stat().st_size
    return sum(os.path.getsize(os.path.join(d, f)) for d, _s, files in os.walk(path) for f in files)
