"""The paper's FNO baseline: the reference's `FNO2d` and `FNO3d` (thu-ml/DPOT models/fno.py), state-dict names kept.

Input (B, X, Y, T, C) frames, output (B, X/p, Y/p, T_out, C) and dataset logits (B, n_cls). The frames are flattened
time-major into T*C channels, x and y coordinates appended, patch-embedded (p = patch_size; the paper's baseline
uses 1), then `n_layers` Fourier layers (a spectral convolution on the lowest modes plus a 1x1 convolution, GELU,
optionally a GroupNorm) and a two-layer pointwise head. The spectral weights keep the reference's layout: real and
imaginary parts stacked on a leading axis of 2.

`FNO3D` (n_dim 3) is the reference's `FNO3d`, a different network: input (B, X, Y, Z, T, C), a linear lift `fc0`
instead of the patch embedding, complex spectral weights on the four corners of the (x, y) spectrum, and no
classification head (its logits are zeros here; the reference returns the prediction alone).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .family_config import (GridError, canonical_grid, config_from_dict, grid_problem, grid_sides, grid_text,
                            multiple_problem)
from .layers import coordinate_grid, initial

FAMILY = "fno"


@dataclass(frozen=True)
class FNOConfig:
    """Constructor arguments of the reference `FNO2d`/`FNO3d` (same names; `n_dim` picks the network, `modes3` is
    FNO3d's); `modes1`/`modes2`/`width` default to the reference training script's (`--modes 16 --width 32`),
    `n_cls` to DPOT's 12 datasets. `img_size`: one side (square or cubic grid) or one per axis, e.g. (48, 64)."""

    modes1: int = 16
    modes2: int = 16
    width: int = 32
    img_size: int | tuple[int, ...] = 64
    n_channels: int = 4
    in_timesteps: int = 10
    out_timesteps: int = 1
    n_layers: int = 4
    patch_size: int = 1
    use_ln: bool = False
    normalize: bool = False
    n_cls: int = 12
    n_dim: int = 2
    modes3: int = 8

    def __post_init__(self) -> None:
        object.__setattr__(self, "img_size", canonical_grid(self.img_size, self.n_dim))
        problems = [f"{name} must be a positive integer, got {getattr(self, name)!r}"
                    for name in ("modes1", "modes2", "width", "n_channels", "in_timesteps",
                                 "out_timesteps", "n_layers", "patch_size", "n_cls", "modes3")
                    if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool)
                    or getattr(self, name) <= 0]
        if self.n_dim not in (2, 3):
            problems.append(f"n_dim must be 2 or 3, got {self.n_dim!r}")
        problems += [p for p in [grid_problem("img_size", self.img_size, self.n_dim)] if p]
        patched = not problems and self.n_dim == 2  # FNO2D patch-embeds; FNO3D lifts every cell
        off_grid = patched and multiple_problem("img_size", self.grid, self.patch_size, "patch_size")
        if off_grid:
            raise GridError(f"invalid FNOConfig: {off_grid}", self.grid, self.patch_size)
        if not problems:
            problems += self._mode_problems()
        if not problems and self.use_ln and self.width % 4:
            problems.append(f"width {self.width} must be divisible by 4 (use_ln: GroupNorm with 4 groups)")
        if problems:
            raise ValueError("invalid FNOConfig: " + "; ".join(problems))

    @property
    def grid(self) -> tuple[int, ...]:
        """The input grid, one side per spatial axis."""
        return grid_sides(self.img_size, self.n_dim)

    def _mode_problems(self) -> list[str]:
        """Modes the grid holds, per axis: the rFFT's last axis has side // 2 + 1 frequencies, the others `side`
        (the reference fails inside einsum otherwise)."""
        sides = [s // self.patch_size for s in self.grid] if self.n_dim == 2 else list(self.grid)
        names = ("modes1", "modes2", "modes3")[:self.n_dim]
        limits = sides[:-1] + [sides[-1] // 2 + 1]
        return [f"{name} {getattr(self, name)} exceeds the {limit} frequencies of a {side}-point axis"
                for name, limit, side in zip(names, limits, sides) if getattr(self, name) > limit]

    # the names the trainer and evaluation read from any model config
    @property
    def in_channels(self) -> int:
        """Physical channels read (the reference's n_channels)."""
        return self.n_channels

    @property
    def out_channels(self) -> int:
        """Physical channels predicted (the same as read)."""
        return self.n_channels

    @property
    def spatial_dims(self) -> int:
        """Number of spatial axes (n_dim)."""
        return self.n_dim

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict with the family named, stored in checkpoints next to the weights (a grid of several
        sides as a list)."""
        values = dataclasses.asdict(self)
        if isinstance(self.img_size, tuple):
            values["img_size"] = list(self.img_size)
        return {"family": FAMILY, **values}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FNOConfig":
        """Inverse of `to_dict`; rejects unknown keys and another family."""
        return config_from_dict(cls, data, FAMILY)

    def replace(self, **changes: Any) -> "FNOConfig":
        """Copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


class SpectralConv2d(nn.Module):
    """Fourier layer: rFFT2, a complex linear map on the `modes1` lowest and highest rows and `modes2` lowest
    columns, inverse rFFT2. `weights1`/`weights2` are (2, in, out, modes1, modes2), real part first."""

    def __init__(self, in_channels: int, out_channels: int, modes1: int, modes2: int) -> None:
        super().__init__()
        self.out_channels, self.modes1, self.modes2 = out_channels, modes1, modes2
        scale = 1.0 / (in_channels * out_channels)
        self.weights1 = nn.Parameter(initial(lambda: scale * torch.rand(2, in_channels, out_channels, modes1, modes2),
                                             2, in_channels, out_channels, modes1, modes2))
        self.weights2 = nn.Parameter(initial(lambda: scale * torch.rand(2, in_channels, out_channels, modes1, modes2),
                                             2, in_channels, out_channels, modes1, modes2))

    @staticmethod
    def _mix(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """(B, I, m1, m2) complex times (2, I, O, m1, m2) real/imaginary weights -> (B, O, m1, m2) complex."""
        real = torch.einsum("bixy,ioxy->boxy", z.real, w[0]) - torch.einsum("bixy,ioxy->boxy", z.imag, w[1])
        imag = torch.einsum("bixy,ioxy->boxy", z.real, w[1]) + torch.einsum("bixy,ioxy->boxy", z.imag, w[0])
        return torch.complex(real, imag)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        with torch.autocast(device_type=x.device.type, enabled=False):  # FFTs in float32, also under autocast
            x = x.float()
            rows, cols = x.shape[-2], x.shape[-1]
            z = torch.fft.rfft2(x)
            out = torch.zeros(x.shape[0], self.out_channels, rows, cols // 2 + 1, dtype=torch.cfloat, device=x.device)
            m1, m2 = self.modes1, self.modes2
            out[:, :, :m1, :m2] = self._mix(z[:, :, :m1, :m2], self.weights1.float())
            out[:, :, -m1:, :m2] = self._mix(z[:, :, -m1:, :m2], self.weights2.float())
            y = torch.fft.irfft2(out, s=(rows, cols))
        return y.to(in_dtype)


class FNOPatchEmbed(nn.Module):
    """Patchify conv (kernel = stride = patch) -> GELU -> 1x1 conv to the width; key `proj.{0,2}`."""

    def __init__(self, in_chans: int, hidden: int, width: int, patch_size: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Conv2d(in_chans, hidden, kernel_size=patch_size, stride=patch_size), nn.GELU(),
                                  nn.Conv2d(hidden, width, kernel_size=1, stride=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class FNO2D(nn.Module):
    """The reference `FNO2d`: call `model(x)` for the prediction, `model(x, return_logits=True)` for
    (prediction, dataset logits) as the reference's forward returns them."""

    spatial_dims = 2

    def __init__(self, config: FNOConfig) -> None:
        super().__init__()
        if config.n_dim != 2:
            raise ValueError(f"FNO2D needs n_dim=2, config has {config.n_dim} (FNO3D is the 3D network)")
        self.config = config
        c, w = config.n_channels, config.width
        flat = c * config.in_timesteps
        # Registration order follows the reference (its checkpoints list the keys in this order).
        self.patch_embed = FNOPatchEmbed(flat + 2, flat * config.patch_size + 2, w, config.patch_size)
        self.spectral_convs = nn.ModuleList(SpectralConv2d(w, w, config.modes1, config.modes2)
                                            for _ in range(config.n_layers))
        self.convs = nn.ModuleList(nn.Conv2d(w, w, 1) for _ in range(config.n_layers))
        if config.normalize:
            self.scale_feats = nn.Linear(2 * c, w)
        if config.use_ln:
            self.ln_layers = nn.ModuleList(nn.GroupNorm(4, w) for _ in range(config.n_layers))
        self.fc1 = nn.Linear(w, w)
        self.fc2 = nn.Linear(w, c * config.out_timesteps)
        self.cls_head = nn.Sequential(nn.Linear(w, w), nn.GELU(), nn.Linear(w, w), nn.GELU(), nn.Linear(w, config.n_cls))

    def _check_input(self, x: torch.Tensor) -> None:
        """Clear error for a wrongly shaped input. Any grid the patch size divides runs (no weight depends on it);
        the reference asserts its `img_size`, which released weights do not record."""
        cfg = self.config
        p = cfg.patch_size
        if x.ndim != 5 or tuple(x.shape[3:]) != (cfg.in_timesteps, cfg.n_channels) or x.shape[1] % p or x.shape[2] % p:
            raise ValueError(f"FNO2D expects input (B, X, Y, T, C) with T={cfg.in_timesteps}, C={cfg.n_channels} "
                             f"and X, Y multiples of the patch size {p} (trained on {grid_text(cfg.grid)}), "
                             f"got {tuple(x.shape)}")

    def forward(self, x: torch.Tensor, return_logits: bool = False) -> Any:
        """Prediction (B, X/p, Y/p, T_out, C); with `return_logits=True` the tuple (prediction, logits (B, n_cls))."""
        self._check_input(x)
        cfg = self.config
        batch, channels = x.shape[0], x.shape[-1]
        stats = None
        if cfg.normalize:
            mu = x.mean(dim=(1, 2, 3), keepdim=True)  # (B, 1, 1, 1, C)
            sigma = x.std(dim=(1, 2, 3), keepdim=True) + 1e-6
            x = (x - mu) / sigma
            stats = (mu, sigma)
        x = x.flatten(-2)  # (B, X, Y, T*C), time-major
        grid = coordinate_grid(x.shape[1:3], device=x.device, dtype=x.dtype)
        x = torch.cat((x, grid.expand(batch, *grid.shape)), dim=-1).permute(0, 3, 1, 2)
        x = self.patch_embed(x)
        if stats is not None:
            feats = self.scale_feats(torch.cat(stats, dim=-1)).squeeze(-2)  # (B, 1, 1, W)
            x = x + feats.permute(0, 3, 1, 2)
        for i in range(cfg.n_layers):
            x = F.gelu(self.spectral_convs[i](x) + self.convs[i](x))
            if cfg.use_ln:
                x = self.ln_layers[i](x)
        logits = self.cls_head(x.mean(dim=(2, 3)))
        y = self.fc2(F.gelu(self.fc1(x.permute(0, 2, 3, 1))))
        y = y.reshape(*y.shape[:3], cfg.out_timesteps, channels)
        if stats is not None:
            y = y * stats[1] + stats[0]
        return (y, logits) if return_logits else y

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """Dataset-classification logits (B, n_cls)."""
        return self.forward(x, return_logits=True)[1]

    def num_parameters(self) -> int:
        """Total parameter count (works on the meta device)."""
        return sum(p.numel() for p in self.parameters())


class SpectralConv3d(nn.Module):
    """3D Fourier layer: rFFTn over (x, y, z), a complex linear map on the `modes3` lowest z frequencies of the four
    corners (lowest/highest `modes1` x, lowest/highest `modes2` y), inverse rFFTn. Complex weights
    `weights1..4` (in, out, modes1, modes2, modes3), as the reference stores them."""

    def __init__(self, in_channels: int, out_channels: int, modes1: int, modes2: int, modes3: int) -> None:
        super().__init__()
        self.out_channels, self.modes = out_channels, (modes1, modes2, modes3)
        scale = 1.0 / (in_channels * out_channels)
        for i in range(1, 5):
            weight = initial(lambda: scale * torch.rand(in_channels, out_channels, modes1, modes2, modes3,
                                                        dtype=torch.cfloat),
                             in_channels, out_channels, modes1, modes2, modes3, dtype=torch.cfloat)
            self.register_parameter(f"weights{i}", nn.Parameter(weight))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        m1, m2, m3 = self.modes
        with torch.autocast(device_type=x.device.type, enabled=False):  # FFTs in float32, also under autocast
            x = x.float()
            sides = tuple(x.shape[-3:])
            z = torch.fft.rfftn(x, dim=(-3, -2, -1))
            out = torch.zeros(x.shape[0], self.out_channels, sides[0], sides[1], sides[2] // 2 + 1,
                              dtype=torch.cfloat, device=x.device)
            corners = ((slice(None, m1), slice(None, m2)), (slice(-m1, None), slice(None, m2)),
                       (slice(None, m1), slice(-m2, None)), (slice(-m1, None), slice(-m2, None)))
            for (rows, cols), w in zip(corners, (self.weights1, self.weights2, self.weights3, self.weights4)):
                out[:, :, rows, cols, :m3] = torch.einsum("bixyz,ioxyz->boxyz", z[:, :, rows, cols, :m3], w)
            y = torch.fft.irfftn(out, s=sides)
        return y.to(in_dtype)


class FNO3D(nn.Module):
    """The reference `FNO3d`: call `model(x)` for the prediction (B, X, Y, Z, T_out, C); `model(x,
    return_logits=True)` adds zero logits (B, n_cls), as the network has no classification head."""

    spatial_dims = 3

    def __init__(self, config: FNOConfig) -> None:
        super().__init__()
        if config.n_dim != 3:
            raise ValueError(f"FNO3D needs n_dim=3, config has {config.n_dim} (FNO2D is the 2D network)")
        self.config = config
        c, w = config.n_channels, config.width
        # Registration order follows the reference (its checkpoints list the keys in this order).
        self.fc0 = nn.Linear(config.in_timesteps * c + 3, w)
        self.spectral_convs = nn.ModuleList(SpectralConv3d(w, w, config.modes1, config.modes2, config.modes3)
                                            for _ in range(config.n_layers))
        self.convs = nn.ModuleList(nn.Conv3d(w, w, 1) for _ in range(config.n_layers))
        if config.normalize:  # defined, and never used, by the reference's forward: kept for its state dict, frozen
            self.scale_feats = nn.Linear(2 * c, w).requires_grad_(False)  # (DDP refuses a trainable unused weight)
        if config.use_ln:
            self.ln_layers = nn.ModuleList(nn.GroupNorm(4, w) for _ in range(config.n_layers))
        self.fc1 = nn.Linear(w, w)
        self.fc2 = nn.Linear(w, c * config.out_timesteps)

    def _check_input(self, x: torch.Tensor) -> None:
        """Clear error for a wrongly shaped input; any grid runs (no weight depends on it)."""
        cfg = self.config
        if x.ndim != 6 or tuple(x.shape[4:]) != (cfg.in_timesteps, cfg.n_channels):
            raise ValueError(f"FNO3D expects input (B, X, Y, Z, T, C) with T={cfg.in_timesteps}, C={cfg.n_channels} "
                             f"(trained on {grid_text(cfg.grid)}), got {tuple(x.shape)}")

    def forward(self, x: torch.Tensor, return_logits: bool = False) -> Any:
        """Prediction (B, X, Y, Z, T_out, C); with `return_logits=True` the tuple (prediction, zeros (B, n_cls))."""
        self._check_input(x)
        cfg = self.config
        batch, channels = x.shape[0], x.shape[-1]
        x = x.flatten(-2)  # (B, X, Y, Z, T*C), time-major
        grid = coordinate_grid(x.shape[1:4], device=x.device, dtype=x.dtype)
        x = self.fc0(torch.cat((x, grid.expand(batch, *grid.shape)), dim=-1)).permute(0, 4, 1, 2, 3)
        for i in range(cfg.n_layers):
            x = F.gelu(self.spectral_convs[i](x) + self.convs[i](x))
            if cfg.use_ln:
                x = self.ln_layers[i](x)
        y = self.fc2(F.gelu(self.fc1(x.permute(0, 2, 3, 4, 1))))
        y = y.reshape(*y.shape[:4], cfg.out_timesteps, channels)
        return (y, torch.zeros(batch, cfg.n_cls, device=y.device)) if return_logits else y

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """Dataset-classification logits (B, n_cls): zeros (no classification head)."""
        self._check_input(x)
        return torch.zeros(x.shape[0], self.config.n_cls, device=x.device)

    def num_parameters(self) -> int:
        """Total parameter count, a complex weight counted once as torch counts it (works on the meta device)."""
        return sum(p.numel() for p in self.parameters())
