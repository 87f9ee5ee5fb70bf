"""Normalisation statistics: float64, mask-aware, mergeable accumulators (Chan et al. count/mean/M2 merge).

Statistics are taken per dataset and per *valid* channel (padded channels are left out), over fluid cells only
(mask == 1), on the train split only. Two families are kept: the field values themselves and their one-step time
differences `f[t+1] - f[t]` within a trajectory. Every block of trajectories gives a `Moments`; blocks computed on
different workers merge exactly (up to float64 rounding) in any order, so the result does not depend on chunking.

`std` is the population standard deviation (ddof = 0); `rms` is sqrt(mean of squares) = sqrt(mean² + std²).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce
from typing import Iterable, Mapping, Sequence

import numpy as np

STAT_KEYS = ("count", "mean", "std", "rms", "min", "max")


@dataclass(frozen=True)
class Moments:
    """Per-channel running moments in float64: count, mean, M2 (sum of squared deviations), min, max."""

    count: np.ndarray
    mean: np.ndarray
    m2: np.ndarray
    min: np.ndarray
    max: np.ndarray

    @classmethod
    def empty(cls, n_channels: int) -> "Moments":
        """The identity of `merge`: no values seen for any of `n_channels` channels."""
        return cls(
            count=np.zeros(n_channels, dtype=np.int64),
            mean=np.zeros(n_channels, dtype=np.float64),
            m2=np.zeros(n_channels, dtype=np.float64),
            min=np.full(n_channels, np.inf, dtype=np.float64),
            max=np.full(n_channels, -np.inf, dtype=np.float64),
        )

    @classmethod
    def of_values(cls, values: np.ndarray) -> "Moments":
        """Moments of a (channel, k) array of values, computed in float64 (two-pass within the block)."""
        v = np.asarray(values, dtype=np.float64)
        if v.ndim != 2:
            raise ValueError(f"values must be (channel, k), got shape {v.shape}")
        n_channels, k = v.shape
        if k == 0:
            return cls.empty(n_channels)
        mean = v.mean(axis=1)
        dev = v - mean[:, None]
        m2 = np.einsum("ck,ck->c", dev, dev)
        return cls(
            count=np.full(n_channels, k, dtype=np.int64),
            mean=mean,
            m2=m2,
            min=v.min(axis=1),
            max=v.max(axis=1),
        )

    @property
    def n_channels(self) -> int:
        """Number of channels tracked."""
        return int(self.count.shape[0])

    def merge(self, other: "Moments") -> "Moments":
        """Combine two disjoint sets of values (Chan, Golub & LeVeque's pairwise update), exact in float64."""
        if other.n_channels != self.n_channels:
            raise ValueError(f"cannot merge moments of {self.n_channels} and {other.n_channels} channels")
        n_a = self.count.astype(np.float64)
        n_b = other.count.astype(np.float64)
        n = n_a + n_b
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = other.mean - self.mean
            w_b = np.where(n > 0, n_b / np.where(n > 0, n, 1.0), 0.0)
            mean = self.mean + delta * w_b
            m2 = self.m2 + other.m2 + delta * delta * n_a * w_b
        return Moments(
            count=self.count + other.count,
            mean=np.where(n > 0, mean, 0.0),
            m2=np.where(n > 0, m2, 0.0),
            min=np.minimum(self.min, other.min),
            max=np.maximum(self.max, other.max),
        )

    def summary(self) -> list[dict[str, float | int | None]]:
        """Per channel {count, mean, std, rms, min, max}; None (JSON null) where a channel saw no value."""
        out: list[dict[str, float | int | None]] = []
        for c in range(self.n_channels):
            n = int(self.count[c])
            if n == 0:
                out.append({"count": 0, "mean": None, "std": None, "rms": None, "min": None, "max": None})
                continue
            var = max(float(self.m2[c]) / n, 0.0)
            mean = float(self.mean[c])
            out.append(
                {
                    "count": n,
                    "mean": mean,
                    "std": math.sqrt(var),
                    "rms": math.sqrt(mean * mean + var),
                    "min": float(self.min[c]),
                    "max": float(self.max[c]),
                }
            )
        return out


@dataclass(frozen=True)
class FieldStats:
    """Moments of the field values and of their one-step time differences, for one set of valid channels."""

    values: Moments
    diffs: Moments
    trajectories: int = 0

    @classmethod
    def empty(cls, n_channels: int) -> "FieldStats":
        """No trajectory seen yet."""
        return cls(Moments.empty(n_channels), Moments.empty(n_channels), 0)

    def merge(self, other: "FieldStats") -> "FieldStats":
        """Combine the statistics of two disjoint blocks of trajectories."""
        return FieldStats(
            self.values.merge(other.values),
            self.diffs.merge(other.diffs),
            self.trajectories + other.trajectories,
        )


def _valid_channel_index(channel_valid: Sequence[bool] | np.ndarray, n_channels: int) -> np.ndarray:
    """Indices of the valid channels, checked against the field's channel count."""
    valid = np.asarray(channel_valid, dtype=bool)
    if valid.shape != (n_channels,):
        raise ValueError(f"channel_valid has shape {valid.shape}, fields have {n_channels} channels")
    return np.flatnonzero(valid)


def _frame_parts(x: np.ndarray, work: np.ndarray | None = None
                 ) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(count, mean, M2, min, max) per channel of a float64 (channel, k) array; the deviations from the mean go
    into `work` (same shape), or into `x` itself when `work` is None (x is then overwritten)."""
    k = x.shape[1]
    mn = x.min(axis=1)
    mx = x.max(axis=1)
    mean = x.sum(axis=1) / k
    dev = np.subtract(x, mean[:, None], out=x if work is None else work)
    return float(k), mean, np.einsum("ck,ck->c", dev, dev), mn, mx


def _combine(parts: list[tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray]], n_c: int) -> Moments:
    """Exact combination of disjoint groups: mean = Σ n_g mean_g / N, M2 = Σ M2_g + Σ n_g (mean_g − mean)²."""
    if not parts:
        return Moments.empty(n_c)
    n_g = np.array([p[0] for p in parts])[:, None]
    means = np.stack([p[1] for p in parts])
    total = float(n_g.sum())
    mean = (n_g * means).sum(axis=0) / total
    dev = means - mean[None, :]
    m2 = np.stack([p[2] for p in parts]).sum(axis=0) + (n_g * dev * dev).sum(axis=0)
    return Moments(count=np.full(n_c, int(total), dtype=np.int64), mean=mean, m2=m2,
                   min=np.stack([p[3] for p in parts]).min(axis=0), max=np.stack([p[4] for p in parts]).max(axis=0))


def trajectory_stats(fields: np.ndarray, mask: np.ndarray, channel_valid: Sequence[bool] | np.ndarray) -> FieldStats:
    """Statistics of ONE trajectory: `fields` (time, channel, *space), `mask` (*space) with 1 = fluid.

    Frame by frame: each frame's fluid cells are copied to float64 (one small block) and reduced with two passes,
    and so is the difference to the previous frame; the per-frame results are combined exactly at the end. No
    float64 copy of the whole trajectory is made (a 512² trajectory would need ~350 MB of temporaries).
    """
    f = np.asarray(fields)
    m = np.asarray(mask)
    if f.ndim < 4 or m.shape != f.shape[2:]:
        raise ValueError(f"fields (time, channel, *space) {f.shape} and mask (*space) {m.shape} do not match")
    idx = _valid_channel_index(channel_valid, f.shape[1])
    n_t, n_c = f.shape[0], idx.size
    chosen = f if n_c == f.shape[1] else f[:, idx]
    fluid = m.astype(bool).ravel()
    every_cell = bool(fluid.all())
    if not fluid.any():
        return FieldStats(Moments.empty(n_c), Moments.empty(n_c), 1)
    values, diffs = [], []
    k = int(np.count_nonzero(fluid))
    # four float64 frame buffers, reused: no allocation per frame (freed and re-faulted memory costs more than the
    # arithmetic, above all in processes that hand memory back to the system at once, as dask workers do)
    current, previous, diff, work = (np.empty((n_c, k), dtype=np.float64) for _ in range(4))
    for t in range(n_t):
        frame = chosen[t].reshape(n_c, -1)
        np.copyto(current, frame if every_cell else np.compress(fluid, frame, axis=1))
        if t:
            diffs.append(_frame_parts(np.subtract(current, previous, out=diff)))
        values.append(_frame_parts(current, work))  # current stays as it is: the next frame's previous
        current, previous = previous, current
    return FieldStats(_combine(values, n_c), _combine(diffs, n_c), 1)


def block_stats(
    fields: np.ndarray,
    mask: np.ndarray,
    channel_valid: Sequence[bool] | np.ndarray,
    include: Sequence[bool] | np.ndarray | None = None,
) -> FieldStats:
    """Statistics of a block of trajectories `fields` (sample, time, channel, *space), `mask` (sample, *space).

    `include` (bool per sample, e.g. split == "train") selects the trajectories that count; None counts all.
    Trajectories are processed one at a time so the float64 copy stays one trajectory big.
    """
    f = np.asarray(fields)
    n_valid = int(np.count_nonzero(np.asarray(channel_valid, dtype=bool)))
    acc = FieldStats.empty(n_valid)
    keep = np.ones(f.shape[0], dtype=bool) if include is None else np.asarray(include, dtype=bool)
    if keep.shape != (f.shape[0],):
        raise ValueError(f"include has shape {keep.shape}, block has {f.shape[0]} trajectories")
    for i in np.flatnonzero(keep):
        acc = acc.merge(trajectory_stats(f[i], mask[i], channel_valid))
    return acc


def merge_all(parts: Iterable[FieldStats], n_channels: int) -> FieldStats:
    """Merge any number of partial statistics (from chunks or workers) into one."""
    return reduce(FieldStats.merge, parts, FieldStats.empty(n_channels))


def to_manifest(stats: FieldStats, channels: Sequence[str], channel_valid: Sequence[bool]) -> dict:
    """The manifest's `stats` object: per valid channel name, the field and time-difference summaries."""
    names = [name for name, ok in zip(channels, channel_valid) if ok]
    if len(names) != stats.values.n_channels:
        raise ValueError(f"{len(names)} valid channel names for {stats.values.n_channels} channels of statistics")
    return {
        "split": "train",
        "dtype": "float64",
        "ddof": 0,
        "cells": "fluid (mask == 1)",
        "trajectories": stats.trajectories,
        "channels": names,
        "fields": dict(zip(names, stats.values.summary())),
        "diff": dict(zip(names, stats.diffs.summary())),
    }


def compare(expected: Mapping, actual: Mapping, rtol: float = 1e-9, atol: float = 1e-12) -> list[str]:
    """Differences between two manifest `stats` objects, as readable lines (empty when they agree)."""
    problems: list[str] = []
    if list(expected.get("channels", [])) != list(actual.get("channels", [])):
        return [f"channels differ: {expected.get('channels')} vs {actual.get('channels')}"]
    if expected.get("trajectories") != actual.get("trajectories"):
        problems.append(f"trajectories: {expected.get('trajectories')} vs {actual.get('trajectories')}")
    for family in ("fields", "diff"):
        for name in expected.get("channels", []):
            a = expected.get(family, {}).get(name, {})
            b = actual.get(family, {}).get(name, {})
            for key in STAT_KEYS:
                x, y = a.get(key), b.get(key)
                if x is None or y is None:
                    if x is not y:
                        problems.append(f"{family}.{name}.{key}: {x} vs {y}")
                elif not math.isclose(float(x), float(y), rel_tol=rtol, abs_tol=atol):
                    problems.append(f"{family}.{name}.{key}: {x!r} vs {y!r}")
    return problems


def stats_lines(recomputed: Mapping[str, dict], problems: Mapping[str, list[str]]) -> list[str]:
    """The table `dpot-data stats` prints: per dataset and channel the values' and the time differences'
    moments, then whether the manifest matches."""
    lines = []
    for name, doc in recomputed.items():
        lines.append(f"{name}: {doc['trajectories']} train trajectories, float64, fluid cells, ddof 0")
        lines.append(f"  {'channel':<12} {'kind':<6} {'count':>12} {'mean':>13} {'std':>13} {'rms':>13} "
                     f"{'min':>13} {'max':>13}")
        for family, label in (("fields", "value"), ("diff", "dt")):
            for ch in doc["channels"]:
                v = doc[family][ch]
                nums = " ".join(f"{v[k]:>13.6g}" if v[k] is not None else f"{'-':>13}"
                                for k in ("mean", "std", "rms", "min", "max"))
                lines.append(f"  {ch:<12} {label:<6} {v['count']:>12} {nums}")
        diffs = problems[name]
        lines.append(f"  manifest: {'matches' if not diffs else 'DIFFERS: ' + '; '.join(diffs[:5])}")
    return lines
