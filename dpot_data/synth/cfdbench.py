"""A small CFDBench tree in the published layout (docs/sources.md).

`<problem>/<subset>/caseNNNN/{u.npy, v.npy, case.json}` with `u`, `v` of shape (T_i, 64, 64) in [t, y, x] order
(row 0 = the bottom of the domain, frames 0.1 s apart), T_i different for every case, no mask file: the solid parts
are given by `case.json` only. The grid is taken as 64×64 cell centres over the physical domain:

| problem  | domain                                  | solid                                                |
|----------|-----------------------------------------|------------------------------------------------------|
| cavity   | [0, width] × [0, height]                | none                                                 |
| tube     | [0, width] × [0, height]                | none (inlet column u = vel_in, wall rows u = v = 0) |
| cylinder | [0, x_max − x_min] × [0, y_max − y_min] | disc of `radius` centred at (−x_min, −y_min)         |
| dam      | [0, width] × [0, height]                | x ∈ [0.5, 0.5 + barrier_width], y ∈ [0, barrier_height] |

Velocities are closed-form smooth flows (a lid-driven vortex, developing Poiseuille flow, potential flow past the
disc with an oscillating wake, flow over the barrier), zero in solid cells. The solid region is computed here on its
own, independently of the reader, so that a test can compare the two.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

PROBLEMS = ("cavity", "tube", "cylinder", "dam")
FRAME_DT = 0.1


def case_parameters(problem: str, rng: np.random.Generator, case_no: int) -> dict[str, object]:
    """Plausible `case.json` contents for one case (exactly the keys of docs/sources.md)."""
    density, viscosity = float(rng.uniform(0.5, 2.0)), float(10 ** rng.uniform(-4, -2))
    if problem == "cavity":
        return {"vel_top": float(rng.uniform(1, 10)), "density": density, "viscosity": viscosity,
                "height": float(rng.uniform(0.05, 0.2)), "width": float(rng.uniform(0.05, 0.2)), "rotated": False}
    if problem == "tube":
        return {"vel_in": float(rng.uniform(0.1, 1.0)), "density": density, "viscosity": viscosity,
                "height": float(rng.uniform(0.05, 0.2)), "width": float(rng.uniform(0.5, 1.0))}
    if problem == "cylinder":
        return {"vel_in": float(rng.uniform(0.1, 1.0)), "density": density, "viscosity": viscosity,
                "radius": float(rng.uniform(0.012, 0.025)), "x_min": -0.06, "x_max": 0.16,
                "y_min": -0.06, "y_max": 0.06}
    if problem == "dam":
        width, height = 1.5, 0.4
        return {"case_no": case_no, "velocity": float(rng.uniform(0.1, 1.0)), "density": density,
                "viscosity": viscosity, "barrier_height": float(rng.uniform(0.08, 0.2)),
                "barrier_width": float(rng.uniform(0.1, 0.25)), "height": height, "width": width,
                "dx": width / 64, "dy": height / 64}
    raise ValueError(f"unknown CFDBench problem {problem!r}; expected one of {PROBLEMS}")


def domain(problem: str, case: dict[str, object]) -> tuple[float, float]:
    """Physical width and height of the domain covered by the 64×64 grid."""
    if problem == "cylinder":
        return float(case["x_max"]) - float(case["x_min"]), float(case["y_max"]) - float(case["y_min"])
    return float(case["width"]), float(case["height"])


def grid(problem: str, case: dict[str, object], res: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Cell-centre coordinates (x, y) of the grid, each of length res."""
    lx, ly = domain(problem, case)
    return (np.arange(res) + 0.5) * lx / res, (np.arange(res) + 0.5) * ly / res


def solid(problem: str, case: dict[str, object], res: int = 64) -> np.ndarray:
    """Boolean (y, x) array, True in solid cells (cell centre inside the obstacle)."""
    x, y = grid(problem, case, res)
    yy, xx = np.meshgrid(y, x, indexing="ij")
    if problem == "cylinder":
        cx, cy, r = -float(case["x_min"]), -float(case["y_min"]), float(case["radius"])
        return (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
    if problem == "dam":
        bw, bh = float(case["barrier_width"]), float(case["barrier_height"])
        return (xx >= 0.5) & (xx <= 0.5 + bw) & (yy <= bh)
    return np.zeros((res, res), dtype=bool)


def velocity(problem: str, case: dict[str, object], frames: int, res: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form smooth (u, v), each (frames, y, x) float64, zero in solid cells."""
    x, y = grid(problem, case, res)
    lx, ly = domain(problem, case)
    yy, xx = np.meshgrid(y, x, indexing="ij")
    t = FRAME_DT * np.arange(frames)[:, None, None]
    ramp = 1.0 - np.exp(-(t + FRAME_DT) / 0.5)
    if problem == "cavity":
        a, sx, sy = float(case["vel_top"]), xx / lx, yy / ly
        psi_dy = np.sin(np.pi * sx) ** 2 * (2 * sy - 3 * sy**2) / ly        # d/dy of sin²(πx)·y²(1−y)
        psi_dx = 2 * np.pi * np.sin(np.pi * sx) * np.cos(np.pi * sx) * sy**2 * (1 - sy) / lx
        u, v = -a * ly * ramp * psi_dy, a * ly * ramp * psi_dx  # scaled so that the lid moves at vel_top
    elif problem == "tube":
        a, sy = float(case["vel_in"]), yy / ly
        u = a * 4 * sy * (1 - sy) * ramp * np.ones_like(t)
        v = 0.05 * a * np.sin(np.pi * sy) * np.sin(2 * np.pi * xx / lx - t) * ramp
        u[:, :, 0], v[:, :, 0] = a, 0.0                                     # inlet column
        u[:, [0, -1], :], v[:, [0, -1], :] = 0.0, 0.0                       # wall rows
    elif problem == "cylinder":
        a, r = float(case["vel_in"]), float(case["radius"])
        dx, dy = xx + float(case["x_min"]), yy + float(case["y_min"])
        rho2 = np.maximum(dx * dx + dy * dy, r * r)
        wake = 0.2 * a * np.sin(4 * np.pi * t) * np.exp(-((dy / (2 * r)) ** 2)) * (dx > 0) * np.exp(-dx / (10 * r))
        u = a * ramp * (1 - r * r * (dx * dx - dy * dy) / rho2**2)
        v = -a * ramp * 2 * r * r * dx * dy / rho2**2 + wake
    elif problem == "dam":
        a, bh = float(case["velocity"]), float(case["barrier_height"])
        lift = np.exp(-(((xx - 0.5 - float(case["barrier_width"]) / 2) / 0.2) ** 2))
        u = a * ramp * (1 + bh / ly * lift) * (yy / ly) ** 0.5 * np.ones_like(t)
        v = a * ramp * 0.3 * bh / ly * lift * np.sin(np.pi * yy / ly) * np.cos(2 * np.pi * t)
    else:
        raise ValueError(f"unknown CFDBench problem {problem!r}; expected one of {PROBLEMS}")
    keep = ~solid(problem, case, res)
    return u * keep, v * keep


def write_cfdbench(out: str | Path, *, problems: tuple[str, ...] = PROBLEMS, subsets: tuple[str, ...] = ("bc",),
                   cases: int = 2, frames: tuple[int, int] = (24, 45), res: int = 64, seed: int = 0) -> list[Path]:
    """Write the tree; returns the case folders. Frame counts are drawn in `frames` (inclusive), dtypes alternate
    float32 / float64 between cases (the published dtype is uncertain, readers accept both)."""
    out = Path(out)
    folders: list[Path] = []
    for p, problem in enumerate(problems):
        for s, subset in enumerate(subsets):
            rng = np.random.default_rng([seed, p, s])
            for c in range(cases):
                case = case_parameters(problem, rng, c)
                n_frames = int(rng.integers(frames[0], frames[1] + 1))
                u, v = velocity(problem, case, n_frames, res)
                dtype = np.float32 if c % 2 == 0 else np.float64
                folder = out / problem / subset / f"case{c:04d}"
                folder.mkdir(parents=True, exist_ok=True)
                np.save(folder / "u.npy", u.astype(dtype))
                np.save(folder / "v.npy", v.astype(dtype))
                (folder / "case.json").write_text(json.dumps(case, indent=2))
                folders.append(folder)
    return folders
