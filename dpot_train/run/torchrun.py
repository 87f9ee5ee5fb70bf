"""`python -m dpot_train.run.torchrun ARGS`: torch.distributed.run with ARGS, except that when a worker failed with a
problem it already reported in one line (exit code worker.REPORTED), torchrun's own report (log lines, a failure
table and a traceback) is left out and the launch exits with that code."""

from __future__ import annotations

import logging
import os
import sys

import signal

from dpot_train.core.threads import OMP_ENV, USER_OMP_ENV
from dpot_train.run.worker import PEER_FAILED, REPORTED


def main(argv: list[str]) -> int:
    """Run torchrun in this process (the launcher execs it, so signals still reach it directly)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # "sending SIGTERM to the other workers" and "failed (exitcode ...)": the failure table below repeats them
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    os.environ.setdefault(USER_OMP_ENV, os.environ.get(OMP_ENV, ""))  # before torchrun sets it for several processes
    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        codes = [f.exitcode for f in exc.failures.values()]
        # a worker reported its error in one line; the others stopped because of it (or were stopped by torchrun)
        if any(c in (REPORTED, PEER_FAILED) for c in codes) and \
                all(c in (REPORTED, PEER_FAILED, -signal.SIGTERM) for c in codes):
            return REPORTED
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
