"""Ingest benchmark: `dpot-data ingest` against a plain read, the reference preprocessing and the disk, in one run.

Run:  PYTHONPATH=$PWD .venv/bin/python benchmarks/ingest.py --size-gb 1 --profile

Input: the PDEBench compressible-NS file `dpot-data synth pdebench-cfd --n N --res 128` writes
(`dpot_data.synth.pdebench.write_cfd`: flat HDF5, `Vx`, `Vy`, `density`, `pressure` float32 (N, 21, X, Y), contiguous,
in that order, `t-coordinate` with 22 entries, cell-centred `x-`/`y-coordinate`, attributes M, eta, zeta; smooth
band-limited fields, so lossless compression behaves as on real data). `--size-gb` sets N: as many whole
trajectories as fit in that many 1e9 bytes (1 GB = 181 trajectories at 128²).

Passes (`--passes`, all by default), each on a cold page cache:
  read      plain h5py read of the four fields, 16 trajectories at a time
  baseline  a benchmark-only re-implementation of the reference DPOT preprocessing of this source
            (`process_pdebench_data`): read the four fields whole, stack to (N, X, Y, T, C) float32, write one
            uncompressed HDF5 file `data_<i>.hdf5` (dataset `data`, (X, Y, T, C)) per trajectory, the first
            int(0.9 N) into train/ and the rest into test/, no fsync
  default   `dpot-data ingest pdebench FILE --out DIR` (Zarr + WebDataset + statistics + manifest)
  zarr      the same with `--format zarr`
  wds       the same with `--format wds`
  raise     the default with `--nonfinite raise` (no NaN/Inf scan of the file when it is opened: values are checked
            in the block reads)
  cluster   the default against a `dask.distributed.LocalCluster(n_workers=2, threads_per_worker=1)` started here
            (`--scheduler tcp://...`; skipped with --no-cluster); the workers import the ingest code before the clock
            starts
  durable   write 512 MiB (--durable-mib) into the output folder, 64 MiB at a time each synced and dropped from the
            page cache as the ingest's writers do: the sustained durable write rate of that disk
  against   with `--against DIR` (another checkout of dpot, e.g. a worktree of main): the default ingest with DIR
            first on PYTHONPATH, run right after `default` in every round, so that the two are measured side by
            side on the same cold input under the same load; reported with the ratios of wall and CPU time
`--repeat K` runs all passes K times, round after round (so that a noisy neighbour touches every pass alike), and
reports each pass by its run of median wall time, with every run's wall time in the JSON (`wall_s_runs`).
`--profile` runs the default ingest once more, in this process, under cProfile with a per-thread CPU clock in every
thread, and prints the CPU time per stage in ns per input byte (a function's self time goes to its own stage, else
to its callers' stages in proportion), the wall time inside fsync/syncfs and the NaN/Inf scan at open, and the
costliest functions; `--profile-out FILE` also saves the merged profile (pstats format).

Every pass except `durable` runs as a child process (`python -m dpot_data ...`, or this script for `read` and
`baseline`) with this worktree on PYTHONPATH. Per pass: wall seconds, CPU seconds (user + sys of the child and its
waited-for descendants, from wait4's rusage; for the ingest passes also the sys part and the minor page faults in
the JSON), peak RSS (the larger of the polled sum over the process tree and the
child's ru_maxrss), output bytes, input MB/s and CPU ns per input byte. The cluster pass adds the CPU of the worker
processes (psutil) and of the scheduler's threads, which run in this process (the threads that lived through the
pass, the memory poller and this one left out); its RSS is that of the driver tree plus the worker processes.

Cold cache: before every pass the input is fsynced and dropped with posix_fadvise(POSIX_FADV_DONTNEED), and after
every pass its output is fsynced and dropped the same way (so the baseline's unsynced writes are flushed outside
its timing and no later pass finds its files cached). fadvise works without root for clean pages (hence the fsync
first); pages other processes keep mapped stay. Outputs are deleted after each pass unless --keep.

Output: one line per pass, a table, the ratios with their goals (met / missed), a projection to a published 128²
file, the profile breakdown, and last one JSON object with every figure and the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import h5py
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CFD_DATASETS = ("Vx", "Vy", "density", "pressure")  # the reference's channel order, and their order on disk
FRAMES = 21
MB = 1e6
GB = 1e9
MIB = 1 << 20
PASSES = ("read", "baseline", "default", "zarr", "wds", "raise", "cluster", "durable")
INGEST_PASSES = {"default": (), "zarr": ("--format", "zarr"), "wds": ("--format", "wds"),
                 "raise": ("--nonfinite", "raise"), "cluster": ()}
DURABLE_BYTES = 512 * MIB
# the published PDEBench CNS 128² training files: 10 000 trajectories of 21 frames, four float32 fields, 55 GB each
REAL_TRAJECTORIES = 10_000
PACKAGES = ("dpot", "numpy", "h5py", "zarr", "numcodecs", "dask", "distributed", "xarray", "psutil")


# ------------------------------------------------------------------------------------------------ the input file

def trajectory_bytes(res: int, frames: int = FRAMES) -> int:
    """Bytes of one trajectory's four float32 fields."""
    return len(CFD_DATASETS) * frames * res * res * 4


def trajectories_for(size_gb: float, res: int, frames: int = FRAMES) -> int:
    """As many whole trajectories as fit in `size_gb` × 1e9 bytes (at least one)."""
    return max(1, int(size_gb * GB // trajectory_bytes(res, frames)))


def write_input(folder: Path, n: int, res: int, seed: int = 0, m: float = 1.0, eta: float = 0.1) -> Path:
    """The file `dpot-data synth pdebench-cfd --n n --res res --m m --eta eta --seed seed` writes (it is that code:
    one trajectory of one field at a time, never the whole file in memory; ~20 ms per trajectory at 128²)."""
    from dpot_data.synth.pdebench import write_cfd

    return write_cfd(folder, m=m, eta=eta, n=n, frames=FRAMES, res=res, seed=seed)


# ------------------------------------------------------------------------------------------------ page cache

def syncfs(path: Path) -> bool:
    """syncfs(2) of the filesystem holding `path` (one journal commit, where an fsync per file costs one each);
    False where it is not available."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        call = ctypes.CDLL(name, use_errno=True).syncfs
    except (OSError, AttributeError):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        return call(fd) == 0
    finally:
        os.close(fd)


def evict(path: Path) -> None:
    """Make a file (or every file below a folder) durable and drop its pages from the page cache.
    posix_fadvise(DONTNEED) needs no root: it drops clean pages, and the fsync (syncfs for a folder) makes them
    clean."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    synced = path.is_dir() and syncfs(path)
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            if not synced:
                os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def folder_bytes(path: Path) -> int:
    """Total size of the files below a folder (or of one file)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------------ measuring

class TreeMemory(threading.Thread):
    """Polls the resident memory of some processes and all their descendants; keeps the peak of the sum."""

    def __init__(self, pids: list[int], interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pids, self.interval, self.peak = pids, interval, 0
        self._done = threading.Event()

    def _tree_rss(self) -> int:
        seen: dict[int, int] = {}
        for pid in self.pids:
            try:
                root = psutil.Process(pid)
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for p in procs:
                try:
                    seen[p.pid] = p.memory_info().rss
                except psutil.Error:
                    pass
        return sum(seen.values())

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self._tree_rss())
            self._done.wait(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()


@dataclass
class Run:
    """A finished child process: exit code, wall and CPU seconds, peak RSS, the tail of its output."""

    rc: int
    wall_s: float
    cpu_s: float
    peak_rss: int
    log: str
    sys_s: float = 0.0  # the system part of cpu_s
    minor_faults: int = 0  # page faults served without I/O (fresh memory faulted in, and zeroed, among them)


def run_measured(command: list[str], log: Path, env: dict[str, str], watch: list[int] | None = None,
                 cwd: Path | None = None) -> Run:
    """Run a command as a child (in `cwd`, default this one); CPU and ru_maxrss from wait4 (the child and its
    waited-for descendants), RSS also polled over its process tree plus the `watch` processes and their
    descendants."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        watcher = TreeMemory([proc.pid, *(watch or [])])
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.stop()
    return Run(proc.returncode, wall, usage.ru_utime + usage.ru_stime,
               max(watcher.peak, usage.ru_maxrss * 1024), log.read_text(errors="replace")[-4000:], usage.ru_stime,
               usage.ru_minflt)


def process_cpu(pids: list[int]) -> float:
    """User + sys seconds of some live processes (and their waited-for children)."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def self_cpu() -> float:
    """User + sys seconds of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def other_threads_cpu() -> dict[int, float]:
    """User + sys seconds of each live thread of this process except the calling one, by native thread id."""
    me = threading.get_native_id()
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads() if t.id != me}


def figures(input_bytes: int, wall: float, cpu: float | None, peak: int | None, out_bytes: int | None,
            **extra: Any) -> dict[str, Any]:
    """The figures of one pass, rounded for the report."""
    return {
        "wall_s": round(wall, 3),
        "cpu_s": None if cpu is None else round(cpu, 3),
        "peak_rss_bytes": peak,
        "output_bytes": out_bytes,
        "input_mb_s": round(input_bytes / MB / wall, 1),
        "cpu_ns_per_byte": None if cpu is None else round(cpu * 1e9 / input_bytes, 2),
        **extra,
    }


# ------------------------------------------------------------------------------------------------ child processes

def plain_read(path: Path, block: int = 16) -> dict[str, Any]:
    """Read the four fields with h5py, `block` trajectories at a time, in file order."""
    total = 0
    with h5py.File(path, "r") as f:
        for name in CFD_DATASETS:
            ds = f[name]
            for i in range(0, ds.shape[0], block):
                total += ds[i:i + block].nbytes
    return {"bytes_read": total}


def baseline_preprocess(path: Path, out: Path) -> dict[str, Any]:
    """The reference DPOT preprocessing of a compressible-NS file, re-implemented for this benchmark: every field
    read whole, stacked to (N, T, X, Y, C) and viewed as (N, X, Y, T, C), one uncompressed `data_<i>.hdf5` per
    trajectory; the first int(0.9 N) go to train/ (i from 0), the rest to test/ (i from 0); no fsync."""
    (out / "train").mkdir(parents=True, exist_ok=True)
    (out / "test").mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "r") as f:
        fields = [np.array(f[name], dtype=np.float32) for name in CFD_DATASETS]
    data = np.stack(fields, axis=-1).transpose(0, 2, 3, 1, 4)  # (N, X, Y, T, C)
    del fields
    n = data.shape[0]
    n_train = int(9 / 10 * n)
    for split, ids in (("train", range(n_train)), ("test", range(n_train, n))):
        for i, k in enumerate(ids):
            with h5py.File(out / split / f"data_{i}.hdf5", "w") as g:
                g.create_dataset("data", data=data[k], compression=None)
    return {"train": n_train, "test": n - n_train, "shape": list(data.shape)}


def child_main(argv: list[str]) -> int:
    """`ingest.py _child read FILE` / `ingest.py _child baseline FILE OUT`: one pass, its result as a JSON line."""
    what, *paths = argv
    if what == "read":
        result = plain_read(Path(paths[0]))
    elif what == "baseline":
        result = baseline_preprocess(Path(paths[0]), Path(paths[1]))
    else:
        raise SystemExit(f"unknown child pass {what!r}")
    print(json.dumps(result))
    return 0


def last_json(text: str) -> dict[str, Any]:
    """The last line of a child's output, as JSON."""
    return json.loads(text.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ passes

@dataclass
class Bench:
    """The run's input, temp folder and child environment."""

    work: Path
    raw: Path
    res: int
    keep: bool
    env: dict[str, str]
    commands: dict[str, str] = field(default_factory=dict)

    @property
    def input_bytes(self) -> int:
        return self.raw.stat().st_size

    def output(self, name: str) -> Path:
        return self.work / f"out-{name}"

    def done_with(self, out: Path) -> int:
        """Size of a pass's output; then fsync it and drop it from the cache (deleted unless --keep)."""
        size = folder_bytes(out)
        evict(out)
        if not self.keep:
            shutil.rmtree(out, ignore_errors=True)
        return size

    def child(self, name: str, command: list[str], watch: list[int] | None = None,
              env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
        """Run one pass's child on a cold input (in `env`, default the worktree's, and `cwd`); SystemExit with its
        output when it fails."""
        self.commands[name] = shlex.join(command)
        print(f"[{name}] {self.commands[name]}", flush=True)
        evict(self.raw)
        run = run_measured(command, self.work / f"{name}.log", env or self.env, watch, cwd)
        if run.rc != 0:
            print(run.log, file=sys.stderr)
            raise SystemExit(f"pass {name} failed with exit code {run.rc}")
        return run


def ingest_command(bench: Bench, out: Path, *extra: str) -> list[str]:
    """`dpot-data ingest pdebench FILE --out DIR` with default options (the grid kept when --res is not 128)."""
    grid = ["--resolution", str(bench.res)] if bench.res != 128 else []
    return [sys.executable, "-m", "dpot_data", "ingest", "pdebench", str(bench.raw), "--out", str(out),
            "--no-progress", *grid, *extra]


def pass_read(bench: Bench) -> dict[str, Any]:
    run = bench.child("read", [sys.executable, __file__, "_child", "read", str(bench.raw)])
    return figures(bench.input_bytes, run.wall_s, run.cpu_s, run.peak_rss, 0, **last_json(run.log))


def pass_baseline(bench: Bench) -> dict[str, Any]:
    out = bench.output("baseline")
    run = bench.child("baseline", [sys.executable, __file__, "_child", "baseline", str(bench.raw), str(out)])
    result = last_json(run.log)
    return figures(bench.input_bytes, run.wall_s, run.cpu_s, run.peak_rss, bench.done_with(out), **result)


def manifest_summary(out: Path) -> dict[str, Any]:
    """What an ingest wrote, from its manifest."""
    manifest = json.loads((out / "manifest.json").read_text())
    d = manifest["datasets"][0]
    return {"dataset": d["name"], "trajectories": d["trajectories"], "splits": d["splits"]["counts"],
            "shards": len(d["shards"]), "zarr": d["zarr"] is not None, "stats": d["stats"] is not None}


def pass_ingest(bench: Bench, name: str, *extra: str, watch: list[int] | None = None,
                env: dict[str, str] | None = None, cwd: Path | None = None) -> tuple[dict[str, Any], Run]:
    out = bench.output(name)
    run = bench.child(name, ingest_command(bench, out, *INGEST_PASSES.get(name, ()), *extra), watch, env, cwd)
    summary = manifest_summary(out)
    return figures(bench.input_bytes, run.wall_s, run.cpu_s, run.peak_rss, bench.done_with(out),
                   manifest=summary, sys_s=round(run.sys_s, 3), minor_faults=run.minor_faults), run


def pass_against(bench: Bench, tree: Path) -> dict[str, Any]:
    """The default ingest of another checkout (`--against DIR`): DIR first on PYTHONPATH, the same interpreter, run
    in DIR (`python -m` puts its working folder before PYTHONPATH)."""
    return pass_ingest(bench, "against", env=child_env(tree), cwd=tree)[0]


def comparison(passes: dict[str, dict], floor: float | None) -> dict[str, Any] | None:
    """The default ingest against the `against` pass: wall and CPU ratios (this tree / the other), and each one's
    fraction of the I/O floor."""
    if "default" not in passes or "against" not in passes:
        return None
    this, other = passes["default"], passes["against"]
    return {"wall_ratio": round(this["wall_s"] / other["wall_s"], 3),
            "cpu_ratio": round(this["cpu_s"] / other["cpu_s"], 3),
            "sys_s": {"default": this.get("sys_s"), "against": other.get("sys_s")},
            "minor_faults": {"default": this.get("minor_faults"), "against": other.get("minor_faults")},
            "floor_efficiency": None if floor is None else {"default": round(floor / this["wall_s"], 3),
                                                            "against": round(floor / other["wall_s"], 3)}}


def pass_cluster(bench: Bench) -> dict[str, Any]:
    """The default ingest on a LocalCluster of 2 single-threaded worker processes started here."""
    from distributed import Client, LocalCluster

    os.environ["PYTHONPATH"] = bench.env["PYTHONPATH"]  # the worker processes import this worktree's code
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        client.run(exec, "import dpot_data.ingest, dpot_data.sources.pdebench, h5py")  # imports off the clock
        workers = [p.pid for p in psutil.Process().children(recursive=True)]
        before = process_cpu(workers), other_threads_cpu()  # the scheduler's threads, here
        result, run = pass_ingest(bench, "cluster", "--scheduler", cluster.scheduler_address, watch=workers)
        workers_cpu, after = process_cpu(workers) - before[0], other_threads_cpu()
        scheduler_cpu = sum(after[t] - before[1][t] for t in after.keys() & before[1].keys())
    cpu = run.cpu_s + workers_cpu + scheduler_cpu
    return {**result, **figures(bench.input_bytes, run.wall_s, cpu, run.peak_rss, result["output_bytes"]),
            "cpu_parts_s": {"driver": round(run.cpu_s, 3), "workers": round(workers_cpu, 3),
                            "scheduler": round(scheduler_cpu, 3)}}


def pass_durable(bench: Bench, size: int = DURABLE_BYTES, chunk: int = 8 * MIB, piece: int = 64 * MIB
                 ) -> dict[str, Any]:
    """Write `size` incompressible bytes into the output folder as the ingest's writers do, each `piece` synced
    (fdatasync) and dropped from the page cache (fadvise DONTNEED) before the next: the disk's sustained durable write
    rate. (One fsync at the end of 512 MiB written into page-cache memory the VM has not touched before measured
    anywhere from 0.46 to 2.4 GB/s on the same disk: it timed the guest's memory more than the disk.)"""
    folder = bench.output("durable")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "durable.bin"
    data = memoryview(np.random.default_rng(0).bytes(chunk))
    print(f"[durable] write {size / MIB:.0f} MiB to {path}, synced and dropped every {piece / MIB:.0f} MiB",
          flush=True)
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < size:
            done += os.write(fd, data[:min(chunk, size - done)])
            if done % piece == 0 or done == size:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.fsync(fd)
    finally:
        os.close(fd)
    wall = time.perf_counter() - start
    evict(path)
    shutil.rmtree(folder, ignore_errors=True)
    return {"bytes": size, "wall_s": round(wall, 3), "mb_s": round(size / MB / wall, 1), "piece_bytes": piece}


# ------------------------------------------------------------------------------------------------ profile

STAGES = ("raw read (h5py)", "finiteness check", "resample/transform", "Zarr encode+write (zarr/numcodecs)",
          "tar/npy write", "sha256 hashing", "statistics", "fsync/sync", "other")
READ, FINITE, TRANSFORM, ZARR, TAR, SHA, STATS, SYNC, OTHER = STAGES
STAGE_NOTES = {
    READ: "the block read: h5py, the reader's copy to (y, x) order, dask's array code and its copy",
    FINITE: "the NaN/Inf scan when the file is opened, its own h5py read of the whole file included",
    TRANSFORM: "per-block work of the ingest task (piece stacking, resampling, channel padding, copies)",
    ZARR: "zarr and numcodecs (blosc-lz4), chunk file writes and syncs, zarr's asyncio loop",
    TAR: "tarfile, .npy encoding, the shard writer",
    SHA: "hashlib: the input file, the Zarr arrays, the shards",
    STATS: "dpot_data.stats",
    SYNC: "fsync/syncfs calls (CPU only; their wall time is on the line below)",
    OTHER: "dask scheduling, journal, manifest, imports, everything else",
}


def owner_stage(key: tuple[str, int, str]) -> str | None:
    """The stage a profiled function belongs to by itself; None when it takes its callers' stage (numpy, dask,
    h5py, builtins and other shared code)."""
    file, _line, func = key
    path = file.replace("\\", "/")
    if file == "~":  # C functions: named by what they are
        if "_hashlib" in func or "sha256" in func:
            return SHA
        if any(s in func for s in ("posix.fsync", "posix.sync", "posix.fdatasync")):
            return SYNC
        if "numcodecs" in func or "zstd" in func:
            return ZARR
        return None
    if path.endswith("dpot_format/io.py"):
        return SHA
    if path.endswith("dpot_data/stats.py"):
        return STATS
    if path.endswith("dpot_data/writers/zarr_store.py"):
        return SYNC if func in ("fsync_tree", "_syncfs") else ZARR
    if path.endswith("dpot_data/manifest_io.py") and func == "fsync_dir":
        return SYNC
    if "/zarr/" in path or "/numcodecs/" in path:
        return ZARR
    if "/dask/array/" in path:  # the ingest computes dask arrays only to read blocks (slicing, getter, final copy)
        return READ
    if path.endswith("/tarfile.py") or path.endswith("dpot_data/writers/wds_shards.py") or \
            "numpy/lib/format.py" in path or "numpy/lib/_format_impl.py" in path:
        return TAR
    if "dpot_data/sources/" in path:
        if func in ("finite_frames", "_finite_frames", "frames_ok", "_scan_range", "scan", "checked"):
            return FINITE
        if func in ("block", "__getitem__"):
            return READ
        return None
    if path.endswith("dpot_data/transform.py") or (path.endswith("dpot_data/ingest.py") and func == "_process_block"):
        return TRANSFORM
    return None


def fallback_stage(key: tuple[str, int, str]) -> str:
    """The stage of a function none of whose callers has one (thread roots, event loops)."""
    file, _line, func = key
    if "h5py" in file or "h5py" in func:
        return READ
    if "/asyncio/" in file.replace("\\", "/"):
        return ZARR  # only zarr runs an asyncio loop in the ingest
    return OTHER


def callers_first(keys: list[tuple], stats: dict) -> list[tuple]:
    """`keys` ordered so that a function comes after its callers (call cycles cut anywhere): one sweep in this
    order settles every function outside a cycle."""
    wanted, done, order = set(keys), set(), []
    for start in keys:
        if start in done:
            continue
        done.add(start)
        stack = [(start, iter(stats[start][4]))]
        while stack:
            node, callers = stack[-1]
            for caller in callers:
                if caller in wanted and caller not in done:
                    done.add(caller)
                    stack.append((caller, iter(stats[caller][4])))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def stage_shares(stats: dict, rounds: int = 300, tol: float = 1e-4) -> dict[tuple, dict[str, float]]:
    """key -> {stage: fraction} for the functions in `stats` (pstats' raw dict): a function's own stage, else the
    mix of its callers' stages weighted by the cumulative time each caller spent in it. Solved by sweeps until
    nothing changes by more than `tol` (call cycles settle on an average)."""
    shares = {k: {owner_stage(k) or fallback_stage(k): 1.0} for k in stats}
    pending = callers_first([k for k in stats if owner_stage(k) is None and stats[k][4]], stats)
    for _ in range(rounds):
        change = 0.0
        for key in pending:
            mix: dict[str, float] = defaultdict(float)
            weight = 0.0
            for caller, (_cc, nc, _tt, ct) in stats[key][4].items():
                if caller == key or caller not in shares:
                    continue
                w = ct if ct > 0 else 1e-9 * nc
                for stage, part in shares[caller].items():
                    mix[stage] += w * part
                weight += w
            if weight <= 0:
                continue
            new = {s: v / weight for s, v in mix.items() if v > 0}
            old = shares[key]
            change = max(change, max(abs(new.get(s, 0.0) - old.get(s, 0.0)) for s in set(new) | set(old)))
            shares[key] = new
        if change < tol:
            break
    return shares


def stage_seconds(stats: dict, shares: dict[tuple, dict[str, float]]) -> dict[str, float]:
    """The self time of every profiled function, spread over the stages by its `stage_shares`."""
    out = dict.fromkeys(STAGES, 0.0)
    for key, (_cc, _nc, tt, _ct, _callers) in stats.items():
        for stage, part in shares[key].items():
            out[stage] += tt * part
    return out


@contextlib.contextmanager
def wall_probes(walls: dict[str, float]) -> Iterator[None]:
    """While active, add the wall seconds spent inside some calls of the ingest to `walls`: its fsync/syncfs calls
    and the NaN/Inf scan of the input when it is opened (a whole read of the file before any block is processed;
    0 for a clean file under --nonfinite skip, read with no scan first)."""
    from dpot_data.sources import _blocks
    from dpot_data.writers import zarr_store

    targets = {"fsync/syncfs": [(os, "fsync"), (zarr_store, "_syncfs")], "NaN/Inf scan at open": [(_blocks, "scan")]}

    def timed(name: str, fn: Callable) -> Callable:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                walls[name] += time.perf_counter() - t0
        return wrapper

    saved = [(owner, attr, getattr(owner, attr)) for spots in targets.values() for owner, attr in spots]
    for name, spots in targets.items():
        walls[name] = 0.0
        for owner, attr in spots:
            setattr(owner, attr, timed(name, getattr(owner, attr)))
    try:
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


class _Snapshot:
    """What a thread's profiler has recorded so far, for pstats.Stats.add. Stats would call create_stats(), whose
    disable() closes the calls still open in that thread (a pool worker waiting for work) with this thread's CPU
    clock; a snapshot leaves calls in progress out instead."""

    def __init__(self, prof: Any) -> None:
        prof.snapshot_stats()
        self.stats = prof.stats

    def create_stats(self) -> None:
        pass


def profile_ingest(bench: Bench, top: int = 12, dump: Path | None = None) -> dict[str, Any]:
    """Run the default ingest in this process with a cProfile (per-thread CPU clock) in every thread it starts:
    CPU seconds per stage, wall seconds inside fsync/syncfs and the NaN/Inf scan, the costliest functions.
    `dump`: also write the merged profile there (pstats format, for `python -m pstats` or snakeviz)."""
    import cProfile
    import io
    import pstats

    from typer.main import get_command

    import dpot_data.catalog, dpot_data.ingest, dpot_data.ingest.remote, dpot_data.sources.pdebench  # noqa: F401, E401
    from dpot_data.cli import app  # imports done before the clock starts

    out = bench.output("profile")
    args = ingest_command(bench, out)[3:]  # after `python -m dpot_data`
    bench.commands["profile"] = "in-process under cProfile: dpot-data " + shlex.join(args)
    print(f"[profile] {bench.commands['profile']}", flush=True)
    profiles: list[cProfile.Profile] = []
    thread_run = threading.Thread.run

    def profiled_run(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        profiles.append(prof)
        prof.enable()
        try:
            thread_run(self)
        finally:
            prof.disable()

    command = get_command(app)
    evict(bench.raw)
    main = cProfile.Profile(time.thread_time)
    walls: dict[str, float] = {}
    cpu0, start = self_cpu(), time.perf_counter()
    threading.Thread.run = profiled_run
    try:
        with wall_probes(walls), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main.enable()
            try:
                command.main(args=args, prog_name="dpot-data", standalone_mode=False)
            finally:
                main.disable()
    finally:
        threading.Thread.run = thread_run
    wall, cpu = time.perf_counter() - start, self_cpu() - cpu0
    stats = pstats.Stats(main)
    for snapshot in map(_Snapshot, profiles):
        if snapshot.stats:  # a thread that ran no profiled call has nothing to add (pstats refuses an empty one)
            stats.add(snapshot)
    if dump is not None:
        stats.dump_stats(dump)
    bench.done_with(out)
    raw = stats.stats  # type: ignore[attr-defined]
    shares = stage_shares(raw)
    seconds = stage_seconds(raw, shares)
    n = bench.input_bytes
    h5py_s = sum(v[2] for k, v in raw.items() if "h5py" in k[0] or "h5py" in k[2])
    costly = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    return {
        "wall_s": round(wall, 3),
        "process_cpu_s": round(cpu, 3),
        "profiled_cpu_s": round(sum(seconds.values()), 3),
        "threads_profiled": len(profiles) + 1,
        "stages_ns_per_byte": {s: round(v * 1e9 / n, 2) for s, v in seconds.items()},
        "h5py_ns_per_byte": round(h5py_s * 1e9 / n, 2),
        "wall_inside_s": {k: round(v, 3) for k, v in walls.items()},
        "top_functions": [{"function": pstats.func_std_string(k), "ns_per_byte": round(v[2] * 1e9 / n, 2),
                           "calls": v[1], "stage": max(shares[k].items(), key=lambda kv: kv[1])[0]}
                          for k, v in costly],
    }


# ------------------------------------------------------------------------------------------------ report

@dataclass(frozen=True)
class Goal:
    name: str
    value: float | None
    target: float
    at_least: bool  # True: value >= target, False: value <= target

    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.target if self.at_least else self.value <= self.target

    def line(self, fmt: str = "{:.2f}") -> str:
        value = "not measured" if self.value is None else fmt.format(self.value)
        verdict = {True: "met", False: "missed", None: "not measured"}[self.met()]
        return f"goal {self.name}: {value} (goal {'>=' if self.at_least else '<='} {self.target:g}): {verdict}"

    def to_dict(self) -> dict[str, Any]:
        return {"value": None if self.value is None else round(self.value, 4), "goal": self.target,
                "at_least": self.at_least, "met": self.met()}


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time (the lower middle one of an even count), with every run's wall time beside it."""
    chosen = dict(sorted(runs, key=lambda r: r["wall_s"])[(len(runs) - 1) // 2])
    if len(runs) > 1:
        chosen["wall_s_runs"] = [r["wall_s"] for r in runs]
    return chosen


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def wall(passes: dict[str, dict], name: str) -> float | None:
    return passes[name]["wall_s"] if name in passes else None


def io_floor(passes: dict[str, dict], durable: dict | None) -> float | None:
    """What the default ingest cannot beat on this disk: max(plain read time, its output bytes at the durable rate)."""
    if "read" not in passes or "default" not in passes or durable is None:
        return None
    return max(passes["read"]["wall_s"], passes["default"]["output_bytes"] / (durable["mb_s"] * MB))


def goals(passes: dict[str, dict], durable: dict | None) -> list[tuple[Goal, str]]:
    """The goals, each with how its value is printed."""
    floor = io_floor(passes, durable)
    out = [
        (Goal("default / baseline speed", ratio(wall(passes, "baseline"), wall(passes, "default")), 1, True), "{:.2f}"),
        (Goal("wds / baseline speed", ratio(wall(passes, "baseline"), wall(passes, "wds")), 2, True), "{:.2f}"),
        (Goal("default / I/O floor efficiency", ratio(floor, wall(passes, "default")), 0.65, True), "{:.2f}"),
        (Goal("default CPU ns per input byte", passes.get("default", {}).get("cpu_ns_per_byte"), 8, False), "{:.1f}"),
        (Goal("raise / baseline speed", ratio(wall(passes, "baseline"), wall(passes, "raise")), 1, True), "{:.2f}"),
    ]
    for name in ("default", "zarr", "wds", "raise", "cluster"):
        peak = passes.get(name, {}).get("peak_rss_bytes")
        out.append((Goal(f"peak RSS of {name} (GB)", None if peak is None else peak / GB, 2, False), "{:.2f}"))
    out.append((Goal("cluster / local threads wall", ratio(wall(passes, "cluster"), wall(passes, "default")), 1.2,
                     False), "{:.2f}"))
    return out


def table(passes: dict[str, dict]) -> str:
    head = (f"{'pass':<9} {'wall s':>8} {'CPU s':>8} {'CPU ns/B':>9} {'input MB/s':>11} {'peak RSS MB':>12} "
            f"{'output MB':>10}")
    lines = [head, "-" * len(head)]
    for name, p in passes.items():
        lines.append(f"{name:<9} {p['wall_s']:>8.2f} {p['cpu_s']:>8.2f} {p['cpu_ns_per_byte']:>9.2f} "
                     f"{p['input_mb_s']:>11.1f} {p['peak_rss_bytes'] / MB:>12.0f} {p['output_bytes'] / MB:>10.0f}")
    return "\n".join(lines)


def projection(passes: dict[str, dict], input_bytes: int) -> dict[str, Any] | None:
    """A published CNS 128² training file (10 000 trajectories, 55 GB) at the rates measured here, and the RAM the
    baseline needs for it: the four fields read whole plus their stacked copy, twice the file."""
    if "default" not in passes:
        return None
    real = REAL_TRAJECTORIES * trajectory_bytes(128)
    out: dict[str, Any] = {"file_bytes": real, "trajectories": REAL_TRAJECTORIES,
                           "default_s": round(real / (passes["default"]["input_mb_s"] * MB), 1)}
    if "baseline" in passes:
        out.update(baseline_s=round(real / (passes["baseline"]["input_mb_s"] * MB), 1), baseline_ram_bytes=2 * real,
                   baseline_peak_rss_per_input_byte=round(passes["baseline"]["peak_rss_bytes"] / input_bytes, 3))
    return out


def projection_line(proj: dict[str, Any], ram: int) -> str:
    text = (f"projection: one published 2D_CFD_Rand_*_periodic_128_Train.hdf5 ({proj['trajectories']} trajectories, "
            f"{proj['file_bytes'] / GB:.1f} GB): {proj['default_s'] / 60:.0f} min with the default ingest at the "
            f"rate measured here, in the same bounded memory")
    if "baseline_s" in proj:
        text += (f"; the baseline, {proj['baseline_s'] / 60:.0f} min at its rate, but it holds the whole file and its "
                 f"stacked copy: ~{proj['baseline_ram_bytes'] / GB:.0f} GB of RAM for that "
                 f"{proj['file_bytes'] / GB:.0f} GB file (its peak RSS here: "
                 f"{proj['baseline_peak_rss_per_input_byte']:.2f}x its input; this machine has {ram / GB:.0f} GB)")
    return text


def profile_lines(prof: dict[str, Any], input_bytes: int) -> list[str]:
    total = sum(prof["stages_ns_per_byte"].values())
    lines = [f"profile (default ingest in-process, CPU per stage over all threads, ns per input byte): "
             f"wall {prof['wall_s']:.1f} s, process CPU {prof['process_cpu_s']:.1f} s, profiled "
             f"{prof['profiled_cpu_s']:.1f} s in {prof['threads_profiled']} threads"]
    for stage, ns in prof["stages_ns_per_byte"].items():
        share = 100 * ns / total if total else 0.0
        lines.append(f"  {stage:<36} {ns:>7.2f} ns/B {share:>5.1f} %   {STAGE_NOTES[stage]}")
    lines.append(f"  {'total':<36} {total:>7.2f} ns/B")
    lines.append(f"  h5py calls in all stages: {prof['h5py_ns_per_byte']:.2f} ns/B")
    lines.append("  wall time inside " + ", ".join(f"{k}: {v:.2f} s ({v * 1e9 / input_bytes:.2f} ns/B)"
                                                  for k, v in prof["wall_inside_s"].items()))
    lines.append("  costliest functions (self CPU):")
    for f in prof["top_functions"]:
        lines.append(f"    {f['ns_per_byte']:>7.2f} ns/B {f['calls']:>9} calls  {f['stage']:<20.20}  {f['function']}")
    return lines


def git_commit(root: Path = ROOT) -> str | None:
    """A worktree's commit (default this one's), with '+dirty' when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def check_disk(folder: Path, input_bytes: int, keep: bool) -> None:
    """SystemExit unless the folder has room for the input, the outputs (all of them with --keep) and the
    durable-write file."""
    outputs = 9.5 if keep else 2.2  # default ~1.9x the input; all passes together ~9x
    needed = int(input_bytes * (1 + outputs)) + DURABLE_BYTES + int(GB)
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise SystemExit(f"{folder}: {free / GB:.1f} GB free, the benchmark needs {needed / GB:.1f} GB")


def child_env(tree: Path = ROOT) -> dict[str, str]:
    """This process's environment with a worktree (default this one) first on PYTHONPATH, this one left out
    otherwise."""
    env = dict(os.environ)
    skip = {str(ROOT), str(tree)}
    parts = [str(tree), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in skip)]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="input size in GB of 1e9 bytes (default 1)")
    parser.add_argument("--res", type=int, default=128, help="grid of the input (the ingest keeps it)")
    parser.add_argument("--passes", default=",".join(PASSES), help=f"comma list of {', '.join(PASSES)} (default all)")
    parser.add_argument("--no-cluster", action="store_true", help="skip the dask.distributed pass")
    parser.add_argument("--profile", action="store_true", help="also profile the default ingest per stage")
    parser.add_argument("--profile-out", type=Path, help="with --profile: also write the merged profile there "
                        "(pstats format)")
    parser.add_argument("--durable-mib", type=int, default=DURABLE_BYTES // MIB,
                        help="MiB written and fsynced by the durable pass (default 512)")
    parser.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()), help="parent of the temp folder")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder with the input and every output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--against", type=Path, help="another checkout of dpot (e.g. a worktree of main): its "
                        "default ingest runs right after this one's in every round (pass `against`)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of all passes, interleaved; each pass is "
                        "reported by its run of median wall time (default 1)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    args.passes = [p.strip() for p in args.passes.split(",") if p.strip()]
    unknown = [p for p in args.passes if p not in PASSES]
    if unknown:
        parser.error(f"unknown passes {unknown}; expected some of {', '.join(PASSES)}")
    if args.no_cluster:
        args.passes = [p for p in args.passes if p != "cluster"]
    if args.against is not None:
        args.against = args.against.resolve()
        if not (args.against / "dpot_data" / "__init__.py").is_file():
            parser.error(f"--against {args.against}: expected a checkout of dpot (no dpot_data/__init__.py there)")
        if "default" not in args.passes:
            parser.error("--against compares with the default pass: keep `default` in --passes")
        args.passes.insert(args.passes.index("default") + 1, "against")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_child"]:
        return child_main(argv[1:])
    args = parse_args(argv)
    n = trajectories_for(args.size_gb, args.res)
    check_disk(args.tmp, n * trajectory_bytes(args.res), args.keep)
    work = Path(tempfile.mkdtemp(prefix="dpot-bench-", dir=args.tmp.resolve()))  # absolute: passes run elsewhere
    result: dict[str, Any] = {"benchmark": "ingest", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "commit": git_commit(), "machine": machine(args.tmp, PACKAGES)}
    try:
        t0 = time.perf_counter()
        raw = write_input(work / "raw", n, args.res, args.seed)
        generate_s = time.perf_counter() - t0
        bench = Bench(work, raw, args.res, args.keep, child_env())
        evict(raw)
        print(f"input {raw.name}: {n} trajectories, {bench.input_bytes / MB:.0f} MB, written in {generate_s:.1f} s",
              flush=True)
        runners = {"read": pass_read, "baseline": pass_baseline, "cluster": pass_cluster,
                   "against": lambda b: pass_against(b, args.against),
                   **{k: (lambda b, k=k: pass_ingest(b, k)[0]) for k in ("default", "zarr", "wds", "raise")}}
        runs: dict[str, list[dict]] = defaultdict(list)
        for round_no in range(1, args.repeat + 1):
            if args.repeat > 1:
                print(f"round {round_no} of {args.repeat}", flush=True)
            for name in args.passes:
                if name == "durable":
                    d = pass_durable(bench, args.durable_mib * MIB)
                    runs[name].append(d)
                    print(f"[durable] {d['bytes'] / MIB:.0f} MiB written and fsynced in {d['wall_s']:.2f} s "
                          f"= {d['mb_s']:.0f} MB/s", flush=True)
                    continue
                p = runners[name](bench)
                runs[name].append(p)
                print(f"[{name}] {p['wall_s']:.2f} s, {p['input_mb_s']:.0f} MB/s, CPU {p['cpu_s']:.2f} s, peak RSS "
                      f"{p['peak_rss_bytes'] / MB:.0f} MB, output {p['output_bytes'] / MB:.0f} MB", flush=True)
        durable = median_run(runs.pop("durable")) if "durable" in runs else None
        passes = {name: median_run(r) for name, r in runs.items()}
        prof = profile_ingest(bench, dump=args.profile_out) if args.profile else None

        print()
        print(table(passes))
        floor = io_floor(passes, durable)
        if durable is not None:
            print(f"durable write rate: {durable['mb_s']:.0f} MB/s ({durable['bytes'] / MIB:.0f} MiB + fsync in "
                  f"{durable['wall_s']:.2f} s)")
        if floor is not None:
            print(f"I/O floor of the default ingest: {floor:.2f} s = max(plain read {passes['read']['wall_s']:.2f} s, "
                  f"{passes['default']['output_bytes'] / MB:.0f} MB output at {durable['mb_s']:.0f} MB/s)")
        goal_list = goals(passes, durable)
        for goal, fmt in goal_list:
            print(goal.line(fmt))
        against = comparison(passes, floor)
        if against is not None:
            print(f"default against {args.against} ({git_commit(args.against)}): wall {against['wall_ratio']:.2f}x, "
                  f"CPU {against['cpu_ratio']:.2f}x of the other's (system CPU {against['sys_s']['default']:.2f} s "
                  f"against {against['sys_s']['against']:.2f} s)"
                  + ("" if floor is None else f"; of the I/O floor: {against['floor_efficiency']['default']:.2f} "
                     f"against {against['floor_efficiency']['against']:.2f}"))
            against.update(tree=str(args.against), commit=git_commit(args.against))
        proj = projection(passes, bench.input_bytes)
        if proj is not None:
            print(projection_line(proj, result["machine"]["ram_bytes"]))
        if prof is not None:
            print("\n".join(profile_lines(prof, bench.input_bytes)))
        result.update({
            "input": {"file": raw.name, "bytes": bench.input_bytes, "trajectories": n, "res": args.res,
                      "frames": FRAMES, "generate_s": round(generate_s, 2)},
            "cache": "cold: fsync + posix_fadvise(DONTNEED) of the input before and of the output after each pass",
            "commands": bench.commands,
            "passes": passes,
            "durable_write": durable,
            "io_floor_s": None if floor is None else round(floor, 3),
            "goals": {goal.name: goal.to_dict() for goal, _ in goal_list},
            "projection": proj,
            "against": against,
            "profile": prof,
            "load_average_end": [round(v, 2) for v in os.getloadavg()],
            "work": str(work) if args.keep else None,
        })
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
