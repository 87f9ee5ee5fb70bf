"""Training samples/s with 1 and 2 processes, before (torch's default threads) and after (dpot_train.core.threads'
rule).

Run:  .venv/bin/python benchmarks/threads.py                       # README data (24 FNO trajectories, 128x128)
      .venv/bin/python benchmarks/threads.py --manifest shards --steps 40 --repeats 3 --workers 0 2

Each measurement is `dpot-train launch --model tiny --batch-size 8 --device cpu` exactly as the README runs it, in a
fresh run folder. "before" passes OMP_NUM_THREADS with the counts a worker ran with before the rule: torch's default
(one thread per core) for 1 process, the 1 torchrun sets itself for several. "after" leaves OMP_NUM_THREADS unset,
so that each worker applies the rule and logs it. samples/s is the median of the loop's own figures (metrics.jsonl,
every --log-every steps) after the first (warm-up); wall is the whole launch (checks, start-up, training, the final
evaluation). before and after alternate within each repeat, so that the machine's load falls on both alike.
The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402

from dpot_train.core.threads import OMP_ENV, USER_OMP_ENV, available_cores, choose_threads  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def readme_shards(folder: Path) -> Path:
    """The README's data: `dpot-data synth fno --out raw --n 24 --frames 20`, then `dpot-data ingest fno ... --split
    0.8` (128x128, 4 channels)."""
    raw, out = folder / "raw", folder / "shards"
    cli = [sys.executable, "-m", "dpot_data"]
    subprocess.run([*cli, "synth", "fno", "--out", str(raw), "--n", "24", "--frames", "20"], check=True, cwd=ROOT,
                   capture_output=True)
    subprocess.run([*cli, "ingest", "fno", *map(str, sorted(raw.glob("NavierStokes_*.mat"))), "--out", str(out),
                    "--split", "0.8"], check=True, cwd=ROOT, capture_output=True)
    return out


def before_threads(processes: int) -> int:
    """The intra-op threads a worker ran with before the rule: torch's default for one process (a thread per core),
    torchrun's OMP_NUM_THREADS=1 for several."""
    return available_cores() if processes == 1 else 1


def measure(manifest: Path, out: Path, processes: int, workers: int, steps: int, log_every: int,
            omp: int | None) -> dict[str, Any]:
    """One launch; its samples/s (median after the first logged figure), wall seconds and the threads line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop(OMP_ENV, None)
    env.pop(USER_OMP_ENV, None)
    if omp is not None:
        env[OMP_ENV] = str(omp)
    args = [sys.executable, "-m", "dpot_train", "launch", "--manifest", str(manifest), "--model", "tiny",
            "--steps", str(steps), "--batch-size", "8", "--nproc-per-node", str(processes), "--num-workers",
            str(workers), "--log-every", str(log_every), "--no-progress", "--device", "cpu", "--out", str(out)]
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"launch failed ({r.returncode}): {' '.join(args)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    rates = [rec["samples_per_s"] for rec in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if "samples_per_s" in rec]
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("threads:")), "")
    return {"samples_per_s": round(statistics.median(rates[1:] or rates), 2), "rates": [round(x, 2) for x in rates],
            "wall_s": round(wall, 1), "threads_line": line}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", type=Path, help="shards to train on (default: the README's, made in a temp folder)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--workers", type=int, nargs="+", default=[0], help="loader thread workers per process")
    args = ap.parse_args(argv)
    cores = available_cores()
    with tempfile.TemporaryDirectory(prefix="dpot-threads-") as tmp:
        base = Path(tmp)
        manifest = args.manifest.resolve() if args.manifest else readme_shards(base / "data")
        print(f"# {cpu_name()}, {cores} cores (affinity), load average at start {os.getloadavg()}", flush=True)
        print("| processes | loader workers | threads before -> after | samples/s before | samples/s after "
              "| wall s before | wall s after |", flush=True)
        rows: list[dict[str, Any]] = []
        n = 0
        for processes in args.processes:
            for workers in args.workers:
                after_threads = choose_threads(cores, processes, workers, None).intra_op
                runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
                for _ in range(args.repeats):
                    for label, omp in (("before", before_threads(processes)), ("after", None)):
                        n += 1
                        runs[label].append(measure(manifest, base / f"run{n}", processes, workers, args.steps,
                                                   args.log_every, omp))
                row = {"processes": processes, "workers": workers, "threads_before": before_threads(processes),
                       "threads_after": after_threads,
                       **{f"samples_per_s_{k}": [m["samples_per_s"] for m in v] for k, v in runs.items()},
                       **{f"wall_s_{k}": [m["wall_s"] for m in v] for k, v in runs.items()},
                       "threads_line_after": runs["after"][0]["threads_line"]}
                rows.append(row)
                print(f"| {processes} | {workers} | {row['threads_before']} -> {after_threads} | "
                      f"{', '.join(map(str, row['samples_per_s_before']))} | "
                      f"{', '.join(map(str, row['samples_per_s_after']))} | "
                      f"{', '.join(map(str, row['wall_s_before']))} | {', '.join(map(str, row['wall_s_after']))} |",
                      flush=True)
        print(json.dumps({"cpu": cpu_name(), "cores": cores, "load_avg_end": [round(v, 2) for v in os.getloadavg()],
                          "steps": args.steps, "batch_size": 8, "rows": rows}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
