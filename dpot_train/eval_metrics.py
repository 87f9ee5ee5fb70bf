"""The evaluation's metric suite beyond the two L2RE scalars: per-step L2RE, the RMSE per channel in the data's units
(per frame and over the rollout), The Well's NRMSE / VRMSE and binned spectral MSE per channel and step, MPP's
one-step NRMSE; accumulated batch by batch (and chunk of steps by chunk of
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
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from dpot_train.metrics import EPS

WELL_EPS = 1e-7  # The Well's eps in NMSE's denominator
SPECTRAL_BINS = 3


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


class SuiteAccumulator:
    """One predictor's (model's or persistence's) metric suite on one dataset, summed over trajectories.

    Feed each batch of trajectories with `start_batch`, then its rollout in consecutive chunks of steps
    (`add_rollout`) and its one-step predictions (`add_one_step`, any chunking); `result` gives the means."""

    def __init__(self, channels: list[str], channel_valid: list[bool], steps: int) -> None:
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
        self._run_sse: torch.Tensor | None = None
        self._run_sst: torch.Tensor | None = None
        self._next = 0

    def start_batch(self, batch: int) -> None:
        """A new batch of `batch` trajectories: its rollout starts at step 0."""
        self._run_sse = torch.zeros(batch, len(self.names), dtype=torch.float64)
        self._run_sst = torch.zeros_like(self._run_sse)
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
        self.vrmse_sum[t0:t1] += torch.sqrt((sse / n) / (var + WELL_EPS)).sum(dim=0).numpy()
        self.spectral_sum += spectral_mse(pred, true, mask).sum(dim=(0, 1)).cpu().numpy()
        self.rmse_sum[t0:t1] += torch.sqrt(sse / n).sum(dim=0).numpy()
        if t1 == self.steps:  # the batch's rollout is complete: its RMSE over every step
            self.rollout_rmse_sum += torch.sqrt(self._run_sse / (n[:, 0] * self.steps)).sum(dim=0).numpy()
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
            "one_step_nrmse": self.one_step_sum / max(self.one_step_frames, 1),
            "l2re_per_step": (self.l2re_sum / n).tolist(),
            "frame_l2re_per_step": (self.frame_l2re_sum / n).tolist(),
            "channels": {name: {"rmse": float(self.rollout_rmse_sum[i] / n),
                                "rmse_per_step": (self.rmse_sum[:, i] / n).tolist(),
                                "nrmse_per_step": (self.nrmse_sum[:, i] / n).tolist(),
                                "vrmse_per_step": (self.vrmse_sum[:, i] / n).tolist(),
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
