"""Small inputs for the bring-your-own-data sources, written by other tools' own writers (docs/sources.md):

- `write_netcdf`: a CF-style NetCDF-4 file written by xarray (h5netcdf): `u`, `v` (member, time, lat, lon) with
  units and long names, a static `land` mask, NaN over land, a periodic longitude covering 360 degrees;
- `write_the_well`: a Well-layout HDF5 dataset written with h5py (`data/{train,valid,test}/<name>.hdf5`), 2D or 3D,
  with a scalar, a vector and a tensor field, a field constant in time, constant and time-varying scalars and
  periodic or wall boundary conditions; optionally NaN obstacle cells (NaN in every frame, as the Well's
  datasets with obstacles store them) and per-trajectory times (`dimensions/time` (n, T), `sample_varying`);
- `write_well_dummy`: the Well's own test file (the_well 1.2.0 `utils/dummy_data.py`, `write_dummy_data`): its
  boundary conditions say PERIODIC while their masks are all False, which the Well's reader takes as OPEN;
- `write_user_netcdf`: a researcher's own CF NetCDF file as it typically arrives: `temperature` in kelvin (about
  293 +- 3 K) on a non-square (sample, time, y, x) grid in metres and seconds, with a square obstacle of NaN cells
  constant in time;
- `write_pde_storage`: an HDF5 file in py-pde's `FileStorage` layout: a `data` dataset (T, y, x) without
  dimension names or coordinates, and a 1-D `times` dataset.

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


def write_user_netcdf(out: str | Path, *, samples: int = 12, frames: int = 30, ny: int = 48, nx: int = 64,
                      obstacle: int = 6, seed: int = 0, name: str = "heat.nc") -> Path:
    """A CF-1.10 NetCDF-4 file by xarray: `temperature` [K] (sample, time, y, x) float64 = 293 K plus a travelling
    wave of amplitude 3 K, NaN on an `obstacle` x `obstacle` block of cells (the same in every frame); coordinates
    x, y in metres (spacing 0.01 m), time in seconds (step 0.5 s)."""
    import xarray as xr

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    y, x = np.arange(ny) * 0.01, np.arange(nx) * 0.01
    t = np.arange(frames) * 0.5
    temp = 293.0 + 3.0 * np.stack([wave(t / 2, (y / (ny * 0.01), x / (nx * 0.01)), 1, float(rng.uniform(0, 6.28)))
                                   for _ in range(samples)])
    y0, x0 = ny // 2 - obstacle // 2, nx // 3
    temp[:, :, y0: y0 + obstacle, x0: x0 + obstacle] = np.nan
    ds = xr.Dataset(
        {"temperature": (("sample", "time", "y", "x"), temp,
                         {"standard_name": "air_temperature", "long_name": "temperature", "units": "K"})},
        coords={"time": ("time", t, {"standard_name": "time", "units": "s", "axis": "T"}),
                "y": ("y", y, {"long_name": "y", "units": "m", "axis": "Y"}),
                "x": ("x", x, {"long_name": "x", "units": "m", "axis": "X"}),
                "sample": ("sample", np.arange(samples))},
        attrs={"Conventions": "CF-1.10", "title": "synthetic heat transport past an obstacle"},
    )
    path = out / name
    ds.to_netcdf(path, engine="h5netcdf")
    return path


def _set(obj: h5py.HLObject, **attrs: object) -> None:
    for k, v in attrs.items():
        obj.attrs[k] = v


def _field(group: h5py.Group, name: str, data: np.ndarray, *, sample: bool, time: bool, dims: int) -> None:
    dset = group.create_dataset(name, data=data.astype(np.float32))
    _set(dset, sample_varying=sample, time_varying=time, dim_varying=np.ones(dims, dtype=bool))


def obstacle_cells(sizes: tuple[int, ...]) -> np.ndarray:
    """(*sizes) bool: a box of cells in the middle of the grid (x, y[, z] storage order), the synthetic obstacle."""
    cells = np.zeros(sizes, dtype=bool)
    cells[tuple(slice(s // 3, s // 3 + max(1, s // 4)) for s in sizes)] = True
    return cells


def _well_fields(f: h5py.File, n: int, t: np.ndarray, grids: list[np.ndarray], rng: np.random.Generator,
                 nan_cells: np.ndarray | None = None) -> None:
    """t0: density (varying) and a constant-in-time `obstacle`; t1: velocity; t2: a symmetric tensor D. `nan_cells`:
    every field NaN there in every frame (an obstacle, as the Well stores one)."""
    nd = len(grids)
    base = np.stack([wave(t, tuple(grids), 1, float(rng.uniform(0, 6.28))) for _ in range(n)])  # (n, T, *grid)
    if nan_cells is not None:
        base[:, :, nan_cells] = np.nan
    groups = {g: f.create_group(g) for g in ("t0_fields", "t1_fields", "t2_fields")}
    _set(groups["t0_fields"], field_names=["density", "obstacle"])
    _field(groups["t0_fields"], "density", 1.0 + 0.5 * base, sample=True, time=True, dims=nd)
    obstacle = np.where(np.isnan(base[:, 0]), np.nan, (base[:, 0] > 0.9).astype(np.float32))
    _field(groups["t0_fields"], "obstacle", obstacle, sample=True, time=False, dims=nd)
    _set(groups["t1_fields"], field_names=["velocity"])
    _field(groups["t1_fields"], "velocity", np.stack([base * (i + 1) for i in range(nd)], axis=-1), sample=True,
           time=True, dims=nd)
    _set(groups["t2_fields"], field_names=["D"])
    tensor = np.stack([np.stack([base * (1 + i + j) for j in range(nd)], axis=-1) for i in range(nd)], axis=-2)
    _field(groups["t2_fields"], "D", tensor, sample=True, time=True, dims=nd)


def _well_file(path: Path, n: int, t: np.ndarray, sizes: tuple[int, ...], periodic: bool, alpha: float,
               seed: int, obstacle_nan: bool = False, times_per_trajectory: bool = False) -> None:
    names = ("x", "y", "z")[: len(sizes)]
    grids = [np.arange(s, dtype=np.float64) / s for s in sizes]
    with h5py.File(path, "w") as f:
        _set(f, dataset_name="synthetic_waves", grid_type="cartesian", n_spatial_dims=len(sizes),
             n_trajectories=n, simulation_parameters=["alpha"], alpha=alpha)
        dims = f.create_group("dimensions")
        _set(dims, spatial_dims=list(names))
        if times_per_trajectory:  # trajectory i starts at i (its own times), the same steps
            own = np.stack([t + i for i in range(n)])
            dims.create_dataset("time", data=own.astype(np.float32)).attrs["sample_varying"] = True
        else:
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
        _well_fields(f, n, t, grids, np.random.default_rng([seed, int(alpha * 1000)]),
                     obstacle_cells(sizes) if obstacle_nan else None)


def write_the_well(out: str | Path, *, n: int = 2, frames: int = 5, res: int = 16, dims: int = 2,
                   periodic: bool = True, alphas: tuple[float, ...] = (0.5, 1.0), seed: int = 0,
                   obstacle_nan: bool = False, times_per_trajectory: bool = False) -> list[Path]:
    """A Well-layout dataset: `out/data/<split>/waves_alpha_<a>.hdf5` for each alpha and split (n trajectories
    each), float32 fields on a res^dims grid (x, y[, z] storage order). `obstacle_nan`: every field NaN in every
    frame on `obstacle_cells`; `times_per_trajectory`: `dimensions/time` (n, T), trajectory i starting at i."""
    t = np.arange(frames, dtype=np.float64) * 0.25
    paths = []
    for k, split in enumerate(("train", "valid", "test")):
        folder = Path(out) / "data" / split
        folder.mkdir(parents=True, exist_ok=True)
        for alpha in alphas:
            path = folder / f"waves_alpha_{alpha:g}.hdf5"
            _well_file(path, n, t, (res,) * dims, periodic, alpha, seed + k, obstacle_nan, times_per_trajectory)
            paths.append(path)
    return paths


def write_well_dummy(path: str | Path, *, seed: int = 0) -> Path:
    """The Well's own test file, in the layout of the_well 1.2.0 `utils/dummy_data.py` (`write_dummy_data`): 2
    trajectories of 10 frames on 32x32, a constant-in-time t0 field first, a t1 `field`, scalars `a`, `b` and a
    time-varying one, and boundary conditions `x_periodic`/`y_periodic` with bc_type PERIODIC whose masks are all
    False (the Well's reader takes those sides as OPEN)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n, nt, nx, ny = 2, 10, 32, 32
    x, y = np.linspace(0, 1, nx, dtype=np.float32), np.linspace(0, 1, ny, dtype=np.float32)
    t = np.linspace(0, 1, nt, dtype=np.float32)
    with h5py.File(path, "w") as f:
        _set(f, a=0.25, b=0.75, dataset_name="dummy_dataset", grid_type="cartesian", n_spatial_dims=2,
             n_trajectories=n, simulation_parameters=["a", "b"])
        bcs = f.create_group("boundary_conditions")
        for key, size in (("x_periodic", nx), ("y_periodic", ny)):
            bc = bcs.create_group(key)
            _set(bc, associated_dims=key[0], associated_fields=[], bc_type="PERIODIC", sample_varying=False,
                 time_varying=False)
            bc.create_dataset("mask", data=np.zeros(size, dtype=bool))
        dims = f.create_group("dimensions")
        _set(dims, spatial_dims=["x", "y"])
        for key, val in (("time", t), ("x", x), ("y", y)):
            dims.create_dataset(key, data=val).attrs["sample_varying"] = False
        scalars = f.create_group("scalars")
        _set(scalars, field_names=["a", "b", "time_varying_scalar"])
        for key, val in (("a", 0.25), ("b", 0.75)):
            scalars.create_dataset(key, data=np.array(val))
            _set(scalars[key], time_varying=False, sample_varying=False)
        scalars.create_dataset("time_varying_scalar", data=rng.random(nt))
        _set(scalars["time_varying_scalar"], time_varying=True, sample_varying=False)
        t0 = f.create_group("t0_fields")
        _set(t0, field_names=["constant_field"])
        t0.create_dataset("constant_field", data=rng.random((n, nx, ny), dtype=np.float32))
        _set(t0["constant_field"], dim_varying=[True, True], sample_varying=True, time_varying=False)
        t1 = f.create_group("t1_fields")
        _set(t1, field_names=["field"])
        t1.create_dataset("field", data=rng.random((n, nt, nx, ny, 2), dtype=np.float32))
        _set(t1["field"], dim_varying=[True, True], sample_varying=True, time_varying=True)
        _set(f.create_group("t2_fields"), field_names=[])
    return path


def write_pde_storage(path: str | Path, *, frames: int = 6, ny: int = 8, nx: int = 10, dt: float = 0.05,
                      seed: int = 0) -> Path:
    """An HDF5 file in py-pde's `FileStorage` layout: `data` (T, y, x) float64 without dimension names or
    coordinates, and `times` (T,), the frame times (every `dt`, from `dt`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    times = dt * np.arange(1, frames + 1)
    grids = (np.arange(ny) / ny, np.arange(nx) / nx)
    data = wave(times, grids, 1, float(np.random.default_rng(seed).uniform(0, 6.28)))
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=data, maxshape=(None, ny, nx), chunks=(1, ny, nx))  # grown frame by frame
        f.create_dataset("times", data=times, maxshape=(None,), chunks=(max(1, frames),))
        f.attrs["info"] = '{"field_attributes": {"class": "ScalarField"}}'
    return path
