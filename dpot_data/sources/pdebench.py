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

import math
import re
from pathlib import Path
from typing import Sequence

import dask.array as da
import h5py
import numpy as np
import xarray as xr
import yaml

from dpot_format.names import manifest_name
from dpot_data.errors import InputError
from dpot_data.sources._blocks import (READ_ERRORS, SampleBlocks, all_finite, auto_block, check_file_total,
                                        check_h5_dataset, check_hdf5_contained, check_sizes, checked, checked_rows,
                                        file_token, frames_ok, h5_rows, hdf5_problem, input_files, nonfinite_error,
                                        read_error, read_whole, require_file, to_dask)
from dpot_data.sources.base import MAX_FRAMES, ReadResult

READER_VERSION = "1"
# check_finite="raise" refuses, with a TrajectoryError, every trajectory that check_finite=True leaves out (NaN/Inf,
# unreadable data): the ingest reads with "raise" first and scans only when a block read meets one (`ingest.pipeline`)
SCAN_IN_BLOCK_READS = True
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
    """(N, T, C, [Z,] Y, X) float32 view of a flat compressible-NS file.

    A block is read field by field, one trajectory at a time for contiguous storage (the whole block for chunked
    storage), straight into one reused buffer (h5py `read_direct`); each trajectory is checked for NaN/Inf while in
    cache and copied once, spatial axes reversed, into the preallocated output block."""

    def __init__(self, path: Path, names: tuple[str, ...], shape: tuple[int, ...]) -> None:
        self.path, self.names = path, names
        n, t, *space = shape  # storage order (N, T, X, Y[, Z])
        self.shape = (n, t, len(names), *reversed(space))
        self._reverse = (0, 1, *range(len(shape) - 1, 1, -1))  # (b, T, X, Y[, Z]) -> (b, T, [Z,] Y, X)

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        check = self.checks if check is None else check
        out = np.empty((n1 - n0,) + self.shape[1:], dtype=np.float32)
        with h5py.File(self.path, "r") as f, np.errstate(over="ignore"):  # float64 beyond float32: Inf, as always
            for c, name in enumerate(self.names):
                for s0, raw in checked_rows(f[name], n0, n1, self.path, name, check):
                    out[s0 - n0: s0 - n0 + len(raw), :, c] = raw.transpose(self._reverse)
        return out

    def finite_frames(self, n0: int, n1: int) -> np.ndarray:
        ok = np.ones((n1 - n0, self.shape[1]), dtype=bool)
        with h5py.File(self.path, "r") as f:
            for name in self.names:
                for s0, raw in h5_rows(f[name], n0, n1):
                    if not all_finite(raw):
                        ok[s0 - n0: s0 - n0 + len(raw)] &= frames_ok(raw)
        return ok


def _cfd_file(path: Path) -> dict[str, object]:
    """Validate one compressible-NS file and collect its layout (no field data read): the field set of its
    dimension (density (N, T, X, Y) is 2D: Vx, Vy, density, pressure; (N, T, X, Y, Z) is 3D: Vz too), shapes within
    the limits of dpot_data.sources.base and declared sizes backed by stored bytes."""
    with _open(path) as f:
        rank = len(f["density"].shape) if isinstance(f.get("density"), h5py.Dataset) else None
        dims = 3 if rank == 5 or (rank is None and "Vz" in f) else 2
        names = CFD_VARS[dims]
        axes = f"(N, T, X, Y{', Z' if dims == 3 else ''})"
        missing = [k for k in names if not isinstance(f.get(k), h5py.Dataset)]
        if missing:
            raise InputError(path, f"expected datasets {list(names)} {axes}, the {len(names)} fields of {dims}D "
                                   f"compressible NS; missing {missing}")
        shape = tuple(f["density"].shape)
        if len(shape) != 2 + dims:
            raise InputError(path, f"expected 'density' of rank 4 (N, T, X, Y) or 5 (N, T, X, Y, Z), "
                                   f"found shape {shape}")
        if dims == 2 and "Vz" in f:
            raise InputError(path, f"'Vz': expected the 4 fields {list(names)} of 2D compressible NS (density "
                                   f"{shape} is 2D), found a fifth, Vz")
        for k in names:
            if tuple(f[k].shape) != shape:
                raise InputError(path, f"expected {k!r} of shape {shape} like 'density', found {tuple(f[k].shape)}")
            if f[k].dtype.kind != "f":
                raise InputError(path, f"expected {k!r} to hold floats, found {f[k].dtype}")
        check_sizes(path, "density", trajectories=shape[0], frames=shape[1], space=shape[2:], channels=len(names))
        for k in names:
            check_h5_dataset(path, k, f[k])
        check_file_total(path, sum(f[k].nbytes for k in names), f"the fields {list(names)}")
        coords = {}
        for axis, size in zip("xyz", shape[2:]):
            key = f"{axis}-coordinate"
            if key in f and getattr(f[key], "shape", None) != (size,):
                raise InputError(path, f"{key!r}: expected {size} coordinates (one per cell along {axis}), found "
                                       f"{getattr(f[key], 'shape', 'a group')}")
            if key in f:
                check_h5_dataset(path, key, f[key])
                coords[axis] = np.asarray(f[key], dtype=np.float64)
            else:
                coords[axis] = (np.arange(size) + 0.5) / size
        t_raw = None
        if "t-coordinate" in f:
            t = f["t-coordinate"]
            if not isinstance(t, h5py.Dataset) or t.size > MAX_FRAMES + 1:
                raise InputError(path, f"'t-coordinate': expected the {shape[1] + 1} frame times (at most "
                                       f"{MAX_FRAMES + 1}), found {getattr(t, 'shape', 'a group')}")
            check_h5_dataset(path, "t-coordinate", t)
            t_raw = np.asarray(t, dtype=np.float64).reshape(-1)
        attrs = {k: _number_attr(path, k, f.attrs[k]) for k in ("M", "eta", "zeta") if k in f.attrs}
        dtype = f["density"].dtype.name
    return {"dims": dims, "names": names, "shape": shape, "coords": coords, "t": t_raw, "attrs": attrs,
            "dtype": dtype}


def _number_attr(path: Path, key: str, value: object) -> float:
    """A numeric file attribute (M, eta, zeta) as a float; InputError naming it when it is text or empty."""
    try:
        array = np.asarray(value)
        if array.dtype.kind not in "fiu" or array.size == 0:
            raise ValueError
        return float(array.reshape(-1)[0])
    except (ValueError, TypeError, OverflowError):
        raise InputError(path, f"attribute {key!r}: expected a number, found {value!r}") from None


def reference_split(positions: Sequence[tuple[int, int]]) -> tuple[np.ndarray, str]:
    """The reference DPOT split of PDEBench files: per file, the first int(0.9 n) trajectories by index are train,
    the rest test (`positions`: (index in its file, trajectories in that file) per sample)."""
    split = np.array(["train" if i < int(0.9 * n) else "test" for i, n in positions], dtype=str)
    return split, "dpot-reference: per file, the first int(0.9 N) trajectories by index train, the rest test"


def _cfd_parameters(paths: list[Path], infos: list[dict[str, object]]) -> list[tuple[dict, dict]]:
    """(M, eta, zeta) and the name's parameters of each file; InputError when missing or unlike the first file's."""
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
    return params_list


def _cfd_fields(paths: list[Path], infos: list[dict[str, object]], blk: int, check: bool) -> tuple[
        da.Array, list[str], list[tuple[str, str]], list[Path], list[tuple[int, int]]]:
    """All files' usable trajectories as one lazy array, with ids, what was skipped, files used, (index, N) each."""
    names = infos[0]["names"]
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
    return fields, ids, skipped, used, positions


def _cfd_time(t_raw: np.ndarray | None, n_frames: int) -> tuple[np.ndarray, float | None]:
    """Frame times from `t-coordinate` (its first T entries) when it fits, else frame indices; dt when known."""
    if t_raw is not None and len(t_raw) in (n_frames, n_frames + 1):
        time = t_raw[:n_frames]
    else:
        time = np.arange(n_frames, dtype=np.float64)
    dt = float(time[1] - time[0]) if n_frames > 1 and t_raw is not None and len(t_raw) >= n_frames else None
    return time, dt


def _cfd_provenance(paths: list[Path], infos: list[dict[str, object]], params_list: list[tuple[dict, dict]],
                    catalog_name: str) -> dict[str, object]:
    """What the reader saw in each file (shape, storage axes, where the parameters came from), for the manifest."""
    dims = infos[0]["dims"]
    return {
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


def _read_cfd(paths: list[Path], *, name: str | None, block: int | None, check: bool,
              convention: str = "dpot-reference") -> ReadResult:
    """Flat compressible-NS files of one parameter set and layout as one lazy, periodic dataset."""
    infos = [_cfd_file(p) for p in paths]
    first = infos[0]
    params_list = _cfd_parameters(paths, infos)
    params, from_name = params_list[0]
    dims, names = first["dims"], first["names"]
    n_frames = first["shape"][1]
    space = first["shape"][2:]
    blk = auto_block(n_frames * len(names) * int(np.prod(space)) * 4, block)
    fields, ids, skipped, used, positions = _cfd_fields(paths, infos, blk, check)
    time, dt = _cfd_time(first["t"], n_frames)
    kind = from_name.get("kind", "Rand")
    res = from_name.get("res") or (space[0] if dims == 2 else None)
    catalog_name = cfd_dataset_name(kind=str(kind), m=params["M"], eta=params["eta"], zeta=params["zeta"],
                                    res=res, dims=dims)
    spatial = ("z", "y", "x")[3 - dims:]
    coords_space = {axis: first["coords"][axis] for axis in spatial}
    mask = da.ones((fields.shape[0], *fields.shape[3:]), dtype=np.uint8,
                   chunks=(fields.chunks[0], *fields.shape[3:]))
    data = xr.Dataset(
        {"fields": (("sample", "time", "channel", *spatial), fields), "mask": (("sample", *spatial), mask)},
        coords={"sample": np.array(ids, dtype=str), "time": time, "channel": np.array(names), **coords_space},
        attrs={"source": "pdebench", "dataset": manifest_name(name or catalog_name), "boundary": "periodic",
               "parameters": {"M": params["M"], "eta": params["eta"], "zeta": params["zeta"], "kind": str(kind)},
               "dt": dt, "provenance": _cfd_provenance(paths, infos, params_list, catalog_name),
               "model_layout": "xy"},  # the reference's H, W = raw X, Y: as stored
    )
    split = None
    if convention == "dpot-reference":  # 2D and 3D alike (the reference's preprocess.py, docs/sources.md)
        split, data.attrs["split_rule"] = reference_split(positions)
    return ReadResult(data=data, inputs=used, skipped=skipped, split=split)


# ------------------------------------------------------------------------------------------------- one group per sample

class _GroupedBlocks(SampleBlocks):
    """(N, T, C, Y, X) float32 view of a one-group-per-sample file; `data` is (T, y, x, C) in each group. A block is
    read with one copy per value, each group's `data` straight into its place in a preallocated (b, T, y, x, C)
    block (h5py `read_direct`) and checked there for NaN/Inf; the block is returned as its (b, T, C, y, x) view."""

    def __init__(self, path: Path, groups: list[str], shape: tuple[int, ...]) -> None:
        self.path, self.groups = path, groups
        t, y, x, c = shape
        self.shape = (len(groups), t, c, y, x)
        self._raw = shape

    def _read(self, dset: h5py.Dataset, dest: np.ndarray, scratch: dict) -> np.ndarray:
        """`data` of one group into `dest` (float32); returns the array as stored, to be judged."""
        if dset.dtype.itemsize <= 4:
            read_whole(dset, dest)
            return dest
        raw = scratch.setdefault(dset.dtype, np.empty(self._raw, dtype=dset.dtype.newbyteorder("=")))
        read_whole(dset, raw)
        with np.errstate(over="ignore"):
            dest[...] = raw
        return raw

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        check = self.checks if check is None else check
        store = np.empty((n1 - n0, *self._raw), dtype=np.float32)
        scratch: dict = {}
        with h5py.File(self.path, "r") as f:
            for i, g in enumerate(self.groups[n0:n1]):
                try:
                    raw = self._read(f[g]["data"], store[i], scratch)
                except READ_ERRORS as exc:
                    raise read_error(self.path, f"{g}/data", g, exc) from None
                if check and not all_finite(raw):
                    raise nonfinite_error(self.path, f"{g}/data", g, raw)
        return store.transpose(0, 1, 4, 2, 3)  # (b, T, y, x, C) -> (b, T, C, y, x), a view

    def finite_frames(self, n0: int, n1: int) -> np.ndarray:
        ok = np.ones((n1 - n0, self.shape[1]), dtype=bool)
        dest = np.empty(self._raw, dtype=np.float32)
        scratch: dict = {}
        with h5py.File(self.path, "r") as f:
            for i, g in enumerate(self.groups[n0:n1]):
                raw = self._read(f[g]["data"], dest, scratch)
                if not all_finite(raw):
                    ok[i] = frames_ok(raw[None])[0]
        return ok


def _grouped_kind(path: Path, channels: int) -> str:
    """"dr" or "swe", from the file name when it tells, else from the channel count; the channel count must be the
    kind's (diffusion-reaction: 2, u and v; shallow water: 1, h)."""
    by_channels = {2: "dr", 1: "swe"}.get(channels)
    by_name = next((k for k, v in GROUPED.items() if v["marker"] in path.name), None)
    kind = by_name or by_channels
    if kind is None:
        raise InputError(path, f"'data': expected 2 channels (diffusion-reaction: u, v) or 1 (shallow water: h) on "
                               f"its last axis (T, y, x, C), found {channels}")
    spec = GROUPED[kind]
    if channels != len(spec["channels"]):
        raise InputError(path, f"'data': expected {len(spec['channels'])} channel{'s' * (len(spec['channels']) > 1)}"
                               f" ({', '.join(spec['channels'])}) on its last axis (T, y, x, C), as the name says "
                               f"{spec['pde']}; found {channels}")
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
        check_sizes(path, "groups", trajectories=len(groups))
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
                check_sizes(path, f"{g}/data", frames=shape[0], space=shape[1:3], channels=shape[3])
            elif tuple(d.shape) != shape:
                raise InputError(path, f"group {g!r}: expected 'data' of shape {shape} like group {groups[0]!r}, "
                                       f"found {tuple(d.shape)}")
            check_h5_dataset(path, f"{g}/data", d)
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
    check_file_total(path, len(groups) * math.prod(shape) * np.dtype(dtype).itemsize,
                     f"the 'data' of the {len(groups)} groups")
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
         check_finite: bool | str = True, convention: str = "dpot-reference") -> ReadResult:
    """Open PDEBench files lazily as one canonical dataset (all files of one kind and parameter set).

    Among several files, one that cannot be opened (truncated, corrupt) is skipped and reported; a single bad
    file, files of different kinds, a wrong field or channel count, or declared sizes beyond the limits of
    dpot_data.sources.base raise InputError naming the file. With `check_finite=True` (one streamed pass over the
    data when opened, before anything is written), trajectories holding NaN or Inf, or whose data cannot be read (a
    file corrupt past its header), are left out and listed in `skipped` with their id (a file none of whose
    trajectories can be read, by its name). With "raise" nothing is scanned when opened: the block reads check the
    values they read and a trajectory holding NaN or Inf raises InputError naming the file, the key and the
    trajectory. False keeps such values.
    """
    paths = input_files(paths, (".h5", ".hdf5"))
    if not paths:
        raise InputError("<no files>", "expected at least one PDEBench HDF5 file")
    for p in paths:
        require_file(p)
    skipped: list[tuple[str, str]] = []
    good: list[Path] = []
    for p in paths:
        problem = hdf5_problem(p)
        if problem is None:
            check_hdf5_contained(p)  # nothing read from outside the file: refused, never skipped
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
