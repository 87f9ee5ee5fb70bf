"""dpot_train data path and training pieces that need no shards: plans, partitions, windows, noise, loss, schedule,
checkpoints, config."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.core.checkpoint import latest_checkpoint, list_checkpoints, prune, rng_state, save_atomic, set_rng_state
from dpot_train.core.config import TrainConfig, apply_overrides, load_config, save_config
from dpot_train.data.datasets import DataError
from dpot_train.data.mixture import parse_mixture, resolve_weights, visit_counts
from dpot_train.data.stream import epoch_plan, rank_slice
from dpot_train.data.windows import inject_noise, model_view, split_window, to_model_layout, window_start
from dpot_train.core.metrics import l2re, one_step, persistence, predicted_entries, relative_l2_loss, rollout
from dpot_train.train.trainer import build_optimizer


# --- mixture and epoch plans ------------------------------------------------------------------------------------

def test_visit_counts_balance_datasets_independent_of_size() -> None:
    counts = visit_counts({"big": 90, "small": 10}, {"big": 1.0, "small": 1.0})
    assert counts == {"big": 50, "small": 50}
    counts = visit_counts({"big": 90, "small": 10}, {"big": 9.0, "small": 1.0})
    assert counts == {"big": 90, "small": 10}  # weights proportional to sizes: a plain pass over everything
    assert visit_counts({"a": 5, "b": 1000}, {"a": 1e-6, "b": 1.0})["a"] == 1  # a weighted set is never empty
    assert visit_counts({"a": 5, "b": 7}, {"a": 0.0, "b": 1.0}) == {"a": 0, "b": 7}  # weight 0: left out


def test_epoch_plan_single_dataset_is_a_permutation_that_changes_per_epoch() -> None:
    p0 = epoch_plan(["ns"], [17], [17], seed=3, epoch=0)
    p1 = epoch_plan(["ns"], [17], [17], seed=3, epoch=1)
    assert sorted(p0[:, 1].tolist()) == list(range(17)) == sorted(p1[:, 1].tolist())
    assert p0[:, 1].tolist() != p1[:, 1].tolist()
    assert np.array_equal(p0, epoch_plan(["ns"], [17], [17], seed=3, epoch=0))  # deterministic
    assert not np.array_equal(p0, epoch_plan(["ns"], [17], [17], seed=4, epoch=0))


def test_epoch_plan_weighted_rule_visits_each_trajectory_q_or_q_plus_one_times() -> None:
    sizes, visits = [6, 9], [8, 8]
    plan = epoch_plan(["a", "b"], sizes, visits, seed=0, epoch=2)
    assert len(plan) == 16
    for k, (n, v) in enumerate(zip(sizes, visits)):
        c = collections.Counter(plan[plan[:, 0] == k, 1].tolist())
        assert sum(c.values()) == v
        q = v // n
        assert all(q <= c.get(i, 0) <= q + 1 for i in range(n)), c


def test_rank_slices_tile_the_global_batch() -> None:
    got = [list(rank_slice(40, 12, 3, r)) for r in range(3)]
    assert got == [list(range(40, 44)), list(range(44, 48)), list(range(48, 52))]
    with pytest.raises(ValueError, match="not divisible"):
        rank_slice(0, 10, 4, 0)


def test_parse_mixture_forms_and_errors(tmp_path: Path) -> None:
    f = tmp_path / "mix.yaml"
    f.write_text("ns-1e-3: 1.0\npdebench-swe: 2\n")
    assert parse_mixture(str(f)) == {"ns-1e-3": 1.0, "pdebench-swe": 2.0}
    f.write_text("weights:\n  a: 0.5\n")
    assert parse_mixture(str(f)) == {"a": 0.5}
    assert parse_mixture("a=1, b=3") == {"a": 1.0, "b": 3.0}
    with pytest.raises(DataError, match="weight of 'a' must be a number from 0 to"):
        parse_mixture({"a": -1})
    with pytest.raises(DataError, match="not a file"):
        parse_mixture("no/such/mixture.yaml")
    with pytest.raises(DataError, match=r"absent from the given manifests: \['zz'\]; the manifests hold: \['a', 'b'\]"):
        resolve_weights(["a", "b"], {"a": 1.0, "zz": 1.0})
    assert resolve_weights(["a", "b"], {"a": 1.0, "zz": 1.0}, partial=True) == {"a": 1.0, "b": 0.0}
    assert resolve_weights(["a", "b"], None) == {"a": 1.0, "b": 1.0}
    assert resolve_weights(["a", "b"], {"a": 2.0}) == {"a": 2.0, "b": 0.0}


# --- windows and noise --------------------------------------------------------------------------------------------

def test_window_layout_and_split() -> None:
    fields = np.arange(12 * 2 * 3 * 5, dtype=np.float32).reshape(12, 2, 3, 5)  # (T, C, Y, X)
    w = to_model_layout(fields)
    assert w.shape == (5, 3, 12, 2)  # (X, Y, T, C)
    assert w[4, 1, 7, 1] == fields[7, 1, 1, 4]
    assert np.array_equal(model_view(fields), w) and np.shares_memory(model_view(fields), fields)
    x, y = split_window(w, 10)
    assert x.shape == (5, 3, 10, 2) and y.shape == (5, 3, 2, 2)
    rng = np.random.default_rng(0)
    starts = {window_start(rng, 14, 11) for _ in range(200)}
    assert starts == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="does not fit"):
        window_start(rng, 10, 11)


def test_window_starts_in_plain_integers_are_numpys_draws() -> None:
    """seeded.window_start_at gives window_start(np.random.default_rng([seed, position, 0xD907]), ...) for seeds and
    positions of one to three 32-bit words, window ranges from 1 to 2**32 (Lemire's rejection included)."""
    from dpot_train.data import seeded

    assert seeded._drawer() is seeded.python_integer  # this numpy draws as the plain-integer code does
    rng = np.random.default_rng(11)
    cases = [(0, 0, 21, 11), (0, 1, 11, 11), (5, 2**32 - 1, 2**32 + 9, 10), (2**32, 7, 500, 3), (3, 2**70, 40, 1)]
    for _ in range(3000):
        bits = int(rng.integers(1, 70))
        frames = int(rng.integers(1, 5000))
        cases.append((int(rng.integers(0, 2**min(bits, 62))), int(rng.integers(0, 2**int(rng.integers(1, 62)))),
                      frames, int(rng.integers(1, frames + 1))))
    for seed, position, frames, length in cases:
        want = window_start(np.random.default_rng([seed, position, 0xD907]), frames, length)
        assert seeded.window_start_at(seed, position, frames, length) == want, (seed, position, frames, length)
    for high in (2**31 + 1, 3 * 2**30 + 7, 2**32 - 5, 2**32):  # ranges where Lemire's method rejects often
        for position in range(300):
            entropy = [9, position, 0xD907]
            assert seeded.python_integer(entropy, high) == seeded.numpy_integer(entropy, high), (high, position)
    with pytest.raises(ValueError, match="does not fit"):
        seeded.window_start_at(0, 0, 10, 11)


def test_window_starts_fall_back_to_numpy_when_its_draws_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpot_train.data import seeded

    seeded._drawer.cache_clear()
    monkeypatch.setattr(seeded, "python_integer", lambda entropy, high: 0)  # as if numpy's integers had changed
    try:
        assert seeded._drawer() is seeded.numpy_integer
        got = [seeded.window_start_at(4, p, 30, 11) for p in range(50)]
        assert got == [window_start(np.random.default_rng([4, p, 0xD907]), 30, 11) for p in range(50)]
        assert set(got) != {0}
    finally:
        seeded._drawer.cache_clear()


def test_noise_scale_follows_the_per_channel_norm_and_depends_only_on_the_position() -> None:
    rng = np.random.default_rng(0)
    x = torch.zeros(2, 32, 32, 10, 3)
    x[..., 0] = 2.0
    x[..., 1] = torch.from_numpy(rng.standard_normal((2, 32, 32, 10)).astype(np.float32))
    x[..., 2] = 1.0  # a padded channel filled with 1
    cv = torch.tensor([[True, True, False]] * 2)
    positions = torch.tensor([41, 42])
    d = inject_noise(x, 1e-3, positions, 7, None, cv) - x
    for c in (0, 1):
        expected = 1e-3 * torch.linalg.vector_norm(x[0, ..., c])
        assert abs(d[0, ..., c].std() / expected - 1) < 0.05
    assert torch.all(d[..., 2] == 0)  # padded channel: no noise
    # the noise of a sample is a function of (seed, position): the same alone or in another batch, differs otherwise
    alone = inject_noise(x[1:], 1e-3, positions[1:], 7, None, cv[1:]) - x[1:]
    assert torch.equal(alone, d[1:])
    assert not torch.equal(inject_noise(x[1:], 1e-3, torch.tensor([43]), 7, None, cv[1:]) - x[1:], alone)
    assert not torch.equal(inject_noise(x[1:], 1e-3, positions[1:], 8, None, cv[1:]) - x[1:], alone)
    mask = torch.zeros(2, 32, 32, dtype=torch.bool)
    mask[:, :, :16] = True
    d = inject_noise(x, 1e-3, positions, 7, mask, cv) - x
    assert torch.all(d[:, :, 16:] == 0) and torch.any(d[:, :, :16] != 0)
    assert inject_noise(x, 0.0, positions, 7) is x
    view = x.permute(0, 2, 1, 3, 4)  # a non-contiguous batch (as the loader delivers) works the same
    assert torch.equal(inject_noise(view, 1e-3, positions, 7, None, cv), inject_noise(view.contiguous(), 1e-3,
                                                                                      positions, 7, None, cv))


# --- loss and metrics ---------------------------------------------------------------------------------------------

def test_relative_l2_respects_channel_and_geometry_masks() -> None:
    true = torch.ones(2, 4, 4, 1, 3)
    pred = true.clone()
    pred[..., 1] = 3.0  # channel 1 wrong by a factor 3: relative error 2
    pred[:, 0, 0, :, 0] = 100.0  # a solid cell wrong in channel 0
    cv = torch.tensor([[True, False, True], [True, True, True]])
    mask = torch.ones(2, 4, 4, dtype=torch.bool)
    mask[:, 0, 0] = False
    loss = relative_l2_loss(pred, true, mask, cv)
    assert loss.item() == pytest.approx((0.0 + 2.0 / 3.0) / 2, rel=1e-6)  # sample 0 ignores channel 1
    all_loss = relative_l2_loss(pred, true, mask, cv, mode="all")
    err00 = math.sqrt(99.0 ** 2) / math.sqrt(16)
    assert all_loss.item() == pytest.approx((err00 + 2.0 + 0.0) / 3, rel=1e-5)
    with pytest.raises(ValueError, match="unknown loss mode"):
        relative_l2_loss(pred, true, mask, cv, mode="sum")


def test_rollout_and_one_step_with_persistence() -> None:
    t = torch.arange(15, dtype=torch.float32) + 1.0
    frames = t.view(1, 1, 1, 15, 1).expand(2, 3, 3, 15, 1).contiguous()
    roll = rollout(persistence, frames, 10, 5)
    assert roll.shape == (2, 3, 3, 5, 1) and torch.all(roll == 10.0)
    one = one_step(persistence, frames, 10, 5)
    assert one[0, 0, 0, :, 0].tolist() == [10.0, 11.0, 12.0, 13.0, 14.0]
    true = frames[:, :, :, 10:]
    err = l2re(roll, true, None, None)
    expected = math.sqrt(sum((10 - v) ** 2 for v in range(11, 16))) / math.sqrt(sum(v * v for v in range(11, 16)))
    assert err.shape == (2,) and err[0].item() == pytest.approx(expected, rel=1e-6)

    def two_at_once(w: torch.Tensor) -> torch.Tensor:  # a predictor that emits 2 frames per call
        return torch.cat([w[:, :, :, -1:] + 1, w[:, :, :, -1:] + 2], dim=3)

    assert rollout(two_at_once, frames, 10, 5)[0, 0, 0, :, 0].tolist() == [11.0, 12.0, 13.0, 14.0, 15.0]


def test_rollout_never_feeds_back_padded_channels_or_solid_cells() -> None:
    frames = torch.ones(1, 4, 4, 12, 2)  # channel 1 is padding (fill 1.0)
    seen: list[torch.Tensor] = []

    def garbage_outside(w: torch.Tensor) -> torch.Tensor:  # untrained outputs: garbage where the loss never looks
        seen.append(w.clone())
        out = w[:, :, :, -1:].clone()
        out[..., 1] = 123.0
        out[:, 0, 0] = -7.0
        return out

    mask = torch.ones(1, 4, 4, dtype=torch.bool)
    mask[:, 0, 0] = False
    keep = predicted_entries(mask, torch.tensor([[True, False]]), frames[:, :, :, :1])
    roll = rollout(garbage_outside, frames, 10, 2, keep)
    assert torch.all(roll[..., 1] == 1.0) and torch.all(roll[:, 0, 0] == 1.0)
    assert all(torch.all(w == 1.0) for w in seen)  # the second call saw carried-over values, not garbage
    assert torch.all(one_step(garbage_outside, frames, 10, 2, keep) == 1.0)
    assert torch.all(rollout(garbage_outside, frames, 10, 2)[:, 1:, :, :, 1] == 123.0)  # without keep: raw outputs


# --- optimiser, schedule, checkpoints, config -----------------------------------------------------------------

def test_optimizer_and_one_cycle_do_not_cycle_beta1() -> None:
    model = torch.nn.Linear(4, 4)
    cfg = TrainConfig(steps=50)
    opt, sched = build_optimizer(model, cfg)
    g = opt.param_groups[0]
    assert g["betas"] == (0.9, 0.9) and g["weight_decay"] == 1e-6
    lrs, betas = [], []
    for _ in range(50):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
        betas.append(opt.param_groups[0]["betas"][0])
    peak = int(np.argmax(lrs))
    assert 8 <= peak <= 10  # 20% warm-up of 50 steps
    assert max(lrs) == pytest.approx(1e-3)
    assert lrs[-2] == pytest.approx(1e-3 / 1e4 / 1e4)  # the lr of the last of the 50 steps
    assert set(betas) == {0.9}


def test_atomic_checkpoints_prune_and_skip_damaged(tmp_path: Path) -> None:
    d = tmp_path / "checkpoints"
    for step in (2, 4, 6):
        save_atomic({"format": "dpot-train-checkpoint/1", "step": step, "w": torch.full((3,), float(step))},
                    d / f"step-{step:08d}.pt")
    (d / ".step-00000008.pt.tmp-123").write_bytes(b"partial")  # an interrupted save is invisible
    assert [s for s, _ in list_checkpoints(d)] == [2, 4, 6]
    (d / "step-00000006.pt").write_bytes(b"garbage")  # damaged newest: fall back to the previous one
    path, ckpt = latest_checkpoint(d)
    assert path.name == "step-00000004.pt" and ckpt["step"] == 4
    assert [s for s, _ in list_checkpoints(d)] == [2, 4]  # the damaged 6 is kept aside, out of the resumed run's way
    prune(d, 1)  # keeps the newest complete one (4); the damaged 6 is never deleted
    assert [s for s, _ in list_checkpoints(d)] == [4]
    assert (d / "step-00000006.pt.damaged").read_bytes() == b"garbage"


def test_rng_state_round_trips_through_weights_only_load(tmp_path: Path) -> None:
    import random

    torch.manual_seed(5)
    np.random.seed(5)
    random.seed(5)
    state = rng_state()
    save_atomic({"rng": state}, tmp_path / "r.pt")
    a = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(torch.load(tmp_path / "r.pt", weights_only=True)["rng"])
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_config_yaml_round_trip_and_overrides(tmp_path: Path) -> None:
    cfg = apply_overrides(TrainConfig(), {"steps": 7, "optim.lr": 3e-4, "data.manifests": ["m"], "seed": None})
    assert cfg.steps == 7 and cfg.optim.lr == 3e-4 and cfg.data.manifests == ["m"] and cfg.seed == 0
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml")
    assert again == cfg and again.optim.betas == (0.9, 0.9)
    (tmp_path / "bad.yaml").write_text("stepz: 3\n")
    with pytest.raises(ValueError, match="unknown config key.*stepz"):
        load_config(tmp_path / "bad.yaml")
    with pytest.raises(ValueError, match="unknown config key 'optim.lrr'"):
        apply_overrides(cfg, {"optim.lrr": 1.0})


def test_the_checked_in_dpot_pretrain_mixture_parses() -> None:
    path = Path(__file__).resolve().parents[1] / "manifests" / "mixtures" / "dpot-pretrain.yaml"
    weights = parse_mixture(str(path))
    assert weights is not None and "fno-ns-v1e-3" in weights and len(weights) >= 10
    assert all(isinstance(w, float) and w > 0 for w in weights.values())
    with pytest.raises(DataError, match="absent from the given manifests"):  # the corpus needs all its manifests
        resolve_weights(["fno-ns-v1e-3"], weights)
