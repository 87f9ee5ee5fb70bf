"""Entry point of one training process under torchrun: `python -m dpot_train.run.worker --config RUN_DIR/config.yaml`.

torchrun starts workers in their own sessions, so a SIGKILL of the launcher would leave them running; a watchdog
thread ends this process as soon as its parent is gone, so that a killed launch stops writing into RUN_DIR.
A problem the user can act on (full disk, damaged checkpoints, data changed under the run) is one `error:` line and
exit code REPORTED; dpot_train.run.torchrun then adds nothing to it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from dpot_train.core.config import TrainConfig, load_config

if TYPE_CHECKING:
    from dpot_train.integrations.trackers import Trackers

REPORTED = 2  # exit code of a worker that printed its one-line error (or left it to rank 0)
PEER_FAILED = 3  # exit code of a worker stopped by another process's failure; that process says why


def _reported_errors() -> tuple[type[BaseException], ...]:
    """Exceptions whose message is the whole story: checkpoint, run-folder and data problems."""
    from dpot_format.errors import FormatError
    from dpot_train.core.checkpoint import (CheckpointError, CheckpointWriteError, RunDirError,
                                            UnreadableCheckpointsError)

    from dpot_train.core.distributed import CollectiveError
    from dpot_train.evaluation.evaluate import ResultWriteError

    return (CheckpointWriteError, UnreadableCheckpointsError, CheckpointError, RunDirError, FormatError, CollectiveError,
            ResultWriteError)


def _watch_parent(interval: float = 0.2) -> None:
    parent = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=loop, name="parent-watchdog", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """Parse args, run dpot_train.train.trainer.train, shut the process group down."""
    ap = argparse.ArgumentParser(prog="python -m dpot_train.run.worker", description=__doc__)
    ap.add_argument("--config", required=True, help="run config YAML (RUN_DIR/config.yaml)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in RUN_DIR")
    ap.add_argument("--checksums-verified", action="store_true",
                    help="the launcher already verified shard sha256s: check sizes only")
    args = ap.parse_args(argv)
    _watch_parent()
    cfg = load_config(args.config)
    from dpot_train.core.threads import ThreadsError, apply_threads

    try:
        threads = apply_threads(cfg.data.num_workers)  # before any torch work: the run's intra-op thread count
    except ThreadsError as exc:  # the same environment on every rank: rank 0 says it
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return REPORTED
    if int(os.environ.get("RANK", "0")) == 0:
        print(threads.line(), flush=True)
    from dpot_train.core import distributed as D
    from dpot_train.train.run_plan import load_plan
    from dpot_train.train.trainer import train

    tracker = _open_trackers(cfg, args.resume)
    ended = False  # the tracker runs are marked failed unless training and its evaluation end well
    try:
        plan = load_plan(Path(args.config).parent, cfg.to_dict())  # written by launch beside config.yaml
        summary = train(cfg, resume=args.resume, verify_checksums=False if args.checksums_verified else None,
                        plan=plan, tracker=tracker)
        if tracker is not None and "eval" in summary:  # eval.json's numbers at the final step, as TensorBoard has
            from dpot_train.train.log import eval_scalars

            tracker.log(eval_scalars(summary["eval"]), int(summary["step"]))
        ended = True
    except Exception as exc:  # noqa: BLE001 - a reported error or a download that kept failing: one line
        if isinstance(exc, D.CollectiveError):  # every rank stopped on it together: rank 0 says it once, and the
            D.barrier()  # group ends on all ranks together (a peer's transport torn down mid-talk aborts a rank)
            if int(os.environ.get("RANK", "0")) != 0:
                return REPORTED
        line = fetch_failure(exc) or (" ".join(str(exc).split()) if isinstance(exc, _reported_errors()) else None)
        if line is None:
            if D.peer_failed(exc):  # another rank failed and reports it; a traceback here would only bury that
                return PEER_FAILED
            raise
        print(f"error: {line}", file=sys.stderr, flush=True)
        return REPORTED
    finally:
        D.shutdown()
        if tracker is not None:
            tracker.finish(failed=not ended)
    if int(os.environ.get("RANK", "0")) == 0:
        print(closing_lines(cfg.out, int(summary["step"]), "eval" in summary), flush=True)
    return 0


def _open_trackers(cfg: TrainConfig, resume: bool) -> "Trackers | None":
    """Rank 0's experiment trackers (dpot_train.integrations.trackers.Trackers) when the run names any, else None."""
    if not cfg.tracker or int(os.environ.get("RANK", "0")) != 0:
        return None
    from dpot_train.integrations.trackers import open_trackers

    return open_trackers(cfg, Path(cfg.out), resume)


def closing_lines(run: str, step: int, evaluated: bool) -> str:
    """Where a finished run's results are, and how to look at them."""
    from dpot_train.core.checkpoint import checkpoint_path

    run_dir = os.path.normpath(run)
    lines = [f"results in {run_dir}/:",
             f"  checkpoints/   {checkpoint_path(Path(run_dir), step).name} (the newest; `dpot-train evaluate` "
             "and `launch --resume` take it)"]
    if evaluated:
        lines.append("  eval.json      one-step and rollout L2RE per dataset, model vs persistence")
    lines += ["  metrics.jsonl  loss, learning rate and gradient norm per logged step",
              f"  tb/            TensorBoard: tensorboard --logdir {os.path.join(run_dir, 'tb')}"]
    return "\n".join(lines)
def fetch_failure(exc: BaseException) -> str | None:
    """The one-line message of a FetchError or CacheError behind `exc` (raised in a loader thread or worker process),
    else None."""
    from dpot_train.data.cache import CacheError
    from dpot_train.data.remote_fetch import FetchError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (FetchError, CacheError)):
            lines = [ln for ln in str(seen).splitlines() if ln.strip()]  # a worker process's error carries its traceback
            last = lines[-1] if lines else type(seen).__name__
            return last.split(f"{type(seen).__name__}: ", 1)[-1]
        seen = seen.__cause__ or seen.__context__
    return None


def exit_worker(code: int) -> None:
    """Exit with `code`. A worker that failed has said why (or left it to rank 0), destroyed its process group and
    closed its trackers: it then leaves without the interpreter's and the C++ runtime's teardown, where gloo's
    objects, torn down while a peer is still connected, abort the process now and then ("terminate called without
    an active exception", SIGABRT: 1 run in 25 of tests/test_train_stops.py's stop), which buries the one-line error
    under torchrun's traceback of a crashed rank."""
    if code == 0:
        sys.exit(0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_worker(main())
