"""Output bytes are a contract: fixed ingests of small generated raw files give exactly the recorded shard and array
digests (tests/golden/ingest_outputs.json). A change of the stored bytes must be deliberate: regenerate the file with
`DPOT_REGEN_GOLDEN=1 pytest tests/test_output_golden.py` in its own commit, with a format version bump."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from dpot_data.ingest import IngestOptions, ingest_files
from dpot_data.synth.cfdbench import write_cfdbench
from dpot_data.synth.fno import synth_fno
from dpot_data.synth.pdearena import write_standard
from dpot_data.synth.pdebench import write_cfd, write_diff_react

GOLDEN = Path(__file__).parent / "golden" / "ingest_outputs.json"


def _cases(raw: Path) -> dict[str, tuple[str, list[Path], IngestOptions]]:
    """name -> (source, raw files, options): every source, both conventions, a resampled and a native grid, small
    shards so that several roll over, a train/valid/test split, Zarr-only and shards-only runs."""
    fno = synth_fno(raw / "fno", n=5, frames=12, resolution=32, seed=1)
    cns = write_cfd(raw / "cns", n=4, frames=9, res=32, seed=2)
    dr = write_diff_react(raw / "dr", n=3, frames=7, res=16, seed=3)
    arena = write_standard(raw / "arena", n=3, frames=10, res=16, seed=4)
    write_cfdbench(raw / "cfd", problems=("cavity", "cylinder"), cases=3, frames=(21, 30), res=16, seed=5)
    small = 40_000
    return {
        "fno-reference": ("fno", [fno[0]], IngestOptions(resolution=64, shard_size=small)),
        "fno-canonical-split": ("fno", [fno[1]], IngestOptions(convention="canonical", resolution=48,
                                                               split=(0.6, 0.2), seed=7, shard_size=small)),
        "cns-reference": ("pdebench", [cns], IngestOptions(resolution=64, shard_size=small)),
        "cns-canonical-native": ("pdebench", [cns], IngestOptions(convention="canonical", resolution=0,
                                                                  formats=("wds",))),
        "dr-reference": ("pdebench", [dr], IngestOptions(resolution=32, formats=("zarr",))),
        "arena-reference": ("pdearena", arena, IngestOptions(resolution=32, shard_size=small)),
        "cfdbench-reference": ("cfdbench", [raw / "cfd"], IngestOptions(resolution=32, shard_size=small)),
        "cfdbench-canonical": ("cfdbench", [raw / "cfd"], IngestOptions(convention="canonical", resolution=32,
                                                                        segment=10, shard_size=small)),
    }


def _digests(manifest: dict, out: Path) -> dict:
    """What must not change: every shard's path, size, sha256 and sample count, every Zarr array digest, the stored
    (encoded) chunk files of `fields` and `mask`, and the manifest entry's facts (without the time, command line and
    input paths, which depend on the run)."""
    found = {}
    for entry in manifest["datasets"]:
        facts = {k: v for k, v in entry.items() if k not in ("inputs", "provenance")}
        if entry["zarr"]:
            group = out / entry["zarr"]["path"] / entry["zarr"]["group"]
            facts["chunk_files"] = {name: _tree_digest(group / name) for name in ("fields", "mask")}
        found[entry["name"]] = facts
    return found


def _tree_digest(folder: Path) -> str:
    """sha256 over the relative paths and bytes of every file below `folder`, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "zarr.json"):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def produced(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("golden")
    result = {}
    for name, (source, files, opts) in _cases(base / "raw").items():
        opts.command = "golden"
        result[name] = _digests(ingest_files(source, files, base / "out" / name, opts), base / "out" / name)
    return result


def test_ingest_outputs_match_recorded_digests(produced: dict) -> None:
    if os.environ.get("DPOT_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(produced, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(GOLDEN.read_text())
    assert sorted(produced) == sorted(recorded)
    for name in recorded:
        assert produced[name] == recorded[name], f"{name}: the stored output changed"


def test_version_1_outputs_read_as_before(tmp_path, monkeypatch) -> None:
    """A store written with the version 1 codec (zstd level 3, no `zarr.codec`, schema_version 1) still validates
    and reads the same trajectories as a version 2 one."""
    import numpy as np

    from dpot_data.writers import zarr_store
    from dpot_format.io import atomic_write
    from dpot_format.validate import validate_output
    from dpot_train.data.datasets import read_manifests
    from dpot_train.data.readers import make_reader

    raw = synth_fno(tmp_path / "raw", n=3, frames=5, resolution=16, seed=4)[0]
    new = ingest_files("fno", [raw], tmp_path / "v2", IngestOptions(resolution=0, command="t"))
    monkeypatch.setattr(zarr_store, "CODEC_NAME", "zstd-3")
    old = ingest_files("fno", [raw], tmp_path / "v1", IngestOptions(resolution=0, command="t"))
    assert new["datasets"][0]["zarr"]["codec"] == "blosc-lz4-shuffle" and old["datasets"][0]["zarr"]["codec"] == "zstd-3"
    old["schema_version"] = 1
    del old["datasets"][0]["zarr"]["codec"]
    atomic_write(tmp_path / "v1" / "manifest.json", json.dumps(old).encode())
    assert validate_output(str(tmp_path / "v1")) == []
    reader = make_reader("zarr")
    (a,), (b,) = read_manifests([str(tmp_path / "v1")]), read_manifests([str(tmp_path / "v2")])
    refs_a, refs_b = reader.refs(a, "train"), reader.refs(b, "train")
    assert len(refs_a) == len(refs_b) == 3
    for ra, rb in zip(refs_a, refs_b):
        for x, y in zip(reader.read(ra, 0, 5), reader.read(rb, 0, 5)):
            np.testing.assert_array_equal(x, y)
