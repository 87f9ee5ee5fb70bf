"""Training straight from object storage, against an S3-compatible server in this process (moto, 127.0.0.1 only):
the node's shard cache (hit, miss, LRU eviction under its limit, the limit refused below one step's need), a
download killed midway leaves nothing usable, retries then a one-line failure, and the batches equal those read
from a local copy of the same shards for any number of ranks."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
pytest.importorskip("s3fs", reason="needs s3fs (the test or cloud extra)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import s3_local  # noqa: E402

from dpot_train.core.config import DataConfig  # noqa: E402
from dpot_train.data.cache import CacheError, CacheSettings, ShardCache  # noqa: E402
from dpot_train.data.cached_reader import CachedWebDatasetReader  # noqa: E402
from dpot_train.data.datasets import DatasetInfo, read_manifests  # noqa: E402
from dpot_train.data.prepare import prepare_stream  # noqa: E402
from dpot_train.data.readers import WebDatasetReader  # noqa: E402
from dpot_train.data.remote_fetch import FetchError, FetchPlan, RetryPolicy  # noqa: E402
from dpot_train.data.stream import WindowStream  # noqa: E402
from tests.test_shard_cache import flip_middle_byte  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAST = FetchPlan(policy=RetryPolicy(attempts=3, base_s=0.001, max_s=0.002))
BUCKET = "s3://dpot"


@pytest.fixture(scope="module")
def s3():
    server = s3_local.start()
    yield server
    server.stop()
    s3_local.unconfigure_this_process(server)


@pytest.fixture(scope="module")
def corpus(s3, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """12 FNO trajectories of 12 frames at 32x32 in shards of ~2 trajectories, locally and at s3://dpot/corpus."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.fno import synth_fno

    base = tmp_path_factory.mktemp("remote")
    files = synth_fno(base / "raw", n=12, frames=12, viscosity=1e-3, seed=0, resolution=32)
    out = base / "shards"
    ingest_files("fno", [files[0]], out, IngestOptions(resolution=32, split=(0.75, 0.125), seed=0,
                                                       shard_size=300 << 10))
    s3_local.upload(str(out), f"{BUCKET}/corpus")
    return out, f"{BUCKET}/corpus"


def _train(url: str) -> DatasetInfo:
    return read_manifests([url])[0]


def _settings(root: Path, limit: int = 1 << 30, **kw) -> CacheSettings:
    return CacheSettings(str(root), limit=limit, plan=kw.pop("plan", FAST), **kw)


def _read_all(reader, refs) -> list[tuple[np.ndarray, np.ndarray]]:
    return [reader.read(r, 1, 5) for r in refs]


def test_miss_downloads_each_shard_once_then_hits_read_the_local_bytes(s3, corpus, tmp_path: Path) -> None:
    local, url = corpus
    ds = _train(url)
    shards = ds.shards_of("train")
    assert len(shards) >= 4
    s3.reset_counts()
    reader = CachedWebDatasetReader(_settings(tmp_path / "cache"))
    refs = reader.refs(ds, "train")
    plain = WebDatasetReader()
    local_refs = plain.refs(_train(str(local)), "train")
    assert [r.index for r in refs] == [r.index for r in local_refs] and len(refs) == 9
    for (f, m), (lf, lm) in zip(_read_all(reader, refs), _read_all(plain, local_refs)):
        assert f.tobytes() == lf.tobytes() and m.tobytes() == lm.tobytes()
    gets = s3.shard_gets()
    assert sorted(gets) == sorted(f"/dpot/corpus/{s.url.split('/corpus/', 1)[1]}" for s in shards)
    assert set(gets.values()) == {1}  # one whole-object GET per shard: the index and every read use the copy
    assert reader.cache.stats.downloads == len(shards)

    s3.reset_counts()  # another process of the node (a rank, a loader worker): everything is a hit
    again = pickle.loads(pickle.dumps(CachedWebDatasetReader(_settings(tmp_path / "cache"))))
    refs2 = again.refs(ds, "train")
    _read_all(again, refs2)
    assert s3.shard_gets() == {} and again.cache.stats.downloads == 0 and again.cache.stats.hits == len(refs2)


def test_trajectories_indexed_by_the_launch_are_read_through_the_cache(s3, corpus, tmp_path: Path) -> None:
    """A run's workers read the trajectories of its plan (indexed at launch, not by their reader): the reader built
    for the run's datasets still reads every remote shard through the cache, one whole-object GET each."""
    from dpot_format.validate import validate_output
    from dpot_train.data.cached_reader import reader_for
    from dpot_train.data.readers import indexed_trajectories

    local, url = corpus
    ds = _train(url)
    index: dict = {}
    assert not [p for p in validate_output(url, rehash=False, scan=False, indexes=index) if p.fatal]
    refs = indexed_trajectories([ds], "train", index)[ds.name]
    plain = WebDatasetReader()
    local_refs = plain.refs(_train(str(local)), "train")
    assert [(r.index, r.fields_offset, r.mask_offset) for r in refs] == [
        (r.index, r.fields_offset, r.mask_offset) for r in local_refs]
    s3.reset_counts()
    reader = pickle.loads(pickle.dumps(reader_for("webdataset", [url], _settings(tmp_path / "cache"), [ds])))
    for (f, m), (lf, lm) in zip(_read_all(reader, refs), _read_all(plain, local_refs)):
        assert f.tobytes() == lf.tobytes() and m.tobytes() == lm.tobytes()
    shards = ds.shards_of("train")
    assert set(s3.shard_gets().values()) == {1} and len(s3.shard_gets()) == len(shards)
    assert reader.cache.stats.downloads == len(shards)


def test_lru_eviction_keeps_the_cache_under_its_limit(s3, corpus, tmp_path: Path) -> None:
    ds = _train(corpus[1])
    shards = ds.shards_of("train")
    big = max(s.bytes for s in shards)
    settings = _settings(tmp_path / "cache", limit=2 * big)
    cache = ShardCache(settings)
    peak, stop = [0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], cache.usage())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        a, b, c = shards[:3]
        for shard in (a, b):
            with cache.open(shard):
                time.sleep(0.02)
        cache._touched.clear()  # the next open refreshes A's last use: A is now newer than B
        with cache.open(a):
            pass
        with cache.open(c):  # no room for three: B, the least recently used, goes
            assert cache.entry(a).exists() and not cache.entry(b).exists()
        reader = CachedWebDatasetReader(settings)
        _read_all(reader, reader.refs(ds, "train") * 2)
    finally:
        stop.set()
        watcher.join()
    assert 0 < peak[0] <= settings.limit
    assert cache.stats.evicted + reader.cache.stats.evicted >= len(shards) - 2
    with pytest.raises(CacheError) as err:
        CachedWebDatasetReader(_settings(tmp_path / "small", limit=2 * big - 1)).refs(ds, "train")
    assert str(err.value).startswith(f"--cache-limit {2 * big - 1} bytes: below what one step needs, the largest "
                                     "shard (s3://dpot/corpus/") and "\n" not in str(err.value)


def test_an_entry_being_read_is_not_evicted(s3, corpus, tmp_path: Path) -> None:
    shards = _train(corpus[1]).shards_of("train")
    big = max(s.bytes for s in shards)
    cache = ShardCache(_settings(tmp_path / "cache", limit=2 * big))
    other = ShardCache(_settings(tmp_path / "cache", limit=2 * big))  # a second process's view of the same folder
    with cache.open(shards[0]) as held:
        for shard in shards[1:4]:
            with other.open(shard):
                pass
        assert held.exists()  # three other shards came and went around it
    assert other.stats.evicted >= 2


_KILLED_DOWNLOAD = """
import sys
from dpot_train.data.cache import CacheSettings, ShardCache
from dpot_train.data.datasets import read_manifests
from dpot_train.data.remote_fetch import FetchPlan
shard = read_manifests([sys.argv[1]])[0].shards_of("train")[0]
ShardCache(CacheSettings(sys.argv[2], plan=FetchPlan(part=16 << 10, range_from=0, concurrency=1))).ensure(shard)
"""


def test_sigkill_mid_download_leaves_no_usable_entry(s3, corpus, tmp_path: Path) -> None:
    ds = _train(corpus[1])
    shard = ds.shards_of("train")[0]
    key = shard.url.split("/corpus/", 1)[1]
    root = tmp_path / "cache"
    s3.set_faults(s3_local.Faults(stall_on={key}, stall_from=48 << 10, stall_s=20))
    s3.reset_counts()
    env = {**os.environ, **s3.client_env(), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_DOWNLOAD, corpus[1], str(root)], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while s3.gets.get(f"/dpot/corpus/{key}", 0) < 4:  # three 16 KiB parts written, the fourth stalled
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the download did not start"
            time.sleep(0.02)
        time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        s3.set_faults(s3_local.Faults())
    parts = list((root / "part").iterdir())
    assert len(parts) == 1 and parts[0].read_bytes()[:16 << 10] != b"\0" * (16 << 10)  # a partly written download
    cache = ShardCache(_settings(root))
    assert not cache.entry(shard).exists()
    reader = CachedWebDatasetReader(_settings(root))
    local = WebDatasetReader()
    for r, lr in zip(reader.refs(ds, "train"), local.refs(_train(str(corpus[0])), "train")):
        assert reader.read(r, 0, 8)[0].tobytes() == local.read(lr, 0, 8)[0].tobytes()
    assert list((root / "part").iterdir()) == []  # the dead download was removed, the shard fetched anew


def test_a_changed_object_is_never_cached(s3, corpus, tmp_path: Path) -> None:
    import fsspec

    ds = _train(corpus[1])
    shard = ds.shards_of("train")[1]
    fs = fsspec.filesystem("s3")
    original = fs.cat_file(shard.url)
    fs.pipe_file(shard.url, original[:-1] + bytes([original[-1] ^ 1]))  # same size, one bit changed
    try:
        cache = ShardCache(_settings(tmp_path / "cache"))
        with pytest.raises(FetchError, match=r"downloaded sha256 [0-9a-f]{64}, the manifest says"):
            cache.ensure(shard)
        assert not cache.entry(shard).exists() and list((tmp_path / "cache" / "part").iterdir()) == []
    finally:
        fs.pipe_file(shard.url, original)


def test_retries_ride_out_faults_then_fail_with_one_line(s3, corpus, tmp_path: Path) -> None:
    local, url = corpus
    ds = _train(url)
    plain = WebDatasetReader()
    expected = _read_all(plain, plain.refs(_train(str(local)), "train"))
    s3.set_faults(s3_local.Faults(fail=0.3, stall=0.2, stall_s=0.05, seed=3))
    s3.reset_counts()
    try:
        reader = CachedWebDatasetReader(_settings(tmp_path / "a", plan=FetchPlan(
            policy=RetryPolicy(attempts=12, base_s=0.001, max_s=0.002))))
        got = _read_all(reader, reader.refs(ds, "train"))
        assert s3.failed > 0
        assert all(f.tobytes() == lf.tobytes() for (f, _), (lf, _) in zip(got, expected))
        bad = ds.shards_of("train")[2]
        s3.set_faults(s3_local.Faults(always={bad.url.split("/corpus/", 1)[1]}))
        with pytest.raises(FetchError) as err:
            ShardCache(_settings(tmp_path / "b")).ensure(bad)
    finally:
        s3.set_faults(s3_local.Faults())
    msg = str(err.value)
    assert msg.startswith(f"{bad.url}: download failed after 3 attempts (last: ") and "\n" not in msg


@pytest.mark.parametrize("world", [1, 2, 4])
def test_batches_from_object_storage_equal_local_ones_for_any_world_size(s3, corpus, tmp_path: Path,
                                                                         world: int) -> None:
    local, url = corpus
    start, batch = 13, 4  # a resume point inside the second epoch

    def stream_batches(manifest: str, w: int) -> list[bytes]:
        cfg = DataConfig(manifests=[manifest], t_in=4, t_out=1, cache_dir=str(tmp_path / "cache"))
        spec, reader = prepare_stream(cfg, seed=5)
        out = []
        for step in range(6):
            parts = [WindowStream(spec, reader, start, batch, w, r).batch(step, _plans(spec)) for r in range(w)]
            out.append(b"".join(np.concatenate([p[k].numpy() for p in parts]).tobytes() for k in ("x", "y")))
        return out

    assert stream_batches(url, world) == stream_batches(str(local), 1)


def _damage(entries: list[dict], how: str) -> list[dict]:
    """A cached member index made wrong: every entry pointing at its first trajectory's bytes, every offset one tar
    block late, or no entry at all."""
    if how == "all at the first trajectory":
        return [{**e, "fields": entries[0]["fields"], "mask": entries[0]["mask"]} for e in entries]
    if how == "shifted":
        return [{**e, "fields": e["fields"] + 512, "mask": e["mask"] + 512} for e in entries]
    return []


@pytest.fixture(scope="module")
def packed(s3, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """8 FNO trajectories of 8 frames at 16x16, several to a shard, locally and at s3://dpot/packed."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.fno import synth_fno

    base = tmp_path_factory.mktemp("packed")
    files = synth_fno(base / "raw", n=8, frames=8, viscosity=1e-3, seed=0, resolution=16)
    out = base / "shards"
    ingest_files("fno", [files[0]], out, IngestOptions(resolution=16, split=(0.75,), seed=0, shard_size=160 << 10))
    s3_local.upload(str(out), f"{BUCKET}/packed")
    return out, f"{BUCKET}/packed"


@pytest.mark.parametrize("how", ["all at the first trajectory", "shifted", "empty"])
def test_a_cached_index_unlike_the_manifests_is_rebuilt_and_the_batches_are_the_data(
        s3, packed, tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str) -> None:
    """The node cache checks a cached member index against the one the manifest records (its index file, whose
    sha256 the manifest lists) before trusting it: a wrong one, which used to train on other trajectories' bytes
    (or stop the run), is rebuilt from the checked shard with one warning line, and the batches are the data's."""
    local, url = packed
    cache = tmp_path / "cache"

    def stream_batches(manifest: str) -> list[bytes]:
        spec, reader = prepare_stream(DataConfig(manifests=[manifest], t_in=4, t_out=1, cache_dir=str(cache)), seed=5)
        batches = [WindowStream(spec, reader, 0, 4, 1, 0).batch(step, _plans(spec)) for step in range(4)]
        return [b"".join(b[k].numpy().tobytes() for k in ("x", "y", "mask")) for b in batches]

    truth = stream_batches(str(local))
    assert stream_batches(url) == truth  # the cache's indexes are written
    damaged = max((cache / "index").glob("*.json"), key=lambda p: len(json.loads(p.read_text())))
    assert len(json.loads(damaged.read_text())) > 1
    damaged.write_text(json.dumps(_damage(json.loads(damaged.read_text()), how)))
    capsys.readouterr()
    assert stream_batches(url) == truth
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: cached index {damaged} of {url}/") and \
        lines[0].endswith("; rebuilt from the cached shard"), lines
    assert "does not match the member index its manifest records" in lines[0]
    assert stream_batches(url) == truth and capsys.readouterr().err == ""  # repaired once for the node


def _plans(spec):
    from dpot_train.data.stream import EpochPlans

    return EpochPlans(spec)


def test_launch_fills_the_cache_and_writes_no_credentials(s3, corpus, tmp_path: Path, monkeypatch) -> None:
    import yaml
    from typer.testing import CliRunner

    from dpot_train.cli import app

    monkeypatch.delenv("DPOT_CACHE_DIR", raising=False)
    out = tmp_path / "run"
    base = ["launch", "--manifest", corpus[1], "--out", str(out), "--steps", "4", "--batch-size", "4",
            "--device", "cpu", "--no-progress", "--dry-run"]
    small = CliRunner().invoke(app, base + ["--cache-limit", "1KiB"])
    assert small.exit_code == 2 and small.output.startswith("error: --cache-limit 1024 bytes: below what one step")
    assert len(small.output.strip().splitlines()) == 1 and not (out / "config.yaml").exists()
    s3.reset_counts()
    result = CliRunner().invoke(app, base)
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load(result.stdout)  # the run config --dry-run prints (no config.yaml: it writes no run files)
    assert not (out / "config.yaml").exists()
    assert cfg["data"]["cache_dir"] == str(out / "shard-cache")
    shards = _train(corpus[1]).shards_of("train")
    assert sorted(p.name for p in (out / "shard-cache" / "data").iterdir()) == sorted(f"{s.sha256}.tar"
                                                                                      for s in shards)
    assert set(s3.shard_gets().values()) <= {1, 2}  # the validator's header reads, then one download
    secrets = [s3_local.DUMMY_ENV["AWS_SECRET_ACCESS_KEY"], s3_local.DUMMY_ENV["AWS_ACCESS_KEY_ID"]]
    texts = [result.output] + [p.read_text(errors="replace") for p in out.rglob("*")
                               if p.is_file() and p.suffix != ".tar"]
    assert not [s for s in secrets for t in texts if s in t]


_RANK = """
import sys
from dpot_train.core.config import DataConfig
from dpot_train.data.loader import make_loader
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.stream import WindowStream
url, cache, rank, workers, kind = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
spec, reader = prepare_stream(DataConfig(manifests=[url], t_in=4, t_out=1, cache_dir=cache), seed=0)
batches = iter(make_loader(WindowStream(spec, reader, 0, 4, 2, rank), workers, kind=kind))
for _ in range(2 * spec.epoch_length // 4):
    next(batches)
del batches  # stops the loader as the trainer does: reads in flight finish rather than die with the process
"""


@pytest.mark.slow
def test_two_ranks_with_several_workers_download_each_shard_once(s3, corpus, tmp_path: Path) -> None:
    env = {**os.environ, **s3.client_env(), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cache = tmp_path / "cache"
    shards = _train(corpus[1]).shards_of("train")

    def both_ranks() -> dict[str, int]:
        s3.reset_counts()
        procs = [subprocess.Popen([sys.executable, "-c", _RANK, corpus[1], str(cache), str(rank), workers, kind],
                                  env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True)
                 for rank, workers, kind in ((0, "2", "process"), (1, "3", "thread"))]
        for p in procs:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-3000:]
        return s3.shard_gets()

    cold = both_ranks()  # index and data built by whichever process comes first
    assert len(cold) == len(shards) and set(cold.values()) == {1}, cold
    for entry in (cache / "data").iterdir():  # the index stays: now the loader workers' reads and prefetches fetch
        entry.unlink()
    again = both_ranks()
    assert len(again) == len(shards) and set(again.values()) == {1}, again


@pytest.mark.slow
def test_resume_on_another_world_size_from_object_storage_equals_local(s3, fno_train_shards: Path,
                                                                        tmp_path: Path) -> None:
    import shutil

    import torch

    from tests import train_runs

    url = f"{BUCKET}/fno"
    s3_local.upload(str(fno_train_shards), url)
    finals = {}
    for name, manifest in (("local", str(fno_train_shards)), ("s3", url)):
        run = tmp_path / name / "run"
        r = train_runs.run(train_runs.launch_args(manifest, run, "--no-eval", steps=6))  # 2 processes
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        finals[name] = [torch.load(run / "checkpoints" / "step-00000006.pt", weights_only=True)]
        for nproc in (1, 4):  # the same run resumed from step 2 on 1 and on 4 processes
            resumed = tmp_path / name / f"resumed-{nproc}"
            shutil.copytree(run, resumed)
            for step in (4, 6):
                (resumed / "checkpoints" / f"step-{step:08d}.pt").unlink()
            r = train_runs.run(train_runs.launch_args(manifest, resumed, "--resume", "--no-eval", steps=6,
                                                      nproc=nproc))
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
            assert "resumed from" in r.stdout + r.stderr
            finals[name].append(torch.load(resumed / "checkpoints" / "step-00000006.pt", weights_only=True))
    for a, b in zip(finals["local"], finals["s3"]):  # 2 processes; resumed on 1; resumed on 4
        assert a["loader"] == b["loader"]
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


@pytest.mark.slow
def test_remote_loader_benchmark_runs_and_reports_its_figures() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "remote_loader.py"), "--trajectories", "4",
                        "--frames", "12", "--shard-mb", "1", "--epochs", "1", "--rounds", "1", "--tight-epochs", "0.5",
                        "--stall-s", "0.1"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    res = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    assert res["local_warm"]["warm_shard_gets"] == 0 and res["fault"]["equal_to_fault_free"] is True
    assert res["tight"]["peak_cache_bytes"] <= res["limits"]["tight"]
    assert all(x["cold"]["peak_cache_bytes"] <= res["limits"]["cold_warm"] for x in res["cold"]["rounds"])


def test_the_zarr_backend_reads_object_storage_directly_with_the_local_stores_values(s3, corpus) -> None:
    """`--backend zarr` on an s3:// output reads its chunks straight from the store (no shard cache): the same
    trajectories, windows and masks as the local copy."""
    local, url = corpus
    windows = []
    for manifest in (str(local), url):
        spec, reader = prepare_stream(DataConfig(manifests=[manifest], backend="zarr", t_in=4, t_out=1), seed=0)
        assert spec.refs[0][0].url.startswith(manifest)
        windows.append([(r.index, *reader.read(r, 2, 5)) for r in spec.refs[0]])
    assert len(windows[0]) == 9 and [w[0] for w in windows[0]] == [w[0] for w in windows[1]]
    for (_, f, m), (_, rf, rm) in zip(*windows):
        assert f.tobytes() == rf.tobytes() and m.tobytes() == rm.tobytes() and f.shape == (5, 4, 32, 32)


def test_a_damaged_cached_shard_is_fetched_again_never_read(s3, corpus, tmp_path: Path, capsys) -> None:
    local, url = corpus
    ds = _train(url)
    shards = ds.shards_of("train")
    settings = _settings(tmp_path / "cache")
    first = CachedWebDatasetReader(settings)
    _read_all(first, first.refs(ds, "train"))
    for shard in shards:
        flip_middle_byte(first.cache.entry(shard))
    capsys.readouterr()
    s3.reset_counts()
    later = pickle.loads(pickle.dumps(CachedWebDatasetReader(settings)))  # the next run's process
    plain = WebDatasetReader()
    got, want = _read_all(later, later.refs(ds, "train")), _read_all(plain, plain.refs(_train(str(local)), "train"))
    assert len(got) == len(want) == 9
    for (f, m), (lf, lm) in zip(got, want):
        assert f.tobytes() == lf.tobytes() and m.tobytes() == lm.tobytes()
    assert set(s3.shard_gets().values()) == {1} and len(s3.shard_gets()) == len(shards)
    warnings = sorted(line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: "))
    assert warnings == sorted(f"warning: cached shard {later.cache.entry(s)} does not match the sha256 of {s.url} "
                              "(damaged on disk); fetching it again" for s in shards)


def test_a_shard_the_store_never_answers_ends_in_one_line_within_the_budget(s3, corpus, tmp_path: Path,
                                                                             monkeypatch) -> None:
    """A GET that is never answered (the server holds it for 120 s) is cut at $DPOT_FETCH_TIMEOUT_S and the retries
    at $DPOT_FETCH_BUDGET_S: one line naming the URL, long before the server would have answered."""
    shard = _train(corpus[1]).shards_of("train")[0]
    monkeypatch.setenv("DPOT_FETCH_TIMEOUT_S", "0.5")
    monkeypatch.setenv("DPOT_FETCH_BUDGET_S", "2")
    s3.set_faults(s3_local.Faults(stall_on={shard.url.split("/corpus/", 1)[1]}, stall_s=120))
    cache = ShardCache(_settings(tmp_path / "cache", plan=FetchPlan(policy=RetryPolicy(attempts=1000, base_s=0.01,
                                                                                       max_s=0.05))))
    start = time.monotonic()
    try:
        with pytest.raises(FetchError) as err:
            cache.ensure(shard)
    finally:
        s3.set_faults(s3_local.Faults())
    assert time.monotonic() - start < 60  # bounded: the server answers only after 120 s
    msg = str(err.value)
    assert msg.startswith(f"{shard.url}: download failed: no success within the budget of 2 s (") and "\n" not in msg
    assert "FSTimeoutError: no answer within" in msg and "$DPOT_FETCH_BUDGET_S and $DPOT_FETCH_TIMEOUT_S" in msg
    assert not cache.entry(shard).exists() and list((tmp_path / "cache" / "part").iterdir()) == []


@pytest.mark.slow
def test_a_run_on_damaged_cached_shards_trains_as_from_a_local_folder(s3, fno_train_shards: Path,
                                                                      tmp_path: Path) -> None:
    """Every cached shard damaged in its middle (same size) between two launches: the second run fetches each again
    with one warning naming it, and its final weights are those of the run from the local folder."""
    import torch

    from tests import train_runs

    url = f"{BUCKET}/fno-damaged"
    s3_local.upload(str(fno_train_shards), url)
    cache = tmp_path / "cache"
    r = train_runs.run(train_runs.launch_args(url, tmp_path / "fill", "--dry-run", "--cache-dir", str(cache)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    entries = sorted((cache / "data").iterdir())
    assert entries
    for entry in entries:
        flip_middle_byte(entry)
    finals = {}
    for name, manifest, extra in (("local", str(fno_train_shards), ()), ("s3", url, ("--cache-dir", str(cache)))):
        run = tmp_path / name
        r = train_runs.run(train_runs.launch_args(manifest, run, "--no-eval", *extra, steps=6, nproc=1))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        finals[name] = torch.load(run / "checkpoints" / "step-00000006.pt", weights_only=True)
        if name == "s3":
            warned = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("warning: cached shard")]
            assert len(warned) == len(entries) and all(sum(str(e) in w for w in warned) == 1 for e in entries)
            assert all(f" does not match the sha256 of {url}/shards/" in w for w in warned)
    assert all(torch.equal(finals["local"]["model"][k], finals["s3"]["model"][k]) for k in finals["local"]["model"])
