"""Build a DPOT model from a preset name, a config or a config dict."""

from __future__ import annotations

from typing import Any, Mapping, Union

import torch

from .base import DPOTBase
from .config import DPOTConfig, preset
from .dpot2d import DPOT2D
from .dpot3d import DPOT3D

ConfigLike = Union[str, DPOTConfig, Mapping[str, Any]]


def resolve_config(preset_or_config: ConfigLike, **overrides: Any) -> DPOTConfig:
    """DPOTConfig from a preset name ('Ti', 'S', 'M', 'L', 'H', 'tiny'), a DPOTConfig or a dict, plus overrides."""
    if isinstance(preset_or_config, DPOTConfig):
        config = preset_or_config
    elif isinstance(preset_or_config, str):
        config = preset(preset_or_config)
    elif isinstance(preset_or_config, Mapping):
        config = DPOTConfig.from_dict(preset_or_config)
    else:
        raise TypeError(f"expected a preset name, DPOTConfig or dict, got {type(preset_or_config).__name__}")
    return config.replace(**overrides) if overrides else config


def model_class(config: DPOTConfig) -> type[DPOTBase]:
    """DPOT2D or DPOT3D according to `config.spatial_dims`."""
    return DPOT3D if config.spatial_dims == 3 else DPOT2D


def build_model(preset_or_config: ConfigLike, *, device: str | torch.device | None = None, **overrides: Any) -> DPOTBase:
    """Freshly initialised DPOT model; `device='meta'` builds it without allocating memory (for counting)."""
    config = resolve_config(preset_or_config, **overrides)
    if device is None:
        return model_class(config)(config)
    with torch.device(device):
        return model_class(config)(config)
