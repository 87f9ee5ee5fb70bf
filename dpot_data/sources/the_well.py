"""The Well (PolymathicAI, NeurIPS 2024) reader (docs/sources.md, "The Well"): its HDF5 layout, 2D and 3D, lazily.

A Well file has root attributes `dataset_name`, `n_spatial_dims`, `n_trajectories`, `grid_type` and the groups
`dimensions` (attribute `spatial_dims`, e.g. ["x", "y"]; datasets `time` and one per spatial dimension),
`boundary_conditions` (one group per condition: `bc_type` WALL/OPEN/PERIODIC, `associated_dims`, `mask`),
`scalars` and `t0_fields`, `t1_fields`, `t2_fields` (attribute `field_names`; every field dataset carries
`sample_varying`, `time_varying` and `dim_varying`). A field is stored float32 with the axes
[trajectory if sample_varying][time if time_varying][each spatial dimension where dim_varying][D] * tensor order.

Channels, in the file's order (t0, then t1, then t2 fields, each in `field_names` order; the Well's own loader puts
the fields constant in time last instead, docs/sources.md has the table): a scalar field is one channel; a vector or
tensor field is one channel per component, named as the Well names them (`velocity_x`, `D_xy`: the component letters
from `spatial_dims`). Fields constant in time (`time_varying` False) are broadcast over the frames as ordinary
channels (the model sees them in every frame, as the reference's CFDBench geometry channel), and fields constant over
trajectories or along a spatial dimension are broadcast likewise. Spatial axes are stored reversed, (y, x) or (z, y,
x), so that stored x is the Well's x. Constant scalars become parameters (sample parameters when they vary per
trajectory); time-varying scalars are listed in the provenance, not stored.

Split: files under a `train`, `valid` or `test` folder (the Well's `data/<split>/` layout) keep that split and are
named "<split>/<file>#<trajectory>"; otherwise ingest draws the seeded split. The boundary conditions are recorded
in `parameters`, with the condition on each side of each dimension as the Well's own reader (`WellDataset`) reads
it from the `mask` datasets (`_boundary_sides`); the dataset is periodic when every side is PERIODIC, which makes
`--convention canonical` resample spectrally (the default convention resamples bilinearly).

NaN: the one rule of `_blocks.nan_rule`. A cell NaN in every frame (the obstacle cells of a Well dataset, which the
Well's formatter sets to 0) gets mask 0 and is stored as 0; a trajectory with NaN that comes and goes, or with no
cell left, is left out with one warning line naming the file and the trajectory (`check_finite="raise"`: refused).
Times: `dimensions/time` is (T,) or, `sample_varying`, (n, T): every trajectory's own times are kept, as `time`
from its start plus the sample parameter `time_start` where the starts differ; trajectories stepping differently
are refused. Times must be finite and strictly increasing, coordinates finite, and the files of one call must agree
on frames, grid, domain and boundary.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import dask.array as da
import h5py
import numpy as np
import xarray as xr

from dpot_format.layout import own_data_layout
from dpot_format.names import MAX_DATASET_NAME, manifest_name
from dpot_data.errors import InputError
from dpot_data.sources._xr_open import check_hdf5
from dpot_data.sources._blocks import (MaskBlocks, NanMasked, SampleBlocks, as_path, auto_block, check_coordinate,
                                        check_h5_dataset, check_sizes, check_times, checked, common_times,
                                        distinct_files, file_token, files_in, finite_mode, hdf5_problem, no_inf,
                                        text_path, to_dask, uniform_step)
from dpot_data.sources.base import MAX_FRAMES, MAX_GRID_SIDE, SPLITS, ReadResult

READER_VERSION = "1"
GROUPS = ("dimensions", "boundary_conditions", "scalars", "t0_fields", "t1_fields", "t2_fields")
ROOT_ATTRS = ("dataset_name", "n_spatial_dims", "n_trajectories", "grid_type")
FIELD_ATTRS = ("sample_varying", "time_varying", "dim_varying")
LAYOUT = ("the Well's HDF5 layout: root attributes " + ", ".join(ROOT_ATTRS) + " and groups " + ", ".join(GROUPS))


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _names(value: object) -> list[str]:
    """A string-list attribute (h5py gives str, bytes or an array of either) as a list of str."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        return [_text(value)]
    return [_text(v) for v in np.asarray(value).ravel().tolist()]


@dataclass(frozen=True)
class Field:
    """One stored field: its group and name, tensor order, whether it varies per trajectory, in time and along each
    spatial dimension, and its channel names."""

    group: str
    name: str
    order: int
    sample_varying: bool
    time_varying: bool
    dim_varying: tuple[bool, ...]
    channels: tuple[str, ...]

    def expected_shape(self, n: int, t: int, space: tuple[int, ...], d: int) -> tuple[int, ...]:
        """The stored shape the attributes declare (Well storage order)."""
        lead = ((n,) if self.sample_varying else ()) + ((t,) if self.time_varying else ())
        return lead + tuple(s for s, v in zip(space, self.dim_varying) if v) + (d,) * self.order


def _field(f: h5py.File, path: Path, group: str, order: int, name: str, dims: list[str]) -> Field:
    """A field's description from its attributes; InputError naming the key when one is missing."""
    key = f"{group}/{name}"
    if name not in f[group] or not isinstance(f[group][name], h5py.Dataset):
        raise InputError(path, f"{key}: listed in {group}.field_names but not stored; expected {LAYOUT}")
    attrs = f[group][name].attrs
    missing = [a for a in FIELD_ATTRS if a not in attrs]
    if missing:
        raise InputError(path, f"{key}: attributes {missing} missing; expected {', '.join(FIELD_ATTRS)} on every field")
    dim_varying = tuple(bool(v) for v in np.asarray(attrs["dim_varying"]).ravel())
    if len(dim_varying) != len(dims):
        raise InputError(path, f"{key}: dim_varying {list(dim_varying)}; expected one flag per spatial dim {dims}")
    comps = ["".join(c) for c in itertools.product(dims, repeat=order)]
    channels = tuple(f"{name}_{c}" if c else name for c in comps)
    return Field(group, name, order, bool(attrs["sample_varying"]), bool(attrs["time_varying"]), dim_varying,
                 channels)


def _root(f: h5py.File, path: Path) -> dict[str, object]:
    """Root attributes and required groups present, spatial dims as the file names them."""
    for g in GROUPS:
        if g not in f or not isinstance(f[g], h5py.Group):
            raise InputError(path, f"group {g!r} missing; expected {LAYOUT}")
    missing = [a for a in ROOT_ATTRS if a not in f.attrs]
    if missing:
        raise InputError(path, f"root attributes {missing} missing; expected {LAYOUT}")
    dims = _names(f["dimensions"].attrs.get("spatial_dims"))
    nd = int(f.attrs["n_spatial_dims"])
    if nd not in (2, 3) or len(dims) != nd or any(d not in f["dimensions"] for d in dims) \
            or "time" not in f["dimensions"]:
        raise InputError(path, f"dimensions: spatial_dims {dims} with n_spatial_dims {nd}; expected 2 or 3 names, "
                               "each with a coordinate dataset, and a 'time' dataset")
    name = _text(f.attrs["dataset_name"])
    if len(name) > MAX_DATASET_NAME:  # it names the dataset, hence folders: refused before anything is made
        raise InputError(path, f"dataset_name: an attribute of {len(name)} characters ({name[:32]!r}...); expected "
                               f"the dataset's name, at most {MAX_DATASET_NAME} characters")
    return {"dims": dims, "name": name, "n": int(f.attrs["n_trajectories"]),
            "grid_type": _text(f.attrs["grid_type"])}


def _coords(f: h5py.File, path: Path, dims: list[str], n: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Every trajectory's times, (n, T) (the Well's `dimensions/time` is (T,), or (n, T) when `sample_varying`), and
    each spatial coordinate (the first trajectory's where one varies per trajectory), checked (`check_times`,
    `check_coordinate`) in one line naming the file and the dataset."""
    def values(name: str) -> np.ndarray:
        dset = f["dimensions"][name]
        if dset.dtype.kind not in "fiu" or dset.ndim not in (1, 2) or dset.size > (MAX_FRAMES + 1) * max(n, 1) \
                or (dset.ndim == 2 and dset.shape[0] != n):
            raise InputError(path, f"dimensions/{name}: expected numbers of shape (N,) or ({n}, N) (one row per "
                                   f"trajectory), found {dset.dtype} {tuple(dset.shape)}")
        return np.asarray(dset[()], dtype=np.float64)
    times = values("time")
    if times.ndim == 1:  # one time axis for every trajectory
        check_times(path, "dimensions/time", times)
        times = np.broadcast_to(times, (n, times.shape[-1]))
    for i, row in enumerate(times if times.strides[0] else ()):
        check_times(path, f"dimensions/time (trajectory {i})", row)
    coords = {}
    for d in dims:
        v = values(d)
        coords[d] = v.reshape(-1, v.shape[-1])[0]
        check_coordinate(path, f"dimensions/{d}", v)
    return times, coords


def _fields(f: h5py.File, path: Path, dims: list[str], n: int, t: int, space: tuple[int, ...]) -> list[Field]:
    """Every listed field of t0/t1/t2, its stored shape checked against what its attributes declare."""
    out = []
    for order in range(3):
        group = f"t{order}_fields"
        for name in _names(f[group].attrs.get("field_names")):
            fld = _field(f, path, group, order, name, dims)
            dset = f[group][name]
            want = fld.expected_shape(n, t, space, len(dims))
            if tuple(dset.shape) != want or dset.dtype.kind not in "fiu":
                raise InputError(path, f"{group}/{name}: expected numbers of shape {want} (trajectories, time, "
                                       f"{', '.join(dims)}, components as its attributes say), found {dset.dtype} "
                                       f"{tuple(dset.shape)}")
            check_h5_dataset(path, f"{group}/{name}", dset)
            out.append(fld)
    if not out:
        raise InputError(path, "no field listed in t0_fields, t1_fields or t2_fields; expected at least one")
    return out


def _boundary_conditions(f: h5py.File) -> dict[str, dict[str, object]]:
    """Each boundary condition's type and dimensions."""
    bcs = f["boundary_conditions"]
    return {str(k): {"bc_type": _text(bcs[k].attrs.get("bc_type", "")).upper(),
                     "associated_dims": _names(bcs[k].attrs.get("associated_dims"))}
            for k in bcs.keys() if isinstance(bcs[k], h5py.Group)}


def _boundary_sides(f: h5py.File, path: Path, dims: list[str]) -> dict[str, list[str]]:
    """The condition on each side (first, last index) of each spatial dimension, as the Well's own reader decides it
    (`WellDataset._padding_bcs`, the_well 1.2.0): OPEN unless a condition's `mask` says otherwise; for each condition
    (in key order) and each of its dimensions, a WALL takes a side when its mask is set on all of that side, an OPEN
    or PERIODIC when its mask is set anywhere on it. `bc_type` alone does not decide: a condition whose mask is
    empty changes nothing."""
    sides = {d: ["OPEN", "OPEN"] for d in dims}
    bcs = f["boundary_conditions"]
    for key in bcs.keys():
        bc = bcs[key]
        if not isinstance(bc, h5py.Group):
            continue
        bc_type = _text(bc.attrs.get("bc_type", "")).upper()
        assoc = _names(bc.attrs.get("associated_dims"))
        if bc_type not in ("WALL", "OPEN", "PERIODIC") or not set(assoc) <= set(dims) \
                or not isinstance(bc.get("mask"), h5py.Dataset):
            raise InputError(path, f"boundary_conditions/{key}: bc_type {bc_type!r}, associated_dims {assoc}; expected "
                                   f"WALL, OPEN or PERIODIC on some of {dims} with a 'mask' dataset")
        mask = bc["mask"]
        if mask.ndim < len(assoc) or mask.size > MAX_GRID_SIDE ** 3:
            raise InputError(path, f"boundary_conditions/{key}/mask: shape {tuple(mask.shape)}; expected one axis "
                                   f"per associated dimension {assoc}")
        values = np.asarray(mask[()]).astype(bool)
        agg = np.all if bc_type == "WALL" else np.any
        for axis, d in enumerate(assoc):
            for side, index in ((0, 0), (1, -1)):  # the side's entries, indexed as the Well's reader does
                if values.shape[axis] and agg(values[(slice(None),) * axis + (index,)]):
                    sides[d][side] = bc_type
    return sides


def _scalars(f: h5py.File, n: int) -> tuple[dict[str, float], dict[str, np.ndarray], list[str]]:
    """Constant scalars (parameters), per-trajectory constants (sample parameters) and time-varying ones (names)."""
    params, per_sample, timed = {}, {}, []
    group = f["scalars"]
    for name in _names(group.attrs.get("field_names")):
        if name not in group:
            continue
        d = group[name]
        if bool(d.attrs.get("time_varying", False)):
            timed.append(name)
        elif bool(d.attrs.get("sample_varying", False)) and d.size == n:
            per_sample[name] = np.asarray(d[()], dtype=np.float64).ravel()
        elif d.size == 1:
            params[name] = float(np.asarray(d[()]).ravel()[0])
    return params, per_sample, timed


def _file_info(path: Path) -> dict[str, object]:
    """Everything a Well file declares, checked before any field value is read."""
    problem = hdf5_problem(path)
    if problem is not None:
        raise InputError(path, problem)
    with h5py.File(path, "r") as f:
        root = _root(f, path)
        dims = root["dims"]
        check_sizes(path, "n_trajectories", trajectories=int(root["n"]))
        times, coords = _coords(f, path, dims, int(root["n"]))
        space = tuple(len(coords[d]) for d in dims)
        n, t = int(root["n"]), times.shape[1]
        fields = _fields(f, path, dims, n, t, space)
        channels = [c for fld in fields for c in fld.channels]
        check_sizes(path, "fields", trajectories=n, frames=t, space=space, channels=len(channels))
        params, per_sample, timed = _scalars(f, n)
        attrs = {k: _text(v) if isinstance(v, (bytes, str)) else np.asarray(v).tolist()
                 for k, v in f.attrs.items() if k not in ("simulation_parameters",)}
        return {**root, "times": times, "coords": coords, "space": space, "t": t, "fields": fields,
                "channels": channels, "bcs": _boundary_conditions(f), "sides": _boundary_sides(f, path, dims),
                "scalars": params, "sample_scalars": per_sample,
                "time_scalars": timed, "attrs": attrs, "simulation_parameters": _names(f.attrs.get(
                    "simulation_parameters"))}


class _Blocks(SampleBlocks):
    """(n, T, C, *space reversed) float32 of one Well file: every field read for the block's trajectories,
    broadcast over what it does not vary along, its components split into channels, spatial axes reversed."""

    def __init__(self, path: Path, fields: list[Field], n: int, t: int, space: tuple[int, ...]) -> None:
        self.path, self.fields, self.space = path, fields, space
        self.shape = (n, t, sum(len(f.channels) for f in fields), *space[::-1])

    def _field(self, dset: h5py.Dataset, fld: Field, n0: int, n1: int, check: bool) -> np.ndarray:
        """One field for trajectories n0..n1-1 as (b, T, *space, components...) (broadcast views), NaN kept (the
        NaN rule of `NanMasked` decides about it); `check`: ±Inf raises InputError naming the file, the field and
        the trajectory."""
        raw = dset[n0:n1] if fld.sample_varying else dset[()][None]
        if check and not no_inf(raw):
            j = next(j for j in range(len(raw)) if not no_inf(raw[j]))
            where = n0 + j if fld.sample_varying else "all"
            raise InputError(self.path, f"{fld.group}/{fld.name}: trajectory {where} holds +-Inf; expected finite "
                                        "values, or NaN in the cells of an obstacle (NaN in every frame)")
        if not fld.time_varying:
            raw = raw[:, None]
        index = (slice(None), slice(None)) + tuple(slice(None) if v else None for v in fld.dim_varying)
        raw = raw[index + (Ellipsis,)]
        b = n1 - n0
        return np.broadcast_to(raw, (b, self.shape[1], *self.space) + raw.shape[2 + len(self.space):])

    def block(self, n0: int, n1: int, *, check: bool | None = None) -> np.ndarray:
        check = self.checks if check is None else check
        out = np.empty((n1 - n0,) + self.shape[1:], dtype=np.float32)
        nd = len(self.space)
        reverse = (0, 1) + tuple(range(1 + nd, 1, -1))
        c = 0
        with h5py.File(self.path, "r") as f, np.errstate(over="ignore"):
            for fld in self.fields:
                arr = self._field(f[fld.group][fld.name], fld, n0, n1, check)
                for comp in itertools.product(range(nd), repeat=fld.order):
                    out[:, :, c] = arr[(Ellipsis,) + comp].transpose(reverse)
                    c += 1
        return out


def _split_of(path: Path) -> str | None:
    """"train", "valid" or "test" when the file lies in a folder of that name (the Well's data/<split>/)."""
    return path.parent.name if path.parent.name in SPLITS else None


def _well_files(paths: Sequence[str | Path]) -> list[Path]:
    """The .hdf5/.h5 files named or inside the folders named, each once, UTF-8 named, existing."""
    found = files_in([as_path(p) for p in paths], (".hdf5", ".h5"))
    if not found:
        raise InputError(", ".join(map(str, paths)) or "<no files>", "expected Well .hdf5 files or folders of them")
    for p in found:
        text_path(p)
        if not p.is_file():
            raise InputError(p, "file not found")
    return distinct_files(found, name_of=lambda p: f"{p.parent.name}/{p.name}")


def _consistent(paths: list[Path], infos: list[dict]) -> list[str | None]:
    """All files one dataset (name, spatial dims, grid, frames, channels, boundaries, domain); the split of each
    (all or none). Time steps are compared per trajectory where the times are stored (`common_times`)."""
    first = infos[0]
    for p, info in zip(paths[1:], infos[1:]):
        for key in ("name", "dims", "space", "t", "channels", "sides"):
            if info[key] != first[key]:
                what = "boundary conditions (per dimension: first, last side)" if key == "sides" else key
                raise InputError(p, f"expected {what} {first[key]} like {paths[0].name} (one Well dataset per "
                                    f"ingest), found {info[key]}")
        for d in first["dims"]:
            a, b = first["coords"][d], info["coords"][d]
            if not np.allclose(a, b, rtol=1e-5, atol=1e-6 * float(np.ptp(a) or 1.0)):
                raise InputError(p, f"dimensions/{d}: coordinates from {b[0]:g} to {b[-1]:g}; expected {a[0]:g} to "
                                    f"{a[-1]:g} like {paths[0].name} (one domain per ingest)")
    splits = [_split_of(p) for p in paths]
    if len(set(s is None for s in splits)) > 1:
        odd = next(p for p, s in zip(paths, splits) if s is None)
        raise InputError(odd, "expected every file under a train/, valid/ or test/ folder like the others "
                              "(the Well's data/<split>/ layout), or none")
    return splits


def _boundary(info: dict) -> str:
    """"periodic" when both sides of every spatial dimension are PERIODIC as the Well's reader reads the boundary
    masks (`_boundary_sides`)."""
    periodic = all(side == "PERIODIC" for sides in info["sides"].values() for side in sides)
    return "periodic" if periodic else "non-periodic"


def _parameters(info: dict) -> dict[str, object]:
    """Dataset name, grid type, spatial dims, boundary conditions (as declared, and per side as read), and which
    channels are constant in time."""
    static = [c for fld in info["fields"] if not fld.time_varying for c in fld.channels]
    return {"well_dataset": info["name"], "grid_type": info["grid_type"], "spatial_dims": info["dims"],
            "boundary_conditions": info["bcs"], "boundary_sides": info["sides"],
            "constant_in_time_channels": static}


def _per_trajectory(infos: list[dict], keep: list[np.ndarray]) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """Simulation parameters and scalars: shared by every kept trajectory -> parameters, else sample parameters."""
    values: dict[str, list] = {}
    for info, kept in zip(infos, keep):
        sim = {k: info["attrs"][k] for k in info["simulation_parameters"] if k in info["attrs"]}
        for name, value in {**sim, **info["scalars"]}.items():
            values.setdefault(name, []).extend([value] * len(kept))
        for name, per in info["sample_scalars"].items():
            values.setdefault(name, []).extend(per[kept].tolist())
    shared, varying = {}, {}
    total = sum(len(k) for k in keep)
    for name, vals in values.items():
        if len(vals) != total:
            continue  # not in every file: left to the provenance
        if all(v == vals[0] for v in vals):
            shared[name] = vals[0]
        else:
            varying[name] = np.asarray(vals)
    return shared, varying


def _provenance(paths: list[Path], infos: list[dict]) -> dict[str, object]:
    return {"reader": "dpot_data.sources.the_well", "reader_version": READER_VERSION,
            "files": {f"{p.parent.name}/{p.name}": {"trajectories": info["n"], "attrs": info["attrs"],
                                                    "time_varying_scalars": info["time_scalars"]}
                      for p, info in zip(paths, infos)}}


def read(paths: Sequence[str | Path], *, name: str | None = None, block: int | None = None,
         check_finite: bool | str = True, convention: str = "dpot-reference") -> ReadResult:
    """Open Well HDF5 files (or folders of them, e.g. a dataset's data/ with train/, valid/, test/) lazily as one
    canonical dataset (module docstring). `check_finite` as the other readers: trajectories holding NaN/Inf are left
    out and listed (True), raise InputError when read ("raise"), or are kept (False). `convention` changes nothing
    here: the reference never trained on the Well; the resampling follows the convention (choose_method)."""
    files = _well_files(paths)
    infos = [_checked_info(p) for p in files]
    splits = _consistent(files, infos)
    _distinct_labels(files, splits)
    first = infos[0]
    nd = len(first["dims"])
    blk = auto_block(first["t"] * len(first["channels"]) * math.prod(first["space"]) * 4, block)
    parts, masks, ids, split, keeps, skipped, rows = [], [], [], [], [], [], []
    for p, info, s in zip(files, infos, splits):
        label = f"{s}/{p.name}" if s else p.name
        file_ids = [f"{label}#{i}" for i in range(info["n"])]
        blocks = _Blocks(p, info["fields"], info["n"], info["t"], info["space"])
        blocks, keep, bad = checked(blocks, blk, file_ids, label, check_finite, nan_rule=True)
        for what, reason in bad:
            warnings.warn(f"{p}: {what} left out: {reason}", stacklevel=2)
        skipped.extend(bad)
        keeps.append(keep)
        if keep.size:
            masked = NanMasked(blocks, p, [file_ids[i] for i in keep], strict=finite_mode(check_finite) != "off")
            parts.append(to_dask(masked, blk, "the-well", file_token(p), keep.tolist()))
            masks.append(to_dask(MaskBlocks(masked), blk, "the-well-mask", file_token(p), keep.tolist()))
            ids.extend(file_ids[i] for i in keep)
            split.extend([s] * keep.size)
            rows.extend((p, f"dimensions/time (trajectory {i})", info["times"][i]) for i in keep)
    if not parts:
        raise InputError(files[0], "no usable trajectory: " + "; ".join(f"{w}: {r}" for w, r in skipped[:3]))
    fields = da.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    mask = da.concatenate(masks, axis=0) if len(masks) > 1 else masks[0]
    shared, varying = _per_trajectory(infos, keeps)
    canonical = ("z", "y", "x")[3 - nd:]
    times, starts = common_times(rows)
    if starts is not None:  # each trajectory's own times: `time` from its start, plus its start
        varying["time_start"] = starts
    dt = uniform_step(times)
    data = xr.Dataset(
        {"fields": (("sample", "time", "channel", *canonical), fields), "mask": (("sample", *canonical), mask)},
        coords={"sample": np.array(ids, dtype=str), "time": times, "channel": np.array(first["channels"]),
                **{c: first["coords"][d] for c, d in zip(canonical, first["dims"][::-1])}},
        attrs={"source": "the_well", "dataset": manifest_name(name or _default_name(first["name"])),
               "boundary": _boundary(first), "parameters": {**_parameters(first), "simulation_parameters": shared},
               "dt": dt, "provenance": _provenance(files, infos),
               "model_layout": own_data_layout(nd)},
    )
    return ReadResult(data=data, split=np.array(split, dtype=str) if splits[0] else None, sample_params=varying,
                      skipped=skipped, inputs=files)


def _checked_info(path: Path) -> dict[str, object]:
    """`_file_info` of a file that passed the inputs' one containment check (`check_hdf5`: no external link, no
    virtual or externally stored dataset, sizes bounded), an attribute or coordinate of the wrong type refused in
    one line naming the file."""
    check_hdf5(path)
    try:
        return _file_info(path)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InputError(path, f"an attribute or coordinate is not of the type the Well's layout declares "
                               f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); expected "
                               f"{LAYOUT}, with numeric counts, flags and coordinates") from None


def _distinct_labels(files: list[Path], splits: list[str | None]) -> None:
    """Trajectory ids are "<split>/<file>#<k>" (or "<file>#<k>"): two files under one label are refused."""
    seen: dict[str, Path] = {}
    for p, s in zip(files, splits):
        label = f"{s}/{p.name}" if s else p.name
        other = seen.setdefault(label, p)
        if other != p:
            raise InputError(p, f"has the same name as {other} ({label}); trajectory ids are made from it, so give "
                                "files of distinct names (or each split once)")


def _default_name(well_name: str) -> str:
    """The manifest name of a Well dataset: "the-well-" + its name in lower case, other characters as "-"."""
    import re

    return "the-well-" + (re.sub(r"[^a-z0-9_-]+", "-", well_name.lower()).strip("-") or "data")
