"""3D DPOT: shapes, truncated modes, and initialisation from 2D weights."""

from __future__ import annotations

import pytest
import torch

from dpot_train.model import DPOT3D, build_model, dpot3d_from_2d, transfer_2d_to_3d


def test_3d_forward_shapes() -> None:
    model = build_model("tiny", spatial_dims=3, img_size=16, in_timesteps=3, out_timesteps=2, in_channels=5,
                        out_channels=5).eval()
    assert isinstance(model, DPOT3D)
    assert model.patch_embed.proj[0].weight.shape == (5 * 8 + 4, 5 + 4, 8, 8, 8)  # x, y, z, t coordinate channels
    x = torch.randn(2, 16, 16, 16, 3, 5)
    with torch.no_grad():
        pred, logits = model(x, return_logits=True)
    assert pred.shape == (2, 16, 16, 16, 2, 5)
    assert logits.shape == (2, 12)
    assert torch.isfinite(pred).all()
    with pytest.raises(ValueError, match=r"\(B, X, Y, Z, T, C\)"):
        model(torch.randn(2, 16, 16, 3, 5))


def spectral_support(kept: tuple[int, ...], full: tuple[int, ...]) -> torch.Tensor:
    """Boolean mask of the rfftn modes a mixer keeping `kept` may touch: the kept corner plus, on the last
    axis' zero-frequency plane, its Hermitian mirror (irfftn makes that plane conjugate-symmetric)."""
    mask = torch.zeros(full, dtype=torch.bool)
    mask[tuple(slice(0, k) for k in kept)] = True
    plane = mask[..., 0]
    mirrored = torch.roll(torch.flip(plane, dims=tuple(range(plane.ndim))), shifts=(1,) * plane.ndim,
                          dims=tuple(range(plane.ndim)))
    mask[..., 0] = plane | mirrored
    return mask


def test_3d_mixer_keeps_only_the_configured_modes() -> None:
    # Latent grid 8^3: rfftn gives (8, 8, 5) modes; keep 3 x 3 x 2 of them.
    model = build_model("tiny", spatial_dims=3, img_size=16, patch_size=2, modes=3, modes_z=2, in_timesteps=2)
    mixer = model.blocks[0].filter
    x = torch.randn(1, 64, 8, 8, 8)
    with torch.no_grad():
        delta = mixer(x) - x
    spec = torch.fft.rfftn(delta, dim=(2, 3, 4), norm="ortho").abs()
    assert spec[:, :, :3, :3, :2].min() > 0
    support = spectral_support((3, 3, 2), (8, 8, 5))
    assert spec[:, :, ~support].max() < 1e-5
    assert spec[:, :, 5:, :, 2:].max() < 1e-5  # negative x frequencies away from the mirror plane stay empty


def test_transferred_mixer_weights_equal_2d_source() -> None:
    torch.manual_seed(0)
    source = build_model("tiny", img_size=32, in_timesteps=4)
    target = dpot3d_from_2d(source, img_size=16)
    src, dst = source.state_dict(), target.state_dict()
    block_keys = [k for k in src if k.startswith("blocks.")]
    assert len(block_keys) == 2 * 12
    for key in block_keys + ["time_agg_layer.w", "time_agg_layer.gamma"]:
        expected = src[key].unsqueeze(-1) if key.endswith("mlp.0.weight") or key.endswith("mlp.2.weight") else src[key]
        assert torch.equal(dst[key], expected), key
    assert dst["blocks.0.mlp.0.weight"].shape == (64, 64, 1, 1, 1)
    # Dimension-specific parts are not copied.
    assert dst["pos_embed"].ndim == 5 and dst["patch_embed.proj.0.weight"].ndim == 5
    with torch.no_grad():
        assert target(torch.randn(1, 16, 16, 16, 4, 4)).shape == (1, 16, 16, 16, 1, 4)


def test_transfer_refuses_mismatched_sizes() -> None:
    source = build_model("tiny", img_size=32)
    target = build_model("tiny", spatial_dims=3, img_size=16, depth=3)
    with pytest.raises(ValueError, match="configs differ in depth: 2D 2 vs 3D 3"):
        transfer_2d_to_3d(source, target)
