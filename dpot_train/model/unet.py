"""The paper's UNet baseline: the reference's `UNet` (thu-ml/DPOT models/unet.py), its state-dict names kept.

Input (B, *S, T, C) frames (S: 2 or 3 spatial axes), output (B, *S_out, T_out, C) and dataset logits (B, n_cls),
which the reference fixes at zero (the UNet has no classification head). The frames are flattened time-major into
T*C channels with the coordinates put in front, zero-padded at the far end of each axis to a multiple of 16, passed
through four down and four up stages of (conv 3x3, BatchNorm, activation) x 2 with skip connections, cropped back (or
interpolated to `out_shape` when it differs) and mapped to T_out*C channels by a 1x1 convolution.
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .family_config import config_from_dict

FAMILY = "unet"
# the reference's activation names (its ACTIVATION table; "ELU" in capitals as there)
ACTIVATIONS = {"gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "relu": nn.ReLU,
               "leaky_relu": lambda: nn.LeakyReLU(0.1), "softplus": nn.Softplus, "ELU": nn.ELU, "silu": nn.SiLU}
_LAYERS = {2: (nn.Conv2d, nn.ConvTranspose2d, nn.BatchNorm2d, nn.MaxPool2d),
           3: (nn.Conv3d, nn.ConvTranspose3d, nn.BatchNorm3d, nn.MaxPool3d)}


@dataclass(frozen=True)
class UNetConfig:
    """Constructor arguments of the reference `UNet` (same names; `multi_channel`, unused there, left out).
    `in_shape`/`out_shape` are the grid sides; `width` and `act` default to the reference's."""

    n_dim: int = 2
    in_channels: int = 4
    out_channels: int = 4
    in_timesteps: int = 10
    out_timesteps: int = 1
    in_shape: tuple[int, ...] = (128, 128)
    out_shape: tuple[int, ...] = (128, 128)
    width: int = 32
    act: str = "gelu"
    n_cls: int = 12

    def __post_init__(self) -> None:
        object.__setattr__(self, "in_shape", tuple(self.in_shape))
        object.__setattr__(self, "out_shape", tuple(self.out_shape))
        problems = [f"{name} must be a positive integer, got {getattr(self, name)!r}"
                    for name in ("in_channels", "out_channels", "in_timesteps", "out_timesteps", "width", "n_cls")
                    if not isinstance(getattr(self, name), int) or isinstance(getattr(self, name), bool)
                    or getattr(self, name) <= 0]
        if self.n_dim not in (2, 3):
            problems.append(f"n_dim must be 2 or 3, got {self.n_dim!r}")
        for name in ("in_shape", "out_shape"):
            shape = getattr(self, name)
            if len(shape) != self.n_dim or not all(isinstance(s, int) and s > 0 for s in shape):
                problems.append(f"{name} must be {self.n_dim} positive integers, got {list(shape)}")
        if self.act not in ACTIVATIONS:
            problems.append(f"act must be one of {tuple(ACTIVATIONS)}, got {self.act!r}")
        if problems:
            raise ValueError("invalid UNetConfig: " + "; ".join(problems))

    # the names the trainer and evaluation read from any model config
    @property
    def spatial_dims(self) -> int:
        """Number of spatial axes (the reference's n_dim)."""
        return self.n_dim

    @property
    def img_size(self) -> int | tuple[int, ...]:
        """The input grid as the other families' configs give it: one side when square (cubic), else in_shape."""
        return self.in_shape[0] if len(set(self.in_shape)) == 1 else self.in_shape

    @property
    def grid(self) -> tuple[int, ...]:
        """The input grid, one side per spatial axis (in_shape)."""
        return self.in_shape

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict with the family named, stored in checkpoints next to the weights."""
        values = dataclasses.asdict(self)
        values.update(in_shape=list(self.in_shape), out_shape=list(self.out_shape))
        return {"family": FAMILY, **values}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "UNetConfig":
        """Inverse of `to_dict`; rejects unknown keys and another family."""
        return config_from_dict(cls, data, FAMILY)

    def replace(self, **changes: Any) -> "UNetConfig":
        """Copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


class UNet(nn.Module):
    """The reference `UNet`: call `model(x)` for the prediction, `model(x, return_logits=True)` for
    (prediction, dataset logits) as the reference's forward returns them (the logits are zeros there and here)."""

    def __init__(self, config: UNetConfig) -> None:
        super().__init__()
        self.config = config
        conv, upconv, _, pool = _LAYERS[config.n_dim]
        f = config.width
        # Registration order follows the reference (its checkpoints list the keys in this order).
        self.encoder1 = self._block(config.in_channels * config.in_timesteps + config.n_dim, f, "enc1")
        self.pool1 = pool(kernel_size=2, stride=2)
        self.encoder2 = self._block(f, f * 2, "enc2")
        self.pool2 = pool(kernel_size=2, stride=2)
        self.encoder3 = self._block(f * 2, f * 4, "enc3")
        self.pool3 = pool(kernel_size=2, stride=2)
        self.encoder4 = self._block(f * 4, f * 8, "enc4")
        self.pool4 = pool(kernel_size=2, stride=2)
        self.bottleneck = self._block(f * 8, f * 16, "bottleneck")
        self.upconv4 = upconv(f * 16, f * 8, kernel_size=2, stride=2)
        self.decoder4 = self._block(f * 16, f * 8, "dec4")
        self.upconv3 = upconv(f * 8, f * 4, kernel_size=2, stride=2)
        self.decoder3 = self._block(f * 8, f * 4, "dec3")
        self.upconv2 = upconv(f * 4, f * 2, kernel_size=2, stride=2)
        self.decoder2 = self._block(f * 4, f * 2, "dec2")
        self.upconv1 = upconv(f * 2, f, kernel_size=2, stride=2)
        self.decoder1 = self._block(f * 2, f, "dec1")
        self.conv = conv(f, config.out_timesteps * config.out_channels, kernel_size=1)

    def _block(self, c_in: int, features: int, name: str) -> nn.Sequential:
        """(conv 3x3 without bias, BatchNorm, activation) twice, named as the reference names them."""
        conv, _, norm, _ = _LAYERS[self.config.n_dim]
        act = ACTIVATIONS[self.config.act]
        return nn.Sequential(OrderedDict([
            (f"{name}conv1", conv(c_in, features, kernel_size=3, padding=1, bias=False)),
            (f"{name}norm1", norm(num_features=features)),
            (f"{name}tanh1", act()),
            (f"{name}conv2", conv(features, features, kernel_size=3, padding=1, bias=False)),
            (f"{name}norm2", norm(num_features=features)),
            (f"{name}tanh2", act()),
        ]))

    def _check_input(self, x: torch.Tensor) -> None:
        """Clear error for a wrongly shaped input. Any grid runs (padded as the reference pads `in_shape`; no weight
        depends on it), since released weights do not record the grid."""
        cfg = self.config
        if x.ndim != cfg.n_dim + 3 or tuple(x.shape[-2:]) != (cfg.in_timesteps, cfg.in_channels):
            axes = "(B, X, Y, T, C)" if cfg.n_dim == 2 else "(B, X, Y, Z, T, C)"
            raise ValueError(f"UNet expects input {axes} with T={cfg.in_timesteps}, C={cfg.in_channels} "
                             f"(trained on {list(cfg.in_shape)}), got {tuple(x.shape)}")

    def forward(self, x: torch.Tensor, return_logits: bool = False) -> Any:
        """Prediction (B, *out_shape, T_out, C); with `return_logits=True` the tuple (prediction, logits (B, n_cls))."""
        self._check_input(x)
        cfg = self.config
        nd = cfg.n_dim
        batch = x.shape[0]
        x = x.flatten(-2)  # (B, *S, T*C), time-major
        axes = [torch.linspace(0, 1, n, device=x.device) for n in x.shape[1:-1]]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).to(x.dtype)
        x = torch.cat((grid.expand(batch, *grid.shape), x), dim=-1).movedim(-1, 1)  # coordinates first
        sides = tuple(x.shape[2:])
        pads: list[int] = []
        for s in reversed(sides):  # F.pad lists the last axis first; the reference's rule, on this grid
            p = math.ceil(s / 16) * 16 - s
            pads += [0, p]
        x = F.pad(x, pads)

        enc1 = self.encoder1(x)
        enc2 = self.encoder2(self.pool1(enc1))
        enc3 = self.encoder3(self.pool2(enc2))
        enc4 = self.encoder4(self.pool3(enc3))
        bottom = self.bottleneck(self.pool4(enc4))
        dec4 = self.decoder4(torch.cat((self.upconv4(bottom), enc4), dim=1))
        dec3 = self.decoder3(torch.cat((self.upconv3(dec4), enc3), dim=1))
        dec2 = self.decoder2(torch.cat((self.upconv2(dec3), enc2), dim=1))
        dec1 = self.decoder1(torch.cat((self.upconv1(dec2), enc1), dim=1))

        if cfg.out_shape != cfg.in_shape:
            mode = "bilinear" if nd == 2 else "trilinear"
            y = F.interpolate(dec1, size=cfg.out_shape, mode=mode, align_corners=False)
        else:
            y = dec1[(...,) + tuple(slice(0, s) for s in sides)]
        y = self.conv(y).movedim(1, -1)
        y = y.unflatten(-1, (cfg.out_timesteps, cfg.out_channels))
        if not return_logits:
            return y
        return y, torch.zeros(batch, cfg.n_cls, device=y.device)

    def classify(self, x: torch.Tensor) -> torch.Tensor:
        """Dataset-classification logits (B, n_cls): zeros, as the reference's."""
        self._check_input(x)
        return torch.zeros(x.shape[0], self.config.n_cls, device=x.device)

    def num_parameters(self) -> int:
        """Total parameter count (works on the meta device)."""
        return sum(p.numel() for p in self.parameters())
