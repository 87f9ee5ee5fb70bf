"""Rectangular grids, natively: DPOT (2D and 3D), FNO and UNet train on a 48x64 (16x24x32) grid as it is, DPOT's
positional embedding has the (H/p)x(W/p) patch grid, released square weights fine-tune on a rectangular grid with
their embedding resampled (bicubic, said in the summary line), the config records the grid as a shape and older
checkpoints that record one side still load; a grid a model cannot take is refused naming the nearest one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dpot_train.core.checkpoint import checkpoint_payload, load_pretrained
from dpot_train.train.finetune import finetune_model
from dpot_train.model import DPOTConfig, build_model, families, infer_config
from dpot_train.model.family_config import GridError
from dpot_train.core.model_setup import data_overrides, fresh_model


def _forward_backward(model: torch.nn.Module, grid: tuple[int, ...], t_in: int, channels: int = 4) -> torch.Tensor:
    """One forward and backward pass on a random batch of 2; every trainable parameter gets a finite gradient."""
    x = torch.randn(2, *grid, t_in, channels)
    pred = model(x)
    pred.square().mean().backward()
    for name, p in model.named_parameters():
        if p.requires_grad and not name.startswith("cls_head"):
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    return pred


def test_dpot_2d_trains_on_a_rectangular_grid() -> None:
    torch.manual_seed(0)
    model = fresh_model("tiny", {}, data_overrides(4, (48, 64), 3, 2))
    assert model.config.grid == (48, 64) and model.config.latent_grid == (6, 8)
    assert tuple(model.pos_embed.shape) == (1, 64, 6, 8)
    pred = _forward_backward(model, (48, 64), 3)
    assert pred.shape == (2, 48, 64, 2, 4)
    with pytest.raises(ValueError, match=r"expects input \(B, X, Y, T, C\) = \('B', 48, 64, 3, 4\), "
                                         r"got \(2, 64, 48, 3, 4\)"):
        model(torch.randn(2, 64, 48, 3, 4))


def test_dpot_3d_trains_on_a_non_cubic_grid() -> None:
    torch.manual_seed(0)
    model = fresh_model("tiny", {"patch_size": 8}, data_overrides(5, (16, 24, 32), 2, 1))
    assert model.config.spatial_dims == 3 and tuple(model.pos_embed.shape) == (1, 64, 2, 3, 4)
    assert _forward_backward(model, (16, 24, 32), 2, channels=5).shape == (2, 16, 24, 32, 1, 5)


@pytest.mark.parametrize("preset", ["fno-tiny", "unet-tiny"])
@pytest.mark.parametrize("grid", [(48, 64), (16, 24, 32)])
def test_baselines_train_on_rectangular_grids(preset: str, grid: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = fresh_model(preset, {}, data_overrides(4, grid, 3, 1))
    assert model.config.grid == grid
    assert _forward_backward(model, grid, 3).shape == (2, *grid, 1, 4)


def test_a_grid_the_model_cannot_take_names_the_nearest_one() -> None:
    with pytest.raises(GridError) as found:
        build_model("tiny", img_size=(50, 61))
    assert str(found.value) == ("invalid DPOTConfig: img_size 50x61: every side must be a multiple of patch_size 8; "
                                "the nearest such grid is 48x64")
    assert found.value.nearest == (48, 64)
    with pytest.raises(GridError, match="img_size 47x64: every side must be a multiple of patch_size 2; the nearest "
                                        "such grid is 48x64"):
        families.configure("fno-tiny", data_overrides(4, (47, 64), 3, 1), {"patch_size": 2})
    with pytest.raises(ValueError, match="modes2 4 exceeds the 3 frequencies of a 4-point axis"):
        families.configure("fno-tiny", data_overrides(4, (48, 4), 3, 1), {})  # modes per axis


def test_the_config_records_the_grid_as_a_shape_and_old_single_sides_still_load(tmp_path: Path) -> None:
    config = DPOTConfig(img_size=(48, 64), embed_dim=16, n_blocks=2, depth=1, in_timesteps=2)
    assert config.to_dict()["img_size"] == [48, 64]
    assert DPOTConfig.from_dict(config.to_dict()) == config
    assert DPOTConfig(img_size=[32, 32]) == DPOTConfig(img_size=32)  # a square grid is one config, however given
    assert families.resolve("fno-tiny", img_size=(48, 64)).to_dict()["img_size"] == [48, 64]
    torch.manual_seed(0)
    rect = build_model(config)
    path = tmp_path / "rect.pt"
    torch.save(checkpoint_payload(rect), path)
    assert tuple(load_pretrained(str(path)).pos_embed.shape) == (1, 16, 6, 8)
    assert infer_config(rect.state_dict()).img_size == (48, 64)  # released format: the grid from the embedding
    # a checkpoint written before grids were shapes: its config records one side
    square = build_model("tiny", img_size=32, in_timesteps=2)
    old = {**checkpoint_payload(square), "config": {**square.config.to_dict(), "img_size": 32}}
    torch.save(old, tmp_path / "old.pt")
    loaded = load_pretrained(str(tmp_path / "old.pt"))
    assert loaded.config.grid == (32, 32)
    x = torch.randn(1, 32, 32, 2, 4)
    assert torch.equal(loaded(x), square.eval()(x))


@pytest.fixture(scope="module")
def released_square(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """Released-format weights ({'model': state_dict}) of a square tiny model: 32x32, 4 channels, 4 input frames."""
    torch.manual_seed(7)
    model = build_model("tiny", img_size=32, in_timesteps=4).eval()
    path = tmp_path_factory.mktemp("released") / "square.pth"
    torch.save({"model": model.state_dict()}, path)
    return path, model


def test_released_square_weights_on_a_square_grid_are_the_square_model(released_square) -> None:
    path, square = released_square
    model, line = finetune_model(str(path), data_overrides(4, (32, 32), 4, 1), "all")
    x = torch.randn(2, 32, 32, 4, 4)
    assert torch.equal(model.eval()(x), square(x))
    assert "resampled" not in line


def test_released_square_weights_fine_tune_on_a_rectangular_grid(released_square) -> None:
    path, square = released_square
    model, line = finetune_model(str(path), data_overrides(4, (48, 64), 4, 1), "all")
    assert line == (f"--init {path}: loaded patch_embed, pos, blocks, time_agg, cls_head, out; fresh: nothing; "
                    "pos_embed resampled bicubic from the checkpoint's 4x4 latent grid to 6x8 (the 48x64 grid in "
                    "patches of 8)")
    expected = F.interpolate(square.pos_embed.detach(), size=(6, 8), mode="bicubic", align_corners=False)
    assert torch.equal(model.pos_embed.detach(), expected)
    for key, value in square.state_dict().items():  # everything else is the released weights as they are
        if key != "pos_embed":
            assert torch.equal(model.state_dict()[key], value), key
    assert _forward_backward(model.train(), (48, 64), 4).shape == (2, 48, 64, 1, 4)
