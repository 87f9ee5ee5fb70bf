"""DPOT weights in memory, no file involved: the wrapper prefixes, the config a state dict's shapes imply, a strict
load into a model, and the model inside DDP/torch.compile wrappers. Checkpoint files: `dpot_train.core.checkpoint`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from .base import DPOTBase
from .config import DPOTConfig

# Config fields that the weights cannot reveal; taken from saved arguments when present.
HINT_FIELDS = ("modes", "modes_z", "act")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")
# Network classes `unwrap_model` stops at: DPOT's, and each other family's (registered by model.families).
NETWORKS: list[type] = [DPOTBase]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: unsafe content, wrong layout, or weights that do not fit the model."""


def strip_module_prefix(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove the `module.` (DDP) and `_orig_mod.` (torch.compile) prefixes when every key carries them."""
    out = dict(state_dict)
    changed = True
    while changed and out:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in out):
                out = {k[len(prefix):]: v for k, v in out.items()}
                changed = True
    return out


def _shape(state: Mapping[str, torch.Tensor], key: str) -> tuple[int, ...]:
    return tuple(state[key].shape)


def _mlp_ratio(hidden: int, dim: int) -> float:
    """Ratio r with int(dim * r) == hidden (the reference's rounding), robust to float error."""
    ratio = hidden / dim
    while int(dim * ratio) < hidden:
        ratio = math.nextafter(ratio, math.inf)
    return ratio


def infer_config(state_dict: Mapping[str, torch.Tensor], hints: Mapping[str, Any] | None = None) -> DPOTConfig:
    """DPOTConfig from the tensor shapes of a DPOT state dict; `modes`/`modes_z`/`act` come from hints or defaults."""
    required = ["pos_embed", "patch_embed.proj.0.weight", "time_agg_layer.w", "out_layer.0.weight",
                "out_layer.4.weight", "cls_head.4.weight", "blocks.0.filter.w1", "blocks.0.mlp.0.weight"]
    missing = [k for k in required if k not in state_dict]
    if missing:
        raise CheckpointError(f"not a DPOT state dict: missing {missing} (found {len(state_dict)} keys, "
                              f"e.g. {sorted(state_dict)[:5]})")
    pos = _shape(state_dict, "pos_embed")
    nd = len(pos) - 2
    if nd not in (2, 3):
        raise CheckpointError(f"pos_embed has shape {pos}; expected (1, D, h, w) or (1, D, x, y, z)")
    dim, latent = pos[1], pos[2:]
    patch_w = _shape(state_dict, "patch_embed.proj.0.weight")
    patch = patch_w[-1]
    in_channels = patch_w[1] - (nd + 1)
    hidden = patch_w[0] - (nd + 1)
    if hidden <= 0 or hidden % patch:
        raise CheckpointError(f"patch_embed.proj.0.weight has shape {patch_w}; its first axis should be "
                              f"out_channels * patch_size + {nd + 1}")
    out_channels = hidden // patch
    out_total = _shape(state_dict, "out_layer.4.weight")[0]
    if out_total % out_channels:
        raise CheckpointError(f"out_layer.4.weight has {out_total} outputs, not a multiple of out_channels {out_channels}")
    depth = 0
    while f"blocks.{depth}.norm1.weight" in state_dict:
        depth += 1
    w1 = _shape(state_dict, "blocks.0.filter.w1")
    values: dict[str, Any] = dict(
        img_size=tuple(side * patch for side in latent),
        patch_size=patch,
        in_channels=in_channels,
        out_channels=out_channels,
        in_timesteps=_shape(state_dict, "time_agg_layer.w")[0],
        out_timesteps=out_total // out_channels,
        n_blocks=w1[1],
        embed_dim=dim,
        out_layer_dim=_shape(state_dict, "out_layer.0.weight")[1],
        depth=depth,
        mlp_ratio=_mlp_ratio(_shape(state_dict, "blocks.0.mlp.0.weight")[0], dim),
        n_cls=_shape(state_dict, "cls_head.4.weight")[0],
        normalize="scale_feats_mu.weight" in state_dict,
        time_agg="exp_mlp" if "time_agg_layer.gamma" in state_dict else "mlp",
        spatial_dims=nd,
    )
    for key, value in (hints or {}).items():
        if key in HINT_FIELDS:
            values[key] = value
    try:
        return DPOTConfig(**values)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"weights imply an invalid DPOT config: {exc}") from exc


def resize_pos_embed(pos: torch.Tensor, latent: int | tuple[int, ...]) -> torch.Tensor:
    """(1, D, *n) positional embedding resampled to the latent grid `latent` (one side per axis, or one side for
    all) as the reference resamples it to fine-tune at another resolution: bicubic in 2D, trilinear in 3D
    (align_corners False); a square embedding onto a rectangular grid alike. Returned as it is when it fits."""
    nd = pos.ndim - 2
    size = tuple(latent) if isinstance(latent, (tuple, list)) else (int(latent),) * nd
    if tuple(pos.shape[2:]) == size:
        return pos
    mode = "bicubic" if nd == 2 else "trilinear"
    return F.interpolate(pos.float(), size=size, mode=mode, align_corners=False).to(pos.dtype)


def load_weights(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], source: str = "state dict") -> None:
    """Strict load with one clear error listing missing, unexpected and mis-shaped keys."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mis_shaped = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state_dict and tuple(state_dict[k].shape) != tuple(v.shape)
    ]
    if missing or unexpected or mis_shaped:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        if mis_shaped:
            parts.append(f"shape mismatches {mis_shaped}")
        what = "DPOT" if isinstance(model, DPOTBase) else type(model).__name__
        raise CheckpointError(f"{source} does not fit the {what} model: " + "; ".join(parts))
    on_meta = any(p.device.type == "meta" for p in expected.values())
    if on_meta:
        # Take the checkpoint tensors as the parameters (no second copy), cast to each parameter's dtype.
        cast = {k: state_dict[k].to(dtype=v.dtype).contiguous() for k, v in expected.items()}
        model.load_state_dict(cast, strict=True, assign=True)
    else:
        model.load_state_dict(state_dict, strict=True)


def unwrap_model(model: Any) -> torch.nn.Module:
    """The network (DPOT, or another family's) inside DistributedDataParallel (`.module`) and torch.compile
    (`._orig_mod`) wrappers."""
    while not isinstance(model, tuple(NETWORKS)):
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if inner is None:
            raise TypeError(f"expected a DPOT model (possibly wrapped), got {type(model).__name__}")
        model = inner
    return model
