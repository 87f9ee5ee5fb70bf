"""Time to first step: seconds from the start of `dpot-train launch` to the end of the run's first optimizer step,
in four parts that add up to it:

* checks: the launcher's work before torchrun (its start, imports, every check of the config, RUN_DIR and the
  data), the sha256 pass left out;
* hashing: the sha256 pass over local shards and Zarr arrays (`launch.check_outputs`, record consulted);
* start-up: from the hand-over to torchrun to the training loop (workers started, model built, checkpoint restored,
  loader ready);
* first batch: the first batch read and the first optimizer step (synchronised on CUDA).

The launcher hands its times to the workers in the environment (DPOT_LAUNCH_TIMING, JSON: its start and hand-over as
Unix times, the hashing seconds); rank 0 prints one line at its first step and records the parts on that step's
metrics.jsonl line (docs/training.md). Every process of a node reads one clock, so the differences hold.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any

ENV = "DPOT_LAUNCH_TIMING"
FIELDS = ("time_to_first_step_s", "time_to_first_step_checks_s", "time_to_first_step_hashing_s",
          "time_to_first_step_startup_s", "time_to_first_step_first_batch_s")

_noted: dict[str, float] = {}  # phase -> seconds, in the launcher's process


def note(phase: str, seconds: float) -> None:
    """Add `seconds` to a phase of this launch (launch.check_outputs notes its sha256 pass as "hashing")."""
    _noted[phase] = _noted.get(phase, 0.0) + max(0.0, float(seconds))


def process_start() -> float:
    """When this process started (Unix time): the moment the user's command began, imports included."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - no process table to ask: the first call's time is the best left
        return _FALLBACK


_FALLBACK = time.time()


def handover(now: float | None = None) -> str:
    """The value of DPOT_LAUNCH_TIMING for the workers, taken just before torchrun starts (launch.hand_over)."""
    return json.dumps({"start": process_start(), "exec": time.time() if now is None else now,
                       "hashing_s": _noted.get("hashing", 0.0)})


def from_env(environ: Mapping[str, str] | None = None) -> dict[str, float] | None:
    """The launcher's times from DPOT_LAUNCH_TIMING; None when absent or not what launch writes (a worker started
    some other way records no time to first step)."""
    text = (os.environ if environ is None else environ).get(ENV)
    try:
        got = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(got, dict) or set(got) != {"start", "exec", "hashing_s"}:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in got.values()):
        return None
    return {k: float(v) for k, v in got.items()}


def parts(launch: Mapping[str, float], loop_start: float, first_step: float) -> dict[str, float]:
    """The metrics.jsonl fields: the total and its four parts (seconds, rounded to ms; the parts add up to it)."""
    checks = launch["exec"] - launch["start"] - launch["hashing_s"]
    values = [checks, launch["hashing_s"], loop_start - launch["exec"], first_step - loop_start]
    rounded = [round(v, 3) for v in values]
    return dict(zip(FIELDS, [round(sum(rounded), 3), *rounded]))


def line(fields: Mapping[str, Any]) -> str:
    """The one line a launch prints at its first step."""
    total, checks, hashing, start, batch = (fields[k] for k in FIELDS)
    return (f"time to first step: {total:.1f} s (checks {checks:.1f} s, hashing {hashing:.1f} s, start-up "
            f"{start:.1f} s, first batch {batch:.1f} s)")


class FirstStep:
    """Rank 0's clock for the first optimizer step of this launch: `begin` as the loop starts, `end` after the step."""

    def __init__(self, launch: dict[str, float]) -> None:
        self.launch = launch
        self.loop_start = time.time()

    @classmethod
    def begin(cls, is_main: bool) -> "FirstStep | None":
        """A clock when this is rank 0 of a launch (DPOT_LAUNCH_TIMING set), else None."""
        launch = from_env() if is_main else None
        return cls(launch) if launch is not None else None

    def end(self, device: Any) -> dict[str, float]:
        """The fields, the first step's device work finished first (one synchronisation, on CUDA only)."""
        if getattr(device, "type", "cpu") == "cuda":
            import torch

            torch.cuda.synchronize(device)
        return parts(self.launch, self.loop_start, time.time())
