"""Fine-tuning from a checkpoint: each --load choice copies exactly its components (2D -> 3D: 1x1 conv weights
unsqueezed, as transfer_2d_to_3d), everything else keeps the fresh initialisation of the run's seed; the recipes as
configs; epochs converted to steps; the step-decay schedule."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import torch

from dpot_train.core.config import TrainConfig, load_config, resolve_epochs
from dpot_train.train.finetune import COMPONENTS, finetune_model, parse_components
from dpot_train.model import build_model, dpot3d_from_2d
from dpot_train.core.model_setup import data_overrides
from dpot_train.train.trainer import build_optimizer

CONFIGS = resources.files("dpot_train") / "configs"


@pytest.fixture(scope="module")
def released_2d(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """A released-format ({'model': state_dict}) 2D tiny checkpoint on a 32x32 grid, 4 channels, 4 input frames."""
    torch.manual_seed(123)
    model = build_model("tiny", img_size=32, in_timesteps=4)
    path = tmp_path_factory.mktemp("ckpt") / "tiny2d.pth"
    torch.save({"model": model.state_dict()}, path)
    return path, model


def _component(key: str) -> str:
    return next(name for name, prefixes in COMPONENTS.items() if key.startswith(prefixes))


def _fresh(fixed: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """The state a run with this seed starts from before anything is loaded (checkpoint architecture = tiny)."""
    torch.manual_seed(seed)
    return build_model("tiny", **fixed).state_dict()


@pytest.mark.parametrize("load, expected", [
    ("all", ["patch_embed", "pos", "blocks", "time_agg", "cls_head", "out"]),
    ("blocks", ["blocks"]),
    ("blocks,pos,time_agg", ["pos", "blocks", "time_agg"]),
    (["time_agg", "blocks"], ["blocks", "time_agg"]),
])
def test_2d_load_copies_exactly_the_named_components(released_2d, load, expected) -> None:
    path, source = released_2d
    fixed = data_overrides(4, (32, 32), 4, 1)
    torch.manual_seed(0)
    model, line = finetune_model(str(path), fixed, load)
    got, src, fresh = model.state_dict(), source.state_dict(), _fresh(fixed)
    assert got.keys() == src.keys() == fresh.keys()
    for key, value in got.items():
        want = src[key] if _component(key) in expected else fresh[key]
        assert torch.equal(value, want), key
    for name in set(map(_component, got)) - set(expected):  # really fresh: the checkpoint's values differ
        assert any(not torch.equal(got[k], src[k]) for k in got if _component(k) == name), name
    assert line.startswith(f"--init {path}: loaded {', '.join(expected)}; fresh:")
    assert "\n" not in line


@pytest.mark.parametrize("load", ["blocks", "blocks,time_agg", "all"])
def test_2d_checkpoint_on_3d_data_transfers_blocks_and_time_agg(released_2d, load) -> None:
    path, source = released_2d
    fixed = data_overrides(5, (12, 12, 12), 4, 1, res=16)  # 5 channels on a 16^3 grid: a new embedding and head
    assert fixed["spatial_dims"] == 3 and fixed["img_size"] == 16
    torch.manual_seed(0)
    model, line = finetune_model(str(path), fixed, load)
    assert model.config.spatial_dims == 3
    transferred = dpot3d_from_2d(source, img_size=16, in_channels=5, out_channels=5).state_dict()  # the model API
    got, src, fresh = model.state_dict(), source.state_dict(), _fresh(fixed)
    loaded = {"blocks"} | ({"time_agg"} if load != "blocks" else set())
    if load == "all":
        loaded.add("cls_head")  # linear layers: the same shapes in 2D and 3D
    for key, value in got.items():
        if _component(key) in loaded:
            expected = src[key].unsqueeze(-1) if value.ndim == src[key].ndim + 1 else src[key]
            assert torch.equal(value, expected), key
            if key in transferred and not key.startswith("cls_head"):
                assert torch.equal(value, transferred[key]), key
        else:
            assert torch.equal(value, fresh[key]), key
    assert got["blocks.0.mlp.0.weight"].shape[-3:] == (1, 1, 1)
    assert "(2D -> 3D transfer)" in line
    if load == "all":  # asked for, but another dimension and channel count: fresh, and the line says why
        assert "patch_embed (cannot load: patch_embed.proj.0.weight is" in line
        assert "pos (cannot load:" in line and "out (cannot load:" in line


def test_another_channel_count_reinitialises_embedding_and_head_only(released_2d) -> None:
    path, source = released_2d
    fixed = data_overrides(3, (32, 32), 4, 1)
    torch.manual_seed(0)
    model, line = finetune_model(str(path), fixed, "all")
    got, src, fresh = model.state_dict(), source.state_dict(), _fresh(fixed)
    for key, value in got.items():
        want = fresh[key] if _component(key) in ("patch_embed", "out") else src[key]
        assert torch.equal(value, want), key
    assert "loaded pos, blocks, time_agg, cls_head; fresh: patch_embed (cannot load:" in line


def test_another_grid_resamples_the_positional_embedding(released_2d) -> None:
    path, source = released_2d
    torch.manual_seed(0)
    model, _ = finetune_model(str(path), data_overrides(4, (64, 64), 4, 1), "blocks,pos")
    pos = model.state_dict()["pos_embed"]
    assert pos.shape == (1, 64, 8, 8)
    expected = torch.nn.functional.interpolate(source.pos_embed.detach(), size=(8, 8), mode="bicubic",
                                               align_corners=False)
    assert torch.equal(pos, expected)


def test_component_names_are_checked() -> None:
    assert parse_components("all") == list(COMPONENTS)
    assert parse_components("time_agg, blocks") == ["blocks", "time_agg"]
    assert parse_components("patch,out") == ["patch_embed", "out"]  # the reference's docstring name
    with pytest.raises(ValueError, match=r"--load 'blocks,mixer': expected all, or .*\(unknown: mixer\)"):
        parse_components("blocks,mixer")
    with pytest.raises(ValueError, match="expected all"):
        parse_components("")


def test_launch_checks_load_before_torchrun(released_2d) -> None:
    from dpot_train.run.launch import validate_config

    with pytest.raises(ValueError, match="--load blocks: names components of an --init checkpoint"):
        validate_config(TrainConfig(load="blocks"))
    with pytest.raises(ValueError, match="unknown: mixer"):
        validate_config(TrainConfig(init=str(released_2d[0]), load="mixer"))
    validate_config(TrainConfig.from_dict({"init": str(released_2d[0]), "load": ["blocks", "time_agg"]}))


def test_finetune_configs_hold_the_reference_values() -> None:
    two = load_config(Path(str(CONFIGS / "finetune-2d.yaml")))
    assert (two.data.res, two.model_overrides, two.optim.lr, two.optim.schedule, two.optim.warmup_pct, two.epochs,
            two.batch_size, two.data.noise, two.load, two.optim.optimizer, tuple(two.optim.betas),
            two.optim.weight_decay) == (128, {"patch_size": 8, "modes": 32}, 1e-3, "one_cycle", 40 / 200, 200, 32,
                                        0.0, "all", "adam", (0.9, 0.9), 1e-6)
    three = load_config(Path(str(CONFIGS / "finetune-3d.yaml")))
    assert (three.data.res, three.optim.optimizer, three.optim.weight_decay, tuple(three.optim.betas),
            three.optim.lr, three.optim.schedule, three.optim.decay_every_epochs, three.optim.decay_gamma,
            three.epochs, three.batch_size, three.model_overrides["modes_z"], three.load, three.data.noise) == \
        (64, "adam", 1e-6, (0.9, 0.9), 1e-3, "step", 100, 0.5, 500, 4, 8, "blocks,time_agg", 0.0)
    # the reference counts len(train_loader) = ceil(n / batch) steps per epoch: ns3d_pdb_M1_turb has 540
    resolved = resolve_epochs(three, 540)
    assert (resolved.steps, resolved.optim.decay_every) == (500 * 135, 100 * 135)
    assert resolve_epochs(two, 1000).steps == 200 * 32  # ceil(1000 / 32) = 32
    assert resolve_epochs(TrainConfig(steps=7), 1000).steps == 7  # no epochs: --steps stays


def test_step_schedule_halves_the_lr_every_decay_interval() -> None:
    cfg = TrainConfig.from_dict({"steps": 10, "optim": {"optimizer": "adam", "schedule": "step", "decay_every": 3,
                                                        "decay_gamma": 0.5, "lr": 1e-3}})
    model = torch.nn.Linear(2, 2)
    opt, sched = build_optimizer(model, cfg)
    assert isinstance(opt, torch.optim.Adam) and not isinstance(opt, torch.optim.AdamW)
    lrs = []
    for _ in range(7):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1e-3] * 3 + [5e-4] * 3 + [2.5e-4])
    with pytest.raises(ValueError, match="optim.schedule must be one of"):
        TrainConfig.from_dict({"optim": {"schedule": "cosine"}})


def test_downstream_benchmark_trains_the_checkpoints_architecture_from_scratch(released_2d, tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import downstream

    path, source = released_2d
    cfg = load_config(downstream.scratch_config(path, tmp_path / "scratch.yaml", t_in=4))
    assert cfg.data.t_in == 4 and cfg.init is None
    fixed = data_overrides(5, (16, 16, 16), 4, 1)
    scratch = build_model(cfg.model, **{**fixed, **cfg.model_overrides})
    torch.manual_seed(0)
    tuned, _ = finetune_model(str(path), fixed, "blocks", cfg.model_overrides)
    assert scratch.config == tuned.config  # the same network; only the starting weights differ
    assert scratch.config.replace(spatial_dims=2, img_size=32, in_channels=4, out_channels=4) == source.config
