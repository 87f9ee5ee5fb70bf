"""The 2D DPOT network: input (B, X, Y, T, C), prediction (B, X, Y, T_out, C)."""

from __future__ import annotations

from .base import DPOTBase


class DPOT2D(DPOTBase):
    """DPOT on a 2D grid; parameter names equal the released checkpoints' keys (see `DPOTBase`)."""

    spatial_dims = 2
