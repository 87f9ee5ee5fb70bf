"""`dpot-train launch --dry-run` on a local output of large shards (default 16 x 64 MiB): the sha256 pass in one
thread (the validator with no runner, as before) against the pool of dpot_train.data.hash_pool, side by side in one
process, alternated, wall and CPU seconds, and their ratio.

The output is written for real: a small ingest gives the dataset entry (statistics, convention, grid), then each
shard is written as tar bytes in the writer's own member layout (dpot_data.writers.wds_shards), one 128x128 grid of
11 frames per trajectory, as many trajectories per shard as fill --shard-mib, with the shard index and a manifest
listing them. Each launch runs `prepare_run(..., write=False)` (what `launch --dry-run` runs) in this process; the
one-thread variant is the same launch with `available_cores()` answering 1, so that the validator gets no runner.
The page cache is warm for both: one untimed launch of each variant reads every shard first (the output is far
smaller than RAM), so the figures compare hashing, not the disk.

    python benchmarks/launch_hash.py --shards 16 --shard-mib 64 --repeat 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from common import machine  # noqa: E402
from launch_scale import publish_synthetic, template, trajectory_members  # noqa: E402
from dpot_format.names import shard_file  # noqa: E402

FRAMES, GRID = 11, 128
MIB = 1 << 20
VARIANTS = ("serial", "pool", "no_sha256")  # no_sha256: --no-verify-checksums, what the launch costs besides hashing


def fabricate(out: Path, shards: int, shard_mib: float, work: Path) -> dict:
    """Write an output of `shards` train shards of about `shard_mib` MiB each; returns its manifest."""
    entry = template(work, GRID, FRAMES)["datasets"][0]
    name = entry["name"]
    folder = out / "shards" / name
    folder.mkdir(parents=True)
    per_shard = max(1, int(shard_mib * MIB) // (FRAMES * GRID * GRID * 4 + GRID * GRID + 3 * 1024))
    rng = np.random.default_rng(0)
    listed, rows, i = [], [], 0
    for s in range(shards):
        file, at, samples = shard_file("train", s), 0, []
        digest, size = hashlib.sha256(), 0
        with open(folder / file, "wb") as fh:  # one trajectory in memory at a time
            for _ in range(per_shard):
                parts, sample, at = trajectory_members(i, name, at, rng, GRID, FRAMES)
                samples.append(sample)
                i += 1
                for part in parts:
                    fh.write(part)
                    digest.update(part)
            tail = b"\0" * (1024 + (-(at + 1024) % 10240))
            fh.write(tail)
            digest.update(tail)
            size = at + len(tail)
        listed.append({"path": f"shards/{name}/{file}", "split": "train", "sha256": digest.hexdigest(),
                       "bytes": size, "samples": per_shard})
        rows.append((file, digest.hexdigest(), samples))
    return publish_synthetic(out, folder, entry, listed, rows, i, "launch_hash")


def dry_run(out: Path, run: Path, serial: bool, checksums: bool = True) -> tuple[float, float]:
    """(wall s, CPU s of this process, all threads) of one `launch --dry-run` (prepare_run, write=False);
    `serial`: with one usable core, so that the validator hashes in this thread (no runner); `checksums` False:
    `--no-verify-checksums` (the launch without its sha256 pass)."""
    from dpot_train.core.config import DataConfig, TrainConfig
    from dpot_train.data import hash_pool
    from dpot_train.run.launch import Topology, prepare_run

    cfg = TrainConfig(out=str(run), steps=2, batch_size=2, device="cpu", progress=False, eval_at_end=False,
                      data=DataConfig(manifests=[str(out)], verify_checksums=checksums))
    wall, cpu = time.perf_counter(), time.process_time()
    if serial:
        with mock.patch.object(hash_pool, "available_cores", return_value=1):
            prepare_run(cfg, False, Topology(1), write=False)
    else:
        prepare_run(cfg, False, Topology(1), write=False)
    return time.perf_counter() - wall, time.process_time() - cpu


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return r.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--shard-mib", type=float, default=64.0, help="about this many MiB per shard")
    ap.add_argument("--repeat", type=int, default=3, help="timed launches per variant (alternated)")
    args = ap.parse_args(argv)
    from dpot_train.data.hash_pool import hash_threads

    work = Path(tempfile.mkdtemp(prefix="launch-hash-"))
    try:
        out = work / "out"
        t0 = time.perf_counter()
        doc = fabricate(out, args.shards, args.shard_mib, work)
        total = sum(s["bytes"] for s in doc["datasets"][0]["shards"])
        results: dict = {"shards": args.shards, "bytes": total, "fabricate_s": round(time.perf_counter() - t0, 1),
                         "commit": _commit(), "machine": machine(work), "page_cache": "warm (one untimed launch "
                         "of each variant first)", "serial": {"threads": 1, "wall_s": [], "cpu_s": []},
                         "pool": {"threads": hash_threads("shards"), "wall_s": [], "cpu_s": []},
                         "no_sha256": {"threads": 0, "wall_s": [], "cpu_s": []}}
        for serial in (True, False):  # untimed: reads every shard into the page cache, imports everything
            dry_run(out, work / "run", serial)
        for _ in range(args.repeat):  # alternated, so that a change of the machine's load hits both
            for name in VARIANTS:
                wall, cpu = dry_run(out, work / "run", name == "serial", name != "no_sha256")
                results[name]["wall_s"].append(round(wall, 3))
                results[name]["cpu_s"].append(round(cpu, 3))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name in VARIANTS:
        r = results[name]
        r["median_wall_s"] = statistics.median(r["wall_s"])
        r["median_cpu_s"] = statistics.median(r["cpu_s"])
        r["cpu_ms_per_mib"] = round(1000 * r["median_cpu_s"] / (total / MIB), 2)
        r["mib_per_s"] = round(total / MIB / r["median_wall_s"], 1)
    results["wall_ratio"] = round(results["serial"]["median_wall_s"] / results["pool"]["median_wall_s"], 2)
    results["load_after"] = [round(v, 2) for v in os.getloadavg()]
    print(f"launch --dry-run, {args.shards} shards, {total / MIB:.0f} MiB, page cache warm, "
          f"{results['machine']['cores']} cores (load {results['machine']['load_average']})")
    for name in VARIANTS:
        r = results[name]
        print(f"  {name:<9} {r['threads']:>3} hashing thread(s): wall {r['median_wall_s']:.2f} s (median of "
              f"{r['wall_s']}), CPU {r['median_cpu_s']:.2f} s, {r['mib_per_s']} MiB/s, {r['cpu_ms_per_mib']} CPU "
              f"ms/MiB")
    hashing = {n: results[n]["median_wall_s"] - results["no_sha256"]["median_wall_s"] for n in ("serial", "pool")}
    results["hash_wall_ratio"] = round(hashing["serial"] / hashing["pool"], 2) if hashing["pool"] > 0 else None
    print(f"  serial/pool wall ratio: {results['wall_ratio']} (of the sha256 pass alone, the no_sha256 launch "
          f"subtracted: {results['hash_wall_ratio']})")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
