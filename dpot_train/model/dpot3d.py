"""The 3D DPOT network (B, X, Y, Z, T, C) and its initialisation from 2D weights."""

from __future__ import annotations

import torch

from .base import DPOTBase
from .config import DPOTConfig
from .dpot2d import DPOT2D

# Config fields that must agree between a 2D source and a 3D target for the transfer to be meaningful.
_SHARED_FIELDS = ("embed_dim", "depth", "n_blocks", "mlp_ratio", "in_timesteps", "time_agg", "act", "norm_groups")
_TRANSFERRED_PREFIXES = ("blocks.", "time_agg_layer.")


class DPOT3D(DPOTBase):
    """DPOT on a 3D grid: Conv3d patch embedding with (x, y, z, t) coordinates, rfftn over three axes."""

    spatial_dims = 3


def config_3d_from_2d(config: DPOTConfig, **overrides: object) -> DPOTConfig:
    """The 3D config sharing a 2D config's mixer sizes; other fields (img_size, channels ...) may be overridden."""
    return config.replace(spatial_dims=3, **overrides)


@torch.no_grad()
def transfer_2d_to_3d(source: DPOT2D, target: DPOT3D) -> list[str]:
    """Copy mixer blocks and temporal aggregation from a 2D model into a 3D one; returns the copied keys.

    1x1 convolution weights gain a trailing axis; AFNO weights, norms and the time aggregation copy as they are.
    Patch embedding, positional embedding and heads depend on the dimension and keep their initialisation.
    """
    mismatched = [
        f"{name}: 2D {getattr(source.config, name)!r} vs 3D {getattr(target.config, name)!r}"
        for name in _SHARED_FIELDS
        if getattr(source.config, name) != getattr(target.config, name)
    ]
    if mismatched:
        raise ValueError("cannot transfer 2D weights into this 3D model, configs differ in " + "; ".join(mismatched))
    src = source.state_dict()
    dst = target.state_dict()
    copied: list[str] = []
    for key, value in src.items():
        if not key.startswith(_TRANSFERRED_PREFIXES):
            continue
        if key not in dst:
            raise KeyError(f"3D model has no parameter {key!r} to receive the 2D weight")
        if value.ndim == 4 and dst[key].ndim == 5:
            value = value.unsqueeze(-1)
        if value.shape != dst[key].shape:
            raise ValueError(f"shape mismatch for {key!r}: 2D {tuple(value.shape)} vs 3D {tuple(dst[key].shape)}")
        dst[key].copy_(value)
        copied.append(key)
    return copied


def dpot3d_from_2d(source: DPOT2D, **overrides: object) -> DPOT3D:
    """Build a 3D model from a 2D one's config (with overrides) and initialise it from the 2D weights."""
    target = DPOT3D(config_3d_from_2d(source.config, **overrides))
    target.to(next(source.parameters()).device)
    transfer_2d_to_3d(source, target)
    return target
