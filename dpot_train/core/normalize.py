"""Per-channel normalisation of the model's inputs from a manifest's train statistics: pure functions.

Data in physical units (a temperature in kelvin, around 300 with small variations) trains poorly when handed to the
model as it is: the relative L2 loss and the noise are dominated by the offset. A dataset is therefore shifted and
scaled per channel, `(x - mean) / std`, with the `fields` statistics ingest writes into its manifest entry (float64;
train split, valid channels, fluid cells only: docs/format.md), so that solid cells and padded channels never enter
them. Padded channels are left exactly as they are (mean 0, std 1), and a constant channel (std 0, or within float32
rounding of its mean) is only centred, never divided by 0.

`data.normalize` chooses, per dataset: `auto` (the default) normalises every dataset but the paper's sources under
`dpot-reference` (dpot_format.conventions.is_paper_reference), which stay exactly as the released checkpoints saw
them: your own data is normalised whatever convention its manifest records; `manifest` normalises every dataset;
`none` none. The statistics a run used are recorded in its config (`data.norm_stats`,
dataset name -> {"mean": [...], "std": [...]}, one value per channel, padded ones included) and saved with every
checkpoint, so that evaluating it applies the same ones even after the manifest is re-ingested.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Protocol, Sequence

import numpy as np
import torch

from dpot_format.conventions import REFERENCE, is_paper_reference

MODES = ("auto", "none", "manifest")
CONSTANT_RTOL = 1e-6  # a std at most this fraction of |mean| is float32 rounding of a constant channel

Stats = dict[str, list[float]]  # {"mean": [C], "std": [C]}


class _Dataset(Protocol):
    name: str
    manifest: str
    channels: list[str]
    channel_valid: list[bool]
    entry: dict[str, Any]

    @property
    def convention(self) -> dict[str, Any]: ...


def check_mode(mode: str, where: str = "normalize") -> str:
    """`mode` when it is one of MODES; ValueError naming `where` otherwise."""
    if mode not in MODES:
        raise ValueError(f"{where}: expected one of {', '.join(MODES)}, got {mode!r}")
    return mode


def wanted(mode: str, ds: _Dataset, recorded_run: bool = False) -> bool:
    """Whether `mode` normalises dataset `ds`: `auto` every dataset but the paper's sources under dpot-reference
    (decided by the manifest's source, not by the convention name alone). `recorded_run`: `ds` is absent from a
    run's recorded statistics, which name every dataset the run normalised; a run recorded before the decision was
    by source left every dpot-reference entry as stored (own data included), so such an entry stays as stored."""
    check_mode(mode)
    if mode != "auto":
        return mode == "manifest"
    return ds.convention.get("name") != REFERENCE if recorded_run else not is_paper_reference(ds.entry)


def manifest_stats(ds: _Dataset) -> Stats:
    """The per-channel mean and std of a dataset from its manifest's train statistics (`stats.fields`), padded
    channels as (0, 1) and constant channels with std 1; ValueError naming the manifest when they are missing."""
    stats = ds.entry.get("stats")
    fields = stats.get("fields") if isinstance(stats, Mapping) else None
    if not isinstance(fields, Mapping):
        raise ValueError(f"{ds.manifest}: dataset {ds.name!r} has no train statistics (`stats` is null) to normalise "
                         "with; re-ingest it, or pass --normalize none")
    mean, std = [], []
    for name, valid in zip(ds.channels, ds.channel_valid):
        if not valid:
            mean.append(0.0)
            std.append(1.0)
            continue
        s = fields.get(name)
        m, d = (s.get("mean"), s.get("std")) if isinstance(s, Mapping) else (None, None)
        if not _finite(m) or not _finite(d) or d < 0:
            raise ValueError(f"{ds.manifest}: dataset {ds.name!r} channel {name!r}: expected a finite train mean and "
                             f"std in stats.fields, got {m!r} and {d!r}; re-ingest it, or pass --normalize none")
        mean.append(float(m))
        std.append(float(d) if d > CONSTANT_RTOL * abs(m) else 1.0)
    return {"mean": mean, "std": std}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def checked_stats(stats: Any, ds: _Dataset, where: str) -> Stats:
    """Recorded statistics of `ds` (a config's or a checkpoint's) checked: a mean and a positive std per channel."""
    n = len(ds.channels)
    ok = isinstance(stats, Mapping) and all(
        isinstance(stats.get(k), (list, tuple)) and len(stats[k]) == n and all(_finite(v) for v in stats[k])
        for k in ("mean", "std"))
    if not ok or any(v <= 0 for v in stats["std"]):
        raise ValueError(f"{where}: expected {{mean: [{n} numbers], std: [{n} positive numbers]}} for dataset "
                         f"{ds.name!r} ({n} channels), got {stats!r}")
    return {"mean": [float(v) for v in stats["mean"]], "std": [float(v) for v in stats["std"]]}


def resolve(mode: str, datasets: Sequence[_Dataset], recorded: Mapping[str, Any] | None = None
            ) -> dict[str, Stats | None]:
    """Per dataset, the statistics to normalise it with (None: left as it is): the `recorded` ones (a run's, by
    dataset name) where they name it, else the manifest's where `mode` wants it (`wanted`; `recorded` None: no
    run's record, a fresh decision)."""
    check_mode(mode)
    given = recorded is not None
    recorded = recorded or {}
    if mode == "none" and recorded:
        raise ValueError(f"data.norm_stats names {sorted(recorded)} but data.normalize is none")
    out: dict[str, Stats | None] = {}
    for ds in datasets:
        if ds.name in recorded:
            out[ds.name] = checked_stats(recorded[ds.name], ds, f"data.norm_stats.{ds.name}")
        else:
            out[ds.name] = manifest_stats(ds) if wanted(mode, ds, given) else None
    return out


def _unit(ds: _Dataset, channel: str) -> str:
    """` <units>` of a channel where its manifest states them (the variables of `ingest xarray`), else ''."""
    params = ds.entry.get("parameters")
    variables = params.get("variables") if isinstance(params, Mapping) else None
    var = variables.get(channel) if isinstance(variables, Mapping) else None
    units = var.get("units") if isinstance(var, Mapping) else None
    return f" {units}" if isinstance(units, str) and units.strip() else ""


def describe(mode: str, datasets: Sequence[_Dataset], table: Mapping[str, Stats | None],
             recorded: Mapping[str, Any] | None = None) -> str:
    """One line naming, per dataset, what is normalised and with which statistics (`table`: `resolve`'s), e.g.
    `normalise: heat per channel from its manifest's train statistics (temperature mean 293 K std 1.43 K);
    pdebench-dr: none (...)`; `dpot-train launch` prints it and `open_dataset` warns it."""
    parts: list[str] = []
    kept: dict[str, list[str]] = {}  # why a dataset is handed as stored -> the datasets
    for ds in datasets:
        stats = table.get(ds.name)
        if stats is None:
            why = ("normalize none" if mode == "none" else
                   "the paper's data under dpot-reference, as the released checkpoints saw it"
                   if is_paper_reference(ds.entry) else "as stored, as its run's recorded statistics say")
            kept.setdefault(why, []).append(ds.name)
            continue
        where = ("the recorded statistics (data.norm_stats)" if recorded and ds.name in recorded
                 else "its manifest's train statistics")
        channels = ", ".join(f"{c} mean {m:.5g}{_unit(ds, c)} std {d:.3g}{_unit(ds, c)}"
                             for c, ok, m, d in zip(ds.channels, ds.channel_valid, stats["mean"], stats["std"]) if ok)
        parts.append(f"{ds.name} per channel from {where} ({channels})")
    parts += [f"{', '.join(names)}: none ({why})" for why, names in kept.items()]
    return "normalise: " + "; ".join(parts)


def applied(table: Mapping[str, Stats | None]) -> dict[str, Stats]:
    """The entries of a `resolve` table that normalise (what a run records as data.norm_stats)."""
    return {name: s for name, s in table.items() if s is not None}


def _shaped(stats: Stats, ndim: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 mean and std shaped to broadcast along `axis` of an ndim-dimensional array."""
    shape = [1] * ndim
    shape[axis] = -1
    return (np.asarray(stats["mean"], dtype=np.float32).reshape(shape),
            np.asarray(stats["std"], dtype=np.float32).reshape(shape))


def normalize_array(x: np.ndarray, stats: Stats | None, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    """`(x - mean) / std` per channel along `axis`, float32, as a new array; `x` itself when `stats` is None.
    `out`: a float32 array of x's shape to write into instead (x itself: in place), the same values bit for bit."""
    if stats is None:
        return x
    mean, std = _shaped(stats, x.ndim, axis)
    out = np.subtract(x, mean, out=out, dtype=np.float32)
    out /= std
    return out


def normalize(x: torch.Tensor, stats: Stats | None) -> torch.Tensor:
    """(..., C) tensor to `(x - mean) / std` per channel (last axis) in float32; `x` itself when `stats` is None."""
    if stats is None:
        return x
    mean, std = (torch.from_numpy(a).to(x.device) for a in _shaped(stats, 1, 0))
    return (x.float() - mean) / std


def denormalize(x: torch.Tensor, stats: Stats | None) -> torch.Tensor:
    """Inverse of `normalize`: `x * std + mean` per channel (last axis), back in physical units."""
    if stats is None:
        return x
    mean, std = (torch.from_numpy(a).to(x.device) for a in _shaped(stats, 1, 0))
    return x.float() * std + mean


def recorded(content: Any) -> tuple[str, dict[str, Any]] | None:
    """(mode, statistics by dataset) recorded in a checkpoint's content: a training checkpoint's run config
    (`train_config.data`), or the `normalization` entry of a released-format export; None when it records none
    (released weights, and checkpoints written before normalisation existed, trained on the data as it is)."""
    if not isinstance(content, Mapping):
        return None
    train = content.get("train_config")
    data = train.get("data") if isinstance(train, Mapping) else None
    if isinstance(data, Mapping) and "normalize" in data:
        return str(data["normalize"]), dict(data.get("norm_stats") or {})
    record = content.get("normalization")
    if isinstance(record, Mapping) and "normalize" in record:
        return str(record["normalize"]), dict(record.get("stats") or {})
    return None


def export_record(content: Any) -> dict[str, Any] | None:
    """The `normalization` entry a released-format export of `content` carries, so that evaluating the export
    normalises as evaluating the checkpoint does: the run's mode and statistics, unless it normalised nothing by
    choice (`none`, or no record: the export is the bare {'model': state_dict}, evaluated without normalisation)."""
    found = recorded(content)
    if found is None or (found[0] == "none" and not found[1]):
        return None
    return {"normalize": found[0], "stats": found[1]}
