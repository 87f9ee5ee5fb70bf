"""Resample fields and masks to the target grid and pad channels: pure functions on numpy arrays.

Every function works on the trailing `len(shape)` axes (2 for (y, x), 3 for (z, y, x)) and leaves the leading
axes alone, so it can run on one dask block of whole trajectories at a time.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from dpot_format.resample import fluid_resample, nearest_index

FIELD_METHODS = ("fourier", "bilinear", "bilinear-antialias", "bicubic")
MASK_METHODS = ("nearest", "area-threshold")
ANTIALIASED = ("bilinear-antialias", "bicubic")  # these low-pass filter when they shrink a grid


def choose_method(boundary: str, method: str = "auto", convention: str = "canonical") -> str:
    """Resolve `auto`: `bilinear` under the dpot-reference convention (what the released checkpoints saw), else
    `fourier` for periodic data and `bilinear-antialias` otherwise; refuse spectral on non-periodic data."""
    if method == "auto":
        if convention == "dpot-reference":
            return "bilinear"
        return "fourier" if boundary == "periodic" else "bilinear-antialias"
    if method not in FIELD_METHODS:
        raise ValueError(f"unknown resample method {method!r}: expected auto, {', '.join(FIELD_METHODS)}")
    if method == "fourier" and boundary != "periodic":
        raise ValueError("fourier resampling assumes periodic fields; this source is non-periodic (use bilinear or bicubic)")
    return method


def _fourier_axis(x: np.ndarray, m: int, axis: int) -> np.ndarray:
    """Spectrally resample one axis of a real periodic signal from n to m points (Nyquist split/summed for even sizes)."""
    n = x.shape[axis]
    if m == n:
        return x
    import scipy.fft  # imported here: 0.15 s of start-up that only the Fourier path needs

    spec = scipy.fft.rfft(x, axis=axis, workers=-1)
    out_shape = list(spec.shape)
    out_shape[axis] = m // 2 + 1
    out = np.zeros(out_shape, dtype=spec.dtype)
    k = min(n, m) // 2 + 1  # rfft bins kept: 0 .. min(n, m)//2
    src = [slice(None)] * x.ndim
    src[axis] = slice(0, k)
    out[tuple(src)] = spec[tuple(src)]
    nyq = [slice(None)] * x.ndim
    if m > n and n % 2 == 0:
        # the source Nyquist bin stands for +n/2 and -n/2 at once: give each half of it
        nyq[axis] = n // 2
        out[tuple(nyq)] *= 0.5
    elif m < n and m % 2 == 0:
        # the new Nyquist bin receives both +m/2 and -m/2, which for a real signal sum to 2 Re
        nyq[axis] = m // 2
        out[tuple(nyq)] = 2.0 * out[tuple(nyq)].real
    return scipy.fft.irfft(out, n=m, axis=axis, workers=-1) * (m / n)


def resample_fourier(x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Spectral up/down sampling of periodic real fields over the trailing axes; upsample-then-truncate is exact."""
    shape = tuple(int(s) for s in shape)
    if tuple(x.shape[-len(shape):]) == shape:
        return x
    out = np.asarray(x, dtype=np.float64)
    for i, m in enumerate(shape):
        out = _fourier_axis(out, m, x.ndim - len(shape) + i)
    return out.astype(x.dtype if np.issubdtype(x.dtype, np.floating) else np.float32)


def _interp2d(x: np.ndarray, shape: tuple[int, int], mode: str, antialias: bool) -> np.ndarray:
    """Resize the last two axes with torch F.interpolate (align_corners=False; antialiased when asked and shrinking),
    keeping leading axes."""
    import torch  # imported here: the Fourier path and the CLI start-up do not need it
    import torch.nn.functional as F

    lead = x.shape[:-2]
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).reshape(-1, 1, *x.shape[-2:])
    shrinking = shape[0] < x.shape[-2] or shape[1] < x.shape[-1]
    with torch.no_grad():
        out = F.interpolate(t, size=shape, mode=mode, align_corners=False, antialias=antialias and shrinking)
    return out.reshape(*lead, *shape).numpy()


def _interp(x: np.ndarray, shape: tuple[int, ...], mode: str, antialias: bool = True) -> np.ndarray:
    """Resize the trailing 2 or 3 axes; 3D runs as two separable 2D passes ((z,y) then (y,x))."""
    if tuple(x.shape[-len(shape):]) == shape:
        return x
    if len(shape) == 2:
        return _interp2d(x, shape, mode, antialias)
    if len(shape) != 3:
        raise ValueError(f"expected 2 or 3 spatial axes, got {len(shape)}")
    zyx = np.moveaxis(x, -1, 0)  # (x, ..., z, y)
    zyx = _interp2d(zyx, (shape[0], shape[1]), mode, antialias)
    out = np.moveaxis(zyx, 0, -1)  # (..., Z, Y, x)
    return _interp2d(out, (shape[1], shape[2]), mode, antialias)


def resample_bilinear(x: np.ndarray, shape: Sequence[int], antialias: bool = False) -> np.ndarray:
    """Bilinear resampling (separable in 3D), align_corners=False; float32 out. Without antialias this is exactly the
    reference DPOT resize in both directions; `antialias` low-pass filters when downsampling."""
    return _interp(np.asarray(x), tuple(int(s) for s in shape), "bilinear", antialias).astype(np.float32, copy=False)


def resample_bicubic(x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Bicubic (separable in 3D) resampling with antialiasing when downsampling; float32 out."""
    return _interp(np.asarray(x), tuple(int(s) for s in shape), "bicubic").astype(np.float32, copy=False)


def resample_fields(x: np.ndarray, shape: Sequence[int], method: str) -> np.ndarray:
    """Dispatch to the named method (fourier, bilinear, bicubic); returns float32 and the input unchanged if same grid."""
    shape = tuple(int(s) for s in shape)
    if tuple(x.shape[-len(shape):]) == shape:
        return np.asarray(x, dtype=np.float32)
    if method == "fourier":
        return resample_fourier(np.asarray(x, dtype=np.float32), shape)
    if method in ("bilinear", "bilinear-antialias"):
        return resample_bilinear(x, shape, antialias=method == "bilinear-antialias")
    if method == "bicubic":
        return resample_bicubic(x, shape)
    raise ValueError(f"unknown resample method {method!r}: expected one of {FIELD_METHODS}")


_nearest_index = nearest_index  # cell-centre nearest neighbour: one rule with the mask-aware resampling


def resample_mask_nearest(mask: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Nearest-neighbour mask resampling over the trailing axes; stays binary uint8."""
    out = np.asarray(mask)
    nd = len(shape)
    for i, m in enumerate(shape):
        axis = out.ndim - nd + i
        out = np.take(out, _nearest_index(out.shape[axis], int(m)), axis=axis)
    return (out > 0).astype(np.uint8)


def resample_mask_area(mask: np.ndarray, shape: Sequence[int], threshold: float = 0.5) -> np.ndarray:
    """Area-weighted fluid fraction per target cell, then threshold (>= threshold is fluid); stays binary uint8."""
    import torch
    import torch.nn.functional as F

    shape = tuple(int(s) for s in shape)
    m = np.asarray(mask)
    if tuple(m.shape[-len(shape):]) == shape:
        return (m > 0).astype(np.uint8)
    lead = m.shape[: m.ndim - len(shape)]
    t = torch.from_numpy((m > 0).astype(np.float32)).reshape(-1, 1, *m.shape[-len(shape):])
    pool = F.adaptive_avg_pool2d if len(shape) == 2 else F.adaptive_avg_pool3d
    up = tuple(max(a, b) for a, b in zip(m.shape[-len(shape):], shape))
    with torch.no_grad():
        if up != tuple(m.shape[-len(shape):]):
            # refine by nearest first so that every target cell covers at least one source cell
            t = torch.from_numpy(resample_mask_nearest(t.numpy(), up).astype(np.float32))
        frac = pool(t, shape)
    return (frac.reshape(*lead, *shape).numpy() >= threshold - 1e-6).astype(np.uint8)


def resample_mask(mask: np.ndarray, shape: Sequence[int], method: str = "nearest") -> np.ndarray:
    """Dispatch to `nearest` or `area-threshold` mask resampling."""
    if method == "nearest":
        return resample_mask_nearest(mask, shape)
    if method == "area-threshold":
        return resample_mask_area(mask, shape)
    raise ValueError(f"unknown mask resample method {method!r}: expected one of {MASK_METHODS}")


def fluid_kernel(method: str) -> str:
    """The linear method trajectories with solid cells are resampled with: `bilinear` stays `bilinear`; the others
    become `bilinear-antialias` (bicubic and spectral weights go negative, and would leave the fluid range)."""
    return "bilinear" if method == "bilinear" else "bilinear-antialias"


def resample_trajectories(fields: np.ndarray, mask: np.ndarray, shape: Sequence[int], method: str,
                          mask_method: str, swap: bool = False, fluid_rule: bool = True
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Trajectories (b, T, C, *S) and masks (b, *S) on the target grid: `method` and `mask_method` for those
    without a solid cell (exactly as `resample_fields` and `resample_mask`), the mask-aware rule
    (`dpot_format.resample.fluid_resample`, kernel `fluid_kernel(method)`) for those with one, one trajectory at a
    time, unless `fluid_rule` is False. `swap`: interpolate fields with the last two axes swapped (the model's 2D
    orientation)."""
    shape = tuple(int(s) for s in shape)
    nd = len(shape)
    solid = (np.asarray(mask) == 0).reshape(len(mask), -1).any(axis=1)
    if not fluid_rule or tuple(fields.shape[-nd:]) == shape:
        solid[:] = False
    m = resample_mask(mask, shape, mask_method)
    if solid.all():
        f = np.empty((*fields.shape[:-nd], *shape), dtype=np.float32)
    elif swap:
        f = np.swapaxes(resample_fields(np.swapaxes(fields, -1, -2), shape[::-1], method), -1, -2)
    else:
        f = resample_fields(fields, shape, method)
    if not solid.any():
        return f, m
    f, m = np.array(f, dtype=np.float32), np.array(m, dtype=np.uint8)  # writable (a plain result may be a view)
    for i in np.flatnonzero(solid):
        f[i], m[i] = _fluid_trajectory(fields[i], mask[i], shape, fluid_kernel(method), mask_method, swap)
    return f, m


def _fluid_trajectory(fields: np.ndarray, mask: np.ndarray, shape: tuple[int, ...], kernel_method: str,
                      mask_method: str, swap: bool) -> tuple[np.ndarray, np.ndarray]:
    """One trajectory (T, C, *S) with solid cells and its mask (*S) by the mask-aware rule, on the grid `shape`."""
    import torch

    nd = len(shape)
    src, fluid = np.asarray(fields, dtype=np.float32), np.asarray(mask) != 0
    if swap:
        src, fluid, shape = np.swapaxes(src, -1, -2), np.swapaxes(fluid, -1, -2), shape[::-1]

    def kernel(t: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(_interp(t.numpy(), shape, "bilinear",
                                                             kernel_method == "bilinear-antialias")))

    flat = torch.from_numpy(np.ascontiguousarray(src).reshape(1, -1, *src.shape[-nd:]))
    out, out_mask = fluid_resample(flat, torch.from_numpy(np.ascontiguousarray(fluid))[None], shape, kernel,
                                   mask_method)
    f, m = out.numpy().reshape(*src.shape[:-nd], *shape), out_mask.numpy()[0].astype(np.uint8)
    return (np.swapaxes(f, -1, -2), np.swapaxes(m, -1, -2)) if swap else (f, m)


def pad_channels(fields: np.ndarray, n: int, fill: float, axis: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Pad the channel axis to n channels with `fill`; returns (padded, channel_valid bool (n,))."""
    c = fields.shape[axis]
    if c > n:
        raise ValueError(f"data has {c} channels, more than the {n} requested: raise --channels")
    valid = np.zeros(n, dtype=bool)
    valid[:c] = True
    if c == n:
        return fields, valid
    pad_shape = list(fields.shape)
    pad_shape[axis] = n - c
    pad = np.full(pad_shape, fill, dtype=fields.dtype)
    return np.concatenate([fields, pad], axis=axis), valid
