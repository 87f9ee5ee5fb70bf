"""The evaluation's metric suite beyond the two L2RE scalars: per-step L2RE, the RMSE per channel in the data's units
(per frame and over the rollout), The Well's NRMSE / VRMSE and binned spectral MSE per channel and step, MPP's
one-step NRMSE, VRMSE averaged over windows of steps and the blow-ups (trajectories whose VRMSE passed 1), and for an
ensemble of rollouts the CRPS and the spread-skill ratio; accumulated batch by batch (and chunk of steps by chunk of
steps), so that a long rollout is never held whole.

Tensors are in the model layout (B, *S, T, C) with S the spatial axes; `mask` is (B, *S), True on fluid cells.
The Well (the_well 1.2.0, `the_well/benchmark/metrics/spatial.py` and `spectral.py`) defines, per frame and channel:
  NRMSE = sqrt(MSE / (mean(t^2) + 1e-7)),  VRMSE = sqrt(MSE / (std(t)^2 + 1e-7)) (std unbiased, n - 1),
  binned spectral MSE = sum over a wavenumber bin of |FFT(p - t)|^2 / N^2 (N cells; three bins, edges
  [0, ~2pi/max(S)*..., ..., pi*sqrt(ndim)] log-spaced), so that the bins add up to the MSE.
The Well has no masks. Here MSE, mean(t^2) and std(t) are taken over the fluid cells only (their count n in place of
N, n - 1 for the variance); the spectral error is that of the residual zeroed on solid cells, still divided by N^2
(a Fourier transform needs the whole grid): without solid cells every number equals The Well's.
Everything is summed in float64.

Stability (Walrus, 2025; The Well): a trajectory has blown up by step k when, at some step j <= k, its VRMSE
averaged over the valid channels exceeds BLOWUP_VRMSE (1: the error is larger than the truth's own spread);
`vrmse_window` averages a channel's per-step VRMSE over the steps of each of VRMSE_WINDOWS the rollout reaches.
Ensembles (M members): CRPS by the fair (unbiased) estimator, per cell
  CRPS = mean_i |x_i - y| - sum_{i,j} |x_i - x_j| / (2 M (M - 1)),
scoringrules' `crps_ensemble(..., estimator="fair")`, averaged over fluid cells; spread-skill ratio
  sqrt((M + 1) / M) * sqrt(mean var_i(x_i)) / sqrt(mean (mean_i(x_i) - y)^2)
(variance unbiased, means over fluid cells and trajectories; Fortin et al. 2014: 1 for a reliable ensemble).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dpot_train.core.metrics import EPS

WELL_EPS = 1e-7  # The Well's eps in NMSE's denominator
SPECTRAL_BINS = 3
BLOWUP_VRMSE = 1.0  # a trajectory has blown up once its VRMSE (mean over valid channels) passes this
# (key, first step, last step or None: to the end), 1-based rollout steps; Walrus' 1-10 and 11-30, then the rest
VRMSE_WINDOWS = (("1-10", 1, 10), ("11-30", 11, 30), ("31-end", 31, None))


def _spatial_dims(x: torch.Tensor) -> tuple[int, ...]:
    """The spatial axes of a (B, *S, T, C) tensor."""
    return tuple(range(1, x.ndim - 2))


def _fluid(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """(B, *S, 1, 1) float64 weights: 1 on fluid cells (every cell when `mask` is None)."""
    if mask is None:
        return torch.ones(*like.shape[:-2], 1, 1, dtype=torch.float64, device=like.device)
    return mask.to(like.device).to(torch.float64)[..., None, None]


def frame_sums(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample, frame and channel over the fluid cells: (sum of squared error, sum of true^2, unbiased variance of
    true) as (B, T, C) float64, and the fluid-cell count n as (B,)."""
    m = _fluid(mask, pred)
    dims = _spatial_dims(pred)
    p, t = pred.to(torch.float64), true.to(torch.float64)
    sse = ((p - t).pow(2) * m).sum(dim=dims)
    sst = (t.pow(2) * m).sum(dim=dims)
    n = m.sum(dim=dims)  # (B, 1, 1)
    mean = (t * m).sum(dim=dims, keepdim=True) / n.view(n.shape[0], *([1] * len(dims)), 1, 1)
    var = ((t - mean).pow(2) * m).sum(dim=dims) / (n - 1).clamp_min(1.0)
    return sse, sst, var, n.view(-1)


def constant_frames(true: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T, C) bool: the truth takes one value on every fluid cell of the frame and channel."""
    dims = _spatial_dims(true)
    fluid = _fluid(mask, true).bool()
    hi = torch.where(fluid, true, torch.tensor(-math.inf, dtype=true.dtype, device=true.device)).amax(dim=dims)
    lo = torch.where(fluid, true, torch.tensor(math.inf, dtype=true.dtype, device=true.device)).amin(dim=dims)
    return hi == lo


def nrmse(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, C) The Well's NRMSE per frame and channel, over fluid cells."""
    sse, sst, _, n = frame_sums(pred, true, mask)
    n = n[:, None, None]
    return torch.sqrt((sse / n) / (sst / n + WELL_EPS))


def vrmse(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, C) The Well's VRMSE per frame and channel, over fluid cells."""
    sse, _, var, n = frame_sums(pred, true, mask)
    return torch.sqrt((sse / n[:, None, None]) / (var + WELL_EPS))


def spectral_bin_edges(shape: tuple[int, ...]) -> torch.Tensor:
    """The Well's default edges of binned_spectral_mse: four, log-spaced from 2pi/max(shape) to pi*sqrt(ndim)
    (+1e-6), the first set to 0: low, middle and high wavenumbers. float32, as The Well computes them: some
    wavenumbers lie exactly on an edge (pi/2 on a 32-cell axis), and their bin follows that rounding."""
    edges = torch.logspace(float(np.log10(2 * np.pi / max(shape))), float(np.log10(np.pi * np.sqrt(len(shape)) + 1e-6)),
                           SPECTRAL_BINS + 1, dtype=torch.float32)
    edges[0] = 0.0
    return edges


def _bin_matrix(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """(N', 3) float32 weights over the half spectrum torch.fft.rfftn keeps (N' cells, the last axis halved): which
    of the three bins each wavenumber (grid spacing 1, computed in float32 as The Well does) falls in, times the
    number of full-spectrum cells it stands for (2 for the last axis' interior frequencies: the spectrum of a real
    field is symmetric). Wavenumbers past the last edge are in none (The Well drops its open last bin)."""
    wn2 = torch.zeros(shape, dtype=torch.float32)
    for i, s in enumerate(shape):
        k = 2 * np.pi * torch.fft.fftfreq(s, d=1.0)
        wn2 = wn2 + torch.moveaxis(k.reshape((s,) + (1,) * (len(shape) - 1)), 0, i) ** 2
    idx = torch.bucketize(torch.sqrt(wn2).flatten(), spectral_bin_edges(shape), right=True) - 1
    full = torch.nn.functional.one_hot(idx, num_classes=SPECTRAL_BINS + 1)[:, :SPECTRAL_BINS].reshape(*shape, -1)
    last = shape[-1]
    half = full[..., :last // 2 + 1, :].to(torch.float32)
    twice = torch.full((last // 2 + 1,), 2.0)
    twice[0] = 1.0
    if last % 2 == 0:
        twice[-1] = 1.0  # the Nyquist frequency appears once
    return (half * twice[:, None]).reshape(-1, SPECTRAL_BINS).to(device)


def spectral_mse(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, 3, C) The Well's binned spectral MSE of the residual (zeroed on solid cells) per frame and channel;
    float32 FFT as The Well's, summed in float64."""
    dims = _spatial_dims(pred)
    shape = tuple(pred.shape[d] for d in dims)
    res = (pred.float() - true.float()) * _fluid(mask, pred).float()
    power = torch.fft.rfftn(res, dim=dims).abs().pow(2)
    flat = power.reshape(power.shape[0], -1, *power.shape[-2:])  # (B, N', T, C)
    cells = float(np.prod(shape))
    return torch.einsum("bntc,nk->btkc", flat, _bin_matrix(shape, pred.device)).to(torch.float64) / cells ** 2


def window_means(per_step: np.ndarray) -> dict[str, float]:
    """The mean of a per-step curve over each of VRMSE_WINDOWS that it reaches (a window the rollout enters but does
    not fill averages the steps it holds)."""
    out = {}
    for key, first, last in VRMSE_WINDOWS:
        if len(per_step) >= first:
            out[key] = float(np.mean(per_step[first - 1:last]))
    return out


def first_passing(values: torch.Tensor, threshold: float) -> torch.Tensor:
    """(B,) int64: the 0-based index of the first entry of each row of a (B, T) tensor above `threshold`, -1 where
    none is (NaN never passes)."""
    passed = values > threshold
    idx = passed.to(torch.int8).argmax(dim=1)
    return torch.where(passed.any(dim=1), idx, torch.full_like(idx, -1))


class SuiteAccumulator:
    """One predictor's (model's or persistence's) metric suite on one dataset, summed over trajectories.

    Feed each batch of trajectories with `start_batch`, then its rollout in consecutive chunks of steps
    (`add_rollout`) and its one-step predictions (`add_one_step`, any chunking); `result` gives the means.
    `one_step` False: a predictor without one-step predictions (an ensemble's mean), whose result has no
    `one_step_nrmse`."""

    def __init__(self, channels: list[str], channel_valid: list[bool], steps: int, one_step: bool = True) -> None:
        self.names = [c for c, v in zip(channels, channel_valid) if v]
        self.valid = torch.tensor(channel_valid, dtype=torch.bool)
        self.steps = steps
        v = len(self.names)
        self.trajectories = 0
        self.l2re_sum = np.zeros(steps)  # cumulative (rollout) L2RE at each step, summed over trajectories
        self.frame_l2re_sum = np.zeros(steps)
        self.nrmse_sum = np.zeros((steps, v))
        self.vrmse_sum = np.zeros((steps, v))
        self.spectral_sum = np.zeros((SPECTRAL_BINS, v))
        self.rmse_sum = np.zeros((steps, v))  # RMSE of each frame, in the channel's units
        self.rollout_rmse_sum = np.zeros(v)  # RMSE over the whole rollout (all steps' fluid cells)
        self.one_step_sum = 0.0
        self.one_step_frames = 0
        self.constant = np.zeros(v, dtype=bool)
        self.one_step = one_step
        self.blowups_at = np.zeros(steps, dtype=np.int64)  # trajectories whose first blow-up is at each step
        self.first_blowup = torch.zeros(0, dtype=torch.int64)  # the current batch's: 1-based step, -1: none (yet)
        self._run_sse: torch.Tensor | None = None
        self._run_sst: torch.Tensor | None = None
        self._next = 0

    def start_batch(self, batch: int) -> None:
        """A new batch of `batch` trajectories: its rollout starts at step 0."""
        self._run_sse = torch.zeros(batch, len(self.names), dtype=torch.float64)
        self._run_sst = torch.zeros_like(self._run_sse)
        self.first_blowup = torch.full((batch,), -1, dtype=torch.int64)
        self._next = 0
        self.trajectories += batch

    def add_rollout(self, pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None) -> None:
        """The batch's rollout steps [next, next + T) and their truth, (B, *S, T, C)."""
        if self._run_sse is None or self._run_sst is None:
            raise RuntimeError("SuiteAccumulator.add_rollout before start_batch")
        k = self.valid.to(pred.device)
        pred, true = pred[..., k], true[..., k]
        t0, t1 = self._next, self._next + pred.shape[-2]
        sse, sst, var, n = frame_sums(pred, true, mask)
        sse, sst, var = sse.cpu(), sst.cpu(), var.cpu()
        n = n.cpu()[:, None, None]
        cum_sse = self._run_sse[:, None, :] + sse.cumsum(dim=1)
        cum_sst = self._run_sst[:, None, :] + sst.cumsum(dim=1)
        self._run_sse, self._run_sst = cum_sse[:, -1], cum_sst[:, -1]
        self.l2re_sum[t0:t1] += (cum_sse.sqrt() / (cum_sst.sqrt() + EPS)).mean(dim=2).sum(dim=0).numpy()
        self.frame_l2re_sum[t0:t1] += (sse.sqrt() / (sst.sqrt() + EPS)).mean(dim=2).sum(dim=0).numpy()
        self.nrmse_sum[t0:t1] += torch.sqrt((sse / n) / (sst / n + WELL_EPS)).sum(dim=0).numpy()
        vr = torch.sqrt((sse / n) / (var + WELL_EPS))  # (B, T, V)
        self.vrmse_sum[t0:t1] += vr.sum(dim=0).numpy()
        first = first_passing(vr.mean(dim=2), BLOWUP_VRMSE)
        new = (self.first_blowup < 0) & (first >= 0)
        self.first_blowup = torch.where(new, t0 + first + 1, self.first_blowup)
        self.spectral_sum += spectral_mse(pred, true, mask).sum(dim=(0, 1)).cpu().numpy()
        self.rmse_sum[t0:t1] += torch.sqrt(sse / n).sum(dim=0).numpy()
        if t1 == self.steps:  # the batch's rollout is complete: its RMSE over every step, its blow-ups
            self.rollout_rmse_sum += torch.sqrt(self._run_sse / (n[:, 0] * self.steps)).sum(dim=0).numpy()
            hit = self.first_blowup[self.first_blowup > 0] - 1
            self.blowups_at += np.bincount(hit.numpy(), minlength=self.steps)[:self.steps]
        self.constant |= constant_frames(true, mask).any(dim=0).any(dim=0).cpu().numpy()
        self._next = t1

    def add_one_step(self, pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None) -> None:
        """Teacher-forced next-frame predictions (B, *S, T, C) and their truth: MPP's one-step NRMSE."""
        k = self.valid.to(pred.device)
        m = _fluid(mask, pred)
        dims = _spatial_dims(pred)
        p, t = pred[..., k].to(torch.float64), true[..., k].to(torch.float64)
        n = m.sum(dim=dims)  # (B, 1, 1)
        mse, norm = ((p - t).pow(2) * m).sum(dim=dims) / n, (t.pow(2) * m).sum(dim=dims) / n
        err = torch.sqrt(mse / (norm + WELL_EPS)).mean(dim=2)  # (B, T): The Well's NRMSE, mean over valid channels
        self.one_step_sum += float(err.sum())
        self.one_step_frames += err.numel()

    def result(self) -> dict[str, Any]:
        """The means over trajectories (docs/training.md, "eval.json")."""
        n = max(self.trajectories, 1)
        steps = max(self.steps, 1)
        return {
            **({"one_step_nrmse": self.one_step_sum / max(self.one_step_frames, 1)} if self.one_step else {}),
            "l2re_per_step": (self.l2re_sum / n).tolist(),
            "frame_l2re_per_step": (self.frame_l2re_sum / n).tolist(),
            "blowup_fraction_per_step": (np.cumsum(self.blowups_at) / n).tolist(),
            "channels": {name: {"rmse": float(self.rollout_rmse_sum[i] / n),
                                "rmse_per_step": (self.rmse_sum[:, i] / n).tolist(),
                                "nrmse_per_step": (self.nrmse_sum[:, i] / n).tolist(),
                                "vrmse_per_step": (self.vrmse_sum[:, i] / n).tolist(),
                                "vrmse_window": window_means(self.vrmse_sum[:, i] / n),
                                "spectral_mse_per_bin": (self.spectral_sum[:, i] / (n * steps)).tolist()}
                         for i, name in enumerate(self.names)},
        }

    def constant_channels(self) -> list[str]:
        """Valid channels whose truth is constant over the fluid cells in some scored frame (VRMSE's denominator is
        then The Well's eps alone, and the number is large)."""
        return [name for name, c in zip(self.names, self.constant) if c]


class DatasetSuite:
    """The metric suite of one dataset: the model's and the persistence baseline's accumulators."""

    def __init__(self, channels: list[str], channel_valid: list[bool], steps: int) -> None:
        self.channels, self.channel_valid = list(channels), list(channel_valid)
        self.by = {who: SuiteAccumulator(channels, channel_valid, steps) for who in ("model", "persistence")}

    def add(self, who: str, rollout: torch.Tensor, one_step: torch.Tensor, true: torch.Tensor,
            mask: torch.Tensor | None) -> None:
        """A whole batch of one predictor: its rollout and one-step predictions over the same `true` frames."""
        acc = self.by[who]
        acc.start_batch(rollout.shape[0])
        acc.add_rollout(rollout, true, mask)
        acc.add_one_step(one_step, true, mask)

    def result(self) -> dict[str, Any]:
        """The fields each dataset of eval.json gains (docs/training.md): channel names, padded and constant ones,
        and per predictor its suite."""
        constant = sorted(set(self.by["model"].constant_channels()) | set(self.by["persistence"].constant_channels()),
                          key=self.channels.index)
        return {"channels": [c for c, v in zip(self.channels, self.channel_valid) if v],
                "padded_channels": [c for c, v in zip(self.channels, self.channel_valid) if not v],
                "constant_channels": constant,
                **{who: acc.result() for who, acc in self.by.items()}}


def crps_fair(members: torch.Tensor, true: torch.Tensor) -> torch.Tensor:
    """The fair (unbiased) CRPS of an ensemble `members` (M, ...) against `true` (...), elementwise, float64:
    mean_i |x_i - y| - sum_{i,j} |x_i - x_j| / (2 M (M - 1)) (scoringrules' crps_ensemble, estimator="fair");
    the pair sum from the sorted members, 2 sum_k (2k - M - 1) x_(k). Needs M >= 2."""
    m = members.shape[0]
    x, y = members.to(torch.float64), true.to(torch.float64)
    skill = (x - y).abs().mean(dim=0)
    rank = 2 * torch.arange(1, m + 1, dtype=torch.float64, device=x.device) - m - 1
    pairs = 2 * (rank.view(m, *([1] * (x.ndim - 1))) * x.sort(dim=0).values).sum(dim=0)
    return skill - pairs / (2 * m * (m - 1))


class EnsembleAccumulator:
    """An ensemble's scores on one dataset, summed over trajectories: per valid channel and step the fair CRPS and
    the spread-skill ratio, and the metric suite of the ensemble mean (a SuiteAccumulator without one-step
    predictions). Fed like SuiteAccumulator: `start_batch`, then the members' rollouts in consecutive chunks of
    steps (`add_rollout`); the members are scored one trajectory at a time (memory: one trajectory's chunk in
    float64 per member)."""

    def __init__(self, channels: list[str], channel_valid: list[bool], steps: int, members: int) -> None:
        if members < 2:
            raise ValueError(f"an ensemble needs at least 2 members, not {members}")
        self.members = members
        self.names = [c for c, v in zip(channels, channel_valid) if v]
        self.valid = torch.tensor(channel_valid, dtype=torch.bool)
        self.steps = steps
        self.mean = SuiteAccumulator(channels, channel_valid, steps, one_step=False)
        v = len(self.names)
        self.trajectories = 0
        self.crps_sum = np.zeros((steps, v))  # per trajectory: mean over fluid cells
        self.var_sum = np.zeros((steps, v))  # the members' unbiased variance, mean over fluid cells
        self.sq_err_sum = np.zeros((steps, v))  # (ensemble mean - truth)^2, mean over fluid cells
        self._next = 0

    def start_batch(self, batch: int) -> None:
        """A new batch of `batch` trajectories: its rollouts start at step 0."""
        self.mean.start_batch(batch)
        self.trajectories += batch
        self._next = 0

    def add_rollout(self, members: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None) -> None:
        """The members' rollout steps [next, next + T), (M, B, *S, T, C), and their truth (B, *S, T, C)."""
        if members.shape[0] != self.members:
            raise ValueError(f"expected {self.members} members, got {members.shape[0]}")
        k = self.valid.to(members.device)
        t0, t1 = self._next, self._next + members.shape[-2]
        for b in range(members.shape[1]):
            x, y = members[:, b][..., k].to(torch.float64), true[b][..., k].to(torch.float64)  # (M, *S, T, V)
            w = _fluid(None if mask is None else mask[b:b + 1], y[None])[0]  # (*S, 1, 1)
            dims = tuple(range(y.ndim - 2))
            n = w.sum(dim=dims)
            self.crps_sum[t0:t1] += ((crps_fair(x, y) * w).sum(dim=dims) / n).cpu().numpy()
            self.var_sum[t0:t1] += ((x.var(dim=0, correction=1) * w).sum(dim=dims) / n).cpu().numpy()
            self.sq_err_sum[t0:t1] += (((x.mean(dim=0) - y).pow(2) * w).sum(dim=dims) / n).cpu().numpy()
        self.mean.add_rollout(members.to(torch.float64).mean(dim=0), true, mask)
        self._next = t1

    def result(self) -> dict[str, Any]:
        """`ensemble` (per channel: crps_per_step, crps, spread_skill_per_step) and `mean` (the suite of the
        ensemble mean, with its rollout_l2re: the last entry of l2re_per_step); docs/training.md, "eval.json"."""
        n = max(self.trajectories, 1)
        factor = math.sqrt((self.members + 1) / self.members)
        ratio = np.full(self.var_sum.shape, np.nan)
        np.divide(np.sqrt(self.var_sum), np.sqrt(self.sq_err_sum), out=ratio, where=self.sq_err_sum > 0)
        ratio *= factor
        mean = self.mean.result()
        mean = {"rollout_l2re": mean["l2re_per_step"][-1] if mean["l2re_per_step"] else None, **mean}
        channels = {name: {"crps_per_step": (self.crps_sum[:, i] / n).tolist(),
                           "crps": float(self.crps_sum[:, i].sum() / (n * max(self.steps, 1))),
                           "spread_skill_per_step": [None if not np.isfinite(r) else float(r) for r in ratio[:, i]]}
                    for i, name in enumerate(self.names)}
        return {"ensemble": {"members": self.members, "channels": channels}, "mean": mean}
