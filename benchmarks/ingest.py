"""Ingest benchmark at scale: a PDEBench-CFD-shaped HDF5 file of `--size-gb` GiB, read plainly, then ingested.

Run:  .venv/bin/python benchmarks/ingest.py --size-gb 4 --workers 2

1. Checks free disk (`df -h` of the temp folder) and refuses to start without room for the input and the output.
2. Writes the file in the flat PDEBench layout (`density`, `pressure`, `Vx`, `Vy` (N, 21, X, Y) float32, 22 times,
   cell-centre coordinates), 16 trajectories at a time, with the smooth band-limited fields of
   `dpot_data.synth.pdebench.cfd_channel` (evaluated separably, for speed), so lossless compression behaves as on
   real data.
3. Drops the file from the page cache (fsync + posix_fadvise DONTNEED) before each pass, so both passes read from disk.
4. (a) plain sequential h5py read of every dataset in blocks of trajectories; (b) `dpot-data ingest pdebench` of the
   file as a subprocess, its peak resident memory taken both from polling the process tree (psutil) and from
   getrusage(RUSAGE_CHILDREN).
5. Prints input MB/s of each, their ratio and the ingest's peak memory; the last line is one JSON object.
The temp folder is deleted at the end (unless --keep).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import h5py
import numpy as np
import psutil

CFD_DATASETS = ("Vx", "Vy", "density", "pressure")
FRAMES = 21
MB = 1e6
GIB = 1 << 30


def trajectories_for(size_gib: float, res: int, frames: int = FRAMES) -> int:
    """Smallest trajectory count whose four float32 fields reach `size_gib` GiB."""
    per_sample = len(CFD_DATASETS) * frames * res * res * 4
    return max(1, math.ceil(size_gib * GIB / per_sample))


def check_disk(folder: Path, needed: int) -> str:
    """`df -h` of the folder; SystemExit when fewer than `needed` bytes are free."""
    df = subprocess.run(["df", "-h", str(folder)], capture_output=True, text=True, check=False).stdout.strip()
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise SystemExit(f"{folder}: {free / GIB:.1f} GiB free, the benchmark needs {needed / GIB:.1f} GiB\n{df}")
    return df


def cfd_sample(sample: int, axes: np.ndarray, t: np.ndarray, seed: int) -> list[np.ndarray]:
    """The four channels (storage order X, Y) of one trajectory: the band-limited periodic fields of
    `dpot_data.synth.pdebench.cfd_channel`, evaluated separably (cos(a+b) = cos a cos b - sin a sin b)."""
    from dpot_data.synth.pdebench import CFD_CHANNELS, cfd_channel

    x = axes.astype(np.float64)
    out = {}
    for c, name in enumerate(CFD_CHANNELS):
        field = cfd_channel(sample, c, dims=2, seed=seed)
        vals = np.full((len(t), len(x), len(x)), field.offset, dtype=np.float64)
        for m in field.modes:
            (kx, ky), (vx, vy) = m.k, field.velocity
            decay = m.amp * np.exp(-field.nu * 4.0 * np.pi**2 * (kx * kx + ky * ky) * t)
            a = 2.0 * np.pi * kx * (x[None, :] - vx * t[:, None])  # (T, X)
            b = 2.0 * np.pi * ky * (x[None, :] - vy * t[:, None]) + m.phase  # (T, Y)
            vals += decay[:, None, None] * (np.cos(a)[:, :, None] * np.cos(b)[:, None, :]
                                            - np.sin(a)[:, :, None] * np.sin(b)[:, None, :])
        out[name] = vals.astype(np.float32)
    return [out[name] for name in CFD_DATASETS]


def write_input(folder: Path, n: int, res: int, seed: int, block: int = 16) -> Path:
    """The PDEBench CFD file in the published flat layout, written `block` trajectories at a time (never whole)."""
    from dpot_data.synth.pdebench import cell_centres, cfd_file_name

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / cfd_file_name(m=0.1, eta=0.01, zeta=0.01, kind="Rand", res=res)
    axes = cell_centres(res)
    t = np.linspace(0.0, 1.0, FRAMES + 1, dtype=np.float32)  # the generator writes one time more than it stores
    tt = t[:FRAMES].astype(np.float64)
    with h5py.File(path, "w") as f:
        dsets = {name: f.create_dataset(name, shape=(n, FRAMES, res, res), dtype=np.float32) for name in CFD_DATASETS}
        for i0 in range(0, n, block):
            i1 = min(n, i0 + block)
            parts = [cfd_sample(i, axes, tt, seed) for i in range(i0, i1)]
            for c, name in enumerate(CFD_DATASETS):
                dsets[name][i0:i1] = np.stack([p[c] for p in parts])
        f.create_dataset("t-coordinate", data=t)
        f.create_dataset("x-coordinate", data=axes)
        f.create_dataset("y-coordinate", data=axes)
        f.attrs["M"], f.attrs["eta"], f.attrs["zeta"] = 0.1, 0.01, 0.01
    return path


def drop_from_cache(path: Path) -> None:
    """Flush a file (or every file below a folder) and ask the kernel to forget its cached pages."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def plain_read(path: Path, block: int) -> tuple[int, float]:
    """Sequential h5py read of every field dataset in blocks of `block` trajectories: (bytes read, seconds)."""
    total = 0
    start = time.perf_counter()
    with h5py.File(path, "r") as f:
        for name in CFD_DATASETS:
            ds = f[name]
            for i in range(0, ds.shape[0], block):
                arr = ds[i : i + block]
                total += arr.nbytes
        for name in ("t-coordinate", "x-coordinate", "y-coordinate"):
            total += f[name][()].nbytes
    return total, time.perf_counter() - start


class TreeMemory(threading.Thread):
    """Polls the resident memory of a process and all its descendants; keeps the peak of their sum."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak = pid, interval, 0
        self._done = threading.Event()

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._done.is_set():
            try:
                procs = [root] + root.children(recursive=True)
                rss = 0
                for p in procs:
                    try:
                        rss += p.memory_info().rss
                    except psutil.NoSuchProcess:
                        pass
                self.peak = max(self.peak, rss)
            except psutil.NoSuchProcess:
                return
            time.sleep(self.interval)

    def stop(self) -> None:
        self._done.set()


def run_ingest(command: list[str], log: Path) -> dict:
    """Run the ingest command as a child process; wall time, exit status, peak RSS (polled and rusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        watcher = TreeMemory(proc.pid)
        watcher.start()
        rc = proc.wait()
    wall = time.perf_counter() - start
    watcher.stop()
    watcher.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux, max over waited-for children
    return {"rc": rc, "wall_s": wall, "peak_rss_polled": watcher.peak, "peak_rss_rusage": max(after, before) * 1024}


def folder_bytes(path: Path) -> int:
    """Total size of the files below a folder."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=4.0, help="input size in GiB (default 4)")
    parser.add_argument("--res", type=int, default=128, help="grid size of the input (128 or 512 as published)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--block", type=int, default=16, help="trajectories per block of the plain read")
    parser.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="parent of the temp folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (input and output)")
    parser.add_argument(
        "--ingest-args",
        default="--workers {workers}",
        help="extra options for `dpot-data ingest pdebench INPUT --out OUT` ({workers} is replaced)",
    )
    args = parser.parse_args(argv)

    n = trajectories_for(args.size_gb, args.res)
    input_bytes = n * len(CFD_DATASETS) * FRAMES * args.res**2 * 4
    df = check_disk(args.tmp, int(input_bytes * 2.6) + GIB)
    print(f"free disk before the run:\n{df}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="dpot-bench-", dir=args.tmp))
    exe = Path(sys.executable).with_name("dpot-data")
    result: dict = {}
    try:
        t0 = time.perf_counter()
        path = write_input(work / "raw", n, args.res, args.seed)
        gen_s = time.perf_counter() - t0
        size = path.stat().st_size
        print(f"wrote {path.name}: {n} trajectories, {size / MB:.0f} MB in {gen_s:.0f} s", flush=True)

        drop_from_cache(path)
        read_bytes, read_s = plain_read(path, args.block)
        read_mb_s = size / MB / read_s
        print(f"(a) plain h5py read: {read_bytes / MB:.0f} MB in {read_s:.1f} s = {read_mb_s:.0f} MB/s", flush=True)

        drop_from_cache(path)
        out = work / "out"
        extra = shlex.split(args.ingest_args.format(workers=args.workers))
        command = [str(exe), "ingest", "pdebench", str(path), "--out", str(out), *extra]
        print("(b) " + shlex.join(command), flush=True)
        ing = run_ingest(command, work / "ingest.log")
        log_tail = (work / "ingest.log").read_text(errors="replace")[-3000:]
        if ing["rc"] != 0:
            print(log_tail, file=sys.stderr)
            raise SystemExit(f"ingest failed with exit code {ing['rc']}")
        ingest_mb_s = size / MB / ing["wall_s"]
        peak = max(ing["peak_rss_polled"], ing["peak_rss_rusage"])
        out_bytes = folder_bytes(out)
        ratio = ingest_mb_s / read_mb_s
        print(f"(b) dpot-data ingest: {size / MB:.0f} MB in {ing['wall_s']:.1f} s = {ingest_mb_s:.0f} MB/s, "
              f"peak RSS {peak / MB:.0f} MB (polled tree {ing['peak_rss_polled'] / MB:.0f} MB, "
              f"rusage {ing['peak_rss_rusage'] / MB:.0f} MB); output {out_bytes / MB:.0f} MB", flush=True)
        print(f"ratio ingest/read = {ratio:.2f} (target >= 0.5); peak memory {peak / GIB:.2f} GiB (target <= 2)")
        result = {
            "benchmark": "ingest",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpu "
            f"{psutil.virtual_memory().total / GIB:.0f} GiB",
            "python": platform.python_version(),
            "input": path.name,
            "input_bytes": size,
            "trajectories": n,
            "res": args.res,
            "workers": args.workers,
            "command": shlex.join(command),
            "cache": "cold (fsync + posix_fadvise DONTNEED before each pass)",
            "generate_s": round(gen_s, 2),
            "read_s": round(read_s, 2),
            "read_mb_s": round(read_mb_s, 1),
            "ingest_s": round(ing["wall_s"], 2),
            "ingest_mb_s": round(ingest_mb_s, 1),
            "ratio": round(ratio, 3),
            "peak_rss_bytes": peak,
            "peak_rss_polled_bytes": ing["peak_rss_polled"],
            "peak_rss_rusage_bytes": ing["peak_rss_rusage"],
            "output_bytes": out_bytes,
            "meets_throughput": ratio >= 0.5,
            "meets_memory": peak <= 2 * GIB,
        }
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
