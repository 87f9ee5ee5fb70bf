"""Small FNO Navier–Stokes raw files: real vorticity solutions written in the published v5 and v7.3 MAT layouts.

The solver follows the public FNO generator (pseudo-spectral, Crank–Nicolson on viscosity and forcing, explicit
nonlinear term with 2/3 dealiasing, forcing 0.1(sin 2π(x+y) + cos 2π(x+y)), Gaussian-random-field initial
vorticity with alpha 2.5, tau 7); only the time step is larger by default, to stay fast.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import h5py
import numpy as np
import scipy.fft
import scipy.io

from dpot_data.sources.fno import format_viscosity
from dpot_format.io import atomic_path

DEFAULT_DT = 1e-2  # stable and within ~1e-3 of the generator's dt=1e-4 solution at nu=1e-3 on 64x64


def default_dt(viscosity: float) -> float:
    """A fast stable time step at 64x64: 1e-2 for nu >= 1e-3, 5e-3 for nu >= 1e-4, else the generator's 1e-4."""
    if viscosity >= 1e-3:
        return DEFAULT_DT
    return 5e-3 if viscosity >= 1e-4 else 1e-4
MAT73_USERBLOCK = 512


def wavenumbers(s: int) -> tuple[np.ndarray, np.ndarray]:
    """Integer wavenumbers (k_x along axis 0, k_y along axis 1) of an s×s grid in rfft2 layout (s, s//2+1)."""
    kx = np.fft.fftfreq(s, d=1.0 / s)[:, None] * np.ones((1, s // 2 + 1))
    ky = np.arange(s // 2 + 1)[None, :] * np.ones((s, 1))
    return kx, ky


def forcing(s: int) -> np.ndarray:
    """The FNO forcing 0.1(sin 2π(x+y) + cos 2π(x+y)) on the s×s grid x, y = 0, 1/s, ..., (s-1)/s."""
    g = np.arange(s) / s
    xx, yy = np.meshgrid(g, g, indexing="ij")
    return 0.1 * (np.sin(2 * np.pi * (xx + yy)) + np.cos(2 * np.pi * (xx + yy)))


def gaussian_random_field(n: int, s: int, rng: np.random.Generator, alpha: float = 2.5, tau: float = 7.0) -> np.ndarray:
    """n samples of the FNO generator's periodic Gaussian random field (covariance (−Δ + τ²)^(−α)), shape (n, s, s)."""
    sigma = tau ** (0.5 * (2 * alpha - 2))
    k = np.fft.fftfreq(s, d=1.0 / s)
    kx, ky = np.meshgrid(k, k, indexing="ij")
    sqrt_eig = (s**2) * math.sqrt(2.0) * sigma * ((4 * math.pi**2 * (kx**2 + ky**2) + tau**2) ** (-alpha / 2.0))
    sqrt_eig[0, 0] = 0.0
    coeff = rng.standard_normal((n, s, s)) + 1j * rng.standard_normal((n, s, s))
    return np.fft.ifft2(sqrt_eig * coeff).real


def navier_stokes_2d(
    w0: np.ndarray, f: np.ndarray, visc: float, final_time: float, dt: float = DEFAULT_DT, record_steps: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Solve w_t + u·∇w = νΔw + f on the periodic unit square from w0 (n, s, s); returns (sol (n,s,s,record_steps), t)."""
    s = w0.shape[-1]
    k_max = s // 2
    steps = math.ceil(final_time / dt)
    record_time = steps // record_steps
    kx, ky = wavenumbers(s)
    lap = 4 * math.pi**2 * (kx**2 + ky**2)
    lap[0, 0] = 1.0
    dealias = (np.abs(kx) <= (2.0 / 3.0) * k_max) & (np.abs(ky) <= (2.0 / 3.0) * k_max)
    ikx, iky = 2j * math.pi * kx, 2j * math.pi * ky
    fft2 = lambda a: scipy.fft.rfft2(a, axes=(-2, -1), workers=-1)  # noqa: E731
    ifft2 = lambda a: scipy.fft.irfft2(a, s=(s, s), axes=(-2, -1), workers=-1)  # noqa: E731
    w_h = fft2(np.asarray(w0, dtype=np.float64))
    f_h = fft2(np.asarray(f, dtype=np.float64))
    implicit = 1.0 / (1.0 + 0.5 * dt * visc * lap)
    explicit = 1.0 - 0.5 * dt * visc * lap
    sol = np.zeros((*w0.shape, record_steps), dtype=np.float64)
    sol_t = np.zeros(record_steps, dtype=np.float64)
    c = 0
    with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported by the caller's finiteness check
        for j in range(steps):
            psi_h = w_h / lap
            q = ifft2(iky * psi_h)  # velocity x-component  dpsi/dy
            v = ifft2(-ikx * psi_h)  # velocity y-component -dpsi/dx
            w_x = ifft2(ikx * w_h)
            w_y = ifft2(iky * w_h)
            nonlin_h = dealias * fft2(q * w_x + v * w_y)
            w_h = (-dt * nonlin_h + dt * f_h + explicit * w_h) * implicit
            if (j + 1) % record_time == 0 and c < record_steps:
                sol[..., c] = ifft2(w_h)
                sol_t[c] = (j + 1) * dt
                c += 1
    return sol, sol_t


def _matlab73_header() -> bytes:
    """The 128-byte MAT 7.3 header (text, subsystem offset, version 0x0200, 'IM'), padded to the 512-byte userblock."""
    text = "MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: " + time.strftime(
        "%a %b %d %H:%M:%S %Y", time.gmtime(0)
    ) + " HDF5 schema 1.00 ."
    head = text.encode("ascii").ljust(116, b" ") + b"\x00" * 8 + b"\x00\x02" + b"IM"
    return head.ljust(MAT73_USERBLOCK, b"\x00")


def write_mat_v5(path: Path, a: np.ndarray, u: np.ndarray, t: np.ndarray) -> None:
    """Write `a` (N,x,y), `u` (N,x,y,T), `t` (1,T) as scipy's default MAT 5 file (no compression), atomically."""
    with atomic_path(path) as tmp:
        scipy.io.savemat(tmp, {"a": a, "u": u, "t": t}, format="5", do_compression=False, oned_as="row")


def write_mat_v73(path: Path, a: np.ndarray, u: np.ndarray, t: np.ndarray) -> None:
    """Write the same variables as a MAT 7.3 file: HDF5 with a 512-byte MATLAB userblock and axes reversed, atomically."""
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w", userblock_size=MAT73_USERBLOCK, libver="earliest") as h5:
            for name, value in (("a", a), ("u", u), ("t", t)):
                ds = h5.create_dataset(name, data=np.ascontiguousarray(np.transpose(value)))
                ds.attrs.create("MATLAB_class", np.bytes_("single" if value.dtype == np.float32 else "double"))
        with open(tmp, "r+b") as fh:
            fh.write(_matlab73_header())


def solve_fno(n: int, frames: int, viscosity: float, seed: int, resolution: int = 64, dt: float | None = None):
    """Draw n initial fields and solve to t = frames, recording once per unit time; returns float32 (a, u, t)."""
    dt = default_dt(viscosity) if dt is None else dt
    rng = np.random.default_rng(seed)
    w0 = gaussian_random_field(n, resolution, rng)
    sol, sol_t = navier_stokes_2d(w0, forcing(resolution), viscosity, float(frames), dt=dt, record_steps=frames)
    if not np.isfinite(sol).all():
        raise RuntimeError(f"solver diverged at dt={dt}: use a smaller time step")
    return w0.astype(np.float32), sol.astype(np.float32), sol_t.astype(np.float32)[None, :]


def synth_fno(
    out_dir: str | Path,
    n: int = 8,
    frames: int = 20,
    viscosity: float = 1e-3,
    seed: int = 0,
    resolution: int = 64,
    dt: float | None = None,
) -> list[Path]:
    """Write the same solutions as NavierStokes_V{nu}_N{n}_T{T}.mat (v5) and ns_V{nu}_N{n}_T{T}.mat (v7.3)."""
    if n < 1 or frames < 1 or resolution < 4 or viscosity <= 0 or (dt is not None and dt <= 0):
        raise ValueError("n, frames >= 1, resolution >= 4, viscosity > 0 and dt > 0 are required")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    a, u, t = solve_fno(n, frames, viscosity, seed, resolution, dt)
    tag = f"V{format_viscosity(viscosity)}_N{n}_T{frames}"
    v5, v73 = out / f"NavierStokes_{tag}.mat", out / f"ns_{tag}.mat"
    write_mat_v5(v5, a, u, t)
    write_mat_v73(v73, a, u, t)
    return [v5, v73]
