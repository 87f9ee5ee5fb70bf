"""The one-cycle learning-rate schedule, built in one place for the trainer and for launch's check before torchrun."""

from __future__ import annotations

from typing import Any

import torch


def warmup_fraction(pct: float, steps: int) -> float:
    """`pct`, nudged up by one part in 10⁹ where its warm-up would end at step 0 (pct × steps = 1): torch's
    OneCycleLR divides by the warm-up's length in steps minus one there (5 steps at 20 % raised ZeroDivisionError). The nudged
    schedule is the limit of nearby fractions: lr / div_factor at step 0, then the cosine annealing from step 1."""
    return pct * (1 + 1e-9) if float(pct * steps) - 1 == 0 else pct


def one_cycle(opt: torch.optim.Optimizer, steps: int, optim: Any) -> torch.optim.lr_scheduler.OneCycleLR:
    """Cosine one-cycle over `steps` (at least 1) from the optimiser config's lr, warm-up fraction and divisors,
    leaving beta1 alone (no momentum cycling)."""
    steps = max(steps, 1)
    return torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=optim.lr, total_steps=steps, pct_start=warmup_fraction(optim.warmup_pct, steps),
        anneal_strategy="cos", cycle_momentum=False, div_factor=optim.div_factor,
        final_div_factor=optim.final_div_factor)
