"""What the evaluation's metric suite costs, and the memory of a long rollout.

1. cost: `evaluate_model` on the same data and model, with the suite (per-step L2RE, NRMSE / VRMSE / spectral MSE
   per channel, one-step NRMSE) and without it (the suite's accumulator replaced by one that does nothing: the
   evaluation as it was, two L2RE scalars). Runs alternate, --repeat times each; the ratio of the medians.
2. memory: peak RSS of a --long-steps rollout (default 500) at --long-res^2 (default 128), scored chunk by chunk
   (eval_stream) and, for contrast, whole (the rollout held at once), each in a fresh process; with
   --long-ensemble N also streamed with an ensemble of N members (`evaluate --ensemble`,
   dpot_train/evaluation/ensemble.py) at --long-steps and at --long-steps // 4, whose peaks should agree (memory bounded
   whatever the horizon).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/eval_cost.py --work /tmp/eval-cost

Data: FNO Navier-Stokes solutions made by dpot_data.synth (solved at 64^2, ingested at the resolution asked for).
Model: the `tiny` DPOT preset with random weights (what the model predicts does not change the cost of scoring it).
Prints one JSON line with every figure and the machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_shards(work: Path, n: int, frames: int, res: int) -> Path:
    """FNO NS shards of n trajectories (all in the test split) and `frames` frames at res^2, made once."""
    out = work / f"fno-n{n}-t{frames}-r{res}"
    if (out / "manifest.json").is_file():
        return out
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.fno import synth_fno

    files = synth_fno(work / f"raw-n{n}-t{frames}", n=n, frames=frames + 1, viscosity=1e-3, seed=0, resolution=64)
    ingest_files("fno", [files[0]], out, IngestOptions(resolution=res, split=(0.0, 0.0), seed=0))
    return out


def tiny_model(channels: int, res: int) -> Any:
    from dpot_train.core.model_setup import data_overrides, fresh_model

    import torch

    torch.manual_seed(0)
    return fresh_model("tiny", {}, data_overrides(channels, (res, res), 10, 1))


class _NoSuite:
    """The evaluation without the suite: accepts everything, computes nothing."""

    def __init__(self, channels: list[str], channel_valid: list[bool], steps: int) -> None:
        self.by = {w: self for w in ("model", "persistence")}

    def add(self, *args: Any) -> None: ...

    def start_batch(self, *args: Any) -> None: ...

    def add_rollout(self, *args: Any) -> None: ...

    def add_one_step(self, *args: Any) -> None: ...

    def result(self) -> dict[str, Any]:
        return {"model": {}, "persistence": {}}


def cost(shards: Path, steps: int, repeat: int, device: str) -> dict[str, Any]:
    """Median wall and CPU seconds of evaluate_model with and without the suite, runs alternating; and the CPU
    seconds spent inside the suite's accumulation during the runs with it (its share of their CPU time: a figure
    that the noise of other processes barely moves)."""
    import torch

    from dpot_train.evaluation import evaluate
    from dpot_train.core.config import DataConfig
    from dpot_train.data.datasets import read_manifest

    ds = read_manifest(str(shards))[0]
    model = tiny_model(len(ds.channels), ds.shape[0])
    data = DataConfig(manifests=[str(shards)])
    original = evaluate.DatasetSuite
    inside = [0.0]

    class Timed(original):  # type: ignore[misc,valid-type]
        def add(self, *args: Any) -> None:
            c0 = time.process_time()
            super().add(*args)
            inside[0] += time.process_time() - c0

    times: dict[str, list[float]] = {"suite": [], "without": []}
    cpu: dict[str, list[float]] = {"suite": [], "without": []}
    for i in range(2 * repeat + 1):  # the first run warms caches and is not counted
        which = "suite" if i % 2 == 0 else "without"
        evaluate.DatasetSuite = Timed if which == "suite" else _NoSuite  # type: ignore[misc]
        if i == 1:
            inside[0] = 0.0  # the warm-up run's share is not counted
        t0, c0 = time.perf_counter(), time.process_time()
        evaluate.evaluate_model(model, data, rollout_steps=steps, device=torch.device(device), verify=False)
        if i > 0:
            times[which].append(time.perf_counter() - t0)
            cpu[which].append(time.process_time() - c0)
    evaluate.DatasetSuite = original  # type: ignore[misc]
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    share = inside[0] / sum(cpu["suite"])
    return {"steps": steps, "trajectories": ds.split_counts.get("test"), "grid": list(ds.shape),
            "torch_threads": torch.get_num_threads(), "wall_seconds": times, "cpu_seconds": cpu,
            "median_wall": med, "median_cpu": med_cpu, "ratio_wall": med["suite"] / med["without"],
            "ratio_cpu": med_cpu["suite"] / med_cpu["without"], "suite_cpu_share": share,
            "ratio_from_share": 1 / (1 - share)}


def peak_rss_mib() -> float:
    """This process's peak resident set (VmHWM): unlike ru_maxrss it starts anew at exec, so a child process started
    from a large parent reports its own peak."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def long_rollout(shards: Path, steps: int, mode: str, device: str, members: int = 0) -> dict[str, Any]:
    """(In a fresh process) one --long-steps evaluation, streamed or whole (with `members` > 0: an ensemble of that
    many noisy members beside); peak RSS before and after."""
    import torch

    from dpot_train.evaluation import evaluate
    from dpot_train.core.config import DataConfig
    from dpot_train.data.datasets import read_manifest

    ds = read_manifest(str(shards))[0]
    model = tiny_model(len(ds.channels), ds.shape[0])
    if mode == "whole":
        evaluate.STREAM_STEPS = 10**9
    ensemble = None
    if members:
        from dpot_train.evaluation.ensemble import Ensemble

        ensemble = Ensemble([model], ["tiny"], members, 5e-4)
    before = peak_rss_mib()
    t0 = time.perf_counter()
    res = evaluate.evaluate_model(model, DataConfig(manifests=[str(shards)]), rollout_steps=steps,
                                  device=torch.device(device), verify=False, ensemble=ensemble)
    peak = peak_rss_mib()
    r = res["datasets"][ds.name]
    return {"mode": mode, "members": members, "steps": r["rollout_steps"], "trajectories": r["trajectories"],
            "grid": list(ds.shape),
            "seconds": time.perf_counter() - t0, "peak_rss_mib_before": before, "peak_rss_mib": peak,
            "rollout_l2re": r["model"]["rollout_l2re"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/eval-cost", help="scratch folder (shards are made once and kept)")
    ap.add_argument("--trajectories", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20, help="rollout steps of the cost comparison")
    ap.add_argument("--res", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--long-steps", type=int, default=500)
    ap.add_argument("--long-res", type=int, default=128)
    ap.add_argument("--long-trajectories", type=int, default=2)
    ap.add_argument("--long-ensemble", type=int, default=0, help="also an ensemble of N members, streamed")
    ap.add_argument("--skip-whole", action="store_true", help="leave out the whole-rollout contrast (slow)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--skip-long", action="store_true")
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--child", choices=["streamed", "whole"], help=argparse.SUPPRESS)
    ap.add_argument("--members", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rollout", type=int, default=0, help=argparse.SUPPRESS)  # a child's steps (0: --long-steps)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)  # CPU seconds then measure the work, whatever else runs on the machine
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.child:
        shards = make_shards(work, args.long_trajectories, args.long_steps + 10, args.long_res)
        print(json.dumps(long_rollout(shards, args.rollout or args.long_steps, args.child, args.device,
                                      args.members)))
        return
    from benchmarks.common import machine

    out: dict[str, Any] = {"machine": machine(work, ["torch", "numpy", "zarr"]), "device": args.device}
    if not args.skip_cost:
        out["cost"] = c = cost(make_shards(work, args.trajectories, args.steps + 10, args.res), args.steps,
                               args.repeat, args.device)
        print(f"cost: CPU s suite {c['median_cpu']['suite']:.2f} / without {c['median_cpu']['without']:.2f} = "
              f"{c['ratio_cpu']:.3f}; wall s {c['median_wall']['suite']:.2f} / {c['median_wall']['without']:.2f} = "
              f"{c['ratio_wall']:.3f}; suite's share of the CPU time {c['suite_cpu_share']:.3f} (ratio "
              f"{c['ratio_from_share']:.3f})", file=sys.stderr)
    if not args.skip_long:
        make_shards(work, args.long_trajectories, args.long_steps + 10, args.long_res)
        out["long"] = []
        runs = [("streamed", 0, args.long_steps)] + ([] if args.skip_whole else [("whole", 0, args.long_steps)])
        if args.long_ensemble:
            runs += [("streamed", args.long_ensemble, args.long_steps // 4),
                     ("streamed", args.long_ensemble, args.long_steps)]
        for mode, members, steps in runs:
            p = subprocess.run([sys.executable, __file__, "--work", str(work), "--child", mode, "--long-steps",
                                str(args.long_steps), "--rollout", str(steps), "--long-res", str(args.long_res),
                                "--long-trajectories",
                                str(args.long_trajectories), "--device", args.device, "--threads", str(args.threads),
                                "--members", str(members)],
                               capture_output=True, text=True, check=True)
            out["long"].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"long rollout, {mode}: {out['long'][-1]}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
