"""Preset sizes equal the DPOT paper's parameter counts; configs round-trip; `model info` reports them."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from dpot_train.cli import app
from dpot_train.model import DPOTConfig, build_model, preset
from dpot_train.model_info import model_info

PAPER_COUNTS = {"Ti": 7.54e6, "S": 30.80e6, "M": 122.13e6, "L": 509.02e6, "H": 1031.1e6}


@pytest.mark.parametrize("name", list(PAPER_COUNTS))
def test_preset_parameter_counts_match_paper(name: str) -> None:
    model = build_model(name, device="meta")
    count = model.num_parameters()
    assert abs(count - PAPER_COUNTS[name]) / PAPER_COUNTS[name] < 1e-3, count
    assert all(p.device.type == "meta" for p in model.parameters())


def test_tiny_preset_equals_reference_constructor() -> None:
    cfg = preset("tiny")
    assert (cfg.embed_dim, cfg.depth, cfg.n_blocks, cfg.out_layer_dim, cfg.mlp_ratio) == (64, 2, 4, 32, 1)
    assert (cfg.patch_size, cfg.modes, cfg.in_timesteps, cfg.in_channels, cfg.img_size, cfg.n_cls) == (8, 32, 10, 4, 128, 12)
    assert build_model("tiny").num_parameters() == 242675


def test_config_roundtrip_and_validation() -> None:
    cfg = preset("S")
    assert DPOTConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match=r"unknown DPOTConfig keys \['embed_dims'\]"):
        DPOTConfig.from_dict({"embed_dims": 3})
    with pytest.raises(ValueError, match="embed_dim 100 must be divisible by n_blocks 8"):
        DPOTConfig(embed_dim=100, n_blocks=8)
    with pytest.raises(KeyError, match="unknown DPOT preset 'XL'"):
        preset("XL")


def test_forward_shapes_and_input_check() -> None:
    model = build_model("tiny", img_size=32, in_timesteps=3, out_timesteps=2).eval()
    with torch.no_grad():
        pred, logits = model(torch.randn(2, 32, 32, 3, 4), return_logits=True)
    assert pred.shape == (2, 32, 32, 2, 4) and logits.shape == (2, 12)
    with pytest.raises(ValueError, match=r"expects input \(B, X, Y, T, C\) = \('B', 32, 32, 3, 4\), got \(2, 32, 32, 5, 4\)"):
        model(torch.randn(2, 32, 32, 5, 4))


def test_model_info_json_for_L_agrees() -> None:
    result = CliRunner().invoke(app, ["model", "info", "L", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert abs(info["parameters"] - 509.02e6) / 509.02e6 < 1e-3
    assert info["parameters"] == sum(info["parameters_by_module"].values())
    assert info["weight_bytes"] == {"fp32": 4 * info["parameters"], "bf16": 2 * info["parameters"]}
    assert info["config"]["embed_dim"] == 1536 and info["config"]["depth"] == 24


def test_model_info_for_checkpoint(reference_dir) -> None:
    info = model_info(reference_dir / "dpot_tiny.pth")
    assert info["parameters"] == 242675
    assert info["checkpoint"] == {"tensors": 43, "values": 242675, "dtypes": ["float32"], "config_from": "weights"}
    result = CliRunner().invoke(app, ["model", "info", str(reference_dir / "dpot_tiny.pth")])
    assert result.exit_code == 0, result.output
    assert "parameters: 242,675" in result.output
    bad = CliRunner().invoke(app, ["model", "info", "nonexistent-thing"])
    assert bad.exit_code != 0 and "neither a preset" in bad.output


@pytest.mark.parametrize(
    "overrides",
    [
        {"normalize": True, "time_agg": "mlp", "img_size": 32},
        {"spatial_dims": 3, "img_size": 16, "in_timesteps": 3, "out_timesteps": 2, "mlp_ratio": 2.5},
        {"patch_size": 4, "img_size": 32, "in_channels": 3, "out_channels": 3, "n_cls": 5, "out_layer_dim": 16},
    ],
)
def test_config_is_inferred_from_weights(overrides: dict) -> None:
    from dpot_train.model import infer_config

    model = build_model("tiny", **overrides)
    assert infer_config(model.state_dict()) == model.config
    x = torch.randn(2, *([model.config.img_size] * model.config.spatial_dims), model.config.in_timesteps,
                    model.config.in_channels)
    pred = model(x)
    assert pred.shape == (*x.shape[:-2], model.config.out_timesteps, model.config.out_channels)
    assert torch.isfinite(pred).all()
