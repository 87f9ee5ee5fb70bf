"""Pure array transforms: window start, layout change to the model's (X, Y, T, C), and noise injection."""

from __future__ import annotations

import numpy as np


def window_start(rng: np.random.Generator, frames: int, length: int) -> int:
    """Uniform start t0 in [0, frames - length] so that frames [t0, t0 + length) exist."""
    if frames < length:
        raise ValueError(f"a window of {length} frames does not fit in {frames} frames")
    return int(rng.integers(0, frames - length + 1))


def to_model_layout(fields: np.ndarray) -> np.ndarray:
    """(T, C, Y, X) as stored in shards -> (X, Y, T, C) as the model reads it (contiguous copy)."""
    return np.ascontiguousarray(np.transpose(fields, (3, 2, 0, 1)))


def split_window(window: np.ndarray, t_in: int) -> tuple[np.ndarray, np.ndarray]:
    """(X, Y, T, C) window -> inputs (X, Y, t_in, C) and targets (X, Y, T - t_in, C)."""
    return window[:, :, :t_in], window[:, :, t_in:]


def add_noise(x: np.ndarray, eps: float, rng: np.random.Generator, mask: np.ndarray | None = None,
              channel_valid: np.ndarray | None = None) -> np.ndarray:
    """x + eps * ||x||_2 * N(0, 1), the norm per channel over (X, Y, T); noise only on fluid cells and valid channels.

    x is one sample (X, Y, T, C); mask (X, Y) True on fluid cells; channel_valid (C,) False on padded channels.
    """
    if eps <= 0:
        return x
    norm = np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=(0, 1, 2), keepdims=True)).astype(np.float32)
    noise = rng.standard_normal(x.shape, dtype=np.float32) * (np.float32(eps) * norm)
    if mask is not None:
        noise *= mask[:, :, None, None].astype(np.float32)
    if channel_valid is not None:
        noise *= np.asarray(channel_valid, dtype=np.float32)
    return x + noise
