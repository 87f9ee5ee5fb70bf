"""`dpot-train launch --dry-run` on an output of many shards (default 10⁴), locally and from s3:// (moto on
127.0.0.1) on a warm shard cache: its wall time and the requests it sends for shard objects.

The output is fabricated fast and for real: a small ingest gives the dataset entry (statistics, convention, grid),
then N one-trajectory shards are written straight as tar bytes (the writer's own member layout) with their sha256,
the shard index (`shards/<dataset>/index.json`, dpot_format.shard_index) and a manifest listing them. `--without-index`
leaves the index out (an output written before it). `--tree DIR` runs launch from another checkout (e.g. a worktree
of main) on the same output, so that before and after are measured side by side in one run:

    python benchmarks/launch_scale.py --shards 10000 --tree /tmp/main-tree
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from dpot_data.writers.wds_shards import _member_bytes, _padding, _tar_header, npy_header  # noqa: E402
from dpot_format.names import sample_key, shard_file  # noqa: E402
from dpot_format.shard_index import INDEX_NAME, index_bytes, index_document  # noqa: E402
from dpot_format.tar import Member, SampleIndex  # noqa: E402

FRAMES, GRID = 11, 16


def template(base: Path, grid: int = GRID, frames: int = FRAMES) -> dict:
    """The manifest of a real 2-trajectory ingest (grid x grid, `frames` frames, 1 channel): the template dataset
    entry."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.fno import synth_fno

    files = synth_fno(base / "raw", n=2, frames=frames, viscosity=1e-3, seed=0, resolution=grid)
    with warnings.catch_warnings():  # "the split leaves no test trajectory": the benchmark launches with --no-eval
        warnings.simplefilter("ignore")
        opts = IngestOptions(resolution=grid, channels=1, split=(1.0,), command="template", formats=("wds",))
        return ingest_files("fno", [files[0]], base / "template", opts)


def trajectory_members(i: int, name: str, at: int, rng: np.random.Generator, grid: int = GRID,
                       frames: int = FRAMES) -> tuple[list[bytes], SampleIndex, int]:
    """Trajectory i as the writer lays out its tar members, starting at byte `at` of its shard: (the member bytes,
    its member index, the offset after it)."""
    key = sample_key(i)
    fields = rng.standard_normal((frames, 1, grid, grid), dtype=np.float32)
    mask = np.ones((grid, grid), dtype=np.uint8)
    meta = {"id": f"synthetic#{i}", "dataset": name, "split": "train", "index": i, "frames": frames,
            "channels": ["u"], "channel_valid": [True], "params": {}}
    parts, members = [], {}
    for kind, head, data in (("fields.npy", npy_header(fields), fields), ("mask.npy", npy_header(mask), mask),
                             ("meta.json", json.dumps(meta, sort_keys=True, separators=(",", ":")).encode(), None)):
        n = len(head) + (0 if data is None else data.nbytes)
        members[kind] = Member(f"{key}.{kind}", key, kind, at + 512, n)
        parts += [_tar_header(f"{key}.{kind}", n), head, b"" if data is None else data.tobytes(), _padding(n)]
        at += _member_bytes(n)
    return parts, SampleIndex(key, members), at


def _shard(i: int, name: str, rng: np.random.Generator) -> tuple[bytes, SampleIndex]:
    """A one-trajectory shard (trajectory i) as the writer lays it out, and its member index."""
    parts, sample, _ = trajectory_members(i, name, 0, rng)
    body = b"".join(parts)
    end = len(body) + 1024
    return body + b"\0" * (end + (-end % 10240) - len(body)), sample


def fabricate(out: Path, shards: int, with_index: bool, work: Path) -> dict:
    """Write an output of `shards` one-trajectory train shards; returns its manifest."""
    from dpot_format.manifest import build, write_manifest

    manifest = template(work)
    entry = manifest["datasets"][0]
    name = entry["name"]
    folder = out / "shards" / name
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    listed, rows = [], []
    for i in range(shards):
        data, sample = _shard(i, name, rng)
        file = shard_file("train", i)
        (folder / file).write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        listed.append({"path": f"shards/{name}/{file}", "split": "train", "sha256": sha, "bytes": len(data),
                       "samples": 1})
        rows.append((file, sha, [sample]))
    entry = {**entry, "trajectories": shards, "shards": listed, "zarr": None,
             "splits": {**entry["splits"], "counts": {"train": shards}, "ids": {"train": [f"synthetic#{i}"
                                                                                         for i in range(shards)]}}}
    entry.pop("shard_index", None)
    if with_index:
        data = index_bytes(index_document(name, rows))
        (folder / INDEX_NAME).write_bytes(data)
        entry["shard_index"] = {"path": f"shards/{name}/{INDEX_NAME}", "sha256": hashlib.sha256(data).hexdigest(),
                                "bytes": len(data)}
    doc = build([entry], "launch_scale", tool_version="bench")
    write_manifest(out, doc)
    return doc


def warm(cache: Path, out: Path, doc: dict) -> None:
    """The node's shard cache holding every shard (as after a download): data/<sha256>.tar."""
    (cache / "data").mkdir(parents=True, exist_ok=True)
    for s in doc["datasets"][0]["shards"]:
        os.link(out / s["path"], cache / "data" / f"{s['sha256']}.tar")


def launch(tree: Path, manifest: str, run: Path, extra: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of one `launch --dry-run` from checkout `tree`, and its stderr tail."""
    args = [sys.executable, "-m", "dpot_train", "launch", "--manifest", manifest, "--out", str(run), "--steps", "2",
            "--batch-size", "2", "--device", "cpu", "--no-progress", "--no-eval", "--dry-run", *extra]
    start = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True, cwd=tree, env={**env, "PYTHONPATH": str(tree)})
    took = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{tree}: launch failed ({r.returncode}): {r.stderr[-2000:]}")
    return took, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--tree", action="append", default=[], help="another checkout to run launch from (repeatable)")
    ap.add_argument("--no-s3", action="store_true", help="local output only")
    ap.add_argument("--repeat", type=int, default=1, help="local launches per checkout and mode (alternated)")
    args = ap.parse_args()
    trees = [ROOT] + [Path(t).resolve() for t in args.tree]
    work = Path(tempfile.mkdtemp(prefix="launch-scale-"))
    results: dict = {"shards": args.shards, "load": os.getloadavg()}
    try:
        t0 = time.perf_counter()
        out = work / "out"
        doc = fabricate(out, args.shards, True, work)
        results["fabricate_s"] = round(time.perf_counter() - t0, 1)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        for _ in range(args.repeat):  # the checkouts alternated, so that a change of the machine's load hits both
            for tree in trees:
                for extra in (["--no-verify-checksums"], []):
                    took, _ = launch(tree, str(out), work / "run", extra, env)
                    results.setdefault(f"local {tree.name} {' '.join(extra) or 'sha256'}", []).append(round(took, 2))
        if not args.no_s3:
            import s3_local

            server = s3_local.start()
            try:
                t0 = time.perf_counter()
                s3_local.upload(str(out), "s3://dpot/scale")
                results["upload_s"] = round(time.perf_counter() - t0, 1)
                env = {**env, **server.client_env()}
                for tree in trees:
                    cache = work / f"cache-{tree.name}"
                    warm(cache, out, doc)
                    launch(tree, "s3://dpot/scale", work / "run", ["--cache-dir", str(cache)], env)  # cache's index
                    server.reset_counts()
                    took, _ = launch(tree, "s3://dpot/scale", work / "run", ["--cache-dir", str(cache)], env)
                    requests = server.shard_requests()
                    results[f"s3 warm {tree.name}"] = {"s": round(took, 2), "shard_requests": sum(requests.values()),
                                                       "shards_contacted": len(requests),
                                                       "other_gets": sum(n for p, n in server.gets.items()
                                                                         if not p.endswith(".tar"))}
            finally:
                server.stop()
                s3_local.unconfigure_this_process(server)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
