"""Entry point of one training process under torchrun: `python -m dpot_train.worker --config RUN_DIR/config.yaml`.

torchrun starts workers in their own sessions, so a SIGKILL of the launcher would leave them running; a watchdog
thread ends this process as soon as its parent is gone, so that a killed launch stops writing into RUN_DIR.
A problem the user can act on (full disk, damaged checkpoints, data changed under the run) is one `error:` line and
exit code REPORTED; dpot_train.torchrun then adds nothing to it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

from dpot_train.config import load_config

REPORTED = 2  # exit code of a worker that printed its one-line error


def _reported_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is the whole story: checkpoint, run-folder and data problems."""
    from dpot_format.errors import FormatError
    from dpot_train.checkpoint import CheckpointWriteError, RunDirError, UnreadableCheckpointsError
    from dpot_train.model.checkpoint import CheckpointError

    return CheckpointWriteError, UnreadableCheckpointsError, CheckpointError, RunDirError, FormatError


def _watch_parent(interval: float = 0.2) -> None:
    parent = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=loop, name="parent-watchdog", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Parse args, run dpot_train.trainer.train, shut the process group down."""
    ap = argparse.ArgumentParser(prog="python -m dpot_train.worker", description=__doc__)
    ap.add_argument("--config", required=True, help="run config YAML (RUN_DIR/config.yaml)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in RUN_DIR")
    ap.add_argument("--checksums-verified", action="store_true",
                    help="the launcher already verified shard sha256s: check sizes only")
    args = ap.parse_args(argv)
    _watch_parent()
    cfg = load_config(args.config)
    from dpot_train import distributed as D
    from dpot_train.run_plan import load_plan
    from dpot_train.trainer import train

    try:
        plan = load_plan(Path(args.config).parent, cfg.to_dict())  # written by launch beside config.yaml
        train(cfg, resume=args.resume, verify_checksums=False if args.checksums_verified else None, plan=plan)
    except _reported_errors() as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return REPORTED
    finally:
        D.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
