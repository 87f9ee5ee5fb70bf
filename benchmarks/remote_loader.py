"""Remote-loader benchmark: the training stream on the same shards read from a local folder and from s3:// on an
S3-compatible server started in this process (moto's ThreadedMotoServer on 127.0.0.1: no network), side by side.

Run:  PYTHONPATH=$PWD .venv/bin/python benchmarks/remote_loader.py                 # ~250 MB corpus, a few minutes
      PYTHONPATH=$PWD .venv/bin/python benchmarks/remote_loader.py --trajectories 12 --epochs 4   # quick look

1. Synthesizes PDEBench diffusion-reaction trajectories, ingests them (WebDataset only, 128x128, 4 channels) into
   shards of `--shard-mb`, and uploads the output folder to s3://bench/out.
2. Measures the server's whole-object GET rate (every shard fetched once with one GET), which with the shard bytes
   per sample gives the bandwidth bound of a cold cache: GET bytes/s / (shard bytes / samples per epoch).
3. Runs the loader (prepare_stream + WindowStream + make_loader, as the trainer does; `--workers` threads) for:
   `local` (`--epochs` epochs from the local folder), `cold` (one epoch from s3:// into an empty cache: the
   downloads happen while indexing and reading), `warm` (`--epochs` epochs from s3:// with that cache filled) and
   `tight` (`--tight-epochs` epochs through a cache limited to `--tight-fraction` of the corpus: LRU eviction and
   re-downloads). Each figure includes the start-up (manifest, index). Reported: samples/s, GET requests of shards
   per epoch and in all, the peak bytes in the cache folder (polled every 20 ms) against the limit.
4. The fault run: a fresh cache, the server failing `--fail` of GETs with 503 and stalling `--stall` of them past
   the client's read timeout; the sha256 of every batch of two epochs must equal the fault-free stream's.
5. The download alone (`--download-rounds`): every shard fetched by `ShardCache.ensure` into an empty cache, against
   plain whole-object GETs of the same shards, alternated; wall and CPU seconds (the CPU of this whole process: the
   server's included), and the first-use sha256 a new process pays for each entry of a filled cache.
`--baseline-fetch REV` (e.g. `main`) also runs every cold and download measurement with `fetch_into` as of the git
revision REV (loaded from `git show`, used by the benchmark only), side by side with the current one in each round.
The last line of output is one JSON object with every figure. The temp folder is removed unless --keep.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import s3_local  # noqa: E402

RES, CHANNELS, T_IN, T_OUT = 128, 4, 10, 1
ROOT = Path(__file__).resolve().parent.parent


def baseline_fetch(rev: str) -> Callable[..., str]:
    """The download of dpot_train/data/remote_fetch.py as of git revision `rev` (the "before" of a comparison):
    its `fetch_into` with its own default FetchPlan (part size, range threshold, concurrency) and the cache's retry
    policy."""
    import types

    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:dpot_train/data/remote_fetch.py"],
                         capture_output=True, text=True, check=True).stdout
    module = types.ModuleType(f"remote_fetch_at_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(src, f"{rev}:dpot_train/data/remote_fetch.py", "exec"), module.__dict__)

    def fetch(url: str, fd: int, size: int, plan: Any) -> str:
        return module.fetch_into(url, fd, size, module.FetchPlan(policy=plan.policy))

    return fetch


@contextlib.contextmanager
def fetching_with(fetch: Callable[..., str] | None) -> Iterator[None]:
    """Inside the block, the shard caches the loader builds download with `fetch` (None: the current fetch_into)."""
    import functools

    from dpot_train.data import cached_reader

    real = cached_reader.ShardCache
    if fetch is not None:
        cached_reader.ShardCache = functools.partial(real, fetch=fetch)  # type: ignore[misc]
    try:
        yield
    finally:
        cached_reader.ShardCache = real  # type: ignore[misc]


def make_corpus(root: Path, trajectories: int, frames: int, shard_mb: float) -> Path:
    """Ingested diffusion-reaction trajectories (WebDataset shards only); returns the output folder."""
    from dpot_data.ingest import IngestOptions, run_ingest
    from dpot_data.synth.pdebench import write_diff_react

    raw = write_diff_react(root / "raw", n=trajectories, frames=frames, res=64, seed=0)
    opts = IngestOptions(resolution=RES, channels=CHANNELS, fill=1.0, resample="bilinear", split=(1.0,), name="dr",
                         formats=("wds",), seed=0, command="benchmarks/remote_loader.py")
    opts.shard_size = int(shard_mb * 2**20)
    return Path(run_ingest("pdebench", [raw], root / "out", opts).path).parent


class Peak(threading.Thread):
    """Polls the bytes in a cache folder (entries and downloads in progress) and keeps the largest value seen."""

    def __init__(self, root: str) -> None:
        super().__init__(daemon=True)
        self.root, self.peak, self._done = Path(root), 0, threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self._total())
            time.sleep(0.02)

    def _total(self) -> int:
        """Entries plus downloads, summed under the cache's own lock (shared): evictions and reservations happen
        under it, so the two folders are never listed halfway through an eviction that made room for a download."""
        lock = self.root / "lock" / "cache"
        fd = os.open(lock, os.O_RDONLY) if lock.exists() else None
        try:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_SH)
            total = 0
            for sub in ("data", "part"):
                for p in (self.root / sub).glob("*") if (self.root / sub).exists() else []:
                    try:
                        total += p.stat().st_size
                    except FileNotFoundError:
                        pass
            return total
        finally:
            if fd is not None:
                os.close(fd)

    def stop(self) -> int:
        self._done.set()
        self.join()
        return self.peak


def run_stream(manifest: str, epochs: float, workers: int, batch: int, cache_dir: str | None = None,
               limit: int | None = None, digest: bool = False) -> dict[str, Any]:
    """Build the stream as the trainer does and consume `epochs` epochs; samples/s over the whole run."""
    from dpot_train.core.config import DataConfig
    from dpot_train.data.loader import make_loader
    from dpot_train.data.prepare import prepare_stream
    from dpot_train.data.stream import WindowStream

    start = time.perf_counter()
    cfg = DataConfig(manifests=[manifest], t_in=T_IN, t_out=T_OUT, num_workers=workers, verify_checksums=False,
                     cache_dir=cache_dir, cache_limit=str(limit) if limit else None)
    spec, reader = prepare_stream(cfg, seed=0, verify=False)
    prepared = time.perf_counter() - start
    steps = math.ceil(epochs * spec.epoch_length / batch)
    h = hashlib.sha256()
    batches = iter(make_loader(WindowStream(spec, reader, start=0, global_batch=batch), workers))
    for _ in range(steps):
        b = next(batches)
        if digest:
            h.update(b["x"].numpy().tobytes())
            h.update(b["y"].numpy().tobytes())
    close = getattr(batches, "close", None)
    if close:
        close()
    seconds = time.perf_counter() - start
    return {"samples": steps * batch, "epoch_length": spec.epoch_length, "seconds": round(seconds, 3),
            "prepare_s": round(prepared, 3), "samples_per_s": round(steps * batch / seconds, 1),
            **({"sha256": h.hexdigest()} if digest else {})}


def get_rate(server: s3_local.LocalS3, url: str) -> dict[str, float]:
    """Whole-object GET rate: every shard fetched once with one GET."""
    import fsspec

    fs = fsspec.filesystem("s3")
    keys = [k for k in fs.find(url) if k.endswith(".tar")]
    start, cpu, total = time.perf_counter(), time.process_time(), 0
    for k in keys:
        total += len(fs.cat_file(k))
    seconds = time.perf_counter() - start
    return {"objects": len(keys), "bytes": total, "seconds": round(seconds, 3), "cpu_s": round(time.process_time() - cpu, 3),
            "mb_per_s": round(total / seconds / 1e6, 1)}


def measured(server: s3_local.LocalS3, name: str, epochs: float, **kw: Any) -> dict[str, Any]:
    """run_stream with the server's shard GETs and the cache's peak bytes recorded."""
    server.reset_counts()
    peak = Peak(kw.get("cache_dir") or "/nonexistent")  # polled in every mode, so that each run pays for it alike
    peak.start()
    cpu = time.process_time()
    out = run_stream(epochs=epochs, **kw)
    out["cpu_s"] = round(time.process_time() - cpu, 3)
    gets = server.shard_gets()
    out.update(mode=name, shard_gets=sum(gets.values()), shard_gets_per_epoch=round(sum(gets.values()) / epochs, 2),
               injected_failures=server.failed)
    if kw.get("cache_dir"):
        out["peak_cache_bytes"] = peak.stop()
    else:
        peak.stop()
    print(json.dumps(out), flush=True)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=48)
    ap.add_argument("--frames", type=int, default=21)
    ap.add_argument("--shard-mb", type=float, default=64.0)
    ap.add_argument("--workers", type=int, default=2, help="loader worker threads")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=float, default=10.0, help="epochs of the local, warm and tight runs")
    ap.add_argument("--rounds", type=int, default=3, help="local/warm measurements, alternated")
    ap.add_argument("--tight-epochs", type=float, default=2.0, help="epochs of the tight run")
    ap.add_argument("--tight-fraction", type=float, default=0.5, help="cache limit of the tight run / corpus bytes")
    ap.add_argument("--fail", type=float, default=0.2, help="fault run: fraction of GETs answered 503")
    ap.add_argument("--stall", type=float, default=0.05, help="fault run: fraction of GETs stalled")
    ap.add_argument("--stall-s", type=float, default=3.0, help="fault run: stall length (read timeout: 1 s)")
    ap.add_argument("--download-rounds", type=int, default=None, help="rounds of the download alone (default: --rounds)")
    ap.add_argument("--baseline-fetch", metavar="REV", help="also measure cold runs and downloads with fetch_into as "
                    "of this git revision, side by side")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder")
    return ap.parse_args(argv)


def local_vs_warm(server: s3_local.LocalS3, local: Path, url: str, cache: str, limit: int, args: argparse.Namespace,
                  kw: dict[str, Any]) -> dict[str, Any]:
    """`--rounds` of (local, warm) measurements, alternated so that the load of a shared machine hits both alike."""
    rounds, runs = [], []
    for _ in range(args.rounds):
        a = measured(server, "local", args.epochs, manifest=str(local), **kw)
        b = measured(server, "warm", args.epochs, manifest=url, cache_dir=cache, limit=limit, **kw)
        rounds.append((a["samples_per_s"], b["samples_per_s"]))
        runs += [a, b]
    local_med = statistics.median(a for a, _ in rounds)
    return {"rounds": rounds, "runs": runs, "local_median": local_med,
            "warm_median": statistics.median(b for _, b in rounds),
            "warm_shard_gets": sum(r["shard_gets"] for r in runs if r["mode"] == "warm"),
            "warm_over_local": round(statistics.median(b for _, b in rounds) / local_med, 3)}


def cold_rounds(server: s3_local.LocalS3, url: str, tmp: Path, limit: int, local_rate: float,
                args: argparse.Namespace, kw: dict[str, Any]) -> dict[str, Any]:
    """`--rounds` of (whole-object GET rate, one epoch into an empty cache), each cold run against the bound measured
    just before it; with --baseline-fetch, the same with the baseline's fetch in each round (which goes first
    alternates)."""
    variants: list[tuple[str, Callable[..., str] | None]] = [("current", None)]
    if args.baseline_fetch:
        variants.append((f"at {args.baseline_fetch}", baseline_fetch(args.baseline_fetch)))
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    for r in range(args.rounds):
        for name, fetch in variants if r % 2 == 0 else variants[::-1]:
            rate = get_rate(server, url)
            with fetching_with(fetch):
                cold = measured(server, "cold", 1, manifest=url, cache_dir=str(tmp / f"cold-{name}-{r}"), limit=limit,
                                **kw)
            bound = rate["bytes"] / rate["seconds"] / (rate["bytes"] / cold["epoch_length"])
            rounds[name].append({"get_rate": rate, "cold": cold, "bandwidth_bound_samples_per_s": round(bound, 1),
                                 "ratio": round(cold["samples_per_s"] / min(bound, local_rate), 3),
                                 "load_average": round(os.getloadavg()[0], 2)})
            if r > 0 or name != "current":
                shutil.rmtree(tmp / f"cold-{name}-{r}", ignore_errors=True)  # cold-current-0 is the warm runs' cache
    return {"rounds": rounds["current"], "median_ratio": statistics.median(x["ratio"] for x in rounds["current"]),
            **({"baseline": {"rev": args.baseline_fetch, "rounds": rounds[variants[1][0]]}} if len(variants) > 1 else {})}


def download_rounds(server: s3_local.LocalS3, url: str, tmp: Path, limit: int,
                    args: argparse.Namespace) -> dict[str, Any]:
    """The download alone, `--download-rounds` times: plain whole-object GETs of every shard, then `ShardCache.ensure`
    of every shard into an empty cache (one at a time, with the current fetch and the baseline's), then the sha256 a
    new process pays on its first use of each filled entry (`ShardCache.open`)."""
    from dpot_train.data.cache import CacheSettings, ShardCache
    from dpot_train.data.datasets import read_manifests

    shards = read_manifests([url])[0].shards
    variants: list[tuple[str, Callable[..., str] | None]] = [("current", None)]
    if args.baseline_fetch:
        variants.append((f"at {args.baseline_fetch}", baseline_fetch(args.baseline_fetch)))
    out: list[dict[str, Any]] = []
    for r in range(args.download_rounds if args.download_rounds is not None else args.rounds):
        row: dict[str, Any] = {"plain_get": get_rate(server, url)}
        for name, fetch in variants if r % 2 == 0 else variants[::-1]:
            root = tmp / f"download-{r}"
            shutil.rmtree(root, ignore_errors=True)
            settings = CacheSettings(str(root), limit=limit)
            cache = ShardCache(settings) if fetch is None else ShardCache(settings, fetch=fetch)
            start, cpu = time.perf_counter(), time.process_time()
            for shard in shards:
                cache.ensure(shard)
            row[name] = {"seconds": round(time.perf_counter() - start, 3), "cpu_s": round(time.process_time() - cpu, 3)}
        later = ShardCache(CacheSettings(str(root), limit=limit))  # a new process's view of the filled cache
        start, cpu = time.perf_counter(), time.process_time()
        for shard in shards:
            with later.open(shard):
                pass
        row["first_use_sha256"] = {"seconds": round(time.perf_counter() - start, 3),
                                   "cpu_s": round(time.process_time() - cpu, 3)}
        row["load_average"] = round(os.getloadavg()[0], 2)
        shutil.rmtree(root, ignore_errors=True)
        print(json.dumps({"download": row}), flush=True)
        out.append(row)
    med = {k: statistics.median(x[k]["seconds"] for x in out) for k in out[0] if isinstance(out[0][k], dict)}
    return {"rounds": out, "median_seconds": med,
            "current_over_plain_get": round(med["plain_get"] / med["current"], 3),
            **({"baseline_over_plain_get": round(med["plain_get"] / med[variants[1][0]], 3)} if len(variants) > 1
               else {})}


def fault_run(server: s3_local.LocalS3, url: str, tmp: Path, limit: int, args: argparse.Namespace,
              kw: dict[str, Any]) -> dict[str, Any]:
    """Two epochs into an empty cache from a server failing and stalling GETs, against the fault-free stream."""
    clean = run_stream(url, 2, cache_dir=str(tmp / "cold-current-0"), limit=limit, digest=True, **kw)
    s3_local.configure_this_process(server, read_timeout=1.0)
    server.set_faults(s3_local.Faults(fail=args.fail, stall=args.stall, stall_s=args.stall_s, seed=1))
    try:
        out = measured(server, "fault", 2, manifest=url, cache_dir=str(tmp / "fault"), limit=limit, digest=True, **kw)
    finally:
        server.set_faults(s3_local.Faults())
        s3_local.configure_this_process(server)
    out["equal_to_fault_free"] = out["sha256"] == clean["sha256"]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="dpot-remote-bench-"))
    server = s3_local.start(bucket="bench")
    try:
        local = make_corpus(tmp, args.trajectories, args.frames, args.shard_mb)
        url = "s3://bench/out"
        s3_local.upload(str(local), url)
        kw = {"workers": args.workers, "batch": args.batch}
        shard_bytes = [p.stat().st_size for p in local.rglob("*.tar")]
        corpus, largest = sum(shard_bytes), max(shard_bytes)
        limit = max(int(corpus * 1.25), 2 * largest)
        run_stream(str(local), 1, **kw)  # the local shards read once: both sides then read from the page cache
        download = download_rounds(server, url, tmp, limit, args)
        cold = cold_rounds(server, url, tmp, limit, float("inf"), args, kw)  # ratios fixed below, with local's rate
        lw = local_vs_warm(server, local, url, str(tmp / "cold-current-0"), limit, args, kw)
        for r in cold["rounds"]:
            r["ratio"] = round(r["cold"]["samples_per_s"] / min(r["bandwidth_bound_samples_per_s"], lw["local_median"]),
                               3)
        for r in cold.get("baseline", {}).get("rounds", []):
            r["ratio"] = round(r["cold"]["samples_per_s"] / min(r["bandwidth_bound_samples_per_s"], lw["local_median"]),
                               3)
        cold["median_ratio"] = statistics.median(r["ratio"] for r in cold["rounds"])
        if "baseline" in cold:
            cold["baseline"]["median_ratio"] = statistics.median(r["ratio"] for r in cold["baseline"]["rounds"])
        tight = max(int(corpus * args.tight_fraction), 2 * largest)
        res: dict[str, Any] = {"local_warm": lw, "cold": cold, "download": download,
                               "limits": {"cold_warm": limit, "tight": tight}}
        res["tight"] = measured(server, "tight", args.tight_epochs, manifest=url, cache_dir=str(tmp / "tight"),
                                limit=tight, **kw)
        res["fault"] = fault_run(server, url, tmp, limit, args, kw)
        res["config"] = vars(args) | {"corpus_bytes": corpus, "largest_shard_bytes": largest,
                                      "shards": len(shard_bytes)}
        print(json.dumps(res), flush=True)
    finally:
        server.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
