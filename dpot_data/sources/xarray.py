"""Bring your own data (docs/sources.md, "Your own data"): any grid dataset xarray opens, as one canonical dataset.

Inputs: NetCDF files (h5netcdf, or scipy for NetCDF-3), HDF5 files (h5py-written ones name their axes with
`axes`, e.g. "NTYX"), Zarr stores, or `.npy`/`.npz` arrays with `axes` (e.g. "NTYXC"); several inputs are
concatenated along the sample dimension (a file without one is one trajectory). Variables and dimensions come
from the options or are guessed (`dpot_data.sources._xr_choose`); one line says what was chosen (a warning of
category `Chosen`, also kept in the provenance).

Values are cast to float32 as they are read. NaN follows the one rule of every reader (`_blocks.nan_rule`): a cell NaN
in every frame of a trajectory (land, an obstacle) is geometry, mask 0 and stored as 0 (the mask has no time axis);
NaN that comes and goes (a missing frame, member or Zarr chunk) is missing data, and a trajectory left with no
unmasked cell is nothing to train on: both are refused in one line naming the file and the trajectory. ±Inf is refused
(InputError naming the file, variable and trajectory). Frame times come from the time coordinate, or `time_var` (a 1-D
variable, e.g. py-pde's `times`; found by itself when the time dimension has no coordinate); with neither they are
frame indices and `dt` is None (unknown). Time coordinates must be finite and strictly increasing, spatial coordinates
finite, and several inputs must agree on time steps, domain, units and periodicity (InputError naming the file and the
variable). Units, long names, standard names and per-dimension periodicity go into `parameters`, hence into the
store's attributes and the manifest; the dataset is periodic when every spatial dimension is; `boundary` states what a
file cannot (py-pde's grids carry no periodicity), for every axis or per axis.

Memory: a block task opens the input itself and reads only its trajectories (NetCDF/HDF5/Zarr slices, .npy memory
maps); a `.npz` member is read whole by numpy, so large arrays belong in .npy, NetCDF or Zarr.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path
from typing import Sequence

import dask.array as da
import numpy as np
import xarray as xr

from dpot_format.layout import own_data_layout
from dpot_data.errors import InputError
from dpot_data.sources._blocks import MaskBlocks, NanMasked, SampleBlocks, as_path, auto_block, check_coordinate, \
    check_sizes, check_times, common_times, distinct_files, text_path, to_dask, uniform_step, unique_names
from dpot_data.sources._xr_choose import (TIME_NAMES, Choice, choose, has_coordinate, periodic_dim, space_values,
                                          time_values)
from dpot_data.sources._xr_open import Opener, check_input, check_numpy_file, file_bytes, kind_of, open_checked, \
    parse_axes, read_errors
from dpot_data.sources.base import ReadResult

READER_VERSION = "1"


class Chosen(UserWarning):
    """The one line saying which variables and dimensions the xarray source chose."""


class _Blocks(SampleBlocks):
    """(n, T, C, *space) float32 of one input (or inputs split by time): a block opens the input and reads its
    trajectories of each chosen variable, NaN kept for the NaN rule (`NanMasked`, which masks geometry cells and
    keeps the block's mask, so nothing is read twice). With `window` w, every trajectory is cut into T // w samples
    of w frames (n * (T // w), w, C, *space), and a block reads only its windows' frames."""

    def __init__(self, openers: list[Opener], frames: list[int], choice: Choice, shape: tuple[int, ...],
                 window: int | None = None) -> None:
        self.openers, self.frames, self.choice, self.window = openers, frames, choice, window
        self.per = shape[1] // window if window else 1
        self.shape = (shape[0] * self.per, window, *shape[2:]) if window else shape
        self.opener = openers[0]

    def _frames(self, s0: int, s1: int, f0: int, f1: int) -> np.ndarray:
        """Trajectories s0..s1-1, frames f0..f1-1 as float32 (NaN kept): input by input (several: frames
        concatenated along time), variable by variable, into one preallocated array."""
        out = np.empty((s1 - s0, f1 - f0, *self.shape[2:]), dtype=np.float32)
        choice = self.choice
        t0 = 0
        for opener, frames in zip(self.openers, self.frames):
            a, b = max(f0, t0), min(f1, t0 + frames)
            if a < b:
                ds = open_checked(opener)
                try:
                    for c, var in enumerate(choice.variables):
                        with read_errors(opener.path, var), np.errstate(over="ignore", invalid="ignore"):
                            # the bare variable under the file's own dimension names: no coordinate comes along and
                            # nothing is renamed, so variables named like the canonical dims (x, y, sample) are fine
                            arr = ds[var].variable.isel({choice.time: slice(a - t0, b - t0)})
                            many = choice.sample is not None and choice.sample in arr.dims
                            arr = arr.isel({choice.sample: slice(s0, s1)}) if many else arr
                            order = ((choice.sample,) if many else ()) + (choice.time, *choice.space)
                            values = np.asarray(arr.transpose(*order).values, dtype=np.float32)
                            out[:, a - f0:b - f0, c] = values if many else values[None]
                finally:
                    ds.close()
            t0 += frames
        return out

    def _read(self, n0: int, n1: int) -> np.ndarray:
        """Samples n0..n1-1: whole trajectories, or (with `window`) the windows of each trajectory they cover."""
        if not self.window:
            return self._frames(n0, n1, 0, self.shape[1])
        out = np.empty((n1 - n0,) + self.shape[1:], dtype=np.float32)
        w = self.window
        for traj in range(n0 // self.per, (n1 - 1) // self.per + 1):
            a, b = max(n0, traj * self.per), min(n1, (traj + 1) * self.per)
            wa, wb = a - traj * self.per, b - traj * self.per
            frames = self._frames(traj, traj + 1, wa * w, wb * w)[0]
            out[a - n0:b - n0] = frames.reshape(wb - wa, w, *frames.shape[1:])
        return out

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        out = self._read(n0, n1)
        if np.isinf(out).any():
            i, t, c = (int(v[0]) for v in np.nonzero(np.isinf(out))[:3])
            where = self.openers[0 if self.window else int(np.searchsorted(np.cumsum(self.frames), t,
                                                                            side="right"))].path
            raise InputError(where, f"{self.choice.variables[c]}: trajectory {n0 + i} holds +-Inf (first: "
                                               f"frame {t}); expected finite values, or NaN for masked cells")
        return out


def _openers(paths: Sequence[Path], axes: tuple[str, ...] | None, names: tuple[str, ...]) -> list[Opener]:
    """One Opener per input (UTF-8 names, each file once, distinct names); .npy/.npz need `axes`."""
    out = []
    for p in paths:
        text_path(p)
        if not p.exists():
            raise InputError(p, "not found")
        kind = kind_of(p)
        if kind is None:
            raise InputError(p, "expected a NetCDF (.nc), HDF5 (.h5) or .npy/.npz file, or a Zarr store folder")
        check_input(p, kind)
        if kind in ("npy", "npz"):
            check_numpy_file(p, kind, axes)
        out.append(Opener(str(p), kind, axes, names))
    return out


def _inputs(paths: Sequence[str | Path]) -> list[Path]:
    """Paths as given; a folder that is not a Zarr store replaced by the inputs inside it (sorted)."""
    out: list[Path] = []
    for p in map(as_path, paths):
        if p.is_dir() and kind_of(p) is None:
            found = sorted(q for q in p.iterdir() if kind_of(q) is not None)
            if not found:
                raise InputError(p, "expected NetCDF, HDF5, .npy/.npz files or Zarr stores inside")
            out.extend(found)
        else:
            out.append(p)
    if not out:
        raise InputError("<no files>", "expected at least one NetCDF, HDF5, Zarr or .npy/.npz input")
    out = distinct_files(out)
    unique_names(out)
    return out


def _file_shape(ds: xr.Dataset, choice: Choice, where: str, window: int | None = None) -> tuple[int, ...]:
    """(trajectories, T, C, *space) of one input under the choice, checked against the limits (with `window`: the
    bytes of one window, not of a whole trajectory)."""
    size = {str(k): int(v) for k, v in ds.sizes.items()}  # by the file's own names (another dimension may be
    space = tuple(size[d] for d in choice.space)  # named like a canonical one: x, sample)
    n, t = (size.get(choice.sample, 1) if choice.sample else 1), size[choice.time]
    key = ",".join(choice.variables)
    check_sizes(where, key, frames=t)
    check_sizes(where, key, trajectories=n * (t // window if window else 1), frames=min(t, window or t), space=space,
                channels=len(choice.variables))
    return (n, t, len(choice.variables), *space)


def _same_layout(ds: xr.Dataset, choice: Choice, first: tuple[int, ...], where: str, first_name: str,
                 time: bool = True) -> None:
    """Every input holds the chosen variables with the first input's grid, and its frames (`time`) or its
    trajectories (not `time`: inputs concatenated along time)."""
    missing = [v for v in choice.variables if v not in ds.variables]
    if missing:
        raise InputError(where, f"expected the variables {', '.join(choice.variables)} like {first_name}; "
                                f"{', '.join(missing)} missing")
    shape = _file_shape(ds, choice, where)
    if time and shape[1:] != first[1:]:
        raise InputError(where, f"expected {first[1]} frames on a {'x'.join(map(str, first[3:]))} grid like "
                                f"{first_name}, found {shape[1]} frames on {'x'.join(map(str, shape[3:]))}")
    if not time and (shape[0], *shape[2:]) != (first[0], *first[2:]):
        raise InputError(where, f"expected {first[0]} trajectories on a {'x'.join(map(str, first[3:]))} grid like "
                                f"{first_name} (--concat time), found {shape[0]} on {'x'.join(map(str, shape[3:]))}")


def parse_boundary(boundary: str | None, periodic: bool | None, dims: Sequence[str]) -> dict[str, bool]:
    """The periodicity the command line states, per canonical spatial dim: `--boundary periodic|non-periodic` (every
    axis) or per axis `x=periodic,y=non-periodic` (axes not named keep the file's), or `--periodic/--non-periodic`
    (every axis); {} when it states none. InputError naming the option otherwise."""
    if boundary is not None and periodic is not None:
        raise InputError("--boundary", "expected --boundary or --periodic/--non-periodic, not both")
    if boundary is None:
        return {} if periodic is None else {d: bool(periodic) for d in dims}
    kinds = {"periodic": True, "non-periodic": False}
    text = boundary.strip().lower()
    if text in kinds:
        return {d: kinds[text] for d in dims}
    out: dict[str, bool] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        axis, _, kind = (v.strip() for v in part.partition("="))
        if axis not in dims or kind not in kinds or axis in out:
            raise InputError("--boundary", f"expected periodic, non-periodic or per axis AXIS=periodic|non-periodic "
                                           f"with AXIS one of {', '.join(dims)} (each at most once), got {boundary!r}")
        out[axis] = kinds[kind]
    if not out:
        raise InputError("--boundary", f"expected periodic, non-periodic or AXIS=KIND pairs, got {boundary!r}")
    return out


def _attrs_of(ds: xr.Dataset, choice: Choice, stated: dict[str, bool]) -> tuple[dict, str, dict]:
    """(parameters, boundary, provenance extras): units, long and standard names of variables and dimensions, and
    the periodicity of each spatial dimension: the file's, or what the command line `stated` (parse_boundary),
    recorded as `boundary_given`."""
    keep = ("units", "long_name", "standard_name")
    variables = {v: {k: str(ds[v].attrs[k]) for k in keep if k in ds[v].attrs} for v in choice.variables}
    canonical = ("z", "y", "x")[3 - len(choice.space):]
    dims = {}
    for d, c in zip(choice.space, canonical):
        attrs = ds[d].attrs if d in ds.variables else {}
        dims[c] = {"name": d, "periodic": stated.get(c, periodic_dim(ds, d)),
                   **{k: str(attrs[k]) for k in keep if k in attrs}}
    _times, time_units = time_values(ds, choice.time)
    dims["time"] = {"name": choice.time, **({"units": time_units} if time_units else {})}
    boundary = "periodic" if all(dims[c]["periodic"] for c in canonical) else "non-periodic"
    params = {"variables": variables, "dims": dims, "periodic_dims": [c for c in canonical if dims[c]["periodic"]]}
    if stated:  # the file cannot say it (a py-pde grid): the command line did
        params["boundary_given"] = {c: "periodic" if v else "non-periodic" for c, v in stated.items()}
    globals_ = {k: str(v) for k, v in ds.attrs.items() if isinstance(v, (str, int, float, np.number))}
    return params, boundary, {"global_attrs": dict(list(globals_.items())[:32])}


def dataset_name(path: Path) -> str:
    """A manifest dataset name from an input's name: lower case, runs of other characters as "-"."""
    stem = path.name.split(".")[0] if not path.is_dir() else path.name.removesuffix(".zarr")
    name = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-")
    return name or "data"


def _groups(openers: list[Opener], datasets: list[xr.Dataset], choice: Choice,
            concat: str) -> list[list[tuple[Opener, xr.Dataset]]]:
    """Inputs grouped into trajectories: each input its own (concat "sample"), or all inputs one run of frames
    (concat "time": the same trajectories and grid in every input, frames in the order given)."""
    pairs = list(zip(openers, datasets))
    if concat == "sample":
        return [[pair] for pair in pairs]
    if concat != "time":
        raise InputError("--concat", f"expected sample or time, got {concat!r}")
    return [pairs]


def _group_shape(group: list[tuple[Opener, xr.Dataset]], choice: Choice, first: tuple[int, ...] | None,
                 first_name: str, window: int | None = None) -> tuple[tuple[int, ...], list[int]]:
    """(trajectories, frames, C, *space) of a group of inputs and the frames of each; every input checked against
    the first (variables, trajectories, grid)."""
    shapes = []
    for op, ds in group:
        ref = first or (shapes[0] if shapes else None)
        if ref is not None:
            _same_layout(ds, choice, ref, op.path, first_name, time=len(group) == 1)
        shapes.append(_file_shape(ds, choice, op.path, window))
    frames = [s[1] for s in shapes]
    if window is not None and not 1 <= window <= sum(frames):
        raise InputError("--window", f"expected 1 to {sum(frames)} frames (the frames of {first_name}), got {window}")
    return (shapes[0][0], sum(frames), *shapes[0][2:]), frames


def _parts(openers: list[Opener], datasets: list[xr.Dataset], choice: Choice, block: int | None,
           concat: str, window: int | None) -> tuple[da.Array, da.Array, list[str], list[dict]]:
    """Lazy fields and mask of all inputs, the sample ids ("<file>#<trajectory>", with `window`
    "<file>#<trajectory>/w<k>") and what each input looked like."""
    groups = _groups(openers, datasets, choice, concat)
    first_name = Path(openers[0].path).name
    first, _ = _group_shape(groups[0], choice, None, first_name, window)
    blk = auto_block(math.prod(first[2:]) * (window or first[1]) * 4, block)
    fields, masks, ids = [], [], []
    for group in groups:
        shape, frames = _group_shape(group, choice, first, first_name, window)
        blocks = _Blocks([op for op, _ in group], frames, choice, shape, window)
        token = [(op, file_bytes(Path(op.path)), Path(op.path).stat().st_mtime_ns) for op, _ in group]
        name = Path(group[0][0].path).name
        group_ids = [f"{name}#{i // blocks.per}/w{i % blocks.per}" if window else f"{name}#{i}"
                     for i in range(blocks.shape[0])]
        masked = NanMasked(blocks, group[0][0].path, group_ids)
        fields.append(to_dask(masked, blk, "xarray", token, choice, shape, window))
        masks.append(to_dask(MaskBlocks(masked), blk, "xarray-mask", token, choice, shape, window))
        ids.extend(group_ids)
    files = [{"name": Path(op.path).name, "container": op.kind, "dtypes": {v: str(ds[v].dtype) for v in choice.variables},
              "dims": {v: list(map(str, ds[v].dims)) for v in choice.variables}} for op, ds in zip(openers, datasets)]
    join = (lambda xs: da.concatenate(xs, axis=0)) if len(fields) > 1 else (lambda xs: xs[0])
    return join(fields), join(masks), ids, files


def _raw_variable(opener: Opener, name: str) -> np.ndarray | None:
    """A variable of an HDF5/NetCDF input as stored, before `--axes` names the axes (which leaves 1-D datasets such
    as py-pde's `times` out); None when there is none of that name."""
    raw = open_checked(Opener(opener.path, opener.kind))
    try:
        return np.asarray(raw[name].values) if name in raw.variables else None
    finally:
        raw.close()


def _input_times(opener: Opener, ds: xr.Dataset, choice: Choice,
                 time_var: str | None) -> tuple[np.ndarray | None, str | None, str | None]:
    """(frame times, their units, where they came from) of one input: `time_var`, else the time coordinate, else a
    1-D variable named like time (`times`, `time`, `t`, ...) of the time length (an HDF5 file without dimension
    names, e.g. py-pde's `FileStorage`: `data` and `times`); (None, None, None) when nothing gives them. Checked:
    finite, strictly increasing (`check_times`)."""
    n = int(ds.sizes[choice.time])
    where = opener.path
    if n == 0:  # before any time value is looked at (a datetime coordinate is taken from its first value)
        raise InputError(where, f"{choice.time}: a time axis of 0 frames; expected at least one frame")
    if time_var is not None:
        values = np.asarray(ds[time_var].values) if time_var in ds.variables else (
            _raw_variable(opener, time_var) if opener.kind in ("hdf5", "netcdf") else None)
        if values is None or values.shape != (n,) or values.dtype.kind not in "fiuM":
            found = "none" if values is None else f"{values.dtype} {values.shape}"
            raise InputError(where, f"--time-var {time_var}: expected a 1-D numeric variable of {n} frame times, "
                                    f"found {found}")
        units = ds[time_var].attrs.get("units") if time_var in ds.variables else None
        times = time_values(xr.Dataset(coords={"t": ("t", values, {"units": units} if units else {})}), "t")
        check_times(where, time_var, times[0])
        return times[0], times[1], time_var
    if has_coordinate(ds, choice.time):
        times, units = time_values(ds, choice.time)
        check_times(where, choice.time, times)
        return times, units, choice.time
    if opener.axes and opener.kind in ("hdf5", "netcdf"):
        for name in TIME_NAMES:
            values = _raw_variable(opener, name)
            if values is not None and values.shape == (n,) and values.dtype.kind in "fiu":
                times = values.astype(np.float64)
                check_times(where, name, times)
                return times, None, name
    return None, None, None


def _check_alike(openers: list[Opener], datasets: list[xr.Dataset], choice: Choice) -> None:
    """Every input: finite spatial coordinates, and the first input's domain, units and periodicity (only the first's
    are recorded); InputError naming the file and the variable."""
    first_name = Path(openers[0].path).name
    first, _b, _e = _attrs_of(datasets[0], choice, {})
    for k, (op, ds) in enumerate(zip(openers, datasets)):
        for d in choice.space:
            if has_coordinate(ds, d):
                check_coordinate(op.path, d, ds[d].values)
        if k == 0:
            continue
        params, _b, _e = _attrs_of(ds, choice, {})
        for v in choice.variables:
            a, b = first["variables"][v].get("units"), params["variables"][v].get("units")
            if a != b:
                raise InputError(op.path, f"{v}: units {b!r}; expected {a!r} like {first_name} (one unit per "
                                          "variable in one ingest)")
        for key in [c for c in first["dims"] if c != "time"] + ["time"]:
            for attr in ("units", "periodic"):
                a, b = first["dims"][key].get(attr), params["dims"][key].get(attr)
                if a != b:
                    raise InputError(op.path, f"{params['dims'][key]['name']}: {attr} {b!r}; expected {a!r} like "
                                              f"{first_name} (one domain, units and boundary per ingest)")
        for d, d0 in zip(choice.space, choice.space):
            a, b = space_values(datasets[0], d0), space_values(ds, d)
            if not np.allclose(a, b, rtol=1e-5, atol=1e-6 * float(np.ptp(a) or 1.0)):
                raise InputError(op.path, f"{d}: coordinates from {b[0]:g} to {b[-1]:g}; expected {a[0]:g} to "
                                          f"{a[-1]:g} like {first_name} (one domain per ingest)")


def _split_list(value: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """"u,v" or ["u", "v"] -> ("u", "v"); None or empty -> None."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    out = tuple(s.strip() for s in items if s and s.strip())
    return out or None


def _window(value: int | str | None) -> int | None:
    """--window as a positive int (the CLI hands it over as text)."""
    if value is None:
        return None
    try:
        window = int(value)
    except ValueError:
        window = 0
    if window < 1:
        raise InputError("--window", f"expected a positive number of frames, got {value!r}")
    return window


def _open_all(paths: Sequence[str | Path], axes: str | None,
              names: tuple[str, ...]) -> tuple[list[Opener], list[xr.Dataset]]:
    """Openers of the inputs and each one opened lazily (metadata only)."""
    openers = _openers(_inputs(paths), parse_axes(axes), names)
    return openers, [open_checked(op) for op in openers]


def read(paths: Sequence[str | Path], *, name: str | None = None, variables: str | Sequence[str] | None = None,
         time_dim: str | None = None, space_dims: str | Sequence[str] | None = None, sample_dim: str | None = None,
         axes: str | None = None, periodic: bool | None = None, concat: str = "sample", window: int | None = None,
         block: int | None = None, time_var: str | None = None, boundary: str | None = None,
         check_finite: bool | str = True, convention: str = "dpot-reference") -> ReadResult:
    """Open NetCDF / HDF5 / Zarr / .npy / .npz inputs lazily as one canonical dataset (module docstring).

    `variables`, `time_dim`, `space_dims` ((z,) y, x order), `sample_dim` choose what the guess would; `axes` names
    the axes of .npy/.npz arrays and of HDF5 datasets without dimension names (letters N, T, C, Z, Y, X); with a C
    axis, `variables` names its components. `boundary` ("periodic", "non-periodic", or per axis
    "x=periodic,y=non-periodic") states the periodicity a file cannot (parse_boundary), recorded in `parameters`
    (`boundary_given`) and used as a stated one would be; `periodic` True/False is the same for every axis.
    `concat`: several inputs are more trajectories ("sample") or more frames of the same trajectories ("time", in
    the order given, as xarray.open_mfdataset combines files split by time). `window` w: every trajectory becomes
    T // w samples of w consecutive frames (a long run, a reanalysis: one trajectory of any length streams in
    bounded memory); the frames past the last whole window are left out. `time_var` names a 1-D variable holding
    the frame times (default: the time coordinate, else a 1-D `times`/`time`/`t` variable of the time length).
    `check_finite` and `convention` are accepted for the common reader interface: the NaN rule always applies and
    Inf is always refused, and no reference convention exists for user data (the seeded split applies).
    """
    chosen_vars = _split_list(variables)
    window = _window(window)
    named = bool(axes) and "C" in axes.upper()  # --vars names the components of the C axis
    openers, datasets = _open_all(paths, axes, chosen_vars or ())
    try:
        first = openers[0].path
        var_option = None if named or all(op.kind == "npy" for op in openers) else chosen_vars
        choice = choose(datasets[0], first, variables=var_option, time_dim=time_dim,
                        space_dims=_split_list(space_dims), sample_dim=sample_dim)
        stated = parse_boundary(boundary, periodic, ("z", "y", "x")[3 - len(choice.space):])
        fields, mask, ids, files = _parts(openers, datasets, choice, block, concat, window)
        _check_alike(openers, datasets, choice)
        timed = [_input_times(op, ds, choice, time_var) for op, ds in zip(openers, datasets)]
        times, dt, starts = _times(openers, timed, concat, window, ids)
        data = _dataset(datasets if concat == "time" else datasets[:1], choice, fields, mask, ids, stated,
                        (times, dt))
        time_from = next((n for _t, _u, n in timed if n is not None), None)
        if time_from is not None and time_from != choice.time:  # times from a variable: say which, with its units
            data.attrs["parameters"]["dims"]["time"] = {"name": choice.time, "from": time_from,
                                                        **({"units": timed[0][1]} if timed[0][1] else {})}
    finally:
        for ds in datasets:
            ds.close()
    line = choice.line(first if len(openers) == 1 else f"{first} (+{len(openers) - 1} more)")
    warnings.warn(line, Chosen, stacklevel=2)
    data.attrs["dataset"] = name or dataset_name(Path(first))
    data.attrs["provenance"] = {"reader": "dpot_data.sources.xarray", "reader_version": READER_VERSION,
                                "chosen": line, "files": files, "concat": concat, "window": window,
                                **data.attrs["provenance"]}
    return ReadResult(data=data, inputs=[Path(op.path) for op in openers if Path(op.path).is_file()],
                      sample_params={"time_start": starts} if starts is not None else {})


def _times(openers: list[Opener], timed: list[tuple[np.ndarray | None, str | None, str | None]], concat: str,
           window: int | None, ids: list[str]) -> tuple[np.ndarray | None, float | None, np.ndarray | None]:
    """(stored frame times, dt or None when unknown, per-sample start times or None) of the inputs' times
    (`_input_times`): concatenated along time (then increasing across the inputs, or InputError), or, inputs as
    trajectories, the same steps in each (`common_times`; differing starts give `time_start`). Times nobody stated
    are frame indices with dt None."""
    known = [t is not None for t, _u, _n in timed]
    if any(known) and not all(known):
        odd = openers[known.index(False)]
        raise InputError(odd.path, f"no frame times (no time coordinate and no --time-var), while "
                                   f"{Path(openers[known.index(True)].path).name} has them; expected times in every "
                                   "input or in none")
    starts = None
    if not all(known):
        times = None
    elif concat == "time":
        times = np.concatenate([t for t, _u, _n in timed])
        back = np.flatnonzero(np.diff(times) <= 0)
        if back.size:  # within each input they increase (`_input_times`): a later input starts too early
            cut = np.cumsum([len(t) for t, _u, _n in timed])
            where = openers[int(np.searchsorted(cut, int(back[0]) + 1, side="right"))].path
            raise InputError(where, "expected times increasing across the inputs in the order given (--concat "
                                    "time); give the files in time order")
    else:
        times, file_starts = common_times([(op.path, str(n), t) for op, (t, _u, n) in zip(openers, timed)])
        if file_starts is not None and not window:  # windows have times from 0 anyway
            start_of = {Path(op.path).name: start for op, start in zip(openers, file_starts)}
            starts = np.array([start_of[i.rsplit("#", 1)[0]] for i in ids])  # ids: "<file name>#<trajectory>"
    if times is None:
        return None, None, None  # frame indices (of a window, with `window`), dt unknown
    times = times[:window] - times[0] if window else times  # a window's frames, from 0
    return times, uniform_step(times), starts


def _dataset(datasets: list[xr.Dataset], choice: Choice, fields: da.Array, mask: da.Array, ids: list[str],
             stated: dict[str, bool], frame_times: tuple[np.ndarray | None, float | None]) -> xr.Dataset:
    """The canonical dataset of the chosen variables (attrs: parameters with units, names and periodicity);
    `frame_times`: the stored times (None: frame indices) and dt (None: unknown), from `_times`."""
    ds = datasets[0]
    canonical = ("z", "y", "x")[3 - len(choice.space):]
    params, boundary, extra = _attrs_of(ds, choice, stated)
    times, dt = frame_times
    unknown = times is None
    times = np.arange(fields.shape[1], dtype=np.float64) if unknown else times
    coords = {"sample": np.array(ids, dtype=str), "time": times, "channel": np.array(choice.variables),
              **{c: space_values(ds, d) for d, c in zip(choice.space, canonical)}}
    return xr.Dataset(
        {"fields": (("sample", "time", "channel", *canonical), fields), "mask": (("sample", *canonical), mask)},
        coords=coords,
        attrs={"source": "xarray", "dataset": "data", "boundary": boundary, "parameters": params, "dt": dt,
               "time_is_index": unknown,  # no times stated: `time` holds frame indices, dt stays null
               "provenance": extra, "model_layout": own_data_layout(len(canonical))},
    )
