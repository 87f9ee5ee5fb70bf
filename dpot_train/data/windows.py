"""Pure array transforms: window start, layout change to the model's (X, Y[, Z], T, C), grid resize, noise injection.

2D fields are stored (T, C, Y, X), 3D fields (T, C, Z, Y, X); the model reads (X, Y, T, C) or (X, Y, Z, T, C).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from dpot_format.grid import target_shape
from dpot_format.layout import space_order
from dpot_format.resample import fluid_resample, keeps_reference_resize


def window_start(rng: np.random.Generator, frames: int, length: int) -> int:
    """Uniform start t0 in [0, frames - length] so that frames [t0, t0 + length) exist."""
    if frames < length:
        raise ValueError(f"a window of {length} frames does not fit in {frames} frames")
    return int(rng.integers(0, frames - length + 1))


def model_shape(shape: tuple[int, ...] | list[int], model_layout: str) -> tuple[int, ...]:
    """A stored grid shape ((Y, X) or (Z, Y, X)) in the model's orientation ((H, W) or (X, Y, Z))."""
    return tuple(int(shape[a]) for a in space_order(len(shape), model_layout))


def stored_shape(grid: tuple[int, ...] | list[int], model_layout: str) -> tuple[int, ...]:
    """A grid in the model's orientation back in the stored order ((Y, X) or (Z, Y, X)): `model_shape`'s inverse."""
    order = space_order(len(grid), model_layout)
    out = [0] * len(grid)
    for side, axis in zip(grid, order):
        out[axis] = int(side)
    return tuple(out)


def _stored_reversed(a: np.ndarray, space_ndim: int, model_layout: str) -> np.ndarray:
    """`a` (leading axes, then the stored space axes) as a view whose space axes are the model's in reverse order:
    reversing them (`model_view`, `collate`) then gives the model's order. For the stored layouts this is the
    stored array itself, except 2D "yx" (its last two axes swapped)."""
    return np.transpose(a, stored_reversed_axes(a.ndim - space_ndim, space_ndim, model_layout))


@functools.lru_cache(maxsize=64)
def stored_reversed_axes(lead: int, space_ndim: int, model_layout: str) -> tuple[int, ...]:
    """The axis permutation of `as_model_order` for an array of `lead` leading axes and `space_ndim` stored space
    axes: the identity for every layout but 2D "yx" (its last two axes swapped)."""
    order = space_order(space_ndim, model_layout)[::-1]
    return tuple(range(lead)) + tuple(lead + k for k in order)


def to_model_layout(fields: np.ndarray, model_layout: str = "xy") -> np.ndarray:
    """Stored (T, C, Y, X) -> the model's (H, W, T, C) as a contiguous copy, by the same two steps a training window
    takes (`as_model_order`, `model_view`): (X, Y, T, C) for the manifest's model_layout "xy", (Y, X, T, C) for
    "yx"; 3D (T, C, Z, Y, X) -> (X, Y, Z, T, C)."""
    return np.ascontiguousarray(model_view(_stored_reversed(fields, fields.ndim - 2, model_layout)))


def to_model_mask(mask: np.ndarray, model_layout: str = "xy") -> np.ndarray:
    """Stored (Y, X) or (Z, Y, X) fluid mask -> the model's (H, W) or (X, Y, Z) as a contiguous copy: the same rule
    as `to_model_layout`, so a mask's cell lines up with the field's."""
    return np.ascontiguousarray(_stored_reversed(mask, mask.ndim, model_layout).T)


def as_model_order(fields: np.ndarray, mask: np.ndarray, model_layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Stored (T, C, [Z,] Y, X) and ([Z,] Y, X) as views whose space axes are the model's in reverse order, so that
    the one permutation (T, C, *space) -> (*reversed space, T, C) used for every sample (and the mask's reversal)
    gives the model's (H, W[, D], T, C) and (H, W[, D])."""
    space = mask.ndim
    if fields.ndim != space + 2:
        raise ValueError(f"fields of shape {fields.shape} and a mask of shape {mask.shape}: expected (T, C, *S) "
                         "and (*S)")
    return _stored_reversed(fields, space, model_layout), _stored_reversed(mask, space, model_layout)


def model_batch_view(frames: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked `as_model_order` windows (B, T, C, *S) and masks (B, *S) -> the model's (B, H, W[, D], T, C) and
    (B, H, W[, D]) as views: the batch form of `model_view`, the same reversal for the fields and the mask."""
    space = masks.ndim - 1
    if frames.ndim != space + 3:
        raise ValueError(f"windows of shape {tuple(frames.shape)} and masks of shape {tuple(masks.shape)}: expected "
                         "(B, T, C, *S) and (B, *S)")
    order = tuple(range(space, 0, -1))
    return frames.permute(0, *(a + 2 for a in order), 1, 2), masks.permute(0, *order)


def mask_view(mask: np.ndarray) -> np.ndarray:
    """An `as_model_order` mask (*S) -> the model's (H, W[, D]) as a view: the mask's form of `model_view`."""
    return mask.T


def split_window(window: np.ndarray, t_in: int) -> tuple[np.ndarray, np.ndarray]:
    """(X, Y[, Z], T, C) window -> inputs (..., t_in, C) and targets (..., T - t_in, C)."""
    return window[..., :t_in, :], window[..., t_in:, :]


def model_view(fields: np.ndarray) -> np.ndarray:
    """(T, C, *S) -> (*reversed S, T, C) as a view (no copy): (T, C, Y, X) -> (X, Y, T, C), 3D (T, C, Z, Y, X) ->
    (X, Y, Z, T, C). Applied to `as_model_order`'s fields it gives the model's order."""
    return np.transpose(fields, tuple(range(fields.ndim - 1, 1, -1)) + (0, 1))


def run_grid(shape: tuple[int, ...] | list[int], model_layout: str, res: int | tuple[int, ...] | list[int] = 0,
             dims: list[str] | None = None) -> tuple[int, ...]:
    """The grid the model sees, in its axis order: the stored grid `shape` ((Y, X) or (Z, Y, X)) after a run's
    `res` (0: as stored; N: N on every axis; one side per stored axis, as `--res H,W` / `D,H,W` give them),
    oriented by `model_layout`. ValueError in one line when `res` has another number of sides than the grid."""
    return model_shape(target_shape(shape, res, "--res", dims), model_layout)


def _size(res: int | tuple[int, ...], nd: int) -> tuple[int, ...] | None:
    """The target sides of a resize (one per axis), None for no resize (res <= 0)."""
    if isinstance(res, (tuple, list)):
        return tuple(int(s) for s in res)
    return (int(res),) * nd if res > 0 else None


def resize_frames(frames: torch.Tensor, res: int | tuple[int, ...]) -> torch.Tensor:
    """(B, *S, T, C) resampled to the grid `res` (one side for every axis, or one per axis in the model's order),
    each frame and channel alone, as the reference's loaders do: trilinear for 3D (TemporalDataset3D), bilinear for
    2D (both align_corners=False, no antialiasing). res <= 0 or the grid already res: returned as it is."""
    nd = frames.ndim - 3
    size = _size(res, nd)
    if size is None or tuple(frames.shape[1:1 + nd]) == size:
        return frames
    t, c = frames.shape[-2], frames.shape[-1]
    cf = frames.float().flatten(-2).movedim(-1, 1)  # (B, T*C, *S)
    out = F.interpolate(cf, size=size, mode="trilinear" if nd == 3 else "bilinear", align_corners=False)
    return out.movedim(1, -1).unflatten(-1, (t, c)).to(frames.dtype)


def resize_mask(mask: torch.Tensor, res: int | tuple[int, ...]) -> torch.Tensor:
    """(B, *S) fluid mask to the grid `res` (as `resize_frames`) by nearest neighbour (a cell stays fluid or solid,
    never in between)."""
    nd = mask.ndim - 1
    size = _size(res, nd)
    if size is None or tuple(mask.shape[1:]) == size:
        return mask
    out = F.interpolate(mask[:, None].float(), size=size, mode="nearest")
    return out[:, 0].to(mask.dtype)


def resize_window(frames: torch.Tensor, mask: torch.Tensor, res: int | tuple[int, ...],
                  fluid_rule: bool | torch.Tensor = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, *S, T, C) frames and their (B, *S) fluid mask resized to the grid `res` (one side for every axis, or one
    per axis in the model's order): `resize_frames` and `resize_mask`, except for samples with solid cells, which
    take the mask-aware rule (`dpot_format.resample.fluid_resample`, the same bi/trilinear kernel). `fluid_rule`:
    True: every sample with a solid cell; False: none (the reference's resize, `keeps_reference_resize`); a (B,)
    bool CPU tensor: those samples (`fluid_rule_samples`, computed before a batch moves to the device, so that no
    step waits on it)."""
    nd = mask.ndim - 1
    shape = _size(res, nd)
    if shape is None or tuple(mask.shape[1:]) == shape or fluid_rule is False:
        return resize_frames(frames, res), resize_mask(mask, res)
    pick = (solid_samples(mask) if fluid_rule is True else fluid_rule.cpu()).nonzero()[:, 0]
    if len(pick) < len(mask):  # some samples keep the plain resize (computed for all: bit for bit as before)
        out, out_mask = resize_frames(frames, res), resize_mask(mask, res)
    else:
        out = frames.new_empty((len(mask), *shape, *frames.shape[-2:]))
        out_mask = mask.new_empty((len(mask), *shape))
    if len(pick) == 0:
        return out, out_mask
    t, c = frames.shape[-2], frames.shape[-1]

    def kernel(a: torch.Tensor) -> torch.Tensor:
        return F.interpolate(a, size=shape, mode="trilinear" if nd == 3 else "bilinear", align_corners=False)

    pick = pick.to(frames.device)
    cf = frames.index_select(0, pick).float().flatten(-2).movedim(-1, 1)  # (b, T*C, *S)
    got, got_mask = fluid_resample(cf, mask.index_select(0, pick), shape, kernel)
    out[pick] = got.movedim(1, -1).unflatten(-1, (t, c)).to(out.dtype)
    out_mask[pick] = got_mask.to(out_mask.dtype)
    return out, out_mask


def solid_samples(mask: torch.Tensor) -> torch.Tensor:
    """(B, *S) fluid mask -> (B,) bool: the samples with at least one solid cell."""
    return (mask == 0).flatten(1).any(1)


def takes_fluid_rule(ds: Any) -> bool:
    """Whether a dataset's solid cells take the mask-aware rule when resized: every dataset but the paper's sources
    under `dpot-reference`, which keep the reference's resize (`keeps_reference_resize`)."""
    return not keeps_reference_resize(ds.entry.get("source"), ds.convention.get("name"))


def fluid_rule_samples(datasets: list[Any], index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) bool on the CPU: the samples of a batch (dataset `index` into `datasets`, fluid `mask` (B, *S) on the
    CPU) that `resize_window` resizes by the mask-aware rule: a solid cell, in a dataset that `takes_fluid_rule`."""
    table = torch.tensor([takes_fluid_rule(d) for d in datasets], dtype=torch.bool)
    return table[index.cpu()] & solid_samples(mask.cpu())


def noise_seed(seed: int, position: int) -> int:
    """Seed of the noise of the sample at stream position `position` (independent of ranks, workers, device)."""
    return int(np.random.SeedSequence([seed, position, 0x4015E]).generate_state(1)[0])


def inject_noise(x: torch.Tensor, eps: float, positions: torch.Tensor, seed: int, mask: torch.Tensor | None = None,
                 channel_valid: torch.Tensor | None = None) -> torch.Tensor:
    """x + eps * ||x||_2 * N(0, 1) for a batch (B, X, Y[, Z], T, C), on x's device; the norm per sample and channel
    over space and time. Noise only on fluid cells (mask (B, X, Y[, Z])) of valid channels (channel_valid (B, C)).

    Sample i's normal draws come from a generator seeded by (seed, positions[i]), so the noise a sample gets does not
    depend on the batch it lands in, the process count or a resume.
    """
    if eps <= 0:
        return x
    b, c = x.shape[0], x.shape[-1]
    space_time = tuple(x.shape[1:-1])
    noise_cf = torch.zeros((b, c, *space_time), dtype=torch.float32, device=x.device)  # channel-first: dense writes
    valid = channel_valid.bool().cpu().tolist() if channel_valid is not None else [[True] * c] * b
    for i, p in enumerate(positions.tolist()):
        g = torch.Generator(device=x.device)
        g.manual_seed(noise_seed(seed, int(p)))
        for ch in range(c):
            if valid[i][ch]:  # padded channels get no draw: they stay exactly the fill value
                noise_cf[i, ch] = torch.randn(space_time, generator=g, device=x.device, dtype=torch.float32)
    noise = noise_cf.movedim(1, -1)  # (B, X, Y[, Z], T, C) view
    xf = x.float().contiguous()  # one summation order for a view and its copy (the loader delivers views)
    noise *= eps * xf.pow(2).sum(dim=tuple(range(1, x.ndim - 1)), keepdim=True).sqrt()
    if mask is not None:
        noise *= mask.to(noise.dtype)[..., None, None]
    return (xf + noise).to(x.dtype)
