"""`dpot-train launch --dry-run` on an output of many shards (default 10⁴), locally and from s3:// (moto on
127.0.0.1) on a warm shard cache: its wall time and the requests it sends for shard objects.

The output is fabricated fast and for real: a small ingest gives the dataset entry (statistics, convention, grid),
then N one-trajectory shards are written straight as tar bytes (the writer's own member layout) with their sha256,
the shard index (`shards/<dataset>/index.json`, dpot_format.shard_index) and a manifest listing them. `--without-index`
leaves the index out (an output written before it). `--tree DIR` runs launch from another checkout (e.g. a worktree
of main) on the same output, so that before and after are measured side by side in one run:

    python benchmarks/launch_scale.py --shards 10000 --tree /tmp/main-tree

`--record` measures the record of verified shards instead (dpot_train/data/verified.py): a local output of about
`--gib` GiB in `--shards` shards of 128x128, 11-frame trajectories whose first ten frames are zeros written as holes
(sparse files: fast to write, little disk used, read back at page-cache speed, so the first launch's sha256 pass is
bound by sha256 itself, the cheapest the pass can be), beside it the same shards and trajectories at 16x16 (1/64 of
the bytes) and ten times as many of those. On each: a real `launch --steps 1` twice (the first hashes every
shard and writes the record, the second consults it; both print their time to first step, parsed here; the same
two from every `--tree`, its record removed first), then
`launch`'s data check alone in this process (`check_outputs`, consulting the record, and without sha256),
`launch --dry-run` consulting the record, with `--verify-checksums always`, and from every `--tree`:

    python benchmarks/launch_scale.py --record --gib 10 --shards 1000 --tree /tmp/main-tree
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
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
RECORD = ".dpot-verified.json"  # an output's record of verified shards (dpot_train.data.verified.RECORD_NAME)


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


BIG_GRID = 128
_ZERO = bytes(8 << 20)


def _sparse_trajectory(fh, digest, i: int, name: str, at: int, frames: int, grid: int) -> tuple[SampleIndex, int]:
    """Trajectory i written at byte `at` as the writer lays it out: frames 0..frames-2 zeros left as a hole, the last
    frame ones (a finite loss for the one training step), mask ones; hashed into `digest`. (sample index, end)."""
    key = sample_key(i)
    shape = (frames, 1, grid, grid)
    buf = io.BytesIO()  # the header numpy.save writes for a (frames, 1, grid, grid) float32 array
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    fields_head = buf.getvalue()
    frame = np.ones((1, grid, grid), np.float32).tobytes()
    hole = (frames - 1) * len(frame)
    mask = np.ones((grid, grid), np.uint8)
    meta = json.dumps({"id": f"synthetic#{i}", "dataset": name, "split": "train", "index": i, "frames": frames,
                       "channels": ["u"], "channel_valid": [True], "params": {}}, sort_keys=True,
                      separators=(",", ":")).encode()
    members = {}
    for kind, head, body in (("fields.npy", fields_head, None), ("mask.npy", npy_header(mask), mask.tobytes()),
                             ("meta.json", meta, b"")):
        n = len(head) + (hole + len(frame) if body is None else len(body))
        members[kind] = Member(f"{key}.{kind}", key, kind, at + 512, n)
        for part in (_tar_header(f"{key}.{kind}", n), head):
            fh.write(part)
            digest.update(part)
        if body is None:
            fh.seek(hole, os.SEEK_CUR)  # a hole: no block written
            for k in range(0, hole, len(_ZERO)):
                digest.update(memoryview(_ZERO)[:min(len(_ZERO), hole - k)])
            body = frame
        fh.write(body)
        digest.update(body)
        pad = _padding(n)
        fh.write(pad)
        digest.update(pad)
        at += _member_bytes(n)
    return SampleIndex(key, members), at


def per_shard(total: int, shards: int, grid: int = BIG_GRID) -> int:
    """Trajectories (grid x grid, FRAMES frames) per shard that make `shards` shards about `total` bytes."""
    return max(1, round(total / shards / (FRAMES * grid * grid * 4 + grid * grid + 4 * 1024)))


def fabricate_sparse(out: Path, shards: int, trajectories: int, grid: int, work: Path) -> dict:
    """An output of `shards` train shards of `trajectories` grid x grid trajectories of FRAMES frames each, their
    leading frames as holes; its manifest (real sha256s, shard index)."""
    entry = template(work / f"template-{grid}", grid, FRAMES)["datasets"][0]
    name = entry["name"]
    folder = out / "shards" / name
    folder.mkdir(parents=True)
    listed, rows, i = [], [], 0
    for s in range(shards):
        file, at, samples = shard_file("train", s), 0, []
        digest = hashlib.sha256()
        with open(folder / file, "wb") as fh:
            for _ in range(trajectories):
                sample, at = _sparse_trajectory(fh, digest, i, name, at, FRAMES, grid)
                samples.append(sample)
                i += 1
            tail = 1024 + (-(at + 1024) % 10240)
            fh.seek(tail, os.SEEK_CUR)
            fh.truncate(at + tail)
            for k in range(0, tail, len(_ZERO)):
                digest.update(memoryview(_ZERO)[:min(len(_ZERO), tail - k)])
        listed.append({"path": f"shards/{name}/{file}", "split": "train", "sha256": digest.hexdigest(),
                       "bytes": at + tail, "samples": trajectories})
        rows.append((file, digest.hexdigest(), samples))
    return publish_synthetic(out, folder, entry, listed, rows, i, "launch_scale")


def publish_synthetic(out: Path, folder: Path, entry: dict, listed: list[dict], rows: list, count: int,
                      tool: str) -> dict:
    """The manifest of a fabricated output: the shards `listed`, their member index (`rows`) written into `folder`
    and recorded, `count` train trajectories named synthetic#k; written to `out`, returned."""
    from dpot_format.manifest import build, write_manifest

    name = entry["name"]
    data = index_bytes(index_document(name, rows))
    (folder / INDEX_NAME).write_bytes(data)
    entry = {**entry, "trajectories": count, "shards": listed, "zarr": None,
             "shard_index": {"path": f"shards/{name}/{INDEX_NAME}", "sha256": hashlib.sha256(data).hexdigest(),
                             "bytes": len(data)},
             "splits": {**entry["splits"], "counts": {"train": count},
                        "ids": {"train": [f"synthetic#{k}" for k in range(count)]}}}
    doc = build([entry], tool, tool_version="bench")
    write_manifest(out, doc)
    return doc


_TTFS = re.compile(r"time to first step: ([\d.]+) s \(checks ([\d.]+) s, hashing ([\d.]+) s, start-up ([\d.]+) s, "
                   r"first batch ([\d.]+) s\)")


def real_launch(tree: Path, manifest: str, run: Path, env: dict[str, str]) -> dict:
    """One `launch --steps 1` (one process, tiny model, no evaluation) from checkout `tree`: its wall seconds, its
    time to first step and parts (from its line and from metrics.jsonl), and its sha256 note."""
    shutil.rmtree(run, ignore_errors=True)
    args = [sys.executable, "-m", "dpot_train", "launch", "--manifest", manifest, "--out", str(run), "--steps", "1",
            "--batch-size", "1", "--device", "cpu", "--no-progress", "--no-eval", "--model", "tiny"]
    start = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True, cwd=tree, env={**env, "PYTHONPATH": str(tree)})
    took = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"{tree}: launch failed ({r.returncode}): {r.stderr[-2000:]}")
    first = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    parts = {k.removeprefix("time_to_first_step_").removesuffix("_s") or "total": v for k, v in first.items()
             if k.startswith("time_to_first_step")}
    note = next((ln for ln in r.stderr.splitlines() if ln.startswith("note: sha256 of")), "")
    return {"wall_s": round(took, 2), "time_to_first_step": parts, "note": note,
            "line": next((m.group(0) for m in map(_TTFS.search, r.stdout.splitlines()) if m), "")}


def pass_seconds(out: Path, verify: bool) -> float:
    """Wall seconds of launch's data check alone (`launch.check_outputs`, in this process, this checkout), the
    manifest already read: with the record consulted (nothing written), or without sha256 (--no-verify-checksums)."""
    from dpot_train.core.config import DataConfig
    from dpot_train.data.datasets import read_manifest_docs
    from dpot_train.data.verified import RecordPolicy
    from dpot_train.run.launch import check_outputs

    docs = read_manifest_docs([str(out)])
    start = time.perf_counter()
    check_outputs(DataConfig(manifests=[str(out)], verify_checksums=verify), docs, progress=False,
                  record=RecordPolicy(write=False) if verify else None)
    return round(time.perf_counter() - start, 3)


def record_bench(args: argparse.Namespace) -> dict:
    """The record of verified shards: first and second launch on a big sparse output and on small ones, against the
    other trees' launch (docstring)."""
    from common import machine

    trees = [ROOT] + [Path(t).resolve() for t in args.tree]
    work = Path(tempfile.mkdtemp(prefix="launch-record-"))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results: dict = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                              text=True, cwd=ROOT).stdout.strip(),
                     "trees": [str(t) for t in trees], "machine": machine(work)}
    try:
        t0 = time.perf_counter()
        k = per_shard(int(args.gib * (1 << 30)), args.shards)  # the same trajectories per shard in all three
        outputs = {label: (work / label, fabricate_sparse(work / label, n, k, grid, work))
                   for label, n, grid in (("big", args.shards, BIG_GRID), ("small", args.shards, GRID),
                                          ("many", 10 * args.shards, GRID))}
        results["fabricate_s"] = round(time.perf_counter() - t0, 1)
        time.sleep(2.5)  # the files settle: an entry hashed within 2 s of a file's change is not trusted
        for label, (out, doc) in outputs.items():
            listed = doc["datasets"][0]["shards"]
            row: dict = {"shards": len(listed), "bytes": sum(s["bytes"] for s in listed),
                         "disk_bytes": sum(os.stat(out / s["path"]).st_blocks * 512 for s in listed)}
            row["first"] = real_launch(ROOT, str(out), work / "run", env)  # hashes every shard, writes the record
            row["second"] = real_launch(ROOT, str(out), work / "run", env)  # consults it
            for tree in trees[1:]:  # the same two launches from the other checkout, its record written afresh
                (out / RECORD).unlink(missing_ok=True)
                row[f"first_{tree.name}"] = real_launch(tree, str(out), work / "run", env)
                row[f"second_{tree.name}"] = real_launch(tree, str(out), work / "run", env)
            pass_seconds(out, True)  # untimed: imports, the record and index read into the page cache
            for _ in range(args.repeat):  # the check alone, alternated: what the record adds to a pass without sha256
                for variant, verify in (("pass_no_sha256_s", False), ("pass_record_s", True)):
                    row.setdefault(variant, []).append(pass_seconds(out, verify))
            row["dry_run_record_s"] = [launch(ROOT, str(out), work / "dry", [], env)[0] for _ in range(args.repeat)]
            if label == "big":
                row["dry_run_always_s"] = [launch(ROOT, str(out), work / "dry", ["--verify-checksums", "always"],
                                                  env)[0] for _ in range(args.repeat)]
            for tree in trees[1:]:
                row[f"dry_run_{tree.name}_s"] = [launch(tree, str(out), work / "dry", [], env)[0]
                                                 for _ in range(args.repeat)]
            results[label] = row
            print(json.dumps({label: row}), flush=True)
        results["load_after"] = [round(v, 2) for v in os.getloadavg()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(results))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--tree", action="append", default=[], help="another checkout to run launch from (repeatable)")
    ap.add_argument("--no-s3", action="store_true", help="local output only")
    ap.add_argument("--repeat", type=int, default=1, help="local launches per checkout and mode (alternated)")
    ap.add_argument("--record", action="store_true", help="measure the record of verified shards (see above)")
    ap.add_argument("--gib", type=float, default=10.0, help="--record: GiB of the big output")
    args = ap.parse_args()
    if args.record:
        record_bench(args)
        return
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
