"""Verified once, trusted after: launch's record of the shards it hashed (dpot_train/data/verified.py).

A second launch opens no shard the record vouches for; a shard rewritten in place, or changed with its mtime set
back, is hashed again (and a damaged one refused in one line); a damaged record means a full pass and one warning;
`--verify-checksums always` hashes every shard, `never` none; a dry run consults the record and writes nothing; an
output this user cannot write keeps its record in the cache folder; two writers at once lose nothing. Every launch
prints its time to first step in four parts and records them on the first step's metrics.jsonl line.

The launch checks run through `prepare_run` (what `dpot-train launch` runs before torchrun) and the CLI's dry run,
in this process; one slow test runs two real launches."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpot_format.lock import FileLock
from dpot_train.core.config import DataConfig, TrainConfig
from dpot_train.data import verified
from dpot_train.data.verified import RECORD_NAME, Record, read_record
from dpot_train.run.launch import Topology, prepare_run, release_run
from tests import train_runs
from tests.toy_output import write_toy_output

SHARDS = [f"shards/toy/{split}-000000.tar" for split in ("train", "valid", "test")]
TRAIN = SHARDS[0]


class _TarOpens:
    """Every open() / os.open() of a .tar file in this process while active (an audit hook, installed once)."""

    hooked = False
    active: list[str] | None = None

    def __enter__(self) -> list[str]:
        if not _TarOpens.hooked:
            sys.addaudithook(_TarOpens._hook)
            _TarOpens.hooked = True
        _TarOpens.active = []
        return _TarOpens.active

    def __exit__(self, *exc: object) -> None:
        _TarOpens.active = None

    @staticmethod
    def _hook(event: str, args: tuple) -> None:
        if _TarOpens.active is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.endswith(".tar"):
                _TarOpens.active.append(path)


@pytest.fixture
def output(tmp_path: Path) -> Path:
    root = tmp_path / "out"
    write_toy_output(str(root), frames=12, index=True)
    return root


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files count as settled at once (they were written moments ago; see test_a_shard_hashed_right_after_...)."""
    monkeypatch.setattr(verified, "RACY_NS", 0)


def _cfg(tmp_path: Path, root: Path, name: str, **data: object) -> TrainConfig:
    return TrainConfig(out=str(tmp_path / name), steps=2, batch_size=1, device="cpu", progress=False,
                       data=DataConfig(manifests=[str(root)], t_in=3, normalize="none",
                                       **data))  # type: ignore[arg-type]


def _launch(cfg: TrainConfig) -> list[str]:
    """launch's checks and run files (prepare_run), as before torchrun; the .tar files it opened under the output."""
    root = cfg.data.manifests[0]
    with _TarOpens() as opened:
        prepare_run(cfg, False, Topology(1), write=True)
    release_run(cfg.out)
    return sorted(p for p in opened if p.startswith(root))


def _dry_run(root: Path, run: Path, *extra: str) -> tuple[int, list[str], list[str], str]:
    """`dpot-train launch --dry-run` in this process: (exit code, .tar files opened under `root`, stderr lines
    without the torchrun command and the `normalise:` line, stderr)."""
    from dpot_train.cli import app

    args = ["launch", "--manifest", str(root), "--out", str(run), "--steps", "2", "--batch-size", "1", "--device",
            "cpu", "--normalize", "none", "--no-progress", "--no-eval", "--dry-run", *extra]
    with _TarOpens() as opened:
        result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.stderr.splitlines() if "dpot_train.run.torchrun" not in ln
             and not ln.startswith("normalise: ")]
    return result.exit_code, sorted(p for p in opened if p.startswith(str(root))), lines, result.stderr


def _paths(root: Path, *rel: str) -> list[str]:
    return sorted(str(root / r) for r in rel)


def _note(root: Path, served: int, hashed: int) -> str:
    return (f"note: sha256 of {served} of {served + hashed} shards taken from {root / RECORD_NAME} (unchanged since "
            f"they were hashed), {hashed} hashed; --verify-checksums always hashes every one")


def test_a_second_launch_opens_no_shard_the_record_vouches_for(output: Path, tmp_path: Path, settled: None,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert _launch(_cfg(tmp_path, output, "a")) == _paths(output, *SHARDS)  # the first launch hashes each shard
    entries, problem = read_record(output / RECORD_NAME)
    assert problem is None and sorted(entries) == sorted(SHARDS)
    for rel in SHARDS:
        st = os.lstat(output / rel)
        assert entries[rel]["sha256"] == hashlib.sha256((output / rel).read_bytes()).hexdigest()
        assert entries[rel]["stat"] == {"size": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns,
                                        "ctime_ns": st.st_ctime_ns}
    assert _note(output, 3, 0) not in capsys.readouterr().err
    assert _launch(_cfg(tmp_path, output, "b")) == []  # nothing opened, let alone read
    assert capsys.readouterr().err.splitlines().count(_note(output, 3, 0)) == 1  # said once the checks passed
    assert sorted(os.listdir(output)) == sorted([RECORD_NAME, ".dpot-readers.lock", "data.zarr", "manifest.json",
                                                 "shards"])  # the lock file of the record's writes is gone


def test_a_shard_rewritten_in_place_is_hashed_again(output: Path, tmp_path: Path, settled: None,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    _launch(_cfg(tmp_path, output, "a"))
    shard = output / TRAIN
    data = shard.read_bytes()
    time.sleep(0.01)  # a later timestamp than the record's, on any file system clock
    with open(shard, "r+b") as fh:  # the same bytes written again, in place: same size and inode, new mtime, ctime
        fh.write(data)
    assert _launch(_cfg(tmp_path, output, "b")) == [str(shard)]
    assert _note(output, 2, 1) in capsys.readouterr().err.splitlines()
    entries, _ = read_record(output / RECORD_NAME)
    assert entries[TRAIN]["stat"]["mtime_ns"] == os.lstat(shard).st_mtime_ns  # the record follows the file
    assert _launch(_cfg(tmp_path, output, "c")) == []


def test_a_changed_shard_is_refused_in_one_line_even_with_its_mtime_set_back(output: Path, tmp_path: Path,
                                                                            settled: None) -> None:
    _launch(_cfg(tmp_path, output, "a"))
    shard = output / TRAIN
    listed = {s["path"]: s for s in json.loads((output / "manifest.json").read_text())["datasets"][0]["shards"]}
    before = os.lstat(shard)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    time.sleep(0.01)
    with open(shard, "r+b") as fh:  # same size, same inode
        fh.write(bytes(data))
    os.utime(shard, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime set back: only ctime tells
    assert os.lstat(shard).st_mtime_ns == before.st_mtime_ns and os.lstat(shard).st_ctime_ns != before.st_ctime_ns
    code, opened, lines, _ = _dry_run(output, tmp_path / "b")
    assert code == 2 and opened == [str(shard)]
    assert lines == [f"error: {shard}: sha256 mismatch (manifest {listed[TRAIN]['sha256']}, found "
                     f"{hashlib.sha256(bytes(data)).hexdigest()})"]
    with open(shard, "ab") as fh:  # a size that differs is refused before any sha256, record or not
        fh.write(b"\0" * 512)
    code, opened, lines, _ = _dry_run(output, tmp_path / "c")
    assert code == 2 and opened == []
    assert lines == [f"error: {shard}: bytes mismatch (manifest {listed[TRAIN]['bytes']}, found "
                     f"{listed[TRAIN]['bytes'] + 512})"]


def test_a_shard_whose_manifest_sha256_changed_is_hashed_again(output: Path, tmp_path: Path, settled: None) -> None:
    """The record vouches for the sha256 it found, not for the manifest: a manifest that now lists another sha256 for
    an unchanged shard (a re-ingest elsewhere, a manifest edited) has it hashed again, and refused."""
    _launch(_cfg(tmp_path, output, "a"))
    from dpot_format.shard_index import index_bytes

    manifest = json.loads((output / "manifest.json").read_text())
    entry = manifest["datasets"][0]
    listed = next(s for s in entry["shards"] if s["path"] == TRAIN)
    found, listed["sha256"] = listed["sha256"], "0" * 64
    index_file = output / entry["shard_index"]["path"]  # the shard index lists it too, as a re-ingest writes it
    index = json.loads(index_file.read_text())
    next(s for s in index["shards"] if TRAIN.endswith(s["path"]))["sha256"] = "0" * 64
    data = index_bytes(index)
    index_file.write_bytes(data)
    entry["shard_index"].update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (output / "manifest.json").write_text(json.dumps(manifest))
    code, opened, lines, _ = _dry_run(output, tmp_path / "b")
    assert code == 2 and opened == [str(output / TRAIN)]
    assert lines == [f"error: {output / TRAIN}: sha256 mismatch (manifest {'0' * 64}, found {found})"]


@pytest.mark.parametrize("damage, reason", [
    ("edit", "its content does not match its sha256 (edited or damaged)"),
    ("cut", "is not UTF-8 JSON (cut short or overwritten)"),
])
def test_a_damaged_record_means_a_full_pass_and_one_warning(output: Path, tmp_path: Path, settled: None,
                                                            capsys: pytest.CaptureFixture[str], damage: str,
                                                            reason: str) -> None:
    _launch(_cfg(tmp_path, output, "a"))
    record = output / RECORD_NAME
    text = record.read_text()
    if damage == "edit":  # a recorded stat changed by hand: still JSON, no longer its own sha256
        doc = json.loads(text)
        doc["entries"][TRAIN]["stat"]["size"] += 1
        record.write_text(json.dumps(doc))
    else:
        record.write_text(text[: len(text) // 2])
    capsys.readouterr()
    assert _launch(_cfg(tmp_path, output, "b")) == _paths(output, *SHARDS)
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert warnings == [f"warning: {record}: damaged record of verified shards ({reason}); every one is hashed and "
                        "the record rewritten"]
    entries, problem = read_record(record)
    assert problem is None and sorted(entries) == sorted(SHARDS)
    assert _launch(_cfg(tmp_path, output, "c")) == []


def test_verify_checksums_always_hashes_every_shard_and_never_none(output: Path, tmp_path: Path,
                                                                   settled: None) -> None:
    _launch(_cfg(tmp_path, output, "a"))
    code, opened, lines, _ = _dry_run(output, tmp_path / "b")
    assert code == 0 and opened == [] and lines == [_note(output, 3, 0)]
    code, opened, lines, _ = _dry_run(output, tmp_path / "c", "--verify-checksums", "always")
    assert code == 0 and opened == _paths(output, *SHARDS) and lines == []
    for never in (["--verify-checksums", "never"], ["--no-verify-checksums"]):
        code, opened, lines, _ = _dry_run(output, tmp_path / "d", *never)
        assert code == 0 and opened == [] and lines == []
    code, opened, lines, _ = _dry_run(output, tmp_path / "e", "--verify-checksums", "sometimes")
    assert code == 2 and opened == [] and lines == ["error: --verify-checksums: expected auto, always or never, got "
                                                    "'sometimes'"]
    code, opened, lines, _ = _dry_run(output, tmp_path / "f", "--verify-checksums", "always", "--no-verify-checksums")
    assert code == 2 and opened == [] and lines == [
        "error: --verify-checksums always: contradicts --no-verify-checksums (the same as --verify-checksums never); "
        "give one of them"]
    cfg = _cfg(tmp_path, output, "g", checksum_record=False)  # what `always` sets: hashed again, record refreshed
    assert _launch(cfg) == _paths(output, *SHARDS)


def test_a_dry_run_consults_the_record_and_writes_nothing(output: Path, tmp_path: Path, settled: None) -> None:
    before = sorted(os.listdir(output))
    code, opened, _, _ = _dry_run(output, tmp_path / "a")
    assert code == 0 and opened == _paths(output, *SHARDS)
    assert sorted(os.listdir(output)) == before and not (tmp_path / "a").exists()  # no record, no lock file
    _launch(_cfg(tmp_path, output, "b"))
    record = output / RECORD_NAME
    listing, content, st = sorted(os.listdir(output)), record.read_bytes(), os.lstat(record)
    shard = output / TRAIN
    shard.write_bytes(shard.read_bytes())  # one shard changed since: the dry run hashes it, and records nothing
    code, opened, _, _ = _dry_run(output, tmp_path / "c")
    assert code == 0 and opened == [str(shard)]
    after = os.lstat(record)
    assert sorted(os.listdir(output)) == listing and record.read_bytes() == content
    assert (after.st_ino, after.st_mtime_ns) == (st.st_ino, st.st_mtime_ns)


def test_an_output_this_user_cannot_write_keeps_its_record_in_the_cache_folder(
        output: Path, tmp_path: Path, settled: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.access
    monkeypatch.setattr(verified.os, "access", lambda p, mode: False if Path(p) == output else real(p, mode))
    monkeypatch.delenv("DPOT_CACHE_DIR", raising=False)
    key = hashlib.sha256(os.fsencode(str(output))).hexdigest()
    cache = tmp_path / "cache"
    assert _launch(_cfg(tmp_path, output, "a", cache_dir=str(cache))) == _paths(output, *SHARDS)
    assert read_record(cache / "verified" / f"{key}.json")[1] is None
    assert _launch(_cfg(tmp_path, output, "b", cache_dir=str(cache))) == []
    assert not {RECORD_NAME, ".dpot-verified.lock"} & set(os.listdir(output))  # nothing beside the data
    _launch(_cfg(tmp_path, output, "c"))  # launch's default cache folder: RUN_DIR/shard-cache
    assert read_record(tmp_path / "c" / "shard-cache" / "verified" / f"{key}.json")[1] is None
    # evaluate's and the trainer's own check name no cache folder by default: no record, none written anywhere
    assert verified.record_path(str(output), None) is None
    assert verified.record_path(str(output), verified.named_cache(None)) is None


def test_zarr_arrays_are_recorded_and_a_changed_chunk_is_hashed_again(output: Path, settled: None,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import zarr

    import dpot_format.validate as validate
    from dpot_format.io import zarr_store
    from dpot_train.data.datasets import DataError, read_manifest_docs
    from dpot_train.data.verified import RecordPolicy
    from dpot_train.run.launch import check_outputs

    hashed: list[str] = []
    real = validate.sha256_array
    monkeypatch.setattr(validate, "sha256_array", lambda array: (hashed.append(array.basename), real(array))[1])
    data = DataConfig(manifests=[str(output)], backend="zarr")

    def check() -> list[str]:
        hashed.clear()
        check_outputs(data, read_manifest_docs([str(output)]), progress=False, record=RecordPolicy())
        return sorted(hashed)

    arrays = sorted(json.loads((output / "manifest.json").read_text())["datasets"][0]["zarr"]["arrays"])
    assert check() == arrays and check() == []
    group = zarr.open_group(zarr_store(str(output / "data.zarr"), read_only=False), mode="r+", path="toy")
    group["fields"][0, 0, 0, 0, 0] = 123.0  # one chunk rewritten
    with pytest.raises(DataError) as info:
        check()
    assert hashed == ["fields"] and len(str(info.value).splitlines()) == 1
    assert str(info.value).startswith(f"{output}/data.zarr/toy/fields: sha256 mismatch (manifest ")


def test_two_writers_at_once_keep_both_and_wait_for_each_other(output: Path, settled: None) -> None:
    """Two launches on one node: each read the record before the other wrote it, each hashes another shard; the
    second write merges into the first's, and a writer waits while the other holds the record's lock."""
    from dpot_format.validate import Item

    path = output / RECORD_NAME
    first, second = (Record(str(output), path, consult=True, write=True) for _ in range(2))

    def item(rel: str) -> Item:
        listed = {s["path"]: s for s in json.loads((output / "manifest.json").read_text())["datasets"][0]["shards"]}
        return Item(rel, "shard", str(output / rel), "toy", listed[rel]["sha256"], True, listed[rel]["bytes"])

    for record, rel in ((first, SHARDS[0]), (second, SHARDS[1])):
        record.digest(item(rel), lambda rel=rel: hashlib.sha256((output / rel).read_bytes()).hexdigest())
    first.save()
    held = FileLock(output / ".dpot-verified.lock").acquire()  # another writer in the middle of its write
    saving = threading.Thread(target=second.save)
    saving.start()
    saving.join(0.5)
    assert saving.is_alive() and sorted(read_record(path)[0]) == [SHARDS[0]]
    held.release()
    saving.join(30)
    assert not saving.is_alive()
    entries, problem = read_record(path)
    assert problem is None and sorted(entries) == sorted(SHARDS[:2])


def test_a_shard_hashed_right_after_it_changed_is_hashed_once_more(output: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A change within the same timestamp tick as the hash would not show in the stat: an entry hashed within
    RACY_NS (2 s) of the file's last change is not trusted; hashed again later, it is."""
    changed = max(os.lstat(output / rel).st_ctime_ns for rel in SHARDS)
    monkeypatch.setattr(verified.time, "time_ns", lambda: changed + 10**9)  # hashed 1 s after the last change
    assert _launch(_cfg(tmp_path, output, "a")) == _paths(output, *SHARDS)
    monkeypatch.setattr(verified.time, "time_ns", lambda: changed + verified.RACY_NS + 10**9)  # 3 s after
    assert _launch(_cfg(tmp_path, output, "b")) == _paths(output, *SHARDS)  # the entries of 1 s are not trusted
    monkeypatch.undo()
    assert _launch(_cfg(tmp_path, output, "c")) == []  # those of 3 s are


def test_time_to_first_step_parts_add_up_on_the_first_steps_line(tmp_path: Path) -> None:
    """The launcher's hand-over read back, the four parts adding up to the total, one line, and the fields on the
    first step's metrics.jsonl line only, mirrored to the trackers with the rest of that line."""
    import torch

    from dpot_train.train import startup
    from dpot_train.train.log import _flush, _print_loss_curve, _StepLog, _truncate_jsonl

    launch = startup.from_env({startup.ENV: json.dumps({"start": 100.0, "exec": 104.5, "hashing_s": 1.25})})
    assert launch == {"start": 100.0, "exec": 104.5, "hashing_s": 1.25}
    assert startup.from_env({}) is None and startup.from_env({startup.ENV: "{"}) is None
    fields = startup.parts(launch, 110.0, 111.75)
    assert fields == {"time_to_first_step_s": 11.75, "time_to_first_step_checks_s": 3.25,
                      "time_to_first_step_hashing_s": 1.25, "time_to_first_step_startup_s": 5.5,
                      "time_to_first_step_first_batch_s": 1.75}
    assert startup.line(fields) == ("time to first step: 11.8 s (checks 3.2 s, hashing 1.2 s, start-up 5.5 s, "
                                    "first batch 1.8 s)")

    class Writer:
        def add_scalar(self, *args: object) -> None:
            pass

    class Tracker:
        def __init__(self) -> None:
            self.sent: list[tuple[int, dict]] = []

        def log(self, scalars: dict, step: int) -> None:
            self.sent.append((step, scalars))

        def flush(self) -> None:
            pass

    tracker = Tracker()
    path = tmp_path / "metrics.jsonl"
    cfg = TrainConfig(steps=4, log_every=2, batch_size=2)
    log = _StepLog(cfg, 8, path, Writer(), None, tracker)  # type: ignore[arg-type]
    log.extra[1] = fields
    _flush([(s, 2 * s, 1e-3, torch.tensor(1.0 / s), torch.tensor(0.5)) for s in (1, 2)], log)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert {k: lines[0][k] for k in fields} == fields and not set(fields) & set(lines[1])
    assert tracker.sent[0] == (1, {k: v for k, v in lines[0].items() if k != "step"})
    _truncate_jsonl(path, 2)  # the resume's cut and the loss curve read it as before
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    _print_loss_curve(path)


@pytest.mark.slow
def test_a_real_launch_prints_its_time_to_first_step_and_the_next_one_hashes_nothing(
        fno_train_shards: Path, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shutil.copytree(fno_train_shards, shards, ignore=shutil.ignore_patterns(".dpot-*"))
    time.sleep(verified.RACY_NS / 1e9)  # a corpus written before: its files settled
    listed = [s["path"] for s in json.loads((shards / "manifest.json").read_text())["datasets"][0]["shards"]]
    pattern = re.compile(r"time to first step: \d+\.\d s \(checks \d+\.\d s, hashing \d+\.\d s, start-up \d+\.\d s, "
                         r"first batch \d+\.\d s\)")
    hashing = []
    for name in ("first", "second"):
        out = tmp_path / name
        started = time.time()
        r = train_runs.run(train_runs.launch_args(shards, out, "--no-eval", steps=2, nproc=1))
        took = time.time() - started
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        shown = [ln for ln in r.stdout.splitlines() if ln.startswith("time to first step:")]
        assert len(shown) == 1 and pattern.fullmatch(shown[0]), r.stdout[-3000:]
        first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
        assert first["step"] == 1
        parts = [first[k] for k in ("time_to_first_step_checks_s", "time_to_first_step_hashing_s",
                                    "time_to_first_step_startup_s", "time_to_first_step_first_batch_s")]
        assert all(p >= 0 for p in parts) and abs(sum(parts) - first["time_to_first_step_s"]) < 0.005
        assert 0 < first["time_to_first_step_s"] < took + 1.0  # from the launcher's start, inside this run
        notes = [ln for ln in r.stderr.splitlines() if ln.startswith("note: sha256 of")]
        hashing.append(notes)
    assert hashing[0] == []  # the first launch hashed every shard
    assert hashing[1] == [f"note: sha256 of {len(listed)} of {len(listed)} shards taken from {shards / RECORD_NAME} "
                          "(unchanged since they were hashed), 0 hashed; --verify-checksums always hashes every one"]


def test_the_benchmarks_sparse_output_is_one_the_full_validator_accepts(tmp_path: Path) -> None:
    """benchmarks/launch_scale.py --record measures real shards: holes where the leading frames are, every byte
    hashed into the listed sha256, tar headers, .npy headers and meta.json as the writer lays them out."""
    sys.path.insert(0, str(train_runs.ROOT / "benchmarks"))
    import launch_scale

    from dpot_format.validate import validate_output

    doc = launch_scale.fabricate_sparse(tmp_path / "out", 2, 3, 64, tmp_path)
    listed = doc["datasets"][0]["shards"]
    assert [s["samples"] for s in listed] == [3, 3] and validate_output(str(tmp_path / "out")) == []
    for s in listed:
        path = tmp_path / "out" / s["path"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == s["sha256"] and path.stat().st_size == s["bytes"]
        assert path.stat().st_blocks * 512 < s["bytes"]  # sparse: the zero frames take no blocks
