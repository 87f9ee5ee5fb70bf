"""Does the training loop keep a host-bound GPU step fed? The trainer's real loop over the real loader, with the model
step replaced by an emulated one: `--host-ms` of pure Python holding the GIL (a busy loop on the clock), then
`--device-ms` with the GIL released (time.sleep), as an eager CUDA step spends its time. Its bound is
batch / (host + device) samples/s; what the loop reaches against it says how much the loader takes from the step.

Run:  .venv/bin/python benchmarks/loop_bound.py                       # the H100 Ti step, batch 20: ~2 minutes
      .venv/bin/python benchmarks/loop_bound.py --host-ms 42 --device-ms 4.8   # a step at half that rate
      .venv/bin/python benchmarks/loop_bound.py --smoke                # seconds: tiny data, short steps (the test)

Defaults: the H100 figures of benchmarks/RESULTS.md ("On the GPU (NVIDIA H100)"): Ti, bf16, eager, batch 20 at 128^2
takes 23.4 ms per step (`model_step.py`: 23.3 ms of it process CPU time, i.e. the host drives the whole step) and the
loop's model-only step ran at 807-874 samples/s (22.9-24.8 ms, `train_step.py`); so 21 ms of GIL-held host time and
2.4 ms without the GIL, a step of 23.4 ms, a bound of 855 samples/s.

Data: benchmarks/loader.py's (PDEBench diffusion-reaction synthesized and ingested to 128^2 x 4 channels, windows of
10 + 1 frames, 2.9 MB). For each loader setting (no workers; `--workers` thread and process workers) it measures, in
this one process run, one after the other (first "ready": one batch made beforehand and handed out again and again,
the loop's own cost):
  * loader alone: batches per second pulled from the loader with nothing else running (`samples_per_s`);
  * loop: `dpot_train.train.trainer._loop` (the trainer's loop: next batch, the step, the finite-loss guard, the log)
    with `trainer.train_step` replaced by the emulated step and checkpoints left out; steps per second between the first
    and the last timed step, after `--warmup` steps (`loop_samples_per_s`), and `ratio` = loop / bound;
    `between_steps_ms`, the mean time from the end of one step to the start of the next (the loop's own work, its
    wait for the batch, and on a busy machine the wait for a core when the step's sleep ends), and `next_ms`, the
    mean time of those in the loader's next().
The last line of output is one JSON object with every figure, the machine (benchmarks/common.py) and the load
average at the start and the end: on a shared machine, compare only figures of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402
from loader import make_data  # noqa: E402

HOST_MS, DEVICE_MS, BATCH = 21.0, 2.4, 20  # the H100 Ti bf16 eager step at batch 20 (module docstring)
T_IN, T_OUT = 10, 1


def busy(seconds: float) -> None:
    """Pure Python on the clock for `seconds`: holds the GIL as a step's Python does (the interpreter hands it to a
    waiting thread every switch interval, as it does for any Python code)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def emulated_step(host_s: float, device_s: float, stamps: list[float]) -> Any:
    """A stand-in for `trainer.train_step`: records when it starts, holds the GIL for `host_s`, releases it for
    `device_s`; returns a zero loss, per-sample losses and gradient norm (what the loop reads)."""

    def step(cfg: Any, model: Any, opt: Any, sched: Any, batch: dict[str, Any], device: torch.device,
             trainable: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        stamps.append(time.perf_counter())
        busy(host_s)
        time.sleep(device_s)
        return torch.zeros(()), torch.zeros(len(batch["id"])), torch.zeros(())

    return step


def make_stream(manifest: Path, batch: int, seed: int = 0) -> Any:
    """The training stream of the benchmark data, as the trainer builds it."""
    from dpot_train.core.config import DataConfig
    from dpot_train.data.prepare import prepare_stream
    from dpot_train.data.stream import WindowStream

    cfg = DataConfig(manifests=[str(manifest)], t_in=T_IN, t_out=T_OUT, verify_checksums=False)
    spec, reader = prepare_stream(cfg, seed=seed, verify=False)
    return WindowStream(spec, reader, start=0, global_batch=batch)


def loader_alone(stream: Any, workers: int, kind: str, batches: int, warmup: int) -> float:
    """Samples per second the loader delivers with nothing else running."""
    from dpot_train.data.loader import make_loader

    it: Iterator[dict[str, Any]] = iter(make_loader(stream, workers, kind=kind))
    for _ in range(warmup * max(1, workers)):
        next(it)
    start, n = time.perf_counter(), 0
    for _ in range(batches):
        n += len(next(it)["id"])
    seconds = time.perf_counter() - start
    del it
    return n / seconds


class _Timed:
    """The loader's iterator, with the wall time of each next() recorded (the loop's wait for its batch)."""

    def __init__(self, it: Any) -> None:
        self.it, self.waits = it, []

    def __iter__(self) -> "_Timed":
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            return next(self.it)
        finally:
            self.waits.append(time.perf_counter() - start)


def loop_rate(stream: Any, workers: int, kind: str, steps: int, warmup: int, host_s: float, device_s: float,
              run: Path) -> dict[str, float]:
    """The trainer's loop with the emulated step: samples per second over the steps after `warmup` (`loop`); the
    slot copies a process loader made (`copies`: 0 when the loop dropped every batch in time); the mean time from
    the end of one emulated step to the start of the next (`between`: the loop's own work, its wait for the batch,
    and the wait for a core when the step's sleep ends) and the mean time in the loader's next() (`next`), in
    seconds. loop = batch / (host + device + between)."""
    from dpot_train.train import trainer
    from dpot_train.core.config import TrainConfig
    from dpot_train.data.loader import make_loader
    from dpot_train.core.distributed import DistInfo

    batch = stream.global_batch
    cfg = TrainConfig(out=str(run), steps=warmup + steps, batch_size=batch, progress=False,
                      ckpt_every=10**9, device="cpu")
    run.mkdir(parents=True, exist_ok=True)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    stamps: list[float] = []
    saved = trainer.train_step, trainer._save
    trainer.train_step = emulated_step(host_s, device_s, stamps)
    trainer._save = lambda *args, **kwargs: None  # checkpoints are not what is measured
    if kind == "ready":  # one batch made beforehand, handed out again and again: the loop's own cost
        made = next(iter(make_loader(stream, 0)))
        inner: Any = (made for _ in range(warmup + steps))
    else:
        inner = iter(make_loader(stream, workers, kind=kind))
    it = _Timed(inner)
    try:
        trainer._loop(cfg, DistInfo(0, 1, 0, torch.device("cpu")), model, model, opt, sched, it, stream.spec, 0, 0,
                      run)
    finally:
        trainer.train_step, trainer._save = saved
    copies = getattr(inner, "copies", 0)
    waits = it.waits[warmup + 1:]  # the next() calls between timed steps
    del it, inner
    timed = stamps[warmup:]
    gaps = [b - a - host_s - device_s for a, b in zip(timed, timed[1:])]
    return {"loop": batch * (len(timed) - 1) / (timed[-1] - timed[0]), "copies": copies,
            "between": sum(gaps) / len(gaps), "next": sum(waits) / len(waits) if waits else 0.0}


def settings(workers: list[int]) -> list[tuple[str, int]]:
    """(kind, workers) to measure: batches made beforehand ("ready": the loop alone), no workers once, then thread
    and process workers for each count."""
    out = [("ready", 0)] + ([("none", 0)] if 0 in workers else [])
    return out + [(kind, w) for w in workers if w > 0 for kind in ("thread", "process")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-ms", type=float, default=HOST_MS, help="GIL-held Python per step")
    parser.add_argument("--device-ms", type=float, default=DEVICE_MS, help="GIL-free time per step (the device's)")
    parser.add_argument("--batch", type=int, default=BATCH, help="windows per step")
    parser.add_argument("--workers", default="0,2,4", help="comma list of loader worker counts")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per measurement")
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps first (workers starting, filling)")
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--frames", type=int, default=21)
    parser.add_argument("--native", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    parser.add_argument("--smoke", action="store_true", help="tiny data and short steps: checks that it runs")
    parser.add_argument("--tmp", type=Path, default=None, help="parent of the temp folder")
    args = parser.parse_args(argv)
    if args.smoke:
        args.host_ms, args.device_ms, args.batch, args.workers = 2.0, 1.0, 2, "0,1"
        args.steps, args.warmup, args.trajectories, args.frames, args.native = 4, 1, 3, 12, 32
    try:
        args.worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    except ValueError:
        parser.error(f"--workers takes a comma list of integers, got {args.workers!r}")
    if args.steps < 2 or args.host_ms < 0 or args.device_ms < 0 or args.host_ms + args.device_ms <= 0:
        parser.error("--steps must be at least 2 and --host-ms + --device-ms positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="dpot-loop-bound-", dir=args.tmp))
    load_start = os.getloadavg()
    host_s, device_s = args.host_ms / 1e3, args.device_ms / 1e3
    bound = args.batch / (host_s + device_s)
    rows: list[dict[str, Any]] = []
    try:
        data = make_data(root / "data", args.trajectories, args.frames, args.native)
        stream = make_stream(data.manifest, args.batch)
        print(f"# step: {args.host_ms:g} ms holding the GIL + {args.device_ms:g} ms without, batch {args.batch}: "
              f"bound {bound:.1f} samples/s; {os.cpu_count()} cores, load average {load_start[0]:.2f}", flush=True)
        print(f"{'workers':>7} {'kind':>8} {'loader alone':>13} {'loop':>8} {'bound':>8} {'loop/bound':>10} "
              f"{'between ms':>12} {'next ms':>9}", flush=True)
        for i, (kind, workers) in enumerate(settings(args.worker_counts)):
            loader_kind = "thread" if kind == "none" else kind
            alone = (float("inf") if kind == "ready" else
                     loader_alone(stream, workers, loader_kind, max(args.steps // 2, 2), args.warmup))
            got = loop_rate(stream, workers, loader_kind, args.steps, args.warmup, host_s, device_s,
                            root / f"run-{i}")
            loop = got["loop"]
            row = {"kind": kind, "workers": workers,
                   "loader_samples_per_s": None if kind == "ready" else round(alone, 1),
                   "loop_samples_per_s": round(loop, 1), "bound_samples_per_s": round(bound, 1),
                   "ratio": round(loop / bound, 3), "loader_feeds_bound": alone >= bound,
                   "slot_copies": got["copies"], "between_steps_ms": round(got["between"] * 1e3, 2),
                   "next_ms": round(got["next"] * 1e3, 2)}
            rows.append(row)
            print(f"{workers:>7} {kind:>8} {alone:>13.1f} {loop:>8.1f} {bound:>8.1f} {loop / bound:>10.3f} "
                  f"{got['between'] * 1e3:>12.2f} {got['next'] * 1e3:>9.2f}", flush=True)
        summary = {
            "benchmark": "loop_bound",
            "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {**machine(root, ("torch", "numpy")), "load_average_start": [round(v, 2) for v in load_start]},
            "settings": {"host_ms": args.host_ms, "device_ms": args.device_ms, "batch": args.batch,
                         "workers": args.worker_counts, "steps": args.steps, "warmup": args.warmup,
                         "trajectories": args.trajectories, "frames": args.frames, "native": args.native,
                         "threads": args.threads, "smoke": args.smoke},
            "bound_samples_per_s": round(bound, 1),
            "results": rows,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
