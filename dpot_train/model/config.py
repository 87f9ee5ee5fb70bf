"""Typed DPOT configuration and the named size presets (Ti, S, M, L, H and a test-sized `tiny`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from .family_config import (GridError, canonical_grid, grid_problem, grid_sides, grid_text, multiple_problem)

ACTIVATIONS = ("gelu", "tanh", "sigmoid", "relu", "leaky_relu", "softplus", "elu", "silu")
TIME_AGGREGATIONS = ("exp_mlp", "mlp")


@dataclass(frozen=True)
class DPOTConfig:
    """Constructor arguments of a DPOT network; names follow the released reference so saved arguments map 1:1.

    `img_size` is the grid: one side for a square (2D) or cubic (3D) grid, the reference's form, or one side per
    axis in the model's axis order, e.g. (48, 64); the latent grid of patches is each side divided by the patch
    size, and the positional embedding has that shape."""

    img_size: int | tuple[int, ...] = 128
    patch_size: int = 8
    in_channels: int = 4
    out_channels: int = 4
    in_timesteps: int = 10
    out_timesteps: int = 1
    n_blocks: int = 4
    embed_dim: int = 512
    out_layer_dim: int = 32
    depth: int = 4
    modes: int = 32
    mlp_ratio: float = 1.0
    n_cls: int = 12
    normalize: bool = False
    act: str = "gelu"
    time_agg: str = "exp_mlp"
    spatial_dims: int = 2
    modes_z: int = 8
    norm_groups: int = field(default=8)

    def __post_init__(self) -> None:
        object.__setattr__(self, "img_size", canonical_grid(self.img_size, self.spatial_dims))
        problems = _validate(self)
        if problems:
            message = "invalid DPOTConfig: " + "; ".join(problems)
            if any(p.startswith("img_size ") and "multiple of patch_size" in p for p in problems):
                raise GridError(message, self.grid, self.patch_size)
            raise ValueError(message)

    @property
    def grid(self) -> tuple[int, ...]:
        """The input grid, one side per spatial axis in the model's order."""
        return grid_sides(self.img_size, self.spatial_dims)

    @property
    def latent_grid(self) -> tuple[int, ...]:
        """The latent grid of patches: each side of the grid divided by the patch size (the positional embedding's)."""
        return tuple(s // self.patch_size for s in self.grid)

    @property
    def latent_size(self) -> int:
        """Side of a square (cubic) latent grid; ValueError for another grid (see `latent_grid`)."""
        if len(set(self.latent_grid)) != 1:
            raise ValueError(f"the latent grid {grid_text(self.latent_grid)} is not square; use latent_grid")
        return self.latent_grid[0]

    @property
    def block_size(self) -> int:
        """Channels per Fourier-attention head."""
        return self.embed_dim // self.n_blocks

    @property
    def mlp_hidden(self) -> int:
        """Hidden width of the channel MLP, computed as the reference does (int of the product)."""
        return int(self.embed_dim * self.mlp_ratio)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict, stored in checkpoints next to the weights (a grid of several sides as a list)."""
        values = dataclasses.asdict(self)
        if isinstance(self.img_size, tuple):
            values["img_size"] = list(self.img_size)
        return values

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DPOTConfig":
        """Inverse of `to_dict`; rejects unknown keys so a typo never passes silently."""
        if not isinstance(data, Mapping):
            raise TypeError(f"DPOTConfig.from_dict expects a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown DPOTConfig keys {unknown}; known keys: {sorted(known)}")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> "DPOTConfig":
        """Copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _validate(cfg: DPOTConfig) -> list[str]:
    """Human-readable list of everything wrong with a config (empty when valid)."""
    problems: list[str] = []
    positive = ("patch_size", "in_channels", "out_channels", "in_timesteps", "out_timesteps",
                "n_blocks", "embed_dim", "out_layer_dim", "depth", "modes", "n_cls", "modes_z", "norm_groups")
    for name in positive:
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(f"{name} must be a positive integer, got {value!r}")
    if cfg.spatial_dims not in (2, 3):
        problems.append(f"spatial_dims must be 2 or 3, got {cfg.spatial_dims!r}")
    problems += [p for p in [grid_problem("img_size", cfg.img_size, cfg.spatial_dims)] if p]
    if problems:
        return problems
    problems += [p for p in [multiple_problem("img_size", cfg.grid, cfg.patch_size, "patch_size")] if p]
    if cfg.embed_dim % cfg.n_blocks:
        problems.append(f"embed_dim {cfg.embed_dim} must be divisible by n_blocks {cfg.n_blocks}")
    if cfg.embed_dim % cfg.norm_groups:
        problems.append(f"embed_dim {cfg.embed_dim} must be divisible by norm_groups {cfg.norm_groups}")
    if not (isinstance(cfg.mlp_ratio, (int, float)) and cfg.mlp_ratio > 0 and int(cfg.embed_dim * cfg.mlp_ratio) > 0):
        problems.append(f"mlp_ratio must be a positive number, got {cfg.mlp_ratio!r}")
    if cfg.act not in ACTIVATIONS:
        problems.append(f"act must be one of {ACTIVATIONS}, got {cfg.act!r}")
    if cfg.time_agg not in TIME_AGGREGATIONS:
        problems.append(f"time_agg must be one of {TIME_AGGREGATIONS}, got {cfg.time_agg!r}")
    return problems


# Sizes from the DPOT paper (patch 8, modes 32, 10 input frames, 128x128, 4 channels, 12 dataset classes).
PRESETS: dict[str, DPOTConfig] = {
    "tiny": DPOTConfig(embed_dim=64, depth=2, n_blocks=4, out_layer_dim=32, mlp_ratio=1.0),
    "Ti": DPOTConfig(embed_dim=512, depth=4, n_blocks=4, mlp_ratio=1.0, out_layer_dim=32),
    "S": DPOTConfig(embed_dim=1024, depth=6, n_blocks=8, mlp_ratio=1.0, out_layer_dim=32),
    "M": DPOTConfig(embed_dim=1024, depth=12, n_blocks=8, mlp_ratio=4.0, out_layer_dim=32),
    "L": DPOTConfig(embed_dim=1536, depth=24, n_blocks=16, mlp_ratio=4.0, out_layer_dim=128),
    "H": DPOTConfig(embed_dim=2048, depth=27, n_blocks=8, mlp_ratio=4.0, out_layer_dim=128),
}


def preset(name: str) -> DPOTConfig:
    """Config of a named preset; the name is matched case-insensitively (`ti`, `Ti`, `TI`)."""
    lookup = {key.lower(): key for key in PRESETS}
    key = lookup.get(str(name).lower())
    if key is None:
        raise KeyError(f"unknown DPOT preset {name!r}; available: {', '.join(PRESETS)}")
    return PRESETS[key]
