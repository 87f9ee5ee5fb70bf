"""Relative L2 with channel-validity and geometry masks: the training loss, and one-step / rollout L2RE.

Tensors are in the model layout (B, X, Y, T, C) (3D: (B, X, Y, Z, T, C)); `mask` is (B, X, Y[, Z]) with True on
fluid cells, `channel_valid` is (B, C). The relative error of a sample and channel is ||(pred - true) * m|| /
||true * m|| over space and time,
averaged over the sample's valid channels; the loss is the mean of that over the batch (the reference sums).
"""

from __future__ import annotations

from typing import Callable

import torch

EPS = 1e-8


def relative_l2_per_channel(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None = None,
                            eps: float = EPS) -> torch.Tensor:
    """(B, C) relative L2 error over space and time, counting only cells where mask is True."""
    diff = (pred - true).float()
    true = true.float()
    if mask is not None:
        m = mask.to(diff.dtype)[..., None, None]
        diff = diff * m
        true = true * m
    space_time = tuple(range(1, diff.ndim - 1))
    num = diff.pow(2).sum(dim=space_time).sqrt()
    den = true.pow(2).sum(dim=space_time).sqrt()
    return num / (den + eps)


def masked_channel_mean(per_channel: torch.Tensor, channel_valid: torch.Tensor | None) -> torch.Tensor:
    """(B, C) -> (B,): mean over the valid channels of each sample (all channels when None)."""
    if channel_valid is None:
        return per_channel.mean(dim=1)
    w = channel_valid.to(per_channel.dtype)
    return (per_channel * w).sum(dim=1) / w.sum(dim=1).clamp_min(1.0)


def per_sample_loss(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None,
                    channel_valid: torch.Tensor | None, mode: str = "valid") -> torch.Tensor:
    """(B,) training loss of each sample: 'valid' = valid channels and fluid cells; 'all' = everything (reference)."""
    if mode == "valid":
        return masked_channel_mean(relative_l2_per_channel(pred, true, mask), channel_valid)
    if mode == "all":
        return relative_l2_per_channel(pred, true, None).mean(dim=1)
    raise ValueError(f"unknown loss mode {mode!r}; expected 'valid' or 'all'")


def relative_l2_loss(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None,
                     channel_valid: torch.Tensor | None, mode: str = "valid") -> torch.Tensor:
    """Training loss, mean over the batch (see per_sample_loss)."""
    return per_sample_loss(pred, true, mask, channel_valid, mode).mean()


Predictor = Callable[[torch.Tensor], torch.Tensor]


def predicted_entries(mask: torch.Tensor | None, channel_valid: torch.Tensor | None, like: torch.Tensor
                      ) -> torch.Tensor | None:
    """(B, X, Y[, Z], 1, C) bool: fluid cells of valid channels, the entries a model's prediction is used for."""
    if mask is None and channel_valid is None:
        return None
    keep = torch.ones(*like.shape[:-2], 1, like.shape[-1], dtype=torch.bool, device=like.device)
    if mask is not None:
        keep = keep & mask.to(like.device).bool()[..., None, None]
    if channel_valid is not None:
        cv = channel_valid.to(like.device).bool()
        keep = keep & cv.view(cv.shape[0], *([1] * (like.ndim - 2)), cv.shape[1])
    return keep


def rollout(predict: Predictor, frames: torch.Tensor, t_in: int, steps: int,
            keep: torch.Tensor | None = None) -> torch.Tensor:
    """Auto-regressive rollout from the first t_in true frames of (B, *S, T, C): returns (B, *S, steps, C).

    `predict` maps (B, X, Y, t_in, C) to (B, X, Y, k, C) with k >= 1 new frames; they are appended and the window
    slides forward until `steps` frames are produced. Where `keep` (see predicted_entries) is False — padded
    channels and solid cells, which the loss never trains — the last input frame is carried over instead, so that
    untrained outputs are never fed back as inputs.
    """
    window = frames[..., :t_in, :]
    out: list[torch.Tensor] = []
    produced = 0
    while produced < steps:
        new = predict(window)
        if keep is not None:
            new = torch.where(keep, new, window[..., -1:, :])
        out.append(new)
        produced += new.shape[-2]
        window = torch.cat([window, new], dim=-2)[..., -t_in:, :]
    return torch.cat(out, dim=-2)[..., :steps, :]


def one_step(predict: Predictor, frames: torch.Tensor, t_in: int, steps: int,
             keep: torch.Tensor | None = None) -> torch.Tensor:
    """Teacher-forced next-frame predictions for frames t_in .. t_in + steps - 1 (each from the true previous t_in)."""
    preds = []
    for t in range(t_in, t_in + steps):
        window = frames[..., t - t_in:t, :]
        new = predict(window)[..., :1, :]
        preds.append(new if keep is None else torch.where(keep, new, window[..., -1:, :]))
    return torch.cat(preds, dim=-2)


def persistence(window: torch.Tensor) -> torch.Tensor:
    """Baseline predictor: the last input frame, (B, *S, 1, C)."""
    return window[..., -1:, :]


def l2re(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor | None,
         channel_valid: torch.Tensor | None) -> torch.Tensor:
    """(B,) L2RE: relative L2 over the whole predicted space-time block, averaged over valid channels."""
    return masked_channel_mean(relative_l2_per_channel(pred, true, mask), channel_valid)


# ------------------------------------------------------------------------------------------ the reference's metric

def original_grid_cells(shape: tuple[int, ...], native: tuple[int, ...] | list[int]) -> torch.Tensor:
    """(H, W[, D]) bool: the cells that hold the native grid's points after an integer upsampling (every k-th cell
    from 0), all cells otherwise: the reference's test mask (it scores only values that were not interpolated)."""
    cells = torch.zeros(tuple(shape), dtype=torch.bool)
    steps = [s // n if n < s and s % n == 0 else 1 for s, n in zip(shape, native)]
    cells[tuple(slice(None, None, k) for k in steps)] = True
    return cells


def reference_l2re(pred: torch.Tensor, true: torch.Tensor, cells: torch.Tensor, channels: int) -> torch.Tensor:
    """(B,) the reference's relative L2 of each sample: per channel over (H, W[, D], T) on `cells`, averaged over
    the first `channels` channels (the dataset's own, or its pred_channels)."""
    m = cells.to(pred.device)[None, ..., None, None]
    diff = ((pred - true).float() * m)[..., :channels]
    ref = (true.float() * m)[..., :channels]
    space_time = tuple(range(1, diff.ndim - 1))
    num = diff.pow(2).sum(dim=space_time).sqrt()
    den = ref.pow(2).sum(dim=space_time).sqrt()
    return (num / den).mean(dim=1)


def reference_rollout_errors(predict: Predictor, frames: torch.Tensor, t_in: int, steps: int, cells: torch.Tensor,
                             channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference evaluation of a batch: an auto-regressive rollout from the first t_in frames that feeds every
    channel of each prediction back; returns (B,) errors over the whole rollout and (B, steps) per-step errors."""
    window = frames[..., :t_in, :]
    preds: list[torch.Tensor] = []
    while sum(p.shape[-2] for p in preds) < steps:
        new = predict(window)
        preds.append(new)
        window = torch.cat([window, new], dim=-2)[..., -t_in:, :]
    pred = torch.cat(preds, dim=-2)[..., :steps, :]
    true = frames[..., t_in:t_in + steps, :]
    per_step = torch.stack([reference_l2re(pred[..., s:s + 1, :], true[..., s:s + 1, :], cells, channels)
                            for s in range(steps)], dim=1)
    return reference_l2re(pred, true, cells, channels), per_step
