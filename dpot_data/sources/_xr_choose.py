"""Which variables and dimensions of an `xarray.Dataset` make the trajectories of the generic `xarray` source: the
explicit options (`--vars`, `--time-dim`, `--space-dims`, `--sample-dim`) first, else CF conventions (`axis`,
`standard_name`, `units` of the coordinates) and common names. Nothing is read but metadata.

Rules (docs/sources.md, "Your own data"): the time dimension is required; every numeric data variable that has it
must have exactly the chosen dimensions (plus, optionally, the sample dimension), or the file is refused naming the
variable (pass `--vars` to choose); variables without a time dimension (a static land mask, bathymetry) are left out
and named in the one line that says what was chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import xarray as xr

from dpot_data.errors import InputError

TIME_NAMES = ("time", "t", "times", "Time", "TIME", "time_counter", "frame", "step")
SAMPLE_NAMES = ("sample", "samples", "member", "members", "ensemble", "realization", "realisation", "trajectory",
                "trajectories", "traj", "run", "runs", "batch", "case", "n", "N")
SPACE_NAMES = {"z": ("z", "depth", "lev", "level", "height", "altitude", "zc", "nz", "Z"),
               "y": ("y", "lat", "latitude", "yc", "ny", "rlat", "Y", "j"),
               "x": ("x", "lon", "longitude", "xc", "nx", "rlon", "X", "i")}
CF_AXIS = {"T": "time", "Z": "z", "Y": "y", "X": "x"}
CF_NAMES = {"time": "time", "latitude": "y", "longitude": "x", "projection_y_coordinate": "y",
            "projection_x_coordinate": "x", "grid_latitude": "y", "grid_longitude": "x", "depth": "z",
            "height": "z", "altitude": "z", "air_pressure": "z", "model_level_number": "z"}


@dataclass(frozen=True)
class Choice:
    """The chosen variables (channels, in order), the time, space ((z,) y, x order) and sample dimensions."""

    variables: tuple[str, ...]
    time: str
    space: tuple[str, ...]
    sample: str | None
    left_out: tuple[str, ...] = ()
    how: dict[str, str] = field(default_factory=dict)  # dimension role -> "option" | "CF" | "name" | "order"

    def line(self, where: str) -> str:
        """The one line that says what was chosen and how."""
        space = ", ".join(f"{d} -> {c}" for d, c in zip(self.space, ("z", "y", "x")[3 - len(self.space):]))
        sample = f"sample dim {self.sample!r} ({self.how.get('sample')})" if self.sample else "one trajectory per file"
        left = f"; left out (no time dimension): {', '.join(self.left_out)}" if self.left_out else ""
        return (f"{where}: variables {', '.join(self.variables)} ({self.how.get('vars')}); time dim {self.time!r} "
                f"({self.how.get('time')}); space dims {space} ({self.how.get('space')}); {sample}{left}")


def _role(ds: xr.Dataset, dim: str) -> str | None:
    """"time", "z", "y" or "x" from the CF attributes of the coordinate named like the dimension, else None."""
    if dim not in ds.coords and dim not in ds.variables:
        return None
    attrs = ds[dim].attrs
    axis = str(attrs.get("axis", "")).upper()
    if axis in CF_AXIS:
        return CF_AXIS[axis]
    role = CF_NAMES.get(str(attrs.get("standard_name", "")))
    if role is not None:
        return role
    units = str(attrs.get("units", ""))
    if " since " in units:
        return "time"
    return {"degrees_north": "y", "degree_north": "y", "degrees_east": "x", "degree_east": "x"}.get(units)


def _pick(found: Sequence[str], given: str | None, names: Sequence[str], what: str, where: str) -> str | None:
    """The dimension named by an option (must exist), else the first of `names` present."""
    if given is not None:
        if given not in found:
            raise InputError(where, f"--{what}-dim {given!r}: expected one of the dimensions {tuple(found)}")
        return given
    return next((n for n in names if n in found), None)


def _time_dim(ds: xr.Dataset, dims: Sequence[str], given: str | None, where: str) -> tuple[str, str]:
    """The time dimension and how it was found; InputError when there is none."""
    if given is not None:
        return _pick(dims, given, (), "time", where), "option"
    by_cf = [d for d in dims if _role(ds, d) == "time"]
    if by_cf:
        return by_cf[0], "CF"
    by_name = _pick(dims, None, TIME_NAMES, "time", where)
    if by_name is None:
        raise InputError(where, f"expected a time dimension (named {', '.join(TIME_NAMES[:3])}, ... or a coordinate "
                                f"with axis 'T' or units '<unit> since <date>'); found dimensions {tuple(dims)}; name "
                                "it with --time-dim")
    return by_name, "name"


def _space_dims(ds: xr.Dataset, rest: Sequence[str], given: Sequence[str] | None,
                where: str) -> tuple[tuple[str, ...], str]:
    """The spatial dimensions in (z,) y, x order and how they were found: the option, CF roles, common names, or
    the storage order of the two or three dimensions left."""
    if given:
        missing = [d for d in given if d not in rest]
        if missing or len(given) not in (2, 3):
            raise InputError(where, f"--space-dims {','.join(given)}: expected 2 or 3 of the dimensions {tuple(rest)}")
        return tuple(given), "option"
    roles = {d: _role(ds, d) for d in rest}
    by_role = {r: d for d, r in roles.items() if r in ("z", "y", "x")}
    if {"y", "x"} <= set(by_role):
        return tuple(by_role[r] for r in ("z", "y", "x") if r in by_role), "CF"
    by_name = {r: next((d for d in rest if d in names), None) for r, names in SPACE_NAMES.items()}
    if by_name["y"] and by_name["x"]:
        return tuple(by_name[r] for r in ("z", "y", "x") if by_name[r]), "name"
    if len(rest) in (2, 3):
        return tuple(rest), "order"
    raise InputError(where, f"expected 2 or 3 spatial dimensions (x, y, z, lat, lon, ... or CF axis X/Y/Z) beside "
                            f"time; found {tuple(rest)}; name them with --space-dims (and --sample-dim)")


def _candidates(ds: xr.Dataset, given: Sequence[str] | None, where: str) -> list[str]:
    """The data variables named by --vars (each must exist), else every data variable."""
    if given:
        missing = [v for v in given if v not in ds.variables]
        if missing:
            raise InputError(where, f"--vars: no variable {', '.join(map(repr, missing))}; expected some of "
                                    f"{sorted(map(str, ds.data_vars))}")
        return list(given)
    return [str(v) for v in ds.data_vars]


def _check_variable(ds: xr.Dataset, var: str, allowed: set[str], required: set[str], where: str) -> None:
    """A chosen variable: numeric, with the required dimensions and no others."""
    v = ds[var]
    if v.dtype.kind not in "fiub":
        raise InputError(where, f"variable {var!r} holds {v.dtype} data; expected numbers (float or integer)")
    if not required <= set(v.dims) or not set(v.dims) <= allowed:
        raise InputError(where, f"variable {var!r} has dimensions {tuple(map(str, v.dims))}; expected "
                                f"{tuple(sorted(required))} (and optionally the sample dimension) and no others; "
                                "choose variables with --vars or dimensions with --time-dim/--space-dims/--sample-dim")


def choose(ds: xr.Dataset, where: str, *, variables: Sequence[str] | None = None, time_dim: str | None = None,
           space_dims: Sequence[str] | None = None, sample_dim: str | None = None) -> Choice:
    """Decide variables and dimensions (module docstring); InputError naming `where` when the data do not fit."""
    names = _candidates(ds, variables, where)
    with_dims = [v for v in names if ds[v].ndim > 0]
    all_dims = list(dict.fromkeys(str(d) for v in with_dims for d in ds[v].dims))
    time, how_time = _time_dim(ds, all_dims, time_dim, where)
    timed = [v for v in with_dims if time in ds[v].dims]
    if not timed:
        raise InputError(where, f"expected variables with the time dimension {time!r}; found {names}")
    sample = _pick(all_dims, sample_dim, SAMPLE_NAMES, "sample", where)
    order = [str(d) for d in ds[timed[0]].dims if d not in (time, sample)]
    space, how_space = _space_dims(ds, order, space_dims, where)
    allowed = {time, *space} | ({sample} if sample else set())
    for v in (names if variables else timed):
        _check_variable(ds, v, allowed, {time, *space}, where)
    left_out = tuple(v for v in names if v not in timed)
    how = {"vars": "option" if variables else "all with the time dimension", "time": how_time, "space": how_space,
           "sample": "option" if sample_dim else "name"}
    return Choice(tuple(timed), time, space, sample, left_out, how)


def has_coordinate(ds: xr.Dataset, dim: str) -> bool:
    """Whether a dimension has a 1-D numeric (or datetime) coordinate of its own length (else `time_values` gives
    frame indices and `space_values` cell centres: positions nobody stated)."""
    return dim in ds.variables and ds[dim].shape == (int(ds.sizes[dim]),) and ds[dim].dtype.kind in "fiuM"


def time_values(ds: xr.Dataset, dim: str) -> tuple[np.ndarray, str | None]:
    """The time coordinate as float (datetimes as seconds from the first) and its units; frame indices if absent
    (`has_coordinate` tells: the time step is then unknown, not 1)."""
    n = int(ds.sizes[dim])
    if dim not in ds.variables:
        return np.arange(n, dtype=np.float64), None
    values = np.asarray(ds[dim].values)
    units = ds[dim].attrs.get("units")
    if np.issubdtype(values.dtype, np.datetime64):
        seconds = (values - values[0]) / np.timedelta64(1, "s")
        return seconds.astype(np.float64), f"seconds since {values[0]}"
    if values.dtype.kind not in "fiu" or values.shape != (n,):
        return np.arange(n, dtype=np.float64), None
    return values.astype(np.float64), None if units is None else str(units)


def space_values(ds: xr.Dataset, dim: str) -> np.ndarray:
    """A spatial coordinate as float; cell centres of the unit interval where there is no numeric 1-D coordinate."""
    n = int(ds.sizes[dim])
    if dim in ds.variables and ds[dim].shape == (n,) and ds[dim].dtype.kind in "fiu":
        return np.asarray(ds[dim].values, dtype=np.float64)
    return (np.arange(n) + 0.5) / n


def periodic_dim(ds: xr.Dataset, dim: str) -> bool:
    """Whether a spatial dimension wraps around: a truthy `periodic` attribute (or CF `topology`: circular), or a
    longitude coordinate covering 360 degrees with its last step."""
    attrs = ds[dim].attrs if dim in ds.variables else {}
    flag = attrs.get("periodic", attrs.get("topology"))
    if flag is not None:
        return str(flag).strip().lower() in ("1", "true", "yes", "periodic", "circular")
    if _role(ds, dim) != "x" or "degree" not in str(attrs.get("units", "")):
        return False
    v = space_values(ds, dim)
    return bool(len(v) > 1 and abs((v[-1] - v[0]) * len(v) / (len(v) - 1) - 360.0) < 1e-3 * 360)
