"""Each writer owns its resume state: `state_dict()` says what a crashed run completed, `load_state_dict()` on a fresh
writer continues from it, and the result is the uninterrupted writer's, byte for byte. The journal only records
those states (dpot_data.ingest.journal)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dpot_data.ingest.journal import JOURNAL_NAME, Journal, read_lines
from dpot_data.writers.wds_shards import SplitShardWriter
from dpot_data.writers.zarr_store import ZarrDatasetWriter, ZarrLayout

N, FRAMES, RES = 5, 3, 8


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    fields = rng.normal(size=(N, FRAMES, 2, RES, RES)).astype(np.float32)
    mask = (rng.random((N, RES, RES)) > 0.2).astype(np.uint8)
    return fields, mask


def _layout() -> ZarrLayout:
    grid = np.linspace(0, 1, RES)
    return ZarrLayout(group="d", frames=FRAMES, channels=["u", "v"], channel_valid=np.array([True, True]),
                      fill_value=1.0, coords={"y": grid, "x": grid}, time=np.arange(FRAMES, dtype=np.float64),
                      samples=np.array([f"f#{i}" for i in range(N)]), splits=np.array(["train"] * N))


def _zarr_files(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def test_zarr_writer_resumes_from_its_state_dict(tmp_path: Path) -> None:
    fields, mask = _data()
    whole = ZarrDatasetWriter(tmp_path / "whole.zarr", _layout()).create()
    for i in range(0, N, 2):
        whole.write_block(fields[i:i + 2], mask[i:i + 2])
    expected = whole.close()

    first = ZarrDatasetWriter(tmp_path / "resumed.zarr", _layout()).create()
    first.write_block(fields[:2], mask[:2])
    state = first.state_dict()
    assert state["rows"] == 2 and set(state["digests"]) == {"fields", "mask"}
    first.write_block(fields[2:3] * 0 + 7, mask[2:3])  # a block the crashed run wrote but never reported
    second = ZarrDatasetWriter(tmp_path / "resumed.zarr", _layout())
    second.load_state_dict(json.loads(json.dumps(state)))  # the state survives the journal's JSON
    second.write_block(fields[2:4], mask[2:4])
    second.write_block(fields[4:], mask[4:])
    assert second.close() == expected
    assert _zarr_files(tmp_path / "resumed.zarr") == _zarr_files(tmp_path / "whole.zarr")


def test_shard_writer_resumes_from_its_state_dict(tmp_path: Path) -> None:
    fields, mask = _data()
    target = 1  # one trajectory per shard: a shard completes when the next trajectory starts

    def add(writer: SplitShardWriter, i: int) -> None:
        writer.add(i, fields[i], mask[i], {"id": f"f#{i}", "index": i})

    whole = SplitShardWriter(tmp_path / "whole", "shards/d", "train", target)
    for i in range(N):
        add(whole, i)
    expected = [s.to_dict() for s in whole.close()]

    first = SplitShardWriter(tmp_path / "resumed", "shards/d", "train", target)
    for i in range(3):
        add(first, i)
    state = first.state_dict()
    assert [s["samples"] for s in state["done"]] == [1, 1]  # the third shard is still open
    first.abort()  # what a crash leaves: the open shard's temporary file is gone or ignored
    second = SplitShardWriter(tmp_path / "resumed", "shards/d", "train", target)
    second.load_state_dict(json.loads(json.dumps(state)))
    for i in range(2, N):
        add(second, i)
    assert [s.to_dict() for s in second.close()] == expected
    for s in expected:
        assert (tmp_path / "resumed" / s["path"]).read_bytes() == (tmp_path / "whole" / s["path"]).read_bytes()


def test_the_journal_records_what_the_writers_report(tmp_path: Path) -> None:
    """Journal.record stores each shard writer's newly completed shards from its state_dict, once."""
    fields, mask = _data()
    journal = Journal.open(tmp_path, "d", "job", ["train"] * N, [2, 4, 5], zarr=False)
    try:
        writer = SplitShardWriter(journal.staging, "shards/d", "train", 1)
        for i in range(3):
            writer.add(i, fields[i], mask[i], {"index": i})
        journal.record(0, 3, None, {"train": writer})
        journal.record(1, 3, None, {"train": writer})  # nothing new since
    finally:
        journal.close()
    lines = read_lines(journal.staging / JOURNAL_NAME)
    assert [line["shards"] for line in lines[1:]] == [writer.state_dict()["done"], []]


def test_a_zarr_block_is_on_disk_when_write_block_returns(tmp_path: Path, monkeypatch) -> None:
    """The journal records a block after write_block returns, so its chunk files (and their folder entries) must be
    synced by then, not only at close: a power cut must not lose rows the journal counts."""
    import os

    fields, mask = _data()
    writer = ZarrDatasetWriter(tmp_path / "s.zarr", _layout()).create()
    synced: list[str] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    writer.write_block(fields[:2], mask[:2])
    group = tmp_path / "s.zarr" / "d"
    assert sorted(synced) == sorted(str(group / a / f"c.{r}.{rest}") for a, rest in (("fields", "0.0.0.0"),
                                                                                      ("mask", "0.0"))
                                    for r in (0, 1))
