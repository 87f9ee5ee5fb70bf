"""Bad training input is refused before any training step, with a message naming the file and the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dpot_train.core.config import DataConfig
from dpot_train.data.datasets import DataError
from dpot_train.data.prepare import prepare_stream
from tests import train_runs

DATASET = "fno-ns-v1e-3"


@pytest.fixture()
def shards(fno_train_shards: Path, tmp_path: Path) -> Path:
    """A private copy of the session's shards that a test may damage."""
    out = tmp_path / "shards"
    shutil.copytree(fno_train_shards, out)
    return out


def _train_shard(root: Path) -> Path:
    m = json.loads((root / "manifest.json").read_text())
    return root / next(s["path"] for s in m["datasets"][0]["shards"] if s["split"] == "train")


def _prepare(*manifests: Path, **kw: object) -> None:
    prepare_stream(DataConfig(manifests=[str(m) for m in manifests], **kw), seed=0)  # type: ignore[arg-type]


def test_checksum_mismatch(shards: Path) -> None:
    shard = _train_shard(shards)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"dataset '{DATASET}': checksum mismatch for shard .*{shard.name}.*"
                                        r"--no-verify-checksums"):
        _prepare(shards)
    _prepare(shards, verify_checksums=False)  # the escape hatch: sizes still match, sha256 skipped


def test_size_mismatch_is_caught_even_without_checksums(shards: Path) -> None:
    shard = _train_shard(shards)
    size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"\0" * 512)
    with pytest.raises(DataError, match=rf"{shard.name} has {size + 512} bytes, the manifest says {size}"):
        _prepare(shards, verify_checksums=False)


def test_missing_shard(shards: Path) -> None:
    shard = _train_shard(shards)
    shard.unlink()
    with pytest.raises(DataError, match=rf"dataset '{DATASET}': shard missing: .*{shard.name}"):
        _prepare(shards)


def test_missing_manifest_and_schema_violation(shards: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nowhere/manifest.json: expected a manifest.json written by `dpot-data "
                                        r"ingest` \(none found\)"):
        _prepare(tmp_path / "nowhere")
    m = json.loads((shards / "manifest.json").read_text())
    del m["datasets"][0]["frames"]
    (shards / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match=r"manifest.json: expected a manifest following schema version 2: "
                                        r"datasets/0: 'frames' is a required property"):
        _prepare(shards)


def test_mixture_naming_an_unknown_dataset(shards: Path, tmp_path: Path) -> None:
    mix = tmp_path / "mix.yaml"
    mix.write_text(f"{DATASET}: 1.0\npdebench-swe: 2.0\n")
    with pytest.raises(DataError, match=rf"names 1 dataset\(s\) absent from the given manifests: \['pdebench-swe'\]; "
                                        rf"the manifests hold: \['{DATASET}'\].*--mixture-partial"):
        _prepare(shards, mixture=str(mix))


def test_mismatched_channel_counts(shards: Path, fno_train_shards: Path, tmp_path: Path) -> None:
    from dpot_data.ingest import IngestOptions, ingest_files

    raw_file = sorted((fno_train_shards.parent / "raw").glob("NavierStokes_*.mat"))[0]  # see conftest
    other = tmp_path / "two-channels"
    ingest_files("fno", [raw_file], other, IngestOptions(resolution=32, channels=2, name="ns-two", formats=("wds",)))
    with pytest.raises(DataError, match=r"mismatched channel counts: dataset 'ns-two' .* has 2 channels .*"
                                        rf"dataset '{DATASET}' .* has 4"):
        _prepare(shards, other)


def test_duplicate_dataset_and_too_few_frames(shards: Path) -> None:
    with pytest.raises(DataError, match=rf"dataset '{DATASET}' appears in two manifests"):
        _prepare(shards, shards)
    with pytest.raises(DataError, match=r"has 13 frames per trajectory, fewer than t_in \+ t_out = 15"):
        _prepare(shards, t_in=14)


@pytest.mark.slow
def test_cli_reports_bad_input_before_training(shards: Path, tmp_path: Path) -> None:
    _train_shard(shards).unlink()
    out = tmp_path / "run"
    r = train_runs.run(train_runs.launch_args(shards, out, steps=2, nproc=1))
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"error: {_train_shard(shards)}: missing (listed in the manifest)"]
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()
    r = train_runs.run(train_runs.launch_args(shards, out, "--mixture", "nope=1", steps=2, nproc=1))
    assert r.returncode == 2 and "absent from the given manifests: ['nope']" in r.stderr
