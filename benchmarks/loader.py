"""Loader benchmark: our WebDataset and Zarr window streams against a DPOT-style per-trajectory HDF5 loader.

Run:  .venv/bin/python benchmarks/loader.py                  # small default: about a minute on 2 cores
      .venv/bin/python benchmarks/loader.py --workers 0,2,4 --seconds 20 --trajectories 64
      .venv/bin/python benchmarks/loader.py --profile         # cProfile of one single-process pass per loader
      .venv/bin/python benchmarks/loader.py --loaders zarr --workers 0 --zarr-codec lz4   # experiment: Zarr codec
      .venv/bin/python benchmarks/loader.py --loaders webdataset --shard-mb 8           # experiment: shard size

1. Writes PDEBench diffusion-reaction trajectories (2 channels, `--native` grid, `--frames` frames) with
   `dpot_data.synth`, ingests them with `dpot_data.ingest` at 128x128, 4 channels (pad value 1, bilinear, which is
   what DPOT's preprocessing does too), all trajectories in the train split, into WebDataset shards and Zarr;
   and writes the same trajectories as one HDF5 file per trajectory at the native grid (benchmarks/reference_loader.py).
2. For each worker count, measures in this one process: (a) our stream from WebDataset shards, (b) our stream from
   Zarr, both with loader worker threads (`make_loader(kind="thread")`, the training default), (c) the
   reference-style torch Dataset (open the file on each access, read the whole trajectory, bilinear resize to
   128x128, pad channels with 1, random window) under a DataLoader with a shuffling sampler and worker processes, as
   DPOT ships it, and (d) `webdataset-process`: our WebDataset stream with worker processes (`--worker-kind
   process`: batches built in a shared ring of slots, `dpot_train.data.process_ring`; with a --baseline from before
   it, DataLoader worker processes; only with workers: without them it is (a)). Each measurement drops its batch
   before asking for the next, as the training loop does. `zarr-process` can be asked for too, and
   `webdataset-plain`: (a) with its batches built by the plain path (`collate` of `make_sample`: each window read()
   into an array of its own, then stacked) instead of `read_batch` (each window copied from a memory map of the
   shard straight into its slot of the batch buffer): the loader as it was before read_batch.
   All deliver batches of `--batch` windows of 10 + 1 frames, (B, 128, 128, T, 4) float32. Each measurement starts
   after `--warmup` batches per worker (worker start-up excluded) and runs for `--seconds` of wall time.
3. Reports samples/s, delivered window MB/s, input MB/s (bytes the process tree read through read() calls, psutil
   `read_chars`), CPU milliseconds per sample (user + system of the process tree: the figure least disturbed by other
   load on a shared machine) and peak resident memory of the process tree (main process plus workers, polled; pages
   shared between processes count once per process). Neither loader adds noise: both leave it to the training step
   (ours injects it on the training device, `dpot_train.data.windows.inject_noise`; see benchmarks/train_step.py).
   Before the loaders, what one core does per window here (`window_bounds`: a memory copy and a read from the shard
   of 2.9 MB), the floor of a loader's CPU time per sample; after them, whether `webdataset` reached RATE_GOAL.
   Each row's `copy_ratio` is its samples/s over the `copy` bound's windows/s (one core copying the window bytes),
   `copy_cpu_ratio` the same in CPU time per window; the window goal is `webdataset` without workers at
   COPY_GOAL or more.
4. `--baseline DIR` (another checkout of this project, e.g. /work/main): every loader is measured twice, side by
   side, on the same data: with this checkout's code and with DIR's (`NAME@LABEL` rows, LABEL the folder's name),
   each in a child process of its own whose `dpot_train` is that checkout's (`code` in the JSON says which was
   imported), alternating; `--repeat N` does the whole round N times. `ratios.vs_baseline` divides ours by theirs.
The last line of output is one JSON object with every figure. The temp folder is removed unless --keep.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import torch
from torch.utils.data import DataLoader, RandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_name  # noqa: E402
from common import machine as host_machine  # noqa: E402
from reference_loader import ReferenceWindows, write_reference_files  # noqa: E402

MB = 1e6
LOADERS = ("webdataset", "zarr", "reference", "webdataset-process", "zarr-process", "webdataset-plain")
DEFAULT_LOADERS = ("webdataset", "zarr", "reference", "webdataset-process")
T_IN, T_OUT, RES, CHANNELS = 10, 1, 128, 4
RATE_GOAL = 1700  # samples/s a compiled Ti training step consumes on one H100 (batch 8, 128^2, 10 + 1 frames)
COPY_GOAL = 0.6  # webdataset without workers: windows/s against one core copying the window bytes
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class BenchData:
    """The same trajectories in our output folder (manifest, shards, Zarr) and as reference per-trajectory files."""

    root: Path
    manifest: Path
    reference: Path
    trajectories: int
    frames: int
    native: int
    prep_s: float

    def sizes(self) -> dict[str, int]:
        """Bytes on disk of each representation."""
        out = self.manifest.parent
        return {"webdataset": folder_bytes(out / "shards"), "zarr": folder_bytes(out / "data.zarr"),
                "reference": folder_bytes(self.reference)}


@dataclass
class Measurement:
    """One loader at one worker count."""

    loader: str
    workers: int
    kind: str  # who builds the batches: "main" (no workers), "thread" or "process" workers
    samples: int
    seconds: float
    samples_per_s: float
    window_mb_per_s: float
    read_mb_per_s: float
    cpu_ms_per_sample: float
    peak_rss_mib: float
    code: str = ""  # the checkout whose dpot_train was measured ("" for this process's own)
    copy_windows_per_s: float = 0.0  # one core copying windows, measured in the same process just before
    copy_cpu_ms_per_window: float = 0.0


def folder_bytes(path: Path) -> int:
    """Total size of the files below a folder."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def zarr_codec(name: str) -> str:
    """The ingest's chunk codec name for a short name (experiment option; the product writes blosc-lz4)."""
    codecs = {"zstd3": "zstd-3", "lz4": "blosc-lz4-shuffle"}
    if name not in codecs:
        raise ValueError(f"unknown Zarr codec {name!r}; choose from {sorted(codecs)}")
    return codecs[name]


def make_data(root: Path, trajectories: int, frames: int, native: int, seed: int = 0, shard_mb: float | None = None,
              codec: str | None = None) -> BenchData:
    """Synthesize raw PDEBench diffusion-reaction data, ingest it (WDS + Zarr, 128x128, 4 channels), write the
    reference per-trajectory files from the same raw file. `shard_mb` and `codec` override the ingest defaults."""
    from dpot_data.ingest import IngestOptions, run_ingest
    from dpot_data.synth.pdebench import write_diff_react
    from dpot_data.writers import zarr_store

    start = time.perf_counter()
    raw = write_diff_react(root / "raw", n=trajectories, frames=frames, res=native, seed=seed)
    opts = IngestOptions(resolution=RES, channels=CHANNELS, fill=1.0, resample="bilinear", split=(1.0,), name="dr",
                         formats=("zarr", "wds"), seed=seed, command="benchmarks/loader.py")
    if shard_mb is not None:
        opts.shard_size = int(shard_mb * 2**20)
    saved = zarr_store.CODEC_NAME
    try:
        if codec is not None:
            zarr_store.CODEC_NAME = zarr_codec(codec)
        outcome = run_ingest("pdebench", [raw], root / "out", opts)
    finally:
        zarr_store.CODEC_NAME = saved
    write_reference_files("pdebench", [raw], root / "reference")
    return BenchData(root, outcome.path, root / "reference", trajectories, frames, native,
                     time.perf_counter() - start)


def our_loader(data: BenchData, backend: str, workers: int, batch: int, seed: int = 0,
               pin_memory: bool = False, kind: str = "thread", direct: bool = True) -> Any:
    """The training stream as the trainer builds it (prepare_stream, WindowStream, make_loader; pinned on CUDA).
    direct=False: batches by the plain path (collate of make_sample: each window read() into an array of its own,
    then stacked) instead of read_batch (each window copied from the shard's map into its slot of the batch)."""
    from dpot_train.core.config import DataConfig
    from dpot_train.data.prepare import prepare_stream
    from dpot_train.data.loader import make_loader
    from dpot_train.data.stream import WindowStream

    cfg = DataConfig(manifests=[str(data.manifest)], backend=backend, t_in=T_IN, t_out=T_OUT, num_workers=workers,
                     worker_kind=kind, verify_checksums=False)
    spec, reader = prepare_stream(cfg, seed=seed, verify=False)
    if not direct and hasattr(reader, "map_files"):
        reader.map_files = False  # the plain path as it was: each window read() from the shard
    return make_loader(WindowStream(spec, reader, start=0, global_batch=batch, direct=direct), workers,
                       pin_memory=pin_memory, kind=kind)


def reference_loader(data: BenchData, workers: int, batch: int, seed: int = 0) -> DataLoader:
    """DPOT-style Dataset under a DataLoader that shuffles (epochs long enough never to end during a measurement)."""
    ds = ReferenceWindows(data.reference, data.trajectories, res=RES, n_channels=CHANNELS, t_in=T_IN, t_out=T_OUT)
    sampler = RandomSampler(ds, replacement=False, num_samples=len(ds) * 100_000,
                            generator=torch.Generator().manual_seed(seed))
    return DataLoader(ds, batch_size=batch, sampler=sampler, num_workers=workers, drop_last=True,
                      prefetch_factor=2 if workers else None)


def worker_kind(name: str, workers: int) -> str:
    """Who builds the batches of loader `name` with `workers` workers: "main", "thread" or "process"."""
    if workers == 0:
        return "main"
    return "process" if name == "reference" or name.endswith("-process") else "thread"


def build_loader(name: str, data: BenchData, workers: int, batch: int) -> Any:
    """One of LOADERS."""
    if name == "reference":
        return reference_loader(data, workers, batch)
    backend = name.removesuffix("-process").removesuffix("-plain")
    return our_loader(data, backend, workers, batch, kind="process" if name.endswith("-process") else "thread",
                      direct=not name.endswith("-plain"))


def batch_x(batch: Any) -> torch.Tensor:
    """Inputs of a batch from either loader (ours: dict; reference: tuple)."""
    return batch["x"] if isinstance(batch, dict) else batch[0]


def batch_y(batch: Any) -> torch.Tensor:
    """Targets of a batch from either loader."""
    return batch["y"] if isinstance(batch, dict) else batch[1]


class TreeWatch(threading.Thread):
    """Polls the summed RSS of this process and its children (peak); snapshots their read() bytes and CPU time."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(os.getpid())
        self.interval, self.peak = interval, 0
        self._done = threading.Event()

    def procs(self) -> list[psutil.Process]:
        return [self.root] + self.root.children(recursive=True)

    def read_chars(self) -> dict[int, int]:
        """Bytes read through read()/pread() per live process of the tree (page-cache hits included)."""
        out = {}
        for p in self.procs():
            try:
                out[p.pid] = p.io_counters().read_chars
            except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
                pass
        return out

    def cpu_seconds(self) -> dict[int, float]:
        """User + system CPU seconds per live process of the tree (robust to other load on a shared machine)."""
        out = {}
        for p in self.procs():
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return out

    def run(self) -> None:
        while not self._done.is_set():
            rss = 0
            for p in self.procs():
                try:
                    rss += p.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            self.peak = max(self.peak, rss)
            time.sleep(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()


def copy_rate(batch: int, seconds: float = 1.0) -> dict[str, float]:
    """One core copying windows (11 x 4 x 128 x 128 float32, 2.9 MB) with np.copyto from 8 source windows into a
    ring of 4 batches of windows (touched once, larger than the CPU caches): windows per second of wall time, CPU
    milliseconds per window, GB per CPU second. Memory bandwidth, shared with whatever else runs."""
    import numpy as np

    n = (T_IN + T_OUT) * CHANNELS * RES * RES
    ring = np.zeros((4 * batch, n), np.float32)
    src = np.ones((8, n), np.float32)
    np.copyto(ring[0], src[0])
    i, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        i += 1
        np.copyto(ring[i % len(ring)], src[i % len(src)])
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    return {"windows_per_s": round(i / wall, 1), "cpu_ms_per_window": round(cpu / i * 1e3, 3),
            "gb_per_cpu_s": round(i * n * 4 / 1e9 / cpu, 2)}


def measure(name: str, make: Callable[[], Any], workers: int, batch: int, seconds: float, warmup: int,
            min_batches: int = 3, copy_first: bool = True) -> Measurement:
    """Warm up (worker start-up and `warmup` batches per worker), then pull batches for `seconds` of wall time.
    `copy_first`: measure `copy_rate` in this process just before (a second), for the row's copy ratios."""
    copy = copy_rate(batch, min(1.0, seconds)) if copy_first else {"windows_per_s": 0.0, "cpu_ms_per_window": 0.0}
    loader = make()
    it: Iterator[Any] = iter(loader)
    for _ in range(warmup * max(1, workers)):
        next(it)
    watch = TreeWatch()
    watch.start()
    reads0, cpu0 = watch.read_chars(), watch.cpu_seconds()
    n = nbytes = 0
    start = time.perf_counter()
    while True:
        b = next(it)
        x, y = batch_x(b), batch_y(b)
        n += x.shape[0]
        nbytes += x.nbytes + y.nbytes
        b = x = y = None  # dropped before the next batch, as the trainer does (a process loader reuses its slot)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and n >= min_batches * batch:
            break
    reads1, cpu1 = watch.read_chars(), watch.cpu_seconds()
    watch.stop()
    del it
    read = sum(v - reads0.get(pid, 0) for pid, v in reads1.items())
    cpu = sum(v - cpu0.get(pid, 0.0) for pid, v in cpu1.items())
    return Measurement(name, workers, worker_kind(name, workers), n, round(elapsed, 3), round(n / elapsed, 2),
                       round(nbytes / MB / elapsed, 1),
                       round(read / MB / elapsed, 1), round(cpu / n * 1e3, 3), round(watch.peak / 2**20, 1),
                       copy_windows_per_s=copy["windows_per_s"], copy_cpu_ms_per_window=copy["cpu_ms_per_window"])


_CHILD = """
import dataclasses, json, sys
from pathlib import Path
sys.path.insert(1, sys.argv[1])  # benchmarks/ of the measuring checkout, after the measured code's root (cwd)
import torch
import loader as L
import dpot_train
a = json.loads(sys.argv[2])
torch.set_num_threads(a["threads"])
data = L.BenchData(Path(a["root"]), Path(a["manifest"]), Path(a["reference"]), a["trajectories"], a["frames"],
                   a["native"], 0.0)
r = L.measure(a["name"], lambda: L.build_loader(a["name"], data, a["workers"], a["batch"]), a["workers"], a["batch"],
              a["seconds"], a["warmup"])
r.code = str(Path(dpot_train.__file__).resolve().parents[1])
print(json.dumps(dataclasses.asdict(r)))
"""


def measure_in_child(code: Path, label: str, name: str, data: BenchData, workers: int, batch: int, seconds: float,
                     warmup: int, threads: int) -> Measurement:
    """`measure` of loader `name` in a fresh Python process whose `dpot_train` is the checkout `code` (its root is
    the child's working folder, first on its path); the row is named NAME@LABEL."""
    import subprocess

    args = {"root": str(data.root), "manifest": str(data.manifest), "reference": str(data.reference),
            "trajectories": data.trajectories, "frames": data.frames, "native": data.native, "name": name,
            "workers": workers, "batch": batch, "seconds": seconds, "warmup": warmup, "threads": threads}
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": str(threads)}
    r = subprocess.run([sys.executable, "-c", _CHILD, str(Path(__file__).resolve().parent), json.dumps(args)],
                       cwd=code, env=env, capture_output=True, text=True, timeout=max(600, 20 * seconds))
    if r.returncode != 0:
        raise RuntimeError(f"measuring {name}@{label} in {code} failed:\n{r.stderr[-3000:]}")
    row = json.loads(r.stdout.strip().splitlines()[-1])
    row["loader"] = f"{name}@{label}"
    return Measurement(**row)


def copy_ratios(r: Measurement, bounds: dict[str, dict[str, float]]) -> dict[str, float]:
    """A row's samples/s over one core's window copies per second (wall), and the same in CPU time: against the
    copy rate measured in the row's own process just before it (else the run's `bounds`)."""
    rate = r.copy_windows_per_s or bounds["copy"]["windows_per_s"]
    cpu = r.copy_cpu_ms_per_window or bounds["copy"]["cpu_ms_per_window"]
    return {"copy_ratio": round(r.samples_per_s / rate, 3),
            "copy_cpu_ratio": round(cpu / r.cpu_ms_per_sample, 3) if r.cpu_ms_per_sample else 0.0}


def baseline_ratios(results: list[Measurement], label: str) -> dict[str, dict[str, float]]:
    """Per loader and worker count: our samples/s over the baseline's (mean over repeats), and its CPU time per
    sample over ours."""
    out: dict[str, dict[str, float]] = {}
    ours = [r for r in results if "@" not in r.loader or not r.loader.endswith(f"@{label}")]
    for name in dict.fromkeys(r.loader.split("@")[0] for r in ours):
        for workers in dict.fromkeys(r.workers for r in ours if r.loader.split("@")[0] == name):
            mine = [r for r in ours if r.loader.split("@")[0] == name and r.workers == workers]
            base = [r for r in results if r.loader == f"{name}@{label}" and r.workers == workers]
            if not mine or not base:
                continue
            rate = sum(r.samples_per_s for r in mine) / len(mine) / (sum(r.samples_per_s for r in base) / len(base))
            cpu = (sum(r.cpu_ms_per_sample for r in base) / len(base)) / (sum(r.cpu_ms_per_sample for r in mine)
                                                                          / len(mine))
            out.setdefault(f"{name}_vs_{label}", {})[str(workers)] = round(rate, 2)
            out.setdefault(f"{name}_vs_{label}_cpu", {})[str(workers)] = round(cpu, 2)
    return out


def window_bounds(data: BenchData, batch: int, seconds: float = 1.0) -> dict[str, dict[str, float]]:
    """What one core of this machine does per window (11 x 4 x 128 x 128 float32, 2.9 MB), measured in this run:
    `copy`, np.copyto between window buffers (memory bandwidth); `read`, a readinto of a window at a random offset
    of the WebDataset shard (page cache to memory: the plain path's read) and `map`, the same window copied from a
    memory map of the shard (read_batch's copy), into a slot of 4 batches' buffers; windows per second and CPU ms
    per window. A loader cannot deliver more samples/s per core than its way of reading allows."""
    import mmap

    import numpy as np

    n = (T_IN + T_OUT) * CHANNELS * RES * RES
    ring = np.zeros((4 * batch, n), np.float32)  # destinations: touched once, larger than the CPU caches
    src = np.ones((8, n), np.float32)
    shard = max((data.manifest.parent / "shards").rglob("*.tar"), key=lambda p: p.stat().st_size)
    size = shard.stat().st_size
    offsets = np.random.default_rng(0).integers(0, max(1, size - n * 4), 4096)
    out: dict[str, dict[str, float]] = {}
    with open(shard, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        def read(i: int) -> None:
            f.seek(int(offsets[i % len(offsets)]))
            f.readinto(memoryview(ring[i % len(ring)]).cast("B"))

        def copy_mapped(i: int) -> None:
            np.copyto(ring[i % len(ring)].view(np.uint8), np.frombuffer(mapped, np.uint8, n * 4,
                                                                         int(offsets[i % len(offsets)])))

        for name, step in (("copy", lambda i: np.copyto(ring[i % len(ring)], src[i % len(src)])), ("read", read),
                           ("map", copy_mapped)):
            step(0)
            i, start, cpu0 = 0, time.perf_counter(), time.process_time()
            while time.perf_counter() - start < seconds:
                i += 1
                step(i)
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
            out[name] = {"windows_per_s": round(i / wall, 1), "cpu_ms_per_window": round(cpu / i * 1e3, 3),
                         "gb_per_cpu_s": round(i * n * 4 / 1e9 / cpu, 2)}
    return out


def profile_single(name: str, data: BenchData, batch: int, batches: int, top: int = 14) -> str:
    """cProfile of `batches` batches of one loader without workers: the functions with the most own time."""
    it = iter(build_loader(name, data, 0, batch))
    next(it)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(batches):
        next(it)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def machine() -> dict[str, Any]:
    """CPU, core count, load average (the machine may be shared), torch version and threads."""
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "load_avg": [round(v, 2) for v in os.getloadavg()],
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "python": platform.python_version()}


def ratios(results: list[Measurement], loaders: list[str]) -> dict[str, dict[str, float]]:
    """Per worker count: samples/s of each of our loaders over the reference's (`<name>_vs_reference`), and the
    reference's CPU time per sample over ours (`<name>_vs_reference_cpu`)."""
    ref = {r.workers: r for r in results if r.loader == "reference"}
    out: dict[str, dict[str, float]] = {}
    for name in loaders:
        if name == "reference":
            continue
        ours = [r for r in results if r.loader == name and r.workers in ref]
        out[f"{name}_vs_reference"] = {str(r.workers): round(r.samples_per_s / ref[r.workers].samples_per_s, 2)
                                       for r in ours if ref[r.workers].samples_per_s > 0}
        out[f"{name}_vs_reference_cpu"] = {str(r.workers): round(ref[r.workers].cpu_ms_per_sample
                                                                 / r.cpu_ms_per_sample, 2)
                                           for r in ours if r.cpu_ms_per_sample > 0}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--frames", type=int, default=21, help="frames per trajectory (published DR: 101)")
    parser.add_argument("--native", type=int, default=64, help="native grid of the raw data (resampled to 128)")
    parser.add_argument("--batch", type=int, default=8, help="windows per batch (both loaders)")
    parser.add_argument("--workers", default="0,2", help="comma list of DataLoader worker counts")
    parser.add_argument("--loaders", default=",".join(DEFAULT_LOADERS), help=f"comma list of {LOADERS} "
                        "(the -process ones are measured only with workers)")
    parser.add_argument("--seconds", type=float, default=5.0, help="timed wall time per measurement")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches per worker before timing")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the main process (DataLoader "
                        "workers always use 1)")
    parser.add_argument("--shard-mb", type=float, default=None, help="experiment: WebDataset shard size in MiB "
                        "(default: the ingest default, 256)")
    parser.add_argument("--zarr-codec", default=None, help="experiment: Zarr compressor lz4 (blosc-lz4 with "
                        "byte shuffle, the product's) or zstd3")
    parser.add_argument("--profile", action="store_true", help="also cProfile each loader without workers")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout of this project: measure "
                        "its code side by side with this one's, each in child processes")
    parser.add_argument("--repeat", type=int, default=1, help="with --baseline: rounds of the whole comparison")
    parser.add_argument("--tmp", type=Path, default=None, help="parent of the temp folder")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    args = parser.parse_args(argv)
    args.worker_counts = [int(w) for w in args.workers.split(",") if w.strip()]
    args.loader_names = [n.strip() for n in args.loaders.split(",") if n.strip()]
    bad = [n for n in args.loader_names if n not in LOADERS]
    if bad:
        parser.error(f"unknown loaders {bad}; choose from {LOADERS}")
    if args.frames < T_IN + T_OUT:
        parser.error(f"--frames must be at least {T_IN + T_OUT}")
    if args.baseline is not None and not (args.baseline / "dpot_train").is_dir():
        parser.error(f"--baseline {args.baseline}: expected a checkout of this project (a folder holding dpot_train)")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="dpot-loader-bench-", dir=args.tmp))
    load_start = os.getloadavg()
    host = host_machine(root, ("torch", "numpy"))  # RAM, free disk, OS, package versions
    results: list[Measurement] = []
    profiles: dict[str, str] = {}
    try:
        data = make_data(root, args.trajectories, args.frames, args.native, shard_mb=args.shard_mb,
                         codec=args.zarr_codec)
        sizes = data.sizes()
        print(f"# data: {data.trajectories} trajectories x {data.frames} frames, native {data.native}^2 x 2 channels "
              f"-> {RES}^2 x {CHANNELS}; prepared in {data.prep_s:.1f} s; on disk: "
              + ", ".join(f"{k} {v / MB:.0f} MB" for k, v in sizes.items()), flush=True)
        print(f"# {cpu_name()}, {os.cpu_count()} cores, load average {load_start[0]:.2f}; batch {args.batch}, "
              f"{args.seconds:g} s per measurement", flush=True)
        print(f"{'loader':<18} {'workers':>7} {'kind':>7} {'samples/s':>10} {'window MB/s':>12} {'read MB/s':>10} "
              f"{'CPU ms/sample':>14} {'peak RSS MiB':>13} {'/copy':>6} {'/copy CPU':>6}", flush=True)
        bounds = window_bounds(data, args.batch)
        print("# one core, per window: " + "; ".join(
            f"{k} {v['windows_per_s']:.0f}/s wall, {v['cpu_ms_per_window']:.3f} ms CPU ({v['gb_per_cpu_s']:.1f} GB "
            "per CPU s)" for k, v in bounds.items()), flush=True)
        label = args.baseline.resolve().name if args.baseline is not None else ""
        for _ in range(args.repeat):
            for workers in args.worker_counts:
                for name in args.loader_names:
                    if workers == 0 and name.endswith("-process"):
                        continue  # without workers it is the same loader as its thread-kind name
                    if args.baseline is None:
                        rows = [measure(name, lambda: build_loader(name, data, workers, args.batch), workers,
                                        args.batch, args.seconds, args.warmup)]
                    else:  # side by side: this checkout's code, then the baseline's, each in a child of its own
                        rows = [measure_in_child(code, tag, name, data, workers, args.batch, args.seconds,
                                                 args.warmup, args.threads)
                                for code, tag in ((ROOT, "this"), (args.baseline.resolve(), label))]
                        rows[0].loader = name
                    for r in rows:
                        results.append(r)
                        cr = copy_ratios(r, bounds)
                        print(f"{r.loader:<18} {r.workers:>7} {r.kind:>7} {r.samples_per_s:>10.1f} "
                              f"{r.window_mb_per_s:>12.0f} {r.read_mb_per_s:>10.0f} {r.cpu_ms_per_sample:>14.2f} "
                              f"{r.peak_rss_mib:>13.0f} {cr['copy_ratio']:>6.2f} {cr['copy_cpu_ratio']:>6.2f}",
                              flush=True)
        bounds_end = window_bounds(data, args.batch)
        print("# one core at the end, per window: " + "; ".join(
            f"{k} {v['windows_per_s']:.0f}/s wall, {v['cpu_ms_per_window']:.3f} ms CPU" for k, v in
            bounds_end.items()), flush=True)
        if args.profile:
            for name in [n for n in args.loader_names if not n.endswith("-process")]:
                profiles[name] = profile_single(name, data, args.batch, batches=8)
                print(f"# profile of {name} (8 batches, no workers)\n{profiles[name]}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"# kept {root}", flush=True)
    rat = ratios([r for r in results if "@" not in r.loader], args.loader_names)
    if args.baseline is not None:
        rat["vs_baseline"] = baseline_ratios(results, args.baseline.resolve().name)
    for key, per in {**rat, **rat.get("vs_baseline", {})}.items():
        if key == "vs_baseline":
            continue
        print(f"# {key}: " + ", ".join(f"{w} workers {v:.2f}x" for w, v in per.items()), flush=True)
    wds = rat.get("webdataset_vs_reference", {})
    summary = {
        "benchmark": "loader",
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {**host, **machine(), "load_avg_start": [round(v, 2) for v in load_start]},
        "settings": {"baseline": str(args.baseline.resolve()) if args.baseline else None, "repeat": args.repeat,
                     "trajectories": args.trajectories, "frames": args.frames, "native": args.native, "res": RES,
                     "channels": CHANNELS, "t_in": T_IN, "t_out": T_OUT, "batch": args.batch,
                     "workers": args.worker_counts, "seconds": args.seconds, "warmup": args.warmup,
                     "threads": args.threads, "shard_mb": args.shard_mb,
                     "zarr_codec": args.zarr_codec or "lz4 (product default)"},
        "data": {"prep_s": round(data.prep_s, 2), "bytes": sizes},
        "bounds": bounds,
        "bounds_end": bounds_end,
        "results": [{**asdict(r), **copy_ratios(r, bounds)} for r in results],
        "ratios": rat,
        "target": {"webdataset_vs_reference_min": 3.0,
                   "met": bool(wds) and all(v >= 3.0 for v in wds.values())},
        "rate": {"webdataset_samples_per_s_min": RATE_GOAL,  # what a compiled Ti step takes in on one H100
                 "met": {str(r.workers): r.samples_per_s >= RATE_GOAL for r in results if r.loader == "webdataset"}},
        "window": {"copy_ratio_min": COPY_GOAL,  # webdataset without workers against one core's copy rate
                   "copy_ratio": [copy_ratios(r, bounds)["copy_ratio"] for r in results
                                  if r.loader == "webdataset" and r.workers == 0],
                   "met": [copy_ratios(r, bounds)["copy_ratio"] >= COPY_GOAL for r in results
                           if r.loader == "webdataset" and r.workers == 0]},
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
