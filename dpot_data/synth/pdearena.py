"""Small PDEArena Navier–Stokes 2D files in the published layout (docs/sources.md).

`NavierStokes2D_{split}_{seed}_{buo_y:.5f}[_{N}].h5` (the `_{N}` suffix only on train files, as the generator
names them), one top group named after the split with `u`, `vx`, `vy` (N, T, nx, ny) float64 stored in (x, y) order,
`t` (N, T), `x`, `y` (N, n) = linspace(0, 32, n), `dt`, `dx`, `dy`, `buo_y` (N,). Uncompressed, contiguous.

The fields are a smoke plume rising with the buoyancy: a Gaussian blob whose centre moves up at a speed proportional
to `buo_y` and spreads by diffusion (closed form), with the velocity of a rising, spreading vortex pair.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

EXTENT = 32.0


def file_name(split: str, seed: int, buo_y: float, n: int) -> str:
    """The generator's file name: the sample count is appended to train files only."""
    stem = f"NavierStokes2D_{split}_{seed}_{buo_y:.5f}"
    return f"{stem}_{n}.h5" if split == "train" else f"{stem}.h5"


def plume(sample: int, x: np.ndarray, y: np.ndarray, t: np.ndarray, buo_y: float, seed: int) -> dict[str, np.ndarray]:
    """Closed-form rising plume: {"u", "vx", "vy"} each (T, nx, ny) float64 in the file's (x, y) storage order."""
    rng = np.random.default_rng([seed, sample, 3])
    x0, y0 = float(rng.uniform(10, 22)), float(rng.uniform(4, 10))
    s0, amp = float(rng.uniform(2.0, 4.0)), float(rng.uniform(0.5, 1.0))
    xx, yy = np.meshgrid(x, y, indexing="ij")
    out = {k: np.empty((len(t), len(x), len(y))) for k in ("u", "vx", "vy")}
    for k, tk in enumerate(t - t[0]):
        rise = 0.2 * buo_y * tk
        var = s0 * s0 + 0.05 * tk
        dx, dy = xx - x0, yy - (y0 + rise)
        blob = amp * (s0 * s0 / var) * np.exp(-(dx * dx + dy * dy) / (2 * var))
        out["u"][k] = blob
        out["vx"][k] = 0.3 * buo_y * dx * dy / var * blob
        out["vy"][k] = buo_y * (1.0 - 0.3 * dx * dx / var) * blob
    return out


def write_ns(out: str | Path, *, split: str = "train", seed: int = 0, buo_y: float = 0.5, n: int = 3,
             frames: int = 14, res: int = 32, t0: float = 18.0, step: float = 6.0, name: str | None = None) -> Path:
    """Write one PDEArena NS file (published: 128², 14 frames standard or 56 conditioned); returns its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (name or file_name(split, seed, buo_y, n))
    x = np.linspace(0.0, EXTENT, res)
    t = t0 + step * np.arange(frames, dtype=float)
    with h5py.File(path, "w") as f:
        g = f.create_group(split)
        dsets = {k: g.create_dataset(k, (n, frames, res, res), dtype=float) for k in ("u", "vx", "vy")}
        tc = g.create_dataset("t", (n, frames), dtype=float)
        xc = g.create_dataset("x", (n, res), dtype=float)
        yc = g.create_dataset("y", (n, res), dtype=float)
        scal = {k: g.create_dataset(k, (n,), dtype=float) for k in ("dt", "dx", "dy", "buo_y")}
        for i in range(n):
            fields = plume(i, x, x, t, buo_y, seed)
            for k, d in dsets.items():
                d[i] = fields[k]
            tc[i], xc[i], yc[i] = t, x, x
            scal["dt"][i] = step
            scal["dx"][i] = scal["dy"][i] = EXTENT / res
            scal["buo_y"][i] = buo_y
    return path


def write_standard(out: str | Path, *, n: int = 3, frames: int = 14, res: int = 32, seed: int = 0) -> list[Path]:
    """The standard set: one train, one valid and one test file with buo_y = 0.5 (n trajectories each)."""
    return [write_ns(out, split=s, seed=seed + k, buo_y=0.5, n=n, frames=frames, res=res)
            for k, s in enumerate(("train", "valid", "test"))]


def write_conditioned(out: str | Path, *, n: int = 2, frames: int = 12, res: int = 32, seed: int = 0,
                      buoyancies: tuple[float, ...] = (0.2, 0.35, 0.5)) -> list[Path]:
    """The conditioned set: buo_y varies by file; train files for every buoyancy, one valid and one test file."""
    kw = dict(n=n, frames=frames, res=res, step=1.5)
    paths = [write_ns(out, split="train", seed=seed + k, buo_y=b, **kw) for k, b in enumerate(buoyancies)]
    paths.append(write_ns(out, split="valid", seed=seed + 100, buo_y=buoyancies[0], **kw))
    paths.append(write_ns(out, split="test", seed=seed + 200, buo_y=buoyancies[-1], **kw))
    return paths
