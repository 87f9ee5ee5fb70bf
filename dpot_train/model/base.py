"""The DPOT network for any supported number of spatial axes; `DPOT2D` and `DPOT3D` fix that number."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .config import DPOTConfig
from .layers import Block, PatchEmbed, TimeAggregator, activation, conv, conv_transpose, coordinate_grid


class DPOTBase(nn.Module):
    """Auto-regressive denoising operator transformer: (B, *S, T, C) frames -> (B, *S, T_out, C) next frames.

    Call `model(x)` for the prediction, `model(x, return_logits=True)` for (prediction, dataset logits), or
    `model.classify(x)` for the logits alone.
    """

    spatial_dims: int = 2

    def __init__(self, config: DPOTConfig) -> None:
        super().__init__()
        if config.spatial_dims != self.spatial_dims:
            raise ValueError(f"{type(self).__name__} needs spatial_dims={self.spatial_dims}, config has {config.spatial_dims}")
        self.config = config
        nd = self.spatial_dims
        dim = config.embed_dim
        latent = config.latent_grid
        modes = (config.modes,) * 2 + ((config.modes_z,) if nd == 3 else ())

        # Parameter registration order follows the released checkpoints (pos_embed first).
        self.pos_embed = nn.Parameter(torch.zeros(1, dim, *latent))
        self.patch_embed = PatchEmbed(nd, config.in_channels + nd + 1, config.out_channels * config.patch_size + nd + 1,
                                      dim, config.patch_size, config.act)
        self.blocks = nn.ModuleList(
            Block(nd, dim, config.n_blocks, modes, config.mlp_hidden, config.act, config.norm_groups)
            for _ in range(config.depth)
        )
        if config.normalize:
            self.scale_feats_mu = nn.Linear(2 * config.in_channels, dim)
            self.scale_feats_sigma = nn.Linear(2 * config.in_channels, dim)
        self.cls_head = nn.Sequential(
            nn.Linear(dim, dim), activation(config.act), nn.Linear(dim, dim), activation(config.act), nn.Linear(dim, config.n_cls)
        )
        self.time_agg_layer = TimeAggregator(config.in_timesteps, dim, config.time_agg)
        self.out_layer = nn.Sequential(
            conv_transpose(nd, dim, config.out_layer_dim, config.patch_size),
            activation(config.act),
            conv(nd, config.out_layer_dim, config.out_layer_dim),
            activation(config.act),
            conv(nd, config.out_layer_dim, config.out_channels * config.out_timesteps),
        )
        if self.pos_embed.device.type != "meta":
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    # -- shape checks -------------------------------------------------------------------------------------------
    def _check_input(self, x: torch.Tensor) -> None:
        """Clear error for a wrongly shaped input (the positional embedding fixes the grid)."""
        cfg = self.config
        nd = self.spatial_dims
        expected = ("B",) + cfg.grid + (cfg.in_timesteps, cfg.in_channels)
        if x.ndim != nd + 3 or tuple(x.shape[1:]) != expected[1:]:
            axes = "(B, X, Y, T, C)" if nd == 2 else "(B, X, Y, Z, T, C)"
            raise ValueError(f"{type(self).__name__} expects input {axes} = {expected}, got {tuple(x.shape)}")

    # -- forward pieces -----------------------------------------------------------------------------------------
    def _instance_stats(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample, per-channel mean and std over space and time (reference 'normalize' option)."""
        dims = tuple(range(1, self.spatial_dims + 2))
        mu = x.mean(dim=dims, keepdim=True)
        sigma = x.std(dim=dims, keepdim=True) + 1e-6
        return mu, sigma

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """(B, *S, T, C) -> latent (B, D, *latent) after the mixer blocks, plus instance stats when normalising."""
        self._check_input(x)
        nd = self.spatial_dims
        batch, frames = x.shape[0], x.shape[-2]
        stats = None
        if self.config.normalize:
            mu, sigma = self._instance_stats(x)
            x = (x - mu) / sigma
            stats = (mu, sigma)

        grid = coordinate_grid(x.shape[1:-1], device=x.device, dtype=x.dtype)  # (*S, T, nd+1)
        grid = grid.expand(batch, *grid.shape)
        x = torch.cat((x, grid), dim=-1)  # (B, *S, T, C + nd + 1)
        # (B, *S, T, C') -> (B*T, C', *S): frames join the batch for the patch embedding.
        x = x.permute(0, nd + 1, nd + 2, *range(1, nd + 1)).flatten(0, 1)
        x = self.patch_embed(x) + self.pos_embed
        x = x.unflatten(0, (batch, frames))  # (B, T, D, *latent)
        x = self.time_agg_layer(x)  # (B, D, *latent)

        if stats is not None:
            feats = torch.cat(stats, dim=-1).flatten(1)  # (B, 2C)
            scale_mu = self.scale_feats_mu(feats).view(batch, -1, *([1] * nd))
            scale_sigma = self.scale_feats_sigma(feats).view(batch, -1, *([1] * nd))
            x = scale_sigma * x + scale_mu

        for block in self.blocks:
            x = block(x)
        return x, stats

    def head(self, latent: torch.Tensor, stats: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Latent (B, D, *latent) -> prediction (B, *S, T_out, C)."""
        cfg = self.config
        y = self.out_layer(latent).movedim(1, -1)  # (B, *S, T_out*C)
        y = y.unflatten(-1, (cfg.out_timesteps, cfg.out_channels))
        if stats is not None:
            mu, sigma = stats
            y = y * sigma + mu
        return y

    def logits(self, latent: torch.Tensor) -> torch.Tensor:
        """Dataset-classification logits (B, n_cls) from the latent mean over space."""
        return self.cls_head(latent.mean(dim=tuple(range(2, latent.ndim))))

    def forward(self, x: torch.Tensor, return_logits: bool = False) -> Any:
        """Prediction (B, *S, T_out, C); with `return_logits=True` the tuple (prediction, logits (B, n_cls))."""
        latent, stats = self.forward_features(x)
        pred = self.head(latent, stats)
        if return_logits:
            return pred, self.logits(latent)
        return pred

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """Dataset-classification logits (B, n_cls) only (skips the output head)."""
        latent, _ = self.forward_features(x)
        return self.logits(latent)

    def num_parameters(self) -> int:
        """Total parameter count (works on the meta device)."""
        return sum(p.numel() for p in self.parameters())
