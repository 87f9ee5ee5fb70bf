"""Arrays the evaluation's metric suite is checked on against The Well's own metric functions (the referee): a
random 2D block, a real-shaped 2D block with a cylinder of solid cells, a padded channel and a channel constant in one
frame, a masked 3D block and a block with odd sides. Layout as the model's: fields (B, *S, T, C), mask (B, *S) True
on fluid cells.

tests/golden/make_well_metrics.py turns these into tests/golden/well_metrics.npz (inputs and The Well's values);
numpy only, so that the script also runs in a scratch environment that has the_well installed.
"""

from __future__ import annotations

import numpy as np


def _smooth(rng: np.random.Generator, b: int, shape: tuple[int, ...], t: int, c: int) -> np.ndarray:
    """Smooth travelling waves plus a little noise, (b, *shape, t, c) float32: a field's look, not white noise."""
    axes = np.meshgrid(*[np.linspace(0, 2 * np.pi, n, endpoint=False) for n in shape], indexing="ij")
    out = np.empty((b, *shape, t, c), dtype=np.float64)
    for i in range(b):
        for k in range(c):
            kx = rng.integers(1, 4, size=len(shape))
            phase = rng.uniform(0, 2 * np.pi)
            for s in range(t):
                arg = sum(kk * a for kk, a in zip(kx, axes)) + phase + 0.3 * s
                out[i, ..., s, k] = (1 + k) * np.sin(arg) + 0.5 + 0.05 * rng.standard_normal(shape)
    return out.astype(np.float32)


def cases() -> dict[str, dict[str, np.ndarray]]:
    """name -> {pred, true, mask (or absent), channel_valid}."""
    rng = np.random.default_rng(20240311)
    out: dict[str, dict[str, np.ndarray]] = {}

    true = rng.standard_normal((3, 16, 12, 4, 3)).astype(np.float32)
    pred = (true + 0.3 * rng.standard_normal(true.shape)).astype(np.float32)
    out["random_2d"] = {"pred": pred, "true": true, "channel_valid": np.ones(3, dtype=bool)}

    true = _smooth(rng, 2, (32, 32), 3, 4)
    pred = (true + 0.1 * _smooth(rng, 2, (32, 32), 3, 4)).astype(np.float32)
    true[..., 3] = 0.0  # a padded channel: zeros in the truth, anything in the prediction
    true[1, ..., 0, 2] = 0.5  # constant over the frame
    x, y = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    cylinder = (x - 10) ** 2 + (y - 16) ** 2 <= 16
    mask = np.broadcast_to(~cylinder, (2, 32, 32)).copy()
    pred[~mask] = 7.0  # whatever a model says on solid cells never counts
    out["masked_2d"] = {"pred": pred, "true": true, "mask": mask, "channel_valid": np.array([1, 1, 1, 0], dtype=bool)}

    true = rng.standard_normal((2, 8, 8, 8, 2, 2)).astype(np.float32)
    pred = (0.8 * true + 0.2 * rng.standard_normal(true.shape)).astype(np.float32)
    mask = rng.uniform(size=(2, 8, 8, 8)) > 0.2
    out["masked_3d"] = {"pred": pred, "true": true, "mask": mask, "channel_valid": np.ones(2, dtype=bool)}
    true = rng.standard_normal((2, 9, 7, 3, 1)).astype(np.float32)  # odd sides: no Nyquist frequency
    pred = (true + 0.5 * rng.standard_normal(true.shape)).astype(np.float32)
    out["odd_2d"] = {"pred": pred, "true": true, "channel_valid": np.ones(1, dtype=bool)}
    return out
