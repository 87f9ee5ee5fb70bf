"""The example run configs shipped in dpot_train/configs load, name real presets and keep the paper's recipe."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from dpot_train.core.config import load_config
from dpot_train.model import build_model

CONFIGS = resources.files("dpot_train") / "configs"
NTRAIN = [1000, 9800, 1000, 9000, 9000, 9000, 9000, 900, 900, 6500, 3100, 9000]
WEIGHTS = {"ti": [8, 2, 8, 1, 1, 1, 1, 20, 20, 1, 3, 1], "l": [8, 2, 8, 1, 1, 1, 1, 15, 20, 1, 3, 1]}


def _names() -> list[str]:
    return sorted(p.name for p in CONFIGS.iterdir() if p.name.endswith(".yaml"))


def test_one_config_per_preset_and_the_demo() -> None:
    assert _names() == ["demo.yaml", "finetune-2d.yaml", "finetune-3d.yaml", "pretrain-h.yaml", "pretrain-l.yaml",
                        "pretrain-m.yaml", "pretrain-s.yaml", "pretrain-ti.yaml"]


@pytest.mark.parametrize("name", _names())
def test_config_loads_and_builds_its_model(name: str) -> None:
    cfg = load_config(Path(str(CONFIGS / name)))
    model = build_model(cfg.model, device="meta")
    assert model.num_parameters() > 0
    if name.startswith("pretrain-"):
        size = name[len("pretrain-"):-len(".yaml")]
        assert cfg.model.lower() == size
        assert (cfg.batch_size, cfg.optim.lr, tuple(cfg.optim.betas), cfg.optim.weight_decay, cfg.optim.warmup_pct,
                cfg.data.noise) == (160, 1e-3, (0.9, 0.9), 1e-6, 0.2, 5e-4)
        weights = WEIGHTS.get(size, [1] * 12)
        assert cfg.steps == sum(n * w for n, w in zip(NTRAIN, weights)) * 1000 // 160  # 1000 epochs at batch 160
