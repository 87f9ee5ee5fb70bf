"""The ingest command's process settings for speed (dpot_data.ingest.allocator) and what they must not change: the
bytes written. `dpot-data ingest` reuses freed block buffers; its output is byte-for-byte that of the library call
in a process left with the allocator's defaults."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.ingest import IngestOptions, allocator, ingest_files
from dpot_data.synth.pdebench import write_cfd

ROOT = Path(__file__).resolve().parents[1]

# In a thread, as the ingest's block tasks run: a block-sized buffer (16 trajectories of 21 frames, 4 channels,
# 128²: 88 MB) allocated, written and freed four times; prints the minor page faults of the last round.
BLOCKS = """
import resource, sys, threading
import numpy as np
from dpot_data.ingest.allocator import reuse_freed_memory
tuned = reuse_freed_memory() if sys.argv[1] == "tuned" else None
faults = []
def blocks():
    for _ in range(4):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = np.empty((16, 21, 4, 128, 128), np.float32)
        block[...] = 1.0
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del block
worker = threading.Thread(target=blocks)
worker.start()
worker.join()
print(tuned, faults[-1])
"""


def _block_faults(mode: str) -> tuple[str, int]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", BLOCKS, mode], capture_output=True, text=True, env=env, timeout=120,
                         check=True).stdout.split()
    return out[0], int(out[1])


def test_freed_block_buffers_are_reused_without_new_page_faults() -> None:
    tuned, faults = _block_faults("tuned")
    if tuned != "True":
        pytest.skip("no glibc mallopt on this platform")
    _, untuned = _block_faults("default")
    # 88 MB is about 42 huge pages or 21504 small ones: every one is faulted in (and zeroed) again when not reused
    assert untuned >= 32
    assert faults <= 8, f"{faults} page faults for a block buffer allocated again (the allocator's defaults: {untuned})"


def test_ingest_command_tunes_its_own_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple] = []
    monkeypatch.setattr(allocator, "reuse_freed_memory", lambda *args: calls.append(args) or True)
    raw = write_cfd(tmp_path / "raw", n=2, frames=3, res=8)
    result = CliRunner().invoke(app, ["ingest", "pdebench", str(raw), "--out", str(tmp_path / "out"),
                                      "--resolution", "8", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert calls == [()]


def _files(out: Path) -> dict[str, str]:
    """sha256 of every data file under an output folder by relative path: shards, chunk files (the manifest and the
    Zarr metadata left out: they name the command and the time)."""
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name not in ("manifest.json", "zarr.json")}


def test_ingest_command_writes_the_bytes_of_the_library_ingest(tmp_path: Path) -> None:
    """The command (its process tuned) and `ingest_files` in this process (allocator defaults, statistics and
    hashing as in the library) give the same files, shard and array digests and statistics; several blocks and
    shards, so that buffers are reused between blocks."""
    raw = write_cfd(tmp_path / "raw", n=12, frames=5, res=16, seed=3)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    fast = tmp_path / "cli"
    subprocess.run([sys.executable, "-m", "dpot_data", "ingest", "pdebench", str(raw), "--out", str(fast),
                    "--resolution", "16", "--block", "3", "--shard-size", "60000", "--no-progress"], env=env,
                   capture_output=True, text=True, timeout=300, check=True)
    plain = tmp_path / "library"
    ingest_files("pdebench", [raw], plain, IngestOptions(resolution=16, block=3, shard_size=60_000))
    a, b = (json.loads((out / "manifest.json").read_text())["datasets"][0] for out in (fast, plain))
    assert len(a["shards"]) > 2
    assert [(s["path"], s["sha256"], s["bytes"]) for s in a["shards"]] == \
        [(s["path"], s["sha256"], s["bytes"]) for s in b["shards"]]
    assert a["zarr"]["arrays"] == b["zarr"]["arrays"] and a["stats"] == b["stats"] and a["inputs"] == b["inputs"]
    files = _files(fast)
    assert any(name.endswith(".tar") for name in files) and any("/fields/c." in name for name in files)
    assert files == _files(plain)


def test_zarr_writer_syncs_a_block_while_it_hashes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A block's chunk files are synced on a helper thread while the block is hashed (the sync waits on the disk,
    the hash on the CPU): the hash of each block starts once its sync is under way, not after it. Both are done
    when write_block returns, and the store's bytes and digests are those of the straightforward order."""
    import threading

    import numpy as np

    from dpot_data.writers import zarr_store
    from dpot_data.writers.zarr_store import ZarrDatasetWriter, ZarrLayout
    from dpot_format.io import ArrayHasher

    n, frames, res = 4, 3, 8
    grid = np.linspace(0, 1, res)
    layout = ZarrLayout(group="d", frames=frames, channels=["u", "v"], channel_valid=np.array([True, True]),
                        fill_value=1.0, coords={"y": grid, "x": grid}, time=np.arange(frames, dtype=np.float64),
                        samples=np.array([f"f#{i}" for i in range(n)]), splits=np.array(["train"] * n))
    rng = np.random.default_rng(0)
    fields = rng.standard_normal((n, frames, 2, res, res)).astype(np.float32)
    mask = np.ones((n, res, res), np.uint8)

    plain = ZarrDatasetWriter(tmp_path / "plain.zarr", layout).create()
    for i in range(0, n, 2):
        plain.write_block(fields[i:i + 2], mask[i:i + 2])
    expected = plain.close()

    syncing, overlapped, synced_rows = threading.Event(), [], []
    real_sync, real_update, real_settle = os.fdatasync, ArrayHasher.update, ZarrDatasetWriter._settle

    def fdatasync(fd: int) -> None:
        syncing.set()
        real_sync(fd)

    def update(self: ArrayHasher, block: np.ndarray) -> None:
        overlapped.append(syncing.wait(timeout=20))  # the straightforward order (hash, then sync) waits in vain
        real_update(self, block)

    def settle(self: ZarrDatasetWriter, rows: range) -> None:
        real_settle(self, rows)
        synced_rows.extend(rows)

    monkeypatch.setattr(zarr_store.os, "fdatasync", fdatasync)
    monkeypatch.setattr(ArrayHasher, "update", update)
    monkeypatch.setattr(ZarrDatasetWriter, "_settle", settle)
    writer = ZarrDatasetWriter(tmp_path / "overlap.zarr", layout).create()
    for i in range(0, n, 2):
        syncing.clear()
        writer.write_block(fields[i:i + 2], mask[i:i + 2])
        assert synced_rows == list(range(i + 2))  # synced before the call returned
    assert overlapped == [True] * 4  # fields and mask of both blocks
    assert writer.close() == expected
    files = {p.relative_to(tmp_path / "plain.zarr"): p.read_bytes() for p in (tmp_path / "plain.zarr").rglob("c.*")}
    assert files and files == {p.relative_to(tmp_path / "overlap.zarr"): p.read_bytes()
                               for p in (tmp_path / "overlap.zarr").rglob("c.*")}
