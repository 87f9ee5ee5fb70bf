"""Thread counts of one training or evaluation process, chosen from the cores it has, so that the processes of a node
and their loader workers do not oversubscribe the cores (torch's default for a lone process is one intra-op thread
per core, whatever else runs beside it).

The rule (docs/training.md): cores = the CPUs this process may run on (os.sched_getaffinity); per process =
max(1, cores // processes on this node); torch intra-op threads = max(1, per process - loader workers - 1). Each
loader worker (thread or process) keeps a core busy while the step runs, and one core is left to the rest of the
process (Python between ops, the loader's reads without workers, gloo's threads, the torchrun agent): an OpenMP team
waits for its slowest thread at every op, so a team that needs every core stalls whenever anything else runs
(benchmarks/RESULTS.md: 2 threads ran 6-7x slower than 1 on a shared 2-core machine). A user's OMP_NUM_THREADS
wins. torchrun sets OMP_NUM_THREADS=1 itself when it starts several processes; dpot_train.run.torchrun records the
launcher's own value (or its absence) in USER_OMP_ENV first, so that only a value the user gave counts as theirs.
Only thread counts change: a run with the same counts gives the same numbers bit for bit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

OMP_ENV = "OMP_NUM_THREADS"
USER_OMP_ENV = "DPOT_USER_OMP_NUM_THREADS"  # the launcher's OMP_NUM_THREADS ("" when unset), before torchrun's
RESERVED = 1  # cores per process left to everything but torch's intra-op threads


class ThreadsError(ValueError):
    """OMP_NUM_THREADS holds something other than a thread count."""


@dataclass(frozen=True)
class ThreadChoice:
    """What one process runs with, and why."""

    intra_op: int  # torch.set_num_threads
    cores: int  # CPUs this process may run on
    processes: int  # training processes on this node
    loader_workers: int  # the loader's workers (threads or processes) per training process
    user_value: int | None  # the user's OMP_NUM_THREADS, which wins; None when unset

    def line(self) -> str:
        """The one line rank 0 prints in the run's log."""
        why = (f"{OMP_ENV}={self.user_value} (set by the user)" if self.user_value is not None else
               f"max(1, {self.cores} cores // {self.processes} process(es) - {self.loader_workers} loader worker(s) - "
               f"{RESERVED}); "
               f"{OMP_ENV} overrides it")
        return f"threads: torch intra-op {self.intra_op} per process, loader workers {self.loader_workers}: {why}"


applied: ThreadChoice | None = None  # this process's choice, once apply_threads ran (the run's TensorBoard text)


def user_threads(env: Mapping[str, str]) -> int | None:
    """The thread count the user asked for in OMP_NUM_THREADS (the launcher's value when dpot_train.run.torchrun
    recorded it), None when unset. OpenMP's nested form "4,2" gives the outer count."""
    raw = env[USER_OMP_ENV] if USER_OMP_ENV in env else env.get(OMP_ENV, "")
    raw = raw.strip()
    if not raw:
        return None
    head = raw.split(",")[0].strip()
    if not head.isdigit() or int(head) < 1:
        raise ThreadsError(f"{OMP_ENV}={raw!r}: expected a positive integer thread count")
    return int(head)


def choose_threads(cores: int, processes: int, loader_workers: int, user_value: int | None) -> ThreadChoice:
    """The rule: the user's count if given, else max(1, max(1, cores // processes) - loader_workers - 1)."""
    per_process = max(1, max(1, cores) // max(1, processes))
    intra = user_value if user_value is not None else max(1, per_process - max(0, loader_workers) - RESERVED)
    return ThreadChoice(intra, cores, max(1, processes), max(0, loader_workers), user_value)


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask: taskset, cgroups cpusets, a scheduler's allocation)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


def apply_threads(loader_workers: int, env: Mapping[str, str] | None = None) -> ThreadChoice:
    """Choose this process's counts (processes per node from torchrun's LOCAL_WORLD_SIZE, 1 without torchrun) and
    set torch's intra-op threads to them."""
    import torch

    env = os.environ if env is None else env
    choice = choose_threads(available_cores(), int(env.get("LOCAL_WORLD_SIZE", "1") or 1), loader_workers,
                            user_threads(env))
    if torch.get_num_threads() != choice.intra_op:
        torch.set_num_threads(choice.intra_op)
    global applied
    applied = choice
    return choice
