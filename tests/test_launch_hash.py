"""The launch's sha256 pass runs on a local thread pool (dpot_train.data.hash_pool): the same problems, in the same
order and with the same one-line errors as the one-thread pass, each shard hashed once, and a progress bar on
stderr that --no-progress turns off."""

from __future__ import annotations

import io
import json
import sys
import threading
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import zarr

import dpot_format.validate as validate
from dpot_format.io import zarr_store
from dpot_train.core.config import DataConfig, TrainConfig
from dpot_train.data import hash_pool
from dpot_train.data.datasets import DataError, read_manifest_docs, read_manifests, verify_shards
from dpot_train.run.launch import Topology, check_outputs, prepare_run
from tests.toy_output import write_toy_output

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import launch_hash as bench_launch_hash  # noqa: E402

SHARD = "shards/toy/{}-000000.tar"
REAL_SHA256_FILE = validate.sha256_file


def _listed(root: Path) -> dict[str, dict]:
    """The manifest's shard entries by split."""
    doc = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    return {s["split"]: s for s in doc["datasets"][0]["shards"]}


def _flip(path: Path) -> None:
    """One byte of the file changed in place (same size)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


class _Hashes:
    """sha256_file as the validator calls it, counted per file and per thread; `hold` (a file) waits, on a pool
    thread, until `after` (another file) has been hashed: the pool then finishes them out of the manifest's order."""

    def __init__(self, hold: str | None = None, after: str | None = None) -> None:
        self.files: Counter[str] = Counter()
        self.threads: set[str] = set()
        self.hold, self.after = hold, after
        self.done = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, path: str, *args: object, **kwargs: object) -> tuple[str, int]:
        name = threading.current_thread().name
        with self.lock:
            self.files[str(path)] += 1
            self.threads.add(name)
        if self.hold is not None and str(path).endswith(self.hold) and threading.current_thread() is not \
                threading.main_thread():
            assert self.done.wait(60), f"{self.after} was not hashed while {self.hold} waited"
        out = REAL_SHA256_FILE(path, *args, **kwargs)
        if self.after is not None and str(path).endswith(self.after):
            self.done.set()
        return out


def _damaged(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """Two toy outputs: `first` with a damaged train shard, a valid shard of the wrong size and the test shard
    missing; `second` with its train and test shards damaged. The error lines launch prints for them."""
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        write_toy_output(str(root), index=True)
    a, b = _listed(first), _listed(second)
    _flip(first / SHARD.format("train"))
    with open(first / SHARD.format("valid"), "ab") as fh:
        fh.write(b"\0" * 512)
    (first / SHARD.format("test")).unlink()
    _flip(second / SHARD.format("train"))
    _flip(second / SHARD.format("test"))
    lines = [f"{first}/{SHARD.format('train')}: sha256 mismatch (manifest {a['train']['sha256']}, found "
             f"{_sha(first / SHARD.format('train'))})",
             f"{first}/{SHARD.format('valid')}: bytes mismatch (manifest {a['valid']['bytes']}, found "
             f"{a['valid']['bytes'] + 512})",
             f"{first}/{SHARD.format('test')}: missing (listed in the manifest)",
             f"{second}/{SHARD.format('train')}: sha256 mismatch (manifest {b['train']['sha256']}, found "
             f"{_sha(second / SHARD.format('train'))})",
             f"{second}/{SHARD.format('test')}: sha256 mismatch (manifest {b['test']['sha256']}, found "
             f"{_sha(second / SHARD.format('test'))})"]
    return first, second, lines


def _error(data: DataConfig, workers: int) -> list[str]:
    with pytest.raises(DataError) as info:
        check_outputs(data, read_manifest_docs(list(data.manifests)), progress=False, workers=workers)
    return str(info.value).splitlines()


def test_the_pool_finds_the_serial_problems_in_the_serial_order(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    first, second, expected = _damaged(tmp_path)
    data = DataConfig(manifests=[str(first), str(second)])
    serial = _Hashes()
    monkeypatch.setattr(validate, "sha256_file", serial)
    assert _error(data, workers=1) == expected
    assert serial.threads == {threading.main_thread().name}
    # the pool finishes second's test shard before its train shard; the lines keep the manifest's order
    pooled = _Hashes(hold=f"second/{SHARD.format('train')}", after=f"second/{SHARD.format('test')}")
    monkeypatch.setattr(validate, "sha256_file", pooled)
    assert _error(data, workers=4) == expected
    assert pooled.done.is_set() and pooled.threads and all(t.startswith("dpot-hash") for t in pooled.threads)
    assert pooled.files == serial.files  # the same shards hashed (not the missing one, not the one of wrong size)


def test_zarr_arrays_are_hashed_on_the_pool_with_the_serial_lines(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "out"
    write_toy_output(str(root), index=True)
    group = zarr.open_group(zarr_store(str(root / "data.zarr"), read_only=False), mode="r+", path="toy")
    group["fields"][0, 0, 0, 0, 0] = 123.0
    group["mask"][1, 0, 0] = 7
    data = DataConfig(manifests=[str(root)], backend="zarr")
    serial = _error(data, workers=1)
    assert [line.split(": ")[0] for line in serial] == [f"{root}/data.zarr/toy/fields", f"{root}/data.zarr/toy/mask"]
    used: set[str] = set()
    real = validate.sha256_array

    def traced(array: object) -> str:
        used.add(threading.current_thread().name)
        return real(array)

    monkeypatch.setattr(validate, "sha256_array", traced)
    assert _error(data, workers=3) == serial
    assert used and all(t.startswith("dpot-hash") for t in used)


def _run_config(tmp_path: Path, root: Path) -> TrainConfig:
    return TrainConfig(out=str(tmp_path / "run"), steps=2, batch_size=1, device="cpu",
                       data=DataConfig(manifests=[str(root)], t_in=3, normalize="none"))


def test_a_dry_run_launch_hashes_each_shard_once_on_the_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "out"
    write_toy_output(str(root), frames=12, index=True)
    monkeypatch.setattr(hash_pool, "available_cores", lambda: 4)  # a pool even on a one-core machine
    hashes = _Hashes()
    monkeypatch.setattr(validate, "sha256_file", hashes)
    prepare_run(_run_config(tmp_path, root), False, Topology(1), write=False)
    assert sorted(hashes.files) == sorted(str(root / s["path"]) for s in _listed(root).values())
    assert set(hashes.files.values()) == {1}
    assert hashes.threads and all(t.startswith("dpot-hash") for t in hashes.threads)
    assert not (tmp_path / "run").exists()


class _Terminal(io.StringIO):
    """stderr as a terminal (tqdm draws its bar only there)."""

    def isatty(self) -> bool:
        return True


def test_the_bar_shows_on_a_terminal_and_no_progress_turns_it_off(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "out"
    write_toy_output(str(root), frames=12, index=True)
    cfg = _run_config(tmp_path, root)

    def stderr_of(cfg: TrainConfig, terminal: bool = True) -> str:
        err = _Terminal() if terminal else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        prepare_run(cfg, False, Topology(1), write=False)
        return err.getvalue()

    assert "sha256" not in stderr_of(cfg)  # a few kB to hash: less than a little, no bar
    monkeypatch.setattr(hash_pool, "PROGRESS_MIN_BYTES", 1)
    shown = stderr_of(cfg)
    assert "sha256: 100%" in shown and "B/" in shown  # every listed byte checked, counted in bytes
    assert "sha256" not in stderr_of(replace(cfg, progress=False))  # --no-progress
    assert "sha256" not in stderr_of(cfg, terminal=False)  # a log file: no bar, as for the training bar
    assert "sha256" not in stderr_of(replace(cfg, data=replace(cfg.data, verify_checksums=False)))  # nothing hashed


def test_evaluate_checks_hash_on_the_pool_with_the_serial_message(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    first, _, _ = _damaged(tmp_path)
    datasets = read_manifests([str(first)])
    messages, threads = [], []
    for cores in (1, 4):
        monkeypatch.setattr(hash_pool, "available_cores", lambda cores=cores: cores)
        hashes = _Hashes()
        monkeypatch.setattr(validate, "sha256_file", hashes)
        with pytest.raises(DataError) as info:
            verify_shards(datasets, "train", checksums=True)
        messages.append(str(info.value))
        threads.append(hashes.threads)
    assert messages[0] == messages[1] and "checksum mismatch" in messages[0] and "\n" not in messages[0]
    assert threads[0] == {threading.main_thread().name}
    assert threads[1] and all(t.startswith("dpot-hash") for t in threads[1])


def test_the_benchmark_ends_with_its_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    bench_launch_hash.main(["--shards", "3", "--shard-mib", "1", "--repeat", "1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    assert result["shards"] == 3 and len(result["serial"]["wall_s"]) == len(result["pool"]["wall_s"]) == 1
    assert result["pool"]["threads"] >= 1 and result["wall_ratio"] > 0 and len(result["no_sha256"]["wall_s"]) == 1
