"""`evaluate --predictions PATH`: the model's rollouts as a Zarr store that `xarray.open_zarr` opens.

One group per dataset (`xarray.open_zarr(PATH, group=DATASET)`), with variables
  prediction, truth  (trajectory, step, channel, *spatial)  float32
  mask               (trajectory, *spatial)                 bool, True on fluid cells
  first_blowup_step  (trajectory,)                          int32, the first step whose VRMSE (mean over valid
                                                            channels) passed 1 (eval_metrics.BLOWUP_VRMSE); -1: never
  ensemble_prediction (trajectory, member, step, channel, *spatial)  float32, with `evaluate --ensemble` only
and coordinates `trajectory` (ids "dataset:index"), `step` (1..R, frames after the t_in inputs), `frame` (the
trajectory's frame index of each step), `time` (the time of each step's frame, where the dataset states times) and
`channel` (names; padded channels included, see the `channel_valid` attribute), with an ensemble `member` (0..N-1)
and `member_checkpoint` (the checkpoint each member rolled out); the spatial coordinates where the
dataset's Zarr store holds them. `prediction`, `truth` (`channel_units`, one per channel), `time` and the coordinates
carry the data's CF `units` (dpot_format.units). The spatial axes are named and ordered as the manifest stores them (its `dims`, e.g. y, x), whatever
orientation the model reads them in. Chunks hold one trajectory and at most STEP_CHUNK steps, and every batch is
written as it is scored, so memory holds one batch however long the rollout. The store is written under a temporary
name beside PATH (`.PATH.tmp-<pid>`, removed by the next write of PATH when its process is gone) and renamed at the
end: a failed evaluation leaves no partial store at PATH. PATH is checked before the evaluation by the one output rule
(dpot_format.output.check_store): a link, a file, a store inside an ingest output or a run's data, and a store this
command did not write (no dpot mark in its zarr.json) or holding anything else are refused, never replaced.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from dpot_format import __version__
from dpot_format.display import DataAxes, data_axes, regrid
from dpot_format.layout import space_order
from dpot_format.output import STORE_MARK, check_store, remove_entry, temporary_name
from dpot_format.units import fields_units

STEP_CHUNK = 16
WRITTEN_BY = "dpot-train evaluate --predictions"  # the store's mark: only a store bearing it is ever replaced


class PredictionSink(Protocol):
    """What evaluate_model hands the model's rollouts to."""

    def begin(self, ds: Any, ids: list[str], steps: int, t_in: int) -> None: ...

    def write(self, ds: Any, ids: list[str], pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None,
              step0: int = 0) -> None: ...

    def write_blowups(self, ds: Any, ids: list[str], first: torch.Tensor) -> None: ...


def _stored_axes(space_ndim: int, model_layout: str) -> list[int]:
    """For each stored space axis, the model axis (counted from 0) that holds it: the inverse of
    dpot_format.layout.space_order, the one rule windows.to_model_layout follows."""
    order = space_order(space_ndim, model_layout)
    return [order.index(j) for j in range(space_ndim)]


def to_stored_order(x: torch.Tensor, model_layout: str) -> np.ndarray:
    """(B, *S_model, T, C) in the model's orientation -> (B, T, C, *S_stored), the manifest's axis order (the inverse
    of windows.to_model_layout)."""
    nd = x.ndim - 3
    out = x.permute(0, nd + 1, nd + 2, *(1 + a for a in _stored_axes(nd, model_layout)))
    return out.contiguous().cpu().numpy()


def mask_to_stored(mask: torch.Tensor, model_layout: str) -> np.ndarray:
    """(B, *S_model) -> (B, *S_stored), as to_stored_order does for fields."""
    nd = mask.ndim - 1
    out = mask.permute(0, *(1 + a for a in _stored_axes(nd, model_layout)))
    return out.contiguous().cpu().numpy()


def dataset_axes(ds: Any) -> DataAxes:
    """Times, coordinates and units of a dataset (its manifest entry, and its Zarr store's `time` and coordinate
    arrays where it has one: three small reads)."""
    group = None
    if ds.zarr_url is not None and ds.zarr_group is not None:
        import zarr

        group = zarr.open_group(ds.zarr_url, mode="r", path=ds.zarr_group)
    return data_axes(ds.entry, group)


def step_coords(axes: DataAxes, spatial: list[str], shape: tuple[int, ...], t_in: int, steps: int
                ) -> dict[str, Any]:
    """The `time` of each rollout step (frames t_in ..) and the spatial coordinates (regridded when the evaluation
    resized the grid), each with its units; only those the dataset states."""
    out: dict[str, Any] = {}
    if axes.times is not None and len(axes.times) >= t_in + steps:
        out["time"] = ("step", axes.times[t_in:t_in + steps], {"units": axes.units["time"]})
    for d, n in zip(spatial, shape):
        if d in axes.coords:
            out[d] = (d, regrid(axes.coords[d], n), {"units": axes.units[d]})
    return out


class PredictionWriter:
    """Writes the predictions store batch by batch; `close()` publishes it at `path` (an existing store there is
    replaced only then)."""

    def __init__(self, path: str | Path) -> None:
        self.path = check_store(path, "--predictions", WRITTEN_BY)  # OutputError (a ValueError), one line
        self.tmp = temporary_name(self.path)
        remove_entry(self.tmp)  # left by a killed process that had this pid
        self._groups: dict[str, dict[str, Any]] = {}
        self.ensemble: dict[str, Any] | None = None

    def set_ensemble(self, record: dict[str, Any]) -> None:
        """Every dataset's group gains `ensemble_prediction` for the members `record` describes (ensemble.Ensemble
        .record: members, noise, seed, checkpoints, member_checkpoint)."""
        self.ensemble = dict(record)

    def begin(self, ds: Any, ids: list[str], steps: int, t_in: int) -> None:
        """Dataset `ds` will have `ids` trajectories, each rolled out `steps` frames after `t_in` inputs."""
        self._groups[ds.name] = {"ids": list(ids), "steps": steps, "t_in": t_in, "created": False, "next": 0}

    def _create(self, ds: Any, shape: tuple[int, ...]) -> None:
        """The group's metadata and empty arrays (nothing computed: dask zeros, compute=False)."""
        import dask.array as da
        import xarray as xr

        g = self._groups[ds.name]
        n, steps, c = len(g["ids"]), g["steps"], len(ds.channels)
        spatial = [str(d) for d in ds.dims][-len(shape):]
        chunk = (1, min(steps, STEP_CHUNK), c, *shape)
        field = ("trajectory", "step", "channel", *spatial)
        axes = dataset_axes(ds)
        units = {"units": fields_units(axes.units["channels"], ds.channel_valid),
                 "channel_units": axes.units["channels"]}
        arrays = {"prediction": (field, da.zeros((n, steps, c, *shape), dtype=np.float32, chunks=chunk), units),
                  "truth": (field, da.zeros((n, steps, c, *shape), dtype=np.float32, chunks=chunk), units),
                  "mask": (("trajectory", *spatial), da.zeros((n, *shape), dtype=bool, chunks=(1, *shape))),
                  "first_blowup_step": (("trajectory",), da.full((n,), -1, dtype=np.int32, chunks=(n,)),
                                        {"meaning": "first rollout step whose VRMSE, mean over valid channels, "
                                                    "passed 1; -1: never"})}
        members: dict[str, Any] = {}
        if self.ensemble is not None:
            m = int(self.ensemble["members"])
            arrays["ensemble_prediction"] = (
                ("trajectory", "member", "step", "channel", *spatial),
                da.zeros((n, m, steps, c, *shape), dtype=np.float32, chunks=(1, 1, *chunk[1:])),
                {**units, "noise": float(self.ensemble["noise"]), "seed": int(self.ensemble["seed"])})
            names = [str(x) for x in self.ensemble["checkpoints"]]
            members = {"member": np.arange(m),
                       "member_checkpoint": ("member", np.array([names[i] for i in self.ensemble["member_checkpoint"]],
                                                                dtype=object))}
        tmpl = xr.Dataset(
            arrays,
            coords={**members, "trajectory": np.array(g["ids"], dtype=object), "step": np.arange(1, steps + 1),
                    "frame": ("step", np.arange(g["t_in"], g["t_in"] + steps)),
                    "channel": np.array(ds.channels, dtype=object),  # variable-length UTF-8 strings
                    **step_coords(axes, spatial, shape, g["t_in"], steps)},
            attrs={"dataset": ds.name, "t_in": g["t_in"], "model_layout": ds.model_layout,
                   "native_shape": [int(s) for s in ds.entry.get("grid", {}).get("native_shape", ds.shape)],
                   "channel_valid": [bool(v) for v in ds.channel_valid],
                   "mask_meaning": "True on fluid cells; metrics count only these"})
        encoding = {k: {"chunks": tmpl[k].data.chunksize} for k in arrays}
        tmpl.to_zarr(str(self.tmp), group=ds.name, mode="a" if self.tmp.exists() else "w", compute=False,
                     encoding=encoding, zarr_format=3, consolidated=False)
        g["created"] = True

    def write(self, ds: Any, ids: list[str], pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None,
              step0: int = 0) -> None:
        """One batch's rollout steps [step0, step0 + T) in the model's layout (B, *S, T, C), and its mask."""
        import zarr

        g = self._groups[ds.name]
        p, t = to_stored_order(pred.float(), ds.model_layout), to_stored_order(true.float(), ds.model_layout)
        if not g["created"]:
            self._create(ds, tuple(p.shape[3:]))
        start = g["ids"].index(ids[0])
        group = zarr.open_group(str(self.tmp / ds.name), mode="r+")
        rows = slice(start, start + len(ids))
        steps = slice(step0, step0 + p.shape[1])
        group["prediction"][rows, steps] = p
        group["truth"][rows, steps] = t
        if step0 == 0:
            m = np.ones((len(ids), *p.shape[3:]), dtype=bool) if mask is None else \
                mask_to_stored(mask.bool(), ds.model_layout)
            group["mask"][rows] = m

    def write_blowups(self, ds: Any, ids: list[str], first: torch.Tensor) -> None:
        """One batch's `first_blowup_step` (B,), 1-based, -1 where never (written after its rollout)."""
        import zarr

        start = self._groups[ds.name]["ids"].index(ids[0])
        group = zarr.open_group(str(self.tmp / ds.name), mode="r+")
        group["first_blowup_step"][start:start + len(ids)] = first.cpu().numpy().astype(np.int32)

    def write_members(self, ds: Any, ids: list[str], members: torch.Tensor, step0: int = 0) -> None:
        """One batch's ensemble rollouts, steps [step0, step0 + T), (M, B, *S, T, C) in the model's layout."""
        import zarr

        g = self._groups[ds.name]
        stored = np.stack([to_stored_order(m.float(), ds.model_layout) for m in members], axis=1)  # (B, M, T, C, *S)
        if not g["created"]:
            self._create(ds, tuple(stored.shape[4:]))
        start = g["ids"].index(ids[0])
        group = zarr.open_group(str(self.tmp / ds.name), mode="r+")
        group["ensemble_prediction"][start:start + len(ids), :, step0:step0 + stored.shape[2]] = stored

    def close(self) -> Path:
        """Publish the store at `path` (replacing one there) and return it."""
        import zarr

        zarr.open_group(str(self.tmp), mode="r+").attrs[STORE_MARK] = {"written_by": WRITTEN_BY,
                                                                        "version": __version__}
        with warnings.catch_warnings():  # zarr 3 notes that consolidated metadata is outside the v3 spec
            warnings.simplefilter("ignore", category=UserWarning)
            zarr.consolidate_metadata(str(self.tmp))  # so that xarray.open_zarr(PATH, group=...) reads one file
        check_store(self.path, "--predictions", WRITTEN_BY)  # what is there now is still a store of ours
        old = temporary_name(self.path, "old")
        remove_entry(old)  # left by a killed process that had this pid
        if os.path.lexists(self.path):
            os.replace(self.path, old)  # a kill from here leaves `.PATH.tmp-<pid>-old`, which the next write sweeps
        os.replace(self.tmp, self.path)
        remove_entry(old)
        return self.path

    def abort(self) -> None:
        """Remove the temporary store (an evaluation that failed)."""
        shutil.rmtree(self.tmp, ignore_errors=True)
