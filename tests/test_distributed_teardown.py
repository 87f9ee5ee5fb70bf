"""The process group is destroyed with nothing left holding it: a DistributedDataParallel wrapper, which lives in
reference cycles, is freed by `dpot_train.core.distributed.shutdown` while the interpreter is whole, not by a garbage
collection during its finalization (where its teardown aborted a rank after a run that had ended well)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import train_runs

SCRIPT = """
import gc, sys, weakref
import torch, torch.distributed as dist
from dpot_train.core import distributed as D

gc.disable()  # no collection but the one shutdown makes: the outcome does not depend on when the collector runs
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)

def train():  # as the trainer: the wrapper made, a step taken, its name deleted when the loop ends
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    ddp(torch.randn(2, 4)).sum().backward()
    ref = weakref.ref(ddp)
    del ddp
    return ref

ref = train()
alive_before = ref() is not None
D.barrier()
D.shutdown()
print(alive_before, ref() is not None, dist.is_initialized())
"""


def test_shutdown_frees_the_ddp_wrapper_before_destroying_the_group(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store")], capture_output=True, text=True,
                       timeout=300, env=train_runs.env(), cwd=train_runs.ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    alive_before, alive_after, initialized = r.stdout.split()
    assert alive_before == "True"  # held by its own cycles after the last name is gone: only a collection frees it
    assert (alive_after, initialized) == ("False", "False")
