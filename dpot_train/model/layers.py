"""DPOT building blocks for 2 or 3 spatial dimensions: patch embedding, temporal aggregation, AFNO mixer, block.

Module and parameter names equal the released checkpoint keys, so pre-trained weights load without a key map.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

_CONV = {2: nn.Conv2d, 3: nn.Conv3d}
_CONV_T = {2: nn.ConvTranspose2d, 3: nn.ConvTranspose3d}


def initial(draw: Callable[[], torch.Tensor], *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """draw(), a parameter's initial value; on the meta device (a parameter count) an empty tensor of its shape:
    random draws and arithmetic on meta tensors run torch's Python kernels, which import torch._dynamo (~1 s)."""
    return torch.empty(shape, dtype=dtype) if torch.empty(0).is_meta else draw()


def activation(name: str) -> nn.Module:
    """Activation module by config name; GELU is the exact (erf) form, as in the reference."""
    factories = {
        "gelu": lambda: nn.GELU(approximate="none"),
        "tanh": nn.Tanh,
        "sigmoid": nn.Sigmoid,
        "relu": nn.ReLU,
        "leaky_relu": lambda: nn.LeakyReLU(0.1),
        "softplus": nn.Softplus,
        "elu": nn.ELU,
        "silu": nn.SiLU,
    }
    if name not in factories:
        raise ValueError(f"unknown activation {name!r}; expected one of {sorted(factories)}")
    return factories[name]()


def conv(ndim: int, c_in: int, c_out: int, kernel: int = 1) -> nn.Module:
    """Conv2d/Conv3d with kernel == stride (patchify) or a 1x1 pointwise convolution."""
    return _CONV[ndim](c_in, c_out, kernel_size=kernel, stride=kernel)


def conv_transpose(ndim: int, c_in: int, c_out: int, kernel: int) -> nn.Module:
    """ConvTranspose2d/3d with kernel == stride: the un-patchify of the output head."""
    return _CONV_T[ndim](c_in, c_out, kernel_size=kernel, stride=kernel)


def coordinate_grid(sizes: Sequence[int], *, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(*sizes, len(sizes)) tensor of per-axis linspace(0, 1) coordinates (computed in float64, then cast)."""
    axes = [torch.linspace(0.0, 1.0, n, dtype=torch.float64, device=device) for n in sizes]
    mesh = torch.meshgrid(*axes, indexing="ij")
    return torch.stack(mesh, dim=-1).to(dtype)


class PatchEmbed(nn.Module):
    """Patchify conv (kernel = stride = patch) -> activation -> 1x1 conv to the embedding width; key `proj.{0,2}`."""

    def __init__(self, ndim: int, in_chans: int, hidden: int, embed_dim: int, patch_size: int, act: str) -> None:
        super().__init__()
        self.proj = nn.Sequential(conv(ndim, in_chans, hidden, patch_size), activation(act), conv(ndim, hidden, embed_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class TimeAggregator(nn.Module):
    """Contract the frame axis: sum_t (x_t * cos(t * gamma)) @ W_t, t = linspace(0, 1, T) ('exp_mlp'), or without cos ('mlp')."""

    def __init__(self, n_timesteps: int, dim: int, kind: str = "exp_mlp") -> None:
        super().__init__()
        self.kind = kind
        self.w = nn.Parameter(initial(lambda: torch.randn(n_timesteps, dim, dim) / (n_timesteps * math.sqrt(dim)),
                                      n_timesteps, dim, dim))
        if kind == "exp_mlp":
            self.gamma = nn.Parameter(initial(lambda: torch.pow(2.0, torch.linspace(-10, 10, dim)), dim).unsqueeze(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D, *S) -> (B, D, *S)."""
        if self.kind == "exp_mlp":
            t = torch.linspace(0.0, 1.0, x.shape[1], device=x.device, dtype=torch.float32).unsqueeze(-1)
            t_embed = torch.cos(t * self.gamma.float()).to(x.dtype)  # (T, D)
            x = x * t_embed.view(*t_embed.shape, *([1] * (x.ndim - 3)))
        return torch.einsum("btc...,tcd->bd...", x, self.w.to(x.dtype))


class AFNOMixer(nn.Module):
    """Adaptive Fourier neural operator mixing over the latent grid, with block-diagonal complex heads.

    rfftn (ortho) over the spatial axes; on the kept modes a complex two-layer MLP per head (activation on real
    and imaginary parts separately, with biases); other modes are zeroed; irfftn; the input is added back.
    Weights `w1, b1, w2, b2` are stacked (real, imaginary) on their first axis. The spectral part always runs in
    float32, also under autocast.
    """

    def __init__(self, ndim: int, dim: int, n_blocks: int, modes: Sequence[int], act: str, hidden_factor: int = 1) -> None:
        super().__init__()
        if dim % n_blocks:
            raise ValueError(f"width {dim} must be divisible by n_blocks {n_blocks}")
        self.ndim = ndim
        self.n_blocks = n_blocks
        self.block_size = dim // n_blocks
        self.modes = tuple(int(m) for m in modes)
        if len(self.modes) != ndim:
            raise ValueError(f"need one mode count per spatial axis ({ndim}), got {self.modes}")
        self.act = activation(act)
        hidden = self.block_size * hidden_factor
        scale = 1.0 / (self.block_size * self.block_size * hidden_factor)
        size = self.block_size
        self.w1 = nn.Parameter(initial(lambda: scale * torch.rand(2, n_blocks, size, hidden),
                                       2, n_blocks, size, hidden))
        self.b1 = nn.Parameter(initial(lambda: scale * torch.rand(2, n_blocks, hidden), 2, n_blocks, hidden))
        self.w2 = nn.Parameter(initial(lambda: scale * torch.rand(2, n_blocks, hidden, size),
                                       2, n_blocks, hidden, size))
        self.b2 = nn.Parameter(initial(lambda: scale * torch.rand(2, n_blocks, size), 2, n_blocks, size))

    def _complex_linear(self, z: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Block-diagonal complex affine map on z = (2=re/im, B, *K, heads, i) -> (2, B, *K, heads, o)."""
        p = torch.einsum("kb...ni,lnio->klb...no", z, w)  # all four real/imaginary products in one contraction
        real = p[0, 0] - p[1, 1]
        imag = p[1, 0] + p[0, 1]
        bias = b.view(2, *([1] * (self.ndim + 1)), *b.shape[1:])
        return torch.stack((real, imag), dim=0) + bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, *S) -> (B, C, *S), returning x + spectral_mix(x)."""
        in_dtype = x.dtype
        with torch.autocast(device_type=x.device.type, enabled=False):
            xl = x.float().movedim(1, -1)  # (B, *S, C)
            sizes = tuple(xl.shape[1:-1])
            axes = tuple(range(1, self.ndim + 1))
            spec = torch.fft.rfftn(xl, dim=axes, norm="ortho")  # (B, *K, C)
            full = tuple(spec.shape[1:-1])
            kept = tuple(min(m, k) for m, k in zip(self.modes, full))
            if kept != full:
                spec = spec[(slice(None), *(slice(0, k) for k in kept))]
            z = torch.stack((spec.real, spec.imag), dim=0)
            z = z.reshape(*z.shape[:-1], self.n_blocks, self.block_size)
            z = self._complex_linear(z, self.w1.float(), self.b1.float())
            z = self.act(z)
            z = self._complex_linear(z, self.w2.float(), self.b2.float())
            z = z.flatten(-2)  # (2, B, *K_kept, C)
            if kept != full:
                pad: list[int] = [0, 0]
                for k_full, k_kept in reversed(list(zip(full, kept))):
                    pad += [0, k_full - k_kept]
                z = F.pad(z, pad)
            out = torch.fft.irfftn(torch.complex(z[0], z[1]), s=sizes, dim=axes, norm="ortho")
            out = (out + xl).movedim(-1, 1)
        return out.to(in_dtype)


class Block(nn.Module):
    """x + MLP(GN2(AFNO(GN1(x)))), GroupNorm with 8 groups; the mixer adds back its own normalised input."""

    def __init__(self, ndim: int, dim: int, n_blocks: int, modes: Sequence[int], mlp_hidden: int, act: str,
                 norm_groups: int = 8) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(norm_groups, dim)
        self.filter = AFNOMixer(ndim, dim, n_blocks, modes, act)
        self.norm2 = nn.GroupNorm(norm_groups, dim)
        self.mlp = nn.Sequential(conv(ndim, dim, mlp_hidden), activation(act), conv(ndim, mlp_hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm2(self.filter(self.norm1(x))))
