"""DPOT model: 2D/3D networks, typed config and presets, the weight helpers that need no file; the paper's FNO and
UNet baselines beside it, all behind one seam (`families`: build from a config, recognise a state dict, presets).

Public API:
    build_model(preset_or_config, *, device=None, **overrides) -> DPOT2D | DPOT3D
    families.build(families.resolve("fno" | "fno-m" | "unet" | ... | "Ti", **overrides)) -> FNO2D | UNet | DPOT
    model(x) -> prediction (B, X, Y, T_out, C); model(x, return_logits=True) -> (prediction, logits (B, n_cls));
    model.classify(x) -> logits
Checkpoint files (`load_pretrained`, `checkpoint_payload`, ...): `dpot_train.core.checkpoint`; `dpot-train model info`:
`dpot_train.model_info`.

May import: none. The package stands at the bottom, below core, whose checkpoint and model_setup build networks
from files.
"""

from __future__ import annotations

from .base import DPOTBase
from .config import PRESETS, DPOTConfig, preset
from .dpot2d import DPOT2D
from .dpot3d import DPOT3D, config_3d_from_2d, dpot3d_from_2d, transfer_2d_to_3d
from .factory import build_model, resolve_config
from .family_config import GridError
from .fno import FNO2D, FNO3D, FNOConfig
from .unet import UNet, UNetConfig
from . import families  # noqa: E402  (registers the baselines with unwrap_model)
from .weights import CheckpointError, infer_config, load_weights, strip_module_prefix, unwrap_model

__all__ = [
    "CheckpointError",
    "DPOT2D",
    "DPOT3D",
    "DPOTBase",
    "DPOTConfig",
    "FNO2D",
    "FNO3D",
    "FNOConfig",
    "GridError",
    "PRESETS",
    "build_model",
    "config_3d_from_2d",
    "dpot3d_from_2d",
    "infer_config",
    "load_weights",
    "preset",
    "resolve_config",
    "strip_module_prefix",
    "transfer_2d_to_3d",
    "UNet",
    "UNetConfig",
    "families",
    "unwrap_model",
]
