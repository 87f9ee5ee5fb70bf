"""Re-exports of dpot_format.validate for `dpot-data verify` (the checks live there), plus the scheduler wiring."""

from __future__ import annotations

from typing import Callable

from dpot_data.scheduler import SchedulerOptions, scheduler_context
from dpot_format.validate import Item, Problem, as_json, summarise, validate_output  # noqa: F401 - re-export

Mismatch = Problem  # the former name of a problem


def verify_output(root: str, options: SchedulerOptions | None = None,
                  progress: Callable[[Item, list[Problem]], None] | None = None, rehash: bool = True) -> list[Problem]:
    """`validate_output` of the output folder (or URL) `root`, hashing on the chosen scheduler."""
    with scheduler_context(options or SchedulerOptions()) as runner:
        return validate_output(root, rehash=rehash, runner=runner, progress=progress)
