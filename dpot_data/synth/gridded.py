"""Small inputs for the bring-your-own-data sources, written by other tools' own writers (docs/sources.md):

- `write_netcdf`: a CF-style NetCDF-4 file written by xarray (h5netcdf): `u`, `v` (member, time, lat, lon) with
  units and long names, a static `land` mask, NaN over land, a periodic longitude covering 360 degrees;
- `write_the_well`: a Well-layout HDF5 dataset written with h5py (`data/{train,valid,test}/<name>.hdf5`), 2D or 3D,
  with a scalar, a vector and a tensor field, a field constant in time, constant and time-varying scalars and
  periodic or wall boundary conditions.

Both hold a travelling smooth wave, so resampling and rollouts see real structure.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np


def wave(t: np.ndarray, grids: tuple[np.ndarray, ...], k: int, phase: float) -> np.ndarray:
    """(T, *grid) float64: a wave of wave number k per axis over coordinates in [0, 1), travelling with time."""
    mesh = np.meshgrid(*grids, indexing="ij")
    arg = sum(2 * np.pi * k * (g + 0.1 * i) for i, g in enumerate(mesh))
    return np.stack([np.sin(arg - 2 * np.pi * 0.1 * tk + phase) for tk in t])


def write_netcdf(out: str | Path, *, members: int = 3, frames: int = 6, ny: int = 24, nx: int = 32,
                 land: bool = True, seed: int = 0, name: str = "ocean.nc") -> Path:
    """A CF-1.10 NetCDF-4 file by xarray: u, v (member, time, lat, lon) float64, NaN over the land cells."""
    import xarray as xr

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lat = np.linspace(-60.0, 60.0, ny)
    lon = np.arange(nx) * (360.0 / nx)
    t = np.arange(frames, dtype=np.float64)
    fields = {c: np.stack([wave(t, (lat / 120 + 0.5, lon / 360), 1 + i, float(rng.uniform(0, 6.28)))
                           for i in range(members)]) for c in ("u", "v")}
    mask = np.ones((ny, nx), dtype=np.int8)
    if land:
        mask[ny // 3: ny // 2, nx // 4: nx // 2] = 0
        for v in fields.values():
            v[..., mask == 0] = np.nan
    cf = {"u": ("eastward_sea_water_velocity", "eastward velocity", "m s-1"),
          "v": ("northward_sea_water_velocity", "northward velocity", "m s-1")}
    ds = xr.Dataset(
        {c: (("member", "time", "lat", "lon"), fields[c], {"standard_name": cf[c][0], "long_name": cf[c][1],
                                                         "units": cf[c][2]}) for c in ("u", "v")},
        coords={"time": ("time", t, {"standard_name": "time", "units": "hours since 2000-01-01", "axis": "T"}),
                "lat": ("lat", lat, {"standard_name": "latitude", "units": "degrees_north", "axis": "Y"}),
                "lon": ("lon", lon, {"standard_name": "longitude", "units": "degrees_east", "axis": "X"}),
                "member": ("member", np.arange(members))},
        attrs={"Conventions": "CF-1.10", "title": "synthetic travelling waves", "institution": "dpot synth"},
    )
    ds["land"] = (("lat", "lon"), 1 - mask, {"long_name": "land mask", "flag_values": "0 1"})
    path = out / name
    ds.to_netcdf(path, engine="h5netcdf")
    return path


def _set(obj: h5py.HLObject, **attrs: object) -> None:
    for k, v in attrs.items():
        obj.attrs[k] = v


def _field(group: h5py.Group, name: str, data: np.ndarray, *, sample: bool, time: bool, dims: int) -> None:
    dset = group.create_dataset(name, data=data.astype(np.float32))
    _set(dset, sample_varying=sample, time_varying=time, dim_varying=np.ones(dims, dtype=bool))


def _well_fields(f: h5py.File, n: int, t: np.ndarray, grids: list[np.ndarray], rng: np.random.Generator) -> None:
    """t0: density (varying) and a constant-in-time `obstacle`; t1: velocity; t2: a symmetric tensor D."""
    nd = len(grids)
    base = np.stack([wave(t, tuple(grids), 1, float(rng.uniform(0, 6.28))) for _ in range(n)])  # (n, T, *grid)
    groups = {g: f.create_group(g) for g in ("t0_fields", "t1_fields", "t2_fields")}
    _set(groups["t0_fields"], field_names=["density", "obstacle"])
    _field(groups["t0_fields"], "density", 1.0 + 0.5 * base, sample=True, time=True, dims=nd)
    _field(groups["t0_fields"], "obstacle", (base[:, 0] > 0.9).astype(np.float32), sample=True, time=False, dims=nd)
    _set(groups["t1_fields"], field_names=["velocity"])
    _field(groups["t1_fields"], "velocity", np.stack([base * (i + 1) for i in range(nd)], axis=-1), sample=True,
           time=True, dims=nd)
    _set(groups["t2_fields"], field_names=["D"])
    tensor = np.stack([np.stack([base * (1 + i + j) for j in range(nd)], axis=-1) for i in range(nd)], axis=-2)
    _field(groups["t2_fields"], "D", tensor, sample=True, time=True, dims=nd)


def _well_file(path: Path, n: int, t: np.ndarray, sizes: tuple[int, ...], periodic: bool, alpha: float,
               seed: int) -> None:
    names = ("x", "y", "z")[: len(sizes)]
    grids = [np.arange(s, dtype=np.float64) / s for s in sizes]
    with h5py.File(path, "w") as f:
        _set(f, dataset_name="synthetic_waves", grid_type="cartesian", n_spatial_dims=len(sizes),
             n_trajectories=n, simulation_parameters=["alpha"], alpha=alpha)
        dims = f.create_group("dimensions")
        _set(dims, spatial_dims=list(names))
        dims.create_dataset("time", data=t.astype(np.float32)).attrs["sample_varying"] = False
        for d, g in zip(names, grids):
            dims.create_dataset(d, data=g.astype(np.float32))
            _set(dims[d], sample_varying=False, time_varying=False)
        bcs = f.create_group("boundary_conditions")
        for d, s in zip(names, sizes):
            bc = bcs.create_group(f"{d}_{'periodic' if periodic else 'wall'}")
            _set(bc, associated_dims=[d], associated_fields=[], bc_type="PERIODIC" if periodic else "WALL",
                 sample_varying=False, time_varying=False)
            edge = np.zeros(s, dtype=bool)
            edge[[0, -1]] = True
            bc.create_dataset("mask", data=edge)
        scalars = f.create_group("scalars")
        _set(scalars, field_names=["alpha", "energy"])
        scalars.create_dataset("alpha", data=np.array(alpha))
        _set(scalars["alpha"], sample_varying=False, time_varying=False)
        scalars.create_dataset("energy", data=np.linspace(1, 2, len(t)))
        _set(scalars["energy"], sample_varying=False, time_varying=True)
        _well_fields(f, n, t, grids, np.random.default_rng([seed, int(alpha * 1000)]))


def write_the_well(out: str | Path, *, n: int = 2, frames: int = 5, res: int = 16, dims: int = 2,
                   periodic: bool = True, alphas: tuple[float, ...] = (0.5, 1.0), seed: int = 0) -> list[Path]:
    """A Well-layout dataset: `out/data/<split>/waves_alpha_<a>.hdf5` for each alpha and split (n trajectories
    each), float32 fields on a res^dims grid (x, y[, z] storage order)."""
    t = np.arange(frames, dtype=np.float64) * 0.25
    paths = []
    for k, split in enumerate(("train", "valid", "test")):
        folder = Path(out) / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        for alpha in alphas:
            path = folder / f"waves_alpha_{alpha:g}.hdf5"
            _well_file(path, n, t, (res,) * dims, periodic, alpha, seed + k)
            paths.append(path)
    return paths
