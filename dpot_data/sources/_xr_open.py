"""Opening one input of the generic `xarray` source as an `xarray.Dataset`, lazily: NetCDF (h5netcdf or scipy),
HDF5 written by h5py (h5netcdf with phony dimensions, named with `--axes`), a Zarr store, or a `.npy`/`.npz` array
with a stated axis order. An `Opener` is a small picklable recipe, so that every block task (on a thread or a dask
worker) opens the file itself and reads only its own trajectories.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from dpot_data.errors import InputError
from dpot_data.sources._blocks import check_sizes, check_stored, npy_info, on_disk_bytes

NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".cdf")
HDF5_SUFFIXES = (".h5", ".hdf5", ".he5")
NUMPY_SUFFIXES = (".npy", ".npz")
AXIS_LETTERS = {"N": "sample", "T": "time", "C": "channel", "Z": "z", "Y": "y", "X": "x"}


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
        if self.kind == "zarr":
            return xr.open_zarr(self.path, chunks=None, consolidated=None, decode_times=False, decode_coords="all")
        if self.kind in ("netcdf", "hdf5"):
            ds = xr.open_dataset(self.path, engine="h5netcdf" if _is_hdf5(self.path) else None, chunks=None,
                                 decode_times=False, decode_coords="all",  # CF bounds and grid mappings: coordinates
                                 **({"phony_dims": "sort"} if _is_hdf5(self.path) else {}))
            return _named_axes(ds, self.axes, self.names) if self.axes else ds
        if self.kind == "npy":
            data = np.load(self.path, mmap_mode="r", allow_pickle=False)
            return _split_channels(_numpy_arrays({"data": data}, self.axes), self.names, single=True)
        with np.load(self.path, allow_pickle=False) as npz:
            return _split_channels(_numpy_arrays({k: npz[k] for k in npz.files}, self.axes), self.names, single=False)


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
    return _split_channels(arrays, names, single=False)


def _split_channels(arrays: dict[str, xr.DataArray], names: tuple[str, ...], single: bool) -> xr.Dataset:
    """The arrays as variables; a "channel" axis split into one variable per component (named by `names`, else
    "c<k>" for a lone .npy, "<key>_<k>" otherwise). Views only: nothing is read."""
    out: dict[str, xr.DataArray] = {}
    for key, arr in arrays.items():
        if "channel" not in arr.dims:
            out[names[0] if single and names else key] = arr
            continue
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
    if kind != "npy":
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


def open_checked(opener: Opener) -> xr.Dataset:
    """`opener()`, with what goes wrong opening it as one InputError line naming the file."""
    try:
        return opener()
    except InputError:
        raise
    except (OSError, ValueError, TypeError, KeyError) as exc:
        what = {"zarr": "a Zarr store", "netcdf": "NetCDF", "hdf5": "HDF5", "npy": ".npy", "npz": ".npz"}[opener.kind]
        raise InputError(opener.path, f"cannot open as {what} with xarray ({type(exc).__name__}: "
                                      f"{str(exc).splitlines()[0] if str(exc) else ''}); expected NetCDF, HDF5, a "
                                      "Zarr store, or .npy/.npz with --axes") from None


def file_bytes(path: Path) -> int:
    """Bytes of a file, or of every file below a folder (a Zarr store)."""
    if path.is_file():
        return path.stat().st_size
    return sum(os.path.getsize(os.path.join(d, f)) for d, _s, files in os.walk(path) for f in files)
