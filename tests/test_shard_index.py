"""The shards' member index, recorded once at ingest (docs/format.md, "Shard index"): it equals what scanning the tar
headers gives (a resumed ingest included), the validator refuses a tampered one naming the file, and launch,
evaluate and the shard cache take the members from it: no shard is read before the workers start, and a launch
from object storage on a warm cache asks the store for no shard. An output written before the index still trains and
evaluates (scanned once, one line says so)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpot_data.cli import app as data_app
from dpot_data.ingest import IngestOptions, ingest, ingest_files
from dpot_data.sources import fno
from dpot_data.synth.fno import synth_fno
from dpot_format.shard_index import index_bytes, load_index
from dpot_format.tar import index_shard
from tests import train_runs
from tests.test_ingest_fno import _with_hook

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 FNO trajectories of 12 frames at 32x32 in shards of about 2 trajectories (train, valid and test)."""
    base = tmp_path_factory.mktemp("shard_index")
    files = synth_fno(base / "raw", n=12, frames=12, viscosity=1e-3, seed=0, resolution=32)
    out = base / "out"
    ingest_files("fno", [files[0]], out, IngestOptions(resolution=32, split=(0.75, 0.125), seed=0,
                                                       shard_size=300 << 10, command="test"))
    return out


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _copy(out: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(out, dest)
    return dest


def _scanned(out: Path, entry: dict) -> dict:
    return {s["path"]: index_shard(str(out / s["path"])) for s in entry["shards"]}


def test_ingest_records_the_index_that_scanning_the_tar_headers_gives(output: Path) -> None:
    entry = _manifest(output)["datasets"][0]
    ref = entry["shard_index"]
    assert ref["path"] == f"shards/{entry['name']}/index.json"
    data = (output / ref["path"]).read_bytes()
    assert ref["bytes"] == len(data) and ref["sha256"] == hashlib.sha256(data).hexdigest()
    assert len(entry["shards"]) >= 6
    assert load_index(str(output), entry) == _scanned(output, entry)
    result = CliRunner().invoke(data_app, ["verify", str(output)])
    assert result.exit_code == 0, result.output


def test_a_resumed_ingest_still_records_every_shard(fno_pair, tmp_path: Path) -> None:
    """Shards completed before an interruption were written by another run: the index still holds them."""
    opts = IngestOptions(convention="canonical", resolution=64, workers=1, shard_size=1, split=(1.0,), command="t")

    def explode(chunk: int) -> None:
        if chunk == 2:
            raise KeyboardInterrupt("interrupted mid-ingest")  # resumable; an error of the data is not

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt, match="interrupted mid-ingest"):
        ingest(_with_hook(fno.read(convention="canonical", paths=[fno_pair["v5"]], block=1), explode), out, opts)
    outcome = ingest(fno.read(convention="canonical", paths=[fno_pair["v5"]], block=1), out, opts)
    assert "resumed an interrupted ingest" in outcome.notes[0]
    entry = outcome.manifest["datasets"][0]
    assert len(entry["shards"]) == 4
    assert load_index(str(out), entry) == _scanned(out, entry)


def _rewrite_index(out: Path, change) -> str:
    """Apply `change` to the index document and record the new file's sha256 and size in the manifest (a tampered
    but self-consistent output); returns the index path."""
    manifest = _manifest(out)
    ref = manifest["datasets"][0]["shard_index"]
    doc = json.loads((out / ref["path"]).read_text())
    change(doc)
    data = index_bytes(doc)
    (out / ref["path"]).write_bytes(data)
    ref.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (out / "manifest.json").write_text(json.dumps(manifest))
    return ref["path"]


def test_the_validator_refuses_an_index_of_another_checksum(output: Path, tmp_path: Path) -> None:
    out = _copy(output, tmp_path / "out")
    ref = _manifest(out)["datasets"][0]["shard_index"]
    path = out / ref["path"]
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"samples":[[0,', b'"samples":[[1,', 1))  # same size, one digit changed
    assert path.read_bytes() != data
    for args in (["verify", str(out)], ["inspect", str(out)]):
        result = CliRunner().invoke(data_app, args)
        assert result.exit_code == 1, result.output
        lines = [line for line in result.output.splitlines() if ref["path"] in line]
        assert len(lines) == 1 and f"{ref['path']}: sha256 mismatch (manifest {ref['sha256']}, found " in lines[0]


def test_the_validator_refuses_an_index_whose_offsets_are_not_the_tar_headers(output: Path, tmp_path: Path) -> None:
    """A wrong offset in an index whose checksum the manifest records: members out of place are refused from the
    index alone (verify and launch's checks, which read no header, alike), naming the index file and the member."""
    from dpot_train.cli import app as train_app

    out = _copy(output, tmp_path / "out")
    first = _manifest(out)["datasets"][0]["shards"][0]["path"]
    key = index_shard(str(out / first))[0].key

    def shift(doc: dict) -> None:
        doc["shards"][0]["samples"][0][1] += 512  # the first sample's fields.npy, one block later

    index = _rewrite_index(out, shift)
    result = CliRunner().invoke(data_app, ["verify", str(out)])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if index in line]
    assert len(lines) == 1 and lines[0].startswith(f"{index}: {first}:{key}.mask.npy at offset "), result.output
    result = CliRunner().invoke(train_app, ["launch", "--manifest", str(out), "--out", str(tmp_path / "run"),
                                            "--steps", "2", "--batch-size", "2", "--device", "cpu", "--no-progress",
                                            "--dry-run"])
    assert result.exit_code == 2, result.output
    errors = result.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: {out}/{index}: {first}:{key}.mask.npy at offset "), \
        errors


def test_verify_compares_the_index_with_the_tar_headers(output: Path, tmp_path: Path) -> None:
    """An index entry that is well formed but not what the tar header says (a member size one byte short): verify
    reads the headers and names the index file, the shard and the member, in one line."""
    out = _copy(output, tmp_path / "out")
    first = _manifest(out)["datasets"][0]["shards"][0]["path"]
    last = index_shard(str(out / first))[-1]

    def shorten(doc: dict) -> None:
        doc["shards"][0]["samples"][-1][6] -= 1

    index = _rewrite_index(out, shorten)
    result = CliRunner().invoke(data_app, ["verify", str(out)])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if index in line]
    meta = last.meta
    assert lines == [f"{index}: {first}:{meta.name} at offset {meta.offset}, {meta.size - 1} bytes, where its tar "
                     f"header says {meta.name} at offset {meta.offset}, {meta.size} bytes"], result.output


class _TarOpens:
    """Counts the opens of .tar files in this process (an audit hook: every open() and os.open() is seen)."""

    hooked = False
    active: list[str] | None = None

    @classmethod
    def __enter__(cls) -> list[str]:
        if not cls.hooked:
            sys.addaudithook(cls._hook)
            cls.hooked = True
        cls.active = []
        return cls.active

    @classmethod
    def __exit__(cls, *exc: object) -> None:
        cls.active = None

    @classmethod
    def _hook(cls, event: str, args: tuple) -> None:
        if cls.active is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.endswith(".tar"):
                cls.active.append(path)


def _no_scan(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every scan of a shard's tar headers (the one function that reads them)."""
    import dpot_format.shard_index as si

    scans: list[str] = []
    real = si.index_shard

    def counting(source, where=None, *args, **kwargs):
        scans.append(str(where or source))
        return real(source, where, *args, **kwargs)

    monkeypatch.setattr(si, "index_shard", counting)
    return scans


def test_a_local_launch_reads_no_shard_before_its_workers_start(output: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`launch --dry-run` runs every check launch runs before torchrun: with --no-verify-checksums no .tar file is
    opened; with the default sha256 pass each shard is opened once, to hash it, and no tar header is read."""
    from dpot_train.cli import app as train_app

    scans = _no_scan(monkeypatch)
    base = ["launch", "--manifest", str(output), "--steps", "2", "--batch-size", "2", "--device", "cpu",
            "--no-progress", "--dry-run"]
    with _TarOpens() as opened:
        result = CliRunner().invoke(train_app, base + ["--out", str(tmp_path / "a"), "--no-verify-checksums"])
    assert result.exit_code == 0, result.output
    mine = [p for p in opened if p.startswith(str(output))]  # not another test's thread still reading its own
    assert mine == [] and scans == []
    with _TarOpens() as opened:
        result = CliRunner().invoke(train_app, base + ["--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    shards = sorted(str(output / s["path"]) for s in _manifest(output)["datasets"][0]["shards"])
    assert sorted(p for p in opened if p.startswith(str(output))) == shards and scans == []
    assert "records no shard index" not in result.stderr


def _strip_index(out: Path) -> None:
    """Make `out` an output written before the index: no shard_index, no index file."""
    manifest = _manifest(out)
    for entry in manifest["datasets"]:
        (out / entry.pop("shard_index")["path"]).unlink()
    (out / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_an_output_without_the_index_still_trains_and_evaluates(fno_train_shards: Path, tmp_path: Path) -> None:
    out = _copy(fno_train_shards, tmp_path / "old")
    _strip_index(out)
    run = tmp_path / "run"
    r = train_runs.run(train_runs.launch_args(out, run, steps=2, nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    notes = [line for line in r.stderr.splitlines() if "records no shard index" in line]
    assert notes == [f"note: {out}/manifest.json: dataset 'fno-ns-v1e-3' records no shard index (written before "
                     "index.json); its shards' tar headers were scanned (`dpot-data ingest --overwrite` records "
                     "one)"], r.stderr[-3000:]
    assert (run / "checkpoints" / "step-00000002.pt").is_file()
    r = train_runs.run([sys.executable, "-m", "dpot_train", "evaluate", str(run / "checkpoints" / "step-00000002.pt"),
                        "--manifest", str(out), "--out", str(tmp_path / "eval.json"), "--device", "cpu"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert json.loads((tmp_path / "eval.json").read_text())
    assert sum("records no shard index" in line for line in r.stderr.splitlines()) == 1


@pytest.fixture(scope="module")
def s3():
    """An S3-compatible server in this process (moto, 127.0.0.1 only), as in tests/test_remote_cache.py."""
    pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    pytest.importorskip("s3fs", reason="needs s3fs (the test or cloud extra)")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import s3_local

    server = s3_local.start()
    yield server
    server.stop()
    s3_local.unconfigure_this_process(server)


@pytest.mark.slow
def test_a_launch_on_a_warm_cache_asks_the_store_for_no_shard(s3, fno_train_shards: Path, tmp_path: Path) -> None:
    """A first launch fills the node's cache; the second one, a real 2-step run with its final evaluation, sends no
    GET and no HEAD for any shard object (the manifest and index.json are all it reads remotely)."""
    import s3_local

    from dpot_train.data.cache import CacheSettings, ShardCache
    from dpot_train.data.datasets import read_manifests

    url = "s3://dpot/indexed"
    s3_local.upload(str(fno_train_shards), url)
    cache = tmp_path / "cache"
    for shard in read_manifests([url])[0].shards:  # every split: the final evaluation reads the test shards
        ShardCache(CacheSettings(str(cache))).ensure(shard)
    r = train_runs.run(train_runs.launch_args(url, tmp_path / "fill", "--dry-run", "--cache-dir", str(cache)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]  # the cache's own index of each shard
    s3.reset_counts()
    run = tmp_path / "run"
    r = train_runs.run(train_runs.launch_args(url, run, "--cache-dir", str(cache), steps=2, nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (run / "checkpoints" / "step-00000002.pt").is_file()
    assert s3.shard_requests() == {}
    assert sum(n for p, n in s3.gets.items() if p.endswith("/index.json")) >= 1  # the index is what it read


def test_plain_inspect_of_an_s3_output_reads_no_shard_but_checks_each_one_is_there(s3, output: Path) -> None:
    """`dpot-data inspect s3://...` takes members from index.json: no GET of any shard, one HEAD each (its size);
    a shard gone from the store is reported, naming it."""
    import fsspec
    import s3_local

    from dpot_data.inspection import inspect_dir

    url = "s3://dpot/inspected"
    s3_local.upload(str(output), url)
    shards = [s["path"] for s in _manifest(output)["datasets"][0]["shards"]]
    s3.reset_counts()
    report = inspect_dir(url)
    assert report["ok"] and report["problems"] == [], report["problems"]
    assert s3.shard_gets() == {}
    assert sorted(p for p in s3.heads if p.endswith(".tar")) == sorted(f"/dpot/inspected/{p}" for p in shards)
    fsspec.filesystem("s3").rm(f"{url}/{shards[-1]}")
    fsspec.filesystem("s3").invalidate_cache()
    report = inspect_dir(url)
    assert report["problems"] == [f"{shards[-1]}: missing (listed in the manifest)"], report["problems"]
