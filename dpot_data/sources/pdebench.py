"""PDEBench reader (docs/sources.md): 2D/3D compressible NS (flat HDF5), diffusion–reaction and shallow water
(one group per sample), opened lazily as the canonical dataset.

- Compressible NS: `density`, `pressure`, `Vx`, `Vy` [, `Vz`] (N, T, X, Y[, Z]) become channels
  `Vx, Vy, [Vz,] density, pressure` (DPOT's order) with the spatial axes reversed to (y, x) / (z, y, x).
  `t-coordinate` has T+1 entries; the first T are the frame times. M, η, ζ come from the file attributes when
  present, else from the file name (both are recorded). Periodic.
- Diffusion–reaction (`u, v`) and shallow water (`h`): groups `0000`.. sorted by number, `data` (T, y, x, C)
  already in (y, x) order; grid per group (the first group's grid is the dataset's, the others must match in size).
  The YAML `config` attribute is kept verbatim in the provenance and parsed only with a safe loader that turns
  unknown tags (`!!python/...`) into inert values, so nothing in it is ever executed. Non-periodic.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Sequence

import dask.array as da
import h5py
import numpy as np
import xarray as xr
import yaml

from dpot_data.catalog import manifest_name
from dpot_data.errors import InputError
from dpot_data.sources._blocks import (SampleBlocks, auto_block, checked, file_token, files_in, frames_ok,
                                        hdf5_problem, to_dask, unique_names)
from dpot_data.sources.base import ReadResult

READER_VERSION = "1"
CFD_VARS = {2: ("Vx", "Vy", "density", "pressure"), 3: ("Vx", "Vy", "Vz", "density", "pressure")}
_CFD_NAME = re.compile(
    r"(?P<dims>[23])D_CFD_(?P<kind>Rand|Turb)_M(?P<M>[0-9.eE+-]+?)_Eta(?P<eta>[0-9.eE+-]+?)_Zeta(?P<zeta>[0-9.eE+-]+?)"
    r"_periodic(?:_(?P<res>\d+))?_Train\.h(?:df)?5$")
GROUPED = {
    "dr": {"channels": ("u", "v"), "dataset": "pdebench-dr", "pde": "diffusion-reaction", "marker": "diff-react"},
    "swe": {"channels": ("h",), "dataset": "pdebench-swe", "pde": "shallow-water", "marker": "rdb"},
}


# ------------------------------------------------------------------------------------------------- small helpers

def format_number(v: float) -> str:
    """A parameter as dataset names write it: 1.0 -> 1, 0.01 -> 0.01, 1e-08 -> 1e-8."""
    s = f"{float(v):g}"
    return re.sub(r"e([+-])0*(\d)", lambda m: "e" + ("-" if m.group(1) == "-" else "") + m.group(2), s)


def cfd_dataset_name(*, kind: str, m: float, eta: float, zeta: float, res: int | None, dims: int) -> str:
    """Catalog name of a compressible-NS file, e.g. pdebench-cfd-m0.1-eta0.01, pdebench-cfd-turb-m1-eta1e-8-512."""
    tail = f"-zeta{format_number(zeta)}" if zeta != eta else ""
    if dims == 3:
        eta_part = "" if eta == 1e-8 and zeta == 1e-8 else f"-eta{format_number(eta)}{tail}"
        return f"pdebench-cfd3d-m{format_number(m)}{eta_part}-{kind.lower()}"
    turb = "-turb" if kind == "Turb" else ""
    res_part = f"-{res}" if res not in (None, 128) else ""
    return f"pdebench-cfd{turb}-m{format_number(m)}-eta{format_number(eta)}{tail}{res_part}"


def parse_cfd_name(path: Path) -> dict[str, object] | None:
    """Parameters written in a compressible-NS file name, or None when the name does not follow the pattern."""
    match = _CFD_NAME.search(path.name)
    if not match:
        return None
    try:
        out = {k: float(match.group(k)) for k in ("M", "eta", "zeta")}
    except ValueError:
        return None
    return {**out, "kind": match.group("kind"), "dims": int(match.group("dims")),
            "res": int(match.group("res")) if match.group("res") else None}


class _InertLoader(yaml.SafeLoader):
    """A safe YAML loader that reads unknown tags (e.g. !!python/object/apply:...) as plain data, never objects."""


def _inert(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> object:
    if isinstance(node, yaml.MappingNode):
        return {"tag": node.tag, "value": loader.construct_mapping(node, deep=True)}
    if isinstance(node, yaml.SequenceNode):
        return {"tag": node.tag, "value": loader.construct_sequence(node, deep=True)}
    return {"tag": node.tag, "value": loader.construct_scalar(node)}


_InertLoader.add_multi_constructor("tag:yaml.org,2002:python/", _inert)
_InertLoader.add_multi_constructor("!", _inert)


def parse_config(text: str) -> dict[str, object] | None:
    """Parse a generator `config` string safely (unknown tags become inert values); None if it is not YAML."""
    try:
        out = yaml.load(text, Loader=_InertLoader)  # noqa: S506 - a SafeLoader subclass with inert tag handlers
    except yaml.YAMLError:
        return None
    return out if isinstance(out, dict) else None


def sim_parameters(config: dict[str, object] | None) -> dict[str, float]:
    """Numeric PDE parameters of the config's `sim` section (grid sizes, extents, counts and the seed left out)."""
    sim = (config or {}).get("sim")
    if not isinstance(sim, dict):
        return {}
    skip = re.compile(r"^(seed|n|xdim|ydim|tdim|t|n_time_steps|x_left|x_right|y_bottom|y_top|T_end)$")
    return {str(k): float(v) for k, v in sim.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and not skip.match(str(k))}


def _open(path: Path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise InputError(path, f"cannot open as HDF5 (truncated or corrupt): {exc}") from None


# ------------------------------------------------------------------------------------------------- compressible NS

class _CfdBlocks(SampleBlocks):
    """(N, T, C, [Z,] Y, X) float32 view of a flat compressible-NS file."""

    def __init__(self, path: Path, names: tuple[str, ...], shape: tuple[int, ...]) -> None:
        self.path, self.names = path, names
        n, t, *space = shape  # storage order (N, T, X, Y[, Z])
        self.shape = (n, t, len(names), *reversed(space))

    def block(self, n0: int, n1: int) -> np.ndarray:
        out = np.empty((n1 - n0,) + self.shape[1:], dtype=np.float32)
        with h5py.File(self.path, "r") as f:
            for c, name in enumerate(self.names):
                raw = f[name][n0:n1]  # (b, T, X, Y[, Z])
                out[:, :, c] = np.transpose(raw, (0, 1, *range(raw.ndim - 1, 1, -1)))  # one copy, to (y, x)
        return out

    def finite_frames(self, n0: int, n1: int) -> np.ndarray:
        ok = np.ones((n1 - n0, self.shape[1]), dtype=bool)
        with h5py.File(self.path, "r") as f:
            for name in self.names:
                ok &= frames_ok(f[name][n0:n1])
        return ok


def _cfd_file(path: Path) -> dict[str, object]:
    """Validate one compressible-NS file and collect its layout (no field data read)."""
    with _open(path) as f:
        dims = 3 if "Vz" in f else 2
        names = CFD_VARS[dims]
        missing = [k for k in names if k not in f]
        if missing:
            raise InputError(path, f"expected datasets {list(names)} (N, T, X, Y{', Z' if dims == 3 else ''}); "
                                   f"missing {missing}")
        shape = tuple(f["density"].shape)
        if len(shape) != 2 + dims:
            raise InputError(path, f"expected 'density' of rank {2 + dims} (N, T, X, Y{', Z' if dims == 3 else ''}), "
                                   f"found shape {shape}")
        for k in names:
            if tuple(f[k].shape) != shape:
                raise InputError(path, f"expected {k!r} of shape {shape} like 'density', found {tuple(f[k].shape)}")
            if f[k].dtype.kind != "f":
                raise InputError(path, f"expected {k!r} to hold floats, found {f[k].dtype}")
        coords = {}
        for axis, size in zip("xyz", shape[2:]):
            key = f"{axis}-coordinate"
            if key in f and f[key].shape == (size,):
                coords[axis] = np.asarray(f[key], dtype=np.float64)
            else:
                coords[axis] = (np.arange(size) + 0.5) / size
        t_raw = np.asarray(f["t-coordinate"], dtype=np.float64).reshape(-1) if "t-coordinate" in f else None
        attrs = {k: float(np.asarray(f.attrs[k]).reshape(-1)[0]) for k in ("M", "eta", "zeta") if k in f.attrs}
        dtype = f["density"].dtype.name
    return {"dims": dims, "names": names, "shape": shape, "coords": coords, "t": t_raw, "attrs": attrs,
            "dtype": dtype}


def reference_split(positions: Sequence[tuple[int, int]]) -> tuple[np.ndarray, str]:
    """The reference DPOT split of PDEBench files: per file, the first int(0.9 n) trajectories by index are train,
    the rest test (`positions`: (index in its file, trajectories in that file) per sample)."""
    split = np.array(["train" if i < int(0.9 * n) else "test" for i, n in positions], dtype=str)
    return split, "dpot-reference: per file, the first int(0.9 N) trajectories by index train, the rest test"


def _read_cfd(paths: list[Path], *, name: str | None, block: int | None, check: bool,
              convention: str = "dpot-reference") -> ReadResult:
    infos = [_cfd_file(p) for p in paths]
    first, p0 = infos[0], paths[0]
    params_list = []
    for p, info in zip(paths, infos):
        from_name = parse_cfd_name(p) or {}
        attrs = info["attrs"]
        if not attrs and not from_name:
            raise InputError(p, "expected M, eta, zeta as file attributes or in the file name "
                                "(2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5)")
        params = {k: attrs.get(k, from_name.get(k)) for k in ("M", "eta", "zeta")}
        if any(v is None for v in params.values()):
            raise InputError(p, f"expected M, eta and zeta; found {params} (attributes {attrs}, name {from_name})")
        params_list.append((params, from_name))
        if info["shape"][1:] != first["shape"][1:] or info["dims"] != first["dims"]:
            raise InputError(p, f"expected the layout of {p0.name} (frames and grid {first['shape'][1:]}), "
                                f"found {info['shape'][1:]}: ingest each kind of file as its own dataset")
        if params != params_list[0][0]:
            raise InputError(p, f"expected M, eta, zeta = {params_list[0][0]} like {p0.name}, found {params}: "
                                "ingest each parameter set as its own dataset")
    params, from_name = params_list[0]
    dims, names = first["dims"], first["names"]
    n_frames = first["shape"][1]
    space = first["shape"][2:]
    per_sample = n_frames * len(names) * int(np.prod(space)) * 4
    blk = auto_block(per_sample, block)
    parts, ids, skipped, used, positions = [], [], [], [], []
    for p, info in zip(paths, infos):
        file_ids = [f"{p.name}#{i}" for i in range(info["shape"][0])]
        blocks, keep, bad = checked(_CfdBlocks(p, names, info["shape"]), blk, file_ids, p.name, check)
        skipped.extend(bad)
        if keep.size:
            parts.append(to_dask(blocks, blk, "pdebench-cfd", file_token(p), keep.tolist()))
            ids.extend(file_ids[i] for i in keep)
            positions.extend((int(i), int(info["shape"][0])) for i in keep)
            used.append(p)
    if not parts:
        raise InputError(paths[0], "no usable trajectory: " + "; ".join(f"{w}: {r}" for w, r in skipped[:3]))
    fields = da.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    t_raw = first["t"]
    if t_raw is not None and len(t_raw) in (n_frames, n_frames + 1):
        time = t_raw[:n_frames]
    else:
        time = np.arange(n_frames, dtype=np.float64)
    dt = float(time[1] - time[0]) if n_frames > 1 and t_raw is not None and len(t_raw) >= n_frames else None
    kind = from_name.get("kind", "Rand")
    res = from_name.get("res") or (space[0] if dims == 2 else None)
    catalog_name = cfd_dataset_name(kind=str(kind), m=params["M"], eta=params["eta"], zeta=params["zeta"],
                                    res=res, dims=dims)
    spatial = ("z", "y", "x")[3 - dims:]
    coords_space = {axis: first["coords"][axis] for axis in spatial}
    mask = da.ones((fields.shape[0], *fields.shape[3:]), dtype=np.uint8,
                   chunks=(fields.chunks[0], *fields.shape[3:]))
    provenance = {
        "reader": "dpot_data.sources.pdebench",
        "reader_version": READER_VERSION,
        "layout": "flat compressible NS",
        "catalog_name": catalog_name,
        "files": {
            p.name: {
                "container": "hdf5", "dtype": info["dtype"], "shape": list(info["shape"]),
                "storage_axes": ["sample", "time", *("x", "y", "z")[:dims]],
                "t_coordinate_entries": None if info["t"] is None else int(len(info["t"])),
                "parameters_from": "attributes" if info["attrs"] else "file name",
                "attributes": info["attrs"], "name_parameters": {k: v for k, v in pl[1].items()
                                                                   if k in ("M", "eta", "zeta", "kind", "res")},
            }
            for p, info, pl in zip(paths, infos, params_list)
        },
    }
    data = xr.Dataset(
        {"fields": (("sample", "time", "channel", *spatial), fields), "mask": (("sample", *spatial), mask)},
        coords={"sample": np.array(ids, dtype=str), "time": time, "channel": np.array(names), **coords_space},
        attrs={"source": "pdebench", "dataset": manifest_name(name or catalog_name), "boundary": "periodic",
               "parameters": {"M": params["M"], "eta": params["eta"], "zeta": params["zeta"], "kind": str(kind)},
               "dt": dt, "provenance": provenance, "model_layout": "xy"},  # the reference's H, W = raw X, Y: as stored
    )
    split = None
    if convention == "dpot-reference" and dims == 2:
        split, data.attrs["split_rule"] = reference_split(positions)
    return ReadResult(data=data, inputs=used, skipped=skipped, split=split)


# ------------------------------------------------------------------------------------------------- one group per sample

class _GroupedBlocks(SampleBlocks):
    """(N, T, C, Y, X) float32 view of a one-group-per-sample file; `data` is (T, y, x, C) in each group."""

    def __init__(self, path: Path, groups: list[str], shape: tuple[int, ...]) -> None:
        self.path, self.groups = path, groups
        t, y, x, c = shape
        self.shape = (len(groups), t, c, y, x)

    def block(self, n0: int, n1: int) -> np.ndarray:
        out = np.empty((n1 - n0,) + self.shape[1:], dtype=np.float32)
        with h5py.File(self.path, "r") as f:
            for i, g in enumerate(self.groups[n0:n1]):
                out[i] = np.moveaxis(f[g]["data"][()], -1, 1)  # (T, y, x, C) -> (T, C, y, x)
        return out

    def finite_frames(self, n0: int, n1: int) -> np.ndarray:
        with h5py.File(self.path, "r") as f:
            return np.stack([frames_ok(f[g]["data"][()][None])[0] for g in self.groups[n0:n1]]) if n1 > n0 else \
                np.empty((0, self.shape[1]), bool)


def _grouped_kind(path: Path, channels: int) -> str:
    """"dr" or "swe", from the file name when it tells, else from the channel count; they must agree."""
    by_channels = {2: "dr", 1: "swe"}.get(channels)
    by_name = next((k for k, v in GROUPED.items() if v["marker"] in path.name), None)
    if by_name and by_channels and by_name != by_channels:
        raise InputError(path, f"the name says {GROUPED[by_name]['pde']} ({len(GROUPED[by_name]['channels'])} "
                               f"channels) but 'data' has {channels}")
    kind = by_name or by_channels
    if kind is None:
        raise InputError(path, f"expected 'data' with 2 channels (diffusion-reaction) or 1 (shallow water), "
                               f"found {channels}")
    return kind


def _text(value: object) -> str | None:
    """An HDF5 string attribute as str (h5py gives str or bytes), None when absent."""
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _seed_of(config: object, group: str) -> int:
    """The sample's generator seed from its config (`sim.seed`), else the group number, else -1."""
    parsed = parse_config(_text(config)) if config is not None else None
    sim = parsed.get("sim") if parsed else None
    seed = sim.get("seed") if isinstance(sim, dict) else None
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    return int(group) if group.isdigit() else -1


def _grouped_file(path: Path) -> dict[str, object]:
    """Validate a one-group-per-sample file (every group's `data` shape and dtype) and read its grid and config."""
    with _open(path) as f:
        groups = sorted((k for k in f.keys() if isinstance(f[k], h5py.Group)),
                        key=lambda k: (0, int(k)) if k.isdigit() else (1, k))
        if not groups:
            raise InputError(path, "expected groups '0000', '0001', ... each holding 'data' (T, y, x, C)")
        shape = None
        for g in groups:
            if "data" not in f[g]:
                raise InputError(path, f"group {g!r}: expected dataset 'data' (T, y, x, C), "
                                       f"found {sorted(f[g].keys())}")
            d = f[g]["data"]
            if len(d.shape) != 4 or d.dtype.kind != "f":
                raise InputError(path, f"group {g!r}: expected 'data' float (T, y, x, C), found {d.dtype} {d.shape}")
            if shape is None:
                shape = tuple(d.shape)
            elif tuple(d.shape) != shape:
                raise InputError(path, f"group {g!r}: expected 'data' of shape {shape} like group {groups[0]!r}, "
                                       f"found {tuple(d.shape)}")
        g0 = f[groups[0]]
        grid = {}
        for axis, size in zip("tyx", shape[:3]):
            key = f"grid/{axis}"
            if key in g0 and g0[key].shape == (size,):
                grid[axis] = np.asarray(g0[key], dtype=np.float64)
        config = _text(g0.attrs.get("config"))
        seeds = [_seed_of(f[g].attrs.get("config"), g) for g in groups]
        compression = g0["data"].compression
        dtype = g0["data"].dtype.name
    return {"groups": groups, "shape": shape, "grid": grid, "config": config, "seeds": seeds,
            "compression": compression, "dtype": dtype}


def _read_grouped(paths: list[Path], *, name: str | None, block: int | None, check: bool,
                  convention: str = "dpot-reference") -> ReadResult:
    infos = [_grouped_file(p) for p in paths]
    first, p0 = infos[0], paths[0]
    kinds = [_grouped_kind(p, info["shape"][3]) for p, info in zip(paths, infos)]
    for p, info, kind in zip(paths[1:], infos[1:], kinds[1:]):
        if kind != kinds[0] or info["shape"] != first["shape"]:
            raise InputError(p, f"expected the layout of {p0.name} ({GROUPED[kinds[0]]['pde']}, data {first['shape']}),"
                                f" found {GROUPED[kind]['pde']} {info['shape']}")
    spec = GROUPED[kinds[0]]
    n_t, ny, nx, nc = first["shape"]
    blk = auto_block(n_t * nc * ny * nx * 4, block)
    parts, ids, seeds, skipped, used, positions = [], [], [], [], [], []
    for p, info in zip(paths, infos):
        file_ids = [f"{p.name}#{g}" for g in info["groups"]]
        blocks, keep, bad = checked(_GroupedBlocks(p, info["groups"], info["shape"]), blk, file_ids, p.name, check)
        skipped.extend(bad)
        if keep.size:
            parts.append(to_dask(blocks, blk, f"pdebench-{kinds[0]}", file_token(p), keep.tolist()))
            ids.extend(file_ids[i] for i in keep)
            positions.extend((int(i), len(info["groups"])) for i in keep)
            seeds.extend(info["seeds"][i] for i in keep)
            used.append(p)
    if not parts:
        raise InputError(paths[0], "no usable trajectory: " + "; ".join(f"{w}: {r}" for w, r in skipped[:3]))
    fields = da.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    grid = first["grid"]
    time = grid.get("t", np.arange(n_t, dtype=np.float64))
    dt = float(time[1] - time[0]) if "t" in grid and n_t > 1 else None
    config = parse_config(first["config"]) if first["config"] is not None else None
    mask = da.ones((fields.shape[0], ny, nx), dtype=np.uint8, chunks=(fields.chunks[0], ny, nx))
    provenance = {
        "reader": "dpot_data.sources.pdebench",
        "reader_version": READER_VERSION,
        "layout": "one group per sample",
        "files": {
            p.name: {"container": "hdf5", "dtype": info["dtype"], "compression": info["compression"],
                     "groups": len(info["groups"]), "data_shape": list(info["shape"]),
                     "storage_axes": ["time", "y", "x", "channel"], "grid_found": sorted(info["grid"]),
                     "config": info["config"]}
            for p, info in zip(paths, infos)
        },
    }
    data = xr.Dataset(
        {"fields": (("sample", "time", "channel", "y", "x"), fields), "mask": (("sample", "y", "x"), mask)},
        coords={"sample": np.array(ids, dtype=str), "time": time, "channel": np.array(spec["channels"]),
                "y": grid.get("y", (np.arange(ny) + 0.5) / ny), "x": grid.get("x", (np.arange(nx) + 0.5) / nx)},
        attrs={"source": "pdebench", "dataset": manifest_name(name or spec["dataset"]), "boundary": "non-periodic",
               "parameters": {"pde": spec["pde"], **sim_parameters(config)}, "dt": dt, "provenance": provenance,
               # `data` is (T, y, x, C) and the reference's H, W are its axes 1, 2: the model sees (y, x)
               "model_layout": "yx" if convention == "dpot-reference" else "xy"},
    )
    split = None
    if convention == "dpot-reference":
        split, data.attrs["split_rule"] = reference_split(positions)
    return ReadResult(data=data, inputs=used, skipped=skipped, split=split,
                      sample_params={"seed": np.asarray(seeds, dtype=np.int64)})


# ------------------------------------------------------------------------------------------------- entry point

def layout(path: Path) -> str:
    """"cfd" (flat compressible NS) or "grouped" (one group per sample); InputError for anything else."""
    with _open(path) as f:
        if "density" in f and isinstance(f["density"], h5py.Dataset):
            return "cfd"
        for key in f.keys():
            if isinstance(f[key], h5py.Group) and "data" in f[key]:
                return "grouped"
        found = sorted(f.keys())[:8]
    raise InputError(path, "expected a PDEBench file: datasets density/pressure/Vx/Vy (compressible NS) or groups "
                           f"'0000'.. holding 'data' (diffusion-reaction, shallow water); found {found}")


def read(paths: Sequence[str | Path], *, name: str | None = None, block: int | None = None,
         check_finite: bool = True, convention: str = "dpot-reference") -> ReadResult:
    """Open PDEBench files lazily as one canonical dataset (all files of one kind and parameter set).

    Among several files, one that cannot be opened (truncated, corrupt) is skipped and reported; a single bad
    file, or files of different kinds, raise InputError naming the file. With `check_finite` (one streamed pass over
    the data before anything is written), trajectories holding NaN or Inf, or whose data cannot be read (a file
    corrupt past its header), are left out and listed in `skipped` with their id (a file none of whose
    trajectories can be read, by its name).
    """
    paths = files_in(paths, (".h5", ".hdf5"))
    if not paths:
        raise InputError("<no files>", "expected at least one PDEBench HDF5 file")
    for p in paths:
        if not p.is_file():
            raise InputError(p, "file not found")
    unique_names(paths)
    skipped: list[tuple[str, str]] = []
    good: list[Path] = []
    for p in paths:
        problem = hdf5_problem(p)
        if problem is None:
            good.append(p)
        elif len(paths) == 1:
            raise InputError(p, problem)
        else:
            skipped.append((p.name, problem))
    if not good:
        raise InputError(paths[0], "no readable file among the inputs: " + "; ".join(f"{w}: {r}" for w, r in skipped))
    kinds = [layout(p) for p in good]
    for p, k in zip(good[1:], kinds[1:]):
        if k != kinds[0]:
            raise InputError(p, f"expected a {kinds[0]} file like {good[0].name}: ingest each kind as its own dataset")
    result = (_read_cfd if kinds[0] == "cfd" else _read_grouped)(good, name=name, block=block, check=check_finite,
                                                                 convention=convention)
    result.skipped[:0] = skipped
    return result
