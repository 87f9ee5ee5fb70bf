"""Small PDEBench files in the published layouts (docs/sources.md), filled with closed-form smooth solutions.

Compressible NS (2D and 3D): flat HDF5 with `density`, `pressure`, `Vx`, `Vy` [, `Vz`] of shape (N, T, X, Y[, Z]),
`t-coordinate` with T+1 entries, cell-centred `x-coordinate`/`y-coordinate`[/`z-coordinate`] on (0, 1).
Every channel is an exact solution of the periodic advection–diffusion equation u_t + c·∇u = ν Δu built from a few
Fourier modes, so a file of any resolution holds the same band-limited function (see `cfd_channel`).

Diffusion–reaction and shallow water: one group per sample (`0000`, `0001`, ...) holding `data` (T, y, x, C) float32
(chunked, lzf), `grid/{x,y,t}` (lzf) and a YAML `config` attribute with the same Python tag and Hydra interpolation
the generator writes. Diffusion–reaction fields are exact zero-flux (Neumann) diffusion solutions on (−1, 1)²;
shallow water is a spreading Gaussian mound of water on (−2.5, 2.5)².
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

CFD_CHANNELS = ("Vx", "Vy", "density", "pressure")
CFD3D_CHANNELS = ("Vx", "Vy", "Vz", "density", "pressure")


@dataclass(frozen=True)
class Mode:
    """One Fourier mode of a periodic field: amplitude, integer wave vector, phase."""

    amp: float
    k: tuple[int, ...]
    phase: float


@dataclass(frozen=True)
class PeriodicField:
    """A band-limited periodic function on (0,1)^d that is advected with `velocity` and diffused with `nu`."""

    offset: float
    modes: tuple[Mode, ...]
    velocity: tuple[float, ...]
    nu: float

    def __call__(self, coords: tuple[np.ndarray, ...], t: float) -> np.ndarray:
        """Evaluate at broadcastable coordinate arrays (one per axis) and time t (exact solution, float64)."""
        out = np.full(np.broadcast_shapes(*(c.shape for c in coords)), self.offset, dtype=np.float64)
        for m in self.modes:
            k2 = float(sum(ki * ki for ki in m.k))
            arg = sum(ki * (c - vi * t) for ki, c, vi in zip(m.k, coords, self.velocity))
            out += m.amp * np.exp(-self.nu * 4.0 * np.pi**2 * k2 * t) * np.cos(2.0 * np.pi * arg + m.phase)
        return out

    def on_grid(self, axes: tuple[np.ndarray, ...], t: float) -> np.ndarray:
        """The same values on the tensor grid of 1D `axes` (indexing "ij"), by separable complex exponentials."""
        out = np.full(tuple(len(a) for a in axes), self.offset, dtype=np.float64)
        for m in self.modes:
            k2 = float(sum(ki * ki for ki in m.k))
            wave = np.exp(1j * m.phase) * m.amp * np.exp(-self.nu * 4.0 * np.pi**2 * k2 * t)
            for d, (ki, a, vi) in enumerate(zip(m.k, axes, self.velocity)):
                shape = [1] * len(axes)
                shape[d] = len(a)
                wave = wave * np.exp(2j * np.pi * ki * (np.asarray(a, dtype=np.float64) - vi * t)).reshape(shape)
            out += wave.real
        return out


def cfd_channel(sample: int, channel: int, *, dims: int = 2, seed: int = 0, kmax: int = 4,
                high_freq: tuple[int, float] | None = None) -> PeriodicField:
    """The analytic field behind channel `channel` of sample `sample` (deterministic in seed, sample, channel).

    `high_freq=(k, amp)` adds a mode of wave number k along x (used to test that resampling does not alias it).
    """
    rng = np.random.default_rng([seed, sample, channel, dims])
    modes = [
        Mode(float(rng.uniform(0.05, 0.25)), tuple(int(v) for v in rng.integers(-kmax, kmax + 1, size=dims)),
             float(rng.uniform(0, 2 * np.pi)))
        for _ in range(4)
    ]
    if high_freq is not None:
        modes.append(Mode(float(high_freq[1]), (int(high_freq[0]),) + (0,) * (dims - 1), 0.3))
    name = (CFD_CHANNELS if dims == 2 else CFD3D_CHANNELS)[channel]
    offset = 1.0 if name in ("density", "pressure") else 0.0  # density and pressure stay positive
    velocity = tuple(float(v) for v in rng.uniform(-0.5, 0.5, size=dims))
    return PeriodicField(offset, tuple(modes), velocity, nu=1e-3)


def cell_centres(n: int, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """n cell centres on (lo, hi), as the PDEBench generators lay out their grids."""
    return (lo + (np.arange(n) + 0.5) * (hi - lo) / n).astype(np.float32)


def cfd_file_name(*, m: float, eta: float, zeta: float, kind: str = "Rand", res: int = 128, dims: int = 2) -> str:
    """The published file name, e.g. 2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5."""
    if dims == 3:
        return f"3D_CFD_{kind}_M{m}_Eta{eta}_Zeta{zeta}_periodic_Train.hdf5"
    return f"2D_CFD_{kind}_M{m}_Eta{eta}_Zeta{zeta}_periodic_{res}_Train.hdf5"


def write_cfd(out: str | Path, *, m: float = 1.0, eta: float = 0.1, zeta: float | None = None, kind: str = "Rand",
              n: int = 3, frames: int = 21, res: int = 32, dims: int = 2, with_attrs: bool = True, seed: int = 0,
              high_freq: tuple[int, float] | None = None, name: str | None = None) -> Path:
    """Write a compressible-NS file (2D or 3D) in the flat PDEBench layout; returns its path.

    `res` is the grid size per axis (the published files are 128 or 512 in 2D, 64 or 128 in 3D). The file name
    carries the resolution as published (it names `res`), M, η and ζ; `with_attrs` also writes the file attributes
    `M`, `eta`, `zeta` that some published files carry.
    """
    zeta = eta if zeta is None else zeta
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / (name or cfd_file_name(m=m, eta=eta, zeta=zeta, kind=kind, res=res, dims=dims))
    axes = cell_centres(res)
    t = np.linspace(0.0, 1.0, frames + 1, dtype=np.float32)  # the generator writes one time more than it stores
    grid = (axes.astype(np.float64),) * dims  # storage order (X, Y[, Z])
    names = CFD_CHANNELS if dims == 2 else CFD3D_CHANNELS
    shape = (n, frames) + (res,) * dims
    with h5py.File(path, "w") as f:
        for c, var in enumerate(names):
            dset = f.create_dataset(var, shape=shape, dtype=np.float32)
            for i in range(n):
                field = cfd_channel(i, c, dims=dims, seed=seed, high_freq=high_freq)
                dset[i] = np.stack([field.on_grid(grid, float(tk)) for tk in t[:frames]]).astype(np.float32)
        f.create_dataset("t-coordinate", data=t)
        for axis in ("x", "y", "z")[:dims]:
            f.create_dataset(f"{axis}-coordinate", data=axes)
        if with_attrs:
            f.attrs["M"] = m
            f.attrs["eta"] = eta
            f.attrs["zeta"] = zeta
    return path


def write_cfd_published(out: str | Path, published_name: str, *, n: int = 2, frames: int = 21, res: int = 8,
                        seed: int = 0) -> Path:
    """A compressible-NS file under a published name (e.g. the downstream sets
    3D_CFD_Turb_M1.0_Eta1e-08_Zeta1e-08_periodic_Train.hdf5, 64³, and
    2D_CFD_Turb_M1.0_Eta1e-08_Zeta1e-08_periodic_512_Train.hdf5, 512²) on a small `res` grid: kind, M, η, ζ and the
    dimension come from the name, so a reader and the catalog take it for that dataset."""
    from dpot_data.sources.pdebench import parse_cfd_name

    parsed = parse_cfd_name(Path(published_name))
    if parsed is None:
        raise ValueError(f"{published_name}: not a published PDEBench compressible-NS file name")
    return write_cfd(out, m=float(parsed["M"]), eta=float(parsed["eta"]), zeta=float(parsed["zeta"]),
                     kind=str(parsed["kind"]), n=n, frames=frames, res=res, dims=int(parsed["dims"]), seed=seed,
                     name=published_name)


# --------------------------------------------------------------------------------------------------------------
# diffusion–reaction and shallow water: one group per sample

_CONFIG_TEMPLATE = """work_dir: ${{hydra:runtime.cwd}}
data_dir: data
upload: false
output_path: !!python/object/apply:pathlib.PosixPath
- /
- data
- pdebench
- {stem}
- {stem}.h5
name: {name}
sim:
{sim}  seed: {seed}
plot:
  t_idx: 1.0
  dim: 2
  channel_idx: 0
"""


def _config(stem: str, name: str, sim: dict[str, object], seed: int) -> str:
    """The YAML text the generator stores on each group (Hydra config, Python tag and interpolation included)."""
    lines = "".join(f"  {k}: {v}\n" for k, v in sim.items())
    return _CONFIG_TEMPLATE.format(stem=stem, name=name, sim=lines, seed=seed)


def dr_fields(sample: int, x: np.ndarray, y: np.ndarray, t: np.ndarray, *, seed: int = 0,
              du: float = 1e-3, dv: float = 5e-3) -> np.ndarray:
    """Exact zero-flux diffusion of a few cosine modes on (−1,1)²: array (T, y, x, 2) float32 (u, v)."""
    rng = np.random.default_rng([seed, sample, 7])
    yy, xx = np.meshgrid(y.astype(np.float64), x.astype(np.float64), indexing="ij")
    out = np.zeros((len(t), len(y), len(x), 2), dtype=np.float64)
    for c, diff in enumerate((du, dv)):
        for _ in range(4):
            kx, ky = (int(v) for v in rng.integers(0, 5, size=2))
            amp = float(rng.normal(0, 1.0))
            shape = np.cos(kx * np.pi * (xx + 1) / 2) * np.cos(ky * np.pi * (yy + 1) / 2)
            decay = np.exp(-diff * (np.pi / 2) ** 2 * (kx * kx + ky * ky) * t.astype(np.float64))
            out[..., c] += amp * decay[:, None, None] * shape[None]
    return out.astype(np.float32)


def swe_fields(sample: int, x: np.ndarray, y: np.ndarray, t: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """A Gaussian mound of water spreading in time (heat-kernel form) on (−2.5,2.5)²: (T, y, x, 1) float32 (h)."""
    rng = np.random.default_rng([seed, sample, 11])
    cx, cy = (float(v) for v in rng.uniform(-0.5, 0.5, size=2))
    s0, amp, spread = float(rng.uniform(0.3, 0.6)), float(rng.uniform(0.5, 1.5)), 0.4
    yy, xx = np.meshgrid(y.astype(np.float64), x.astype(np.float64), indexing="ij")
    r2 = (xx - cx) ** 2 + (yy - cy) ** 2
    out = np.empty((len(t), len(y), len(x), 1), dtype=np.float64)
    for k, tk in enumerate(t.astype(np.float64)):
        var = s0 * s0 + 2 * spread * tk
        out[k, :, :, 0] = 1.0 + amp * (s0 * s0 / var) * np.exp(-r2 / (2 * var))
    return out.astype(np.float32)


def _write_grouped(path: Path, *, n: int, frames: int, res: int, lo: float, hi: float, t_end: float, fields,
                   config: dict[str, object], name: str, seed: int,
                   order: list[int] | None = None) -> Path:
    """Write the one-group-per-sample layout; `order` lists the sample indices in the order groups are created."""
    x = cell_centres(res, lo, hi)
    t = np.linspace(0.0, t_end, frames, dtype=np.float32)
    chunks = (min(6, frames), min(32, res), min(32, res), 1)
    with h5py.File(path, "w") as f:
        for i in order if order is not None else range(n):
            g = f.create_group(f"{i:04d}")
            g.attrs["config"] = _config(path.stem, name, config, seed + i)
            g.create_dataset("data", data=fields(i, x, x, t), chunks=chunks, compression="lzf")
            grid = g.create_group("grid")
            grid.create_dataset("x", data=x, chunks=(res,), compression="lzf")
            grid.create_dataset("y", data=x, chunks=(res,), compression="lzf")
            grid.create_dataset("t", data=t, chunks=(frames,), compression="lzf")
    return path


def write_diff_react(out: str | Path, *, n: int = 3, frames: int = 11, res: int = 32, seed: int = 0,
                     name: str = "2D_diff-react_NA_NA.h5", t_end: float = 5.0) -> Path:
    """Write `2D_diff-react_NA_NA.h5` (published: 1000 samples, 101 frames, 128², t in [0, 5]; here small). A later
    `t_end` spaces the frames further apart (the fields decay more between frames)."""
    if not t_end > 0:
        raise ValueError(f"t_end: expected a time > 0, got {t_end}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sim = {"Du": 0.001, "Dv": 0.005, "k": 0.005, "t": t_end, "tdim": frames, "x_left": -1.0, "x_right": 1.0,
           "xdim": res, "y_bottom": -1.0, "y_top": 1.0, "ydim": res, "'n'": 1}
    return _write_grouped(out / name, n=n, frames=frames, res=res, lo=-1.0, hi=1.0, t_end=float(t_end),
                          fields=lambda i, x, y, t: dr_fields(i, x, y, t, seed=seed), config=sim,
                          name="2d_diff-react", seed=seed)


def write_swe(out: str | Path, *, n: int = 3, frames: int = 11, res: int = 32, seed: int = 0,
              name: str = "2D_rdb_NA_NA.h5") -> Path:
    """Write `2D_rdb_NA_NA.h5` (radial dam break; published: 1000 samples, 101 frames, 128²; here small)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    sim = {"T_end": 1.0, "n_time_steps": frames - 1, "xdim": res, "ydim": res, "gravity": 1.0,
           "dam_radius": 0.5, "inner_height": 2.0, "x_left": -2.5, "x_right": 2.5, "y_bottom": -2.5, "y_top": 2.5}
    # workers append groups in the order they finish: write them out of order, as the published files may be
    order = list(range(n))[::-1]
    return _write_grouped(out / name, n=n, frames=frames, res=res, lo=-2.5, hi=2.5, t_end=1.0,
                          fields=lambda i, x, y, t: swe_fields(i, x, y, t, seed=seed), config=sim,
                          name="2d_rdb", seed=seed, order=order)
