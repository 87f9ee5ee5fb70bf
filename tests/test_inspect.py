"""`dpot-data inspect`: a report of what an ingest folder holds, checked against the files on disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.ingest import IngestOptions, ingest_files
from dpot_data.inspection import inspect_dir, render


@pytest.fixture(scope="module")
def ingested(fno_pair, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("inspect") / "out"
    ingest_files("fno", [fno_pair["v5"]], out, IngestOptions(resolution=32, split=(0.5,), seed=1, shard_size=1 << 18,
                                                               convention="canonical"))
    return out


def _disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_json_report_matches_what_is_on_disk(ingested):
    result = CliRunner().invoke(app, ["inspect", str(ingested), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["schema_version"] == 2
    (d,) = report["datasets"]
    assert d["name"] == "fno-ns-v1e-3" and d["source"] == "fno"
    assert d["trajectories"] == 4 and d["splits"] == {"train": 2, "valid": 0, "test": 2}
    assert d["frames"] == 5
    assert d["channels"] == [{"name": "vorticity", "valid": True}] + [{"name": f"pad{k}", "valid": False}
                                                                        for k in (1, 2, 3)]
    assert d["grid"] == {"dims": ["y", "x"], "shape": [32, 32], "native_shape": [64, 64]}
    assert d["resample"]["fields"] == "fourier"
    shard_files = sorted((ingested / "shards" / "fno-ns-v1e-3").glob("*.tar"))
    assert d["shards"]["count"] == len(shard_files) >= 2 and d["shards"]["samples"] == 4
    assert d["shards"]["bytes_on_disk"] == sum(p.stat().st_size for p in shard_files) == d["shards"]["bytes_manifest"]
    assert d["zarr"]["bytes_on_disk"] == _disk_bytes(ingested / "data.zarr" / "fno-ns-v1e-3")
    assert d["bytes_on_disk"] == d["shards"]["bytes_on_disk"] + d["zarr"]["bytes_on_disk"]
    assert d["checksums"] == {"verified": False, "checked": len(shard_files) + 6, "status": "sizes ok", "ok": True,
                              "failed": []}


def test_verify_rehashes_and_reports_a_corrupt_shard(ingested, tmp_path):
    assert inspect_dir(ingested, verify=True)["datasets"][0]["checksums"]["status"] == "sha256 ok"
    copy = tmp_path / "copy"
    shutil.copytree(ingested, copy)
    shard = sorted((copy / "shards" / "fno-ns-v1e-3").glob("*.tar"))[0]
    data = bytearray(shard.read_bytes())
    data[1000] ^= 0xFF  # same size, different content: only the sha256 catches it
    shard.write_bytes(bytes(data))
    assert inspect_dir(copy)["ok"]  # sizes alone still agree
    result = CliRunner().invoke(app, ["inspect", str(copy), "--json", "--verify"])
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    failed = report["datasets"][0]["checksums"]["failed"]
    assert [f["path"] for f in failed] == [str(shard.relative_to(copy))]
    assert report["datasets"][0]["checksums"]["status"].startswith("FAILED (1 of")


def test_missing_shard_fails_without_verify(ingested, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ingested, copy)
    victim = sorted((copy / "shards" / "fno-ns-v1e-3").glob("*.tar"))[-1]
    victim.unlink()
    report = inspect_dir(copy)
    assert not report["ok"]
    assert report["datasets"][0]["checksums"]["failed"][0]["actual"] == "missing"


def test_table_and_missing_manifest(ingested, tmp_path):
    console = Console(width=200, record=True)
    console.print(render(inspect_dir(ingested)))
    text = console.export_text()
    for phrase in ("fno-ns-v1e-3", "4 (train 2 / test 2)", "vorticity + 3 pad", "32x32 (from 64x64)", "fourier",
                   "sizes ok"):
        assert phrase in text, phrase
    result = CliRunner().invoke(app, ["inspect", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: {tmp_path / 'manifest.json'}: expected a manifest.json written by " \
                                    "`dpot-data ingest` (none found)"
