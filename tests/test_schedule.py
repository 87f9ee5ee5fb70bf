"""The one-cycle schedule builds for every step count (5 steps at 20 % warm-up used to raise ZeroDivisionError inside
torch) and is torch's own schedule, value for value, wherever torch could build it."""

from __future__ import annotations

import math

import pytest
import torch

from dpot_train.core.config import TrainConfig
from dpot_train.run.launch import check_schedule
from dpot_train.train.schedule import one_cycle


def _lrs(steps: int, pct: float, ours: bool) -> list[float]:
    cfg = TrainConfig()
    cfg.optim.warmup_pct = pct
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr)
    if ours:
        sched = one_cycle(opt, steps, cfg.optim)
    else:
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=cfg.optim.lr, total_steps=steps, pct_start=pct, anneal_strategy="cos", cycle_momentum=False,
            div_factor=cfg.optim.div_factor, final_div_factor=cfg.optim.final_div_factor)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(("steps", "pct"), [(5, 0.2), (10, 0.1), (4, 0.25), (2, 0.5)])
def test_a_warm_up_ending_at_step_0_builds_as_the_limit_of_nearby_fractions(steps: int, pct: float) -> None:
    cfg = TrainConfig(steps=steps)
    cfg.optim.warmup_pct = pct
    check_schedule(cfg)  # raised "the one-cycle schedule cannot be built" before
    lrs = _lrs(steps, pct, ours=True)
    assert all(math.isfinite(v) for v in lrs)
    assert lrs[0] == pytest.approx(cfg.optim.lr / cfg.optim.div_factor)
    assert lrs == pytest.approx(_lrs(steps, pct * (1 + 1e-7), ours=False), rel=1e-5)
    assert lrs[1:] == sorted(lrs[1:], reverse=True) and max(lrs) <= cfg.optim.lr


@pytest.mark.parametrize("steps", [1, 3, 6, 20, 101])
@pytest.mark.parametrize("pct", [0.05, 0.2, 0.3])
def test_elsewhere_the_schedule_is_torchs_own(steps: int, pct: float) -> None:
    if float(pct * steps) - 1 == 0:
        pytest.skip("torch cannot build this one")
    assert _lrs(steps, pct, ours=True) == _lrs(steps, pct, ours=False)
