"""The loader's batch path (`stream.read_batch`: each window read straight into its slot of the batch buffer) gives
bit for bit the batches of the plain path (`collate` of `make_sample`s: read, copy, stack), with the same strides,
for several seeds and starts, without workers, with 2 thread workers and with 1 or 2 process workers (batches
built in a shared ring of slots, `dpot_train.data.process_ring`), for stored-order ("xy") and swapped ("yx")
datasets, normalised or not, mixed in one batch, and through a reader without `read_into` (Zarr). Windows copied
from a shard's memory map equal read() windows, a shard cut after it was mapped is reported, not read past, and
only shards on local filesystems are mapped."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.core.config import DataConfig
from dpot_train.data.datasets import DataError
from dpot_train.data.loader import make_loader
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.stream import BatchBuffers, EpochPlans, WindowStream, read_batch

BATCH = 4
STEPS = 6


@pytest.fixture(scope="module")
def canonical_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The FNO trajectories of `fno_train_shards` ingested under the canonical convention: model_layout "xy" (the
    stored order is the model's reversed order) and normalised by default, where the fixture's are "yx"."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.fno import synth_fno

    base = tmp_path_factory.mktemp("fno_canonical")
    files = synth_fno(base / "raw", n=8, frames=13, viscosity=1e-3, seed=1, resolution=32)
    out = base / "shards"
    ingest_files("fno", [files[0]], out, IngestOptions(resolution=32, split=(0.75, 0.125), seed=0,
                                                       convention="canonical", name="fno-canonical"))
    return out


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().numpy().tobytes()


def _same_bits(a: dict, b: dict, where: str) -> None:
    assert a.keys() == b.keys(), where
    assert a["id"] == b["id"], where
    for k in a:
        if k == "id":
            continue
        x, y = a[k], b[k]
        assert (x.dtype, tuple(x.shape), x.stride()) == (y.dtype, tuple(y.shape), y.stride()), f"{where}: {k}"
        assert _bits(x) == _bits(y), f"{where}: {k} differs"


def _batches(spec, reader, start: int, workers: int, direct: bool, kind: str = "thread") -> list[dict]:
    """STEPS batches; with process workers each copied out of its ring slot (which the next batch recycles),
    strides kept."""
    stream = WindowStream(spec, reader, start=start, global_batch=BATCH, direct=direct)
    it = iter(make_loader(stream, workers, kind=kind))
    out = [_owned(next(it)) if kind == "process" else next(it) for _ in range(STEPS)]
    del it
    return out


def _owned(batch: dict) -> dict:
    """The batch with each tensor copied into memory of its own, with the same shape, strides and bytes."""
    out = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            base = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)
            out[k] = base.copy_(v)
        else:
            out[k] = v
    return out


def _config(manifests: list[Path], backend: str = "webdataset", normalize: str = "auto") -> DataConfig:
    return DataConfig(manifests=[str(m) for m in manifests], backend=backend, t_in=4, t_out=1,
                      verify_checksums=False, normalize=normalize)


@pytest.mark.parametrize("workers,kind", [(0, "thread"), (2, "thread"), (1, "process"), (2, "process")])
@pytest.mark.parametrize("seed", [0, 7, 123])
@pytest.mark.parametrize("data", ["yx", "xy", "mixed"])
def test_read_batch_gives_the_plain_batches_bitwise(fno_train_shards: Path, canonical_shards: Path, data: str,
                                                    seed: int, workers: int, kind: str) -> None:
    manifests = {"yx": [fno_train_shards], "xy": [canonical_shards],
                 "mixed": [fno_train_shards, canonical_shards]}[data]
    spec, reader = prepare_stream(_config(manifests), seed=seed, verify=False)
    assert {d.model_layout for d in spec.datasets} == ({"yx", "xy"} if data == "mixed" else {data})
    assert any(s is not None for s in spec.norm.values()) == (data != "yx")  # canonical data is normalised
    for start in (0, 3 * BATCH + 1):
        fast = _batches(spec, reader, start, workers, direct=True, kind=kind)
        plain = _batches(spec, reader, start, 0, direct=False)
        if data == "mixed":  # both layouts met in one batch: a sample unlike the batch's first goes by copy
            assert any(len(set(b["dataset"].tolist())) == 2 for b in fast)
        for step, (a, b) in enumerate(zip(fast, plain)):
            _same_bits(a, b, f"{data} seed {seed} start {start} workers {workers} {kind} step {step}")


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_the_plain_path_through_workers_keeps_its_batches(canonical_shards: Path, kind: str) -> None:
    """direct=False (collate of make_sample, buffers of their own) through 2 workers of either kind: the batches
    of no workers, strides included (process workers send such a batch through their pipe)."""
    spec, reader = prepare_stream(_config([canonical_shards]), seed=4, verify=False)
    for step, (a, b) in enumerate(zip(_batches(spec, reader, 2, 2, direct=False, kind=kind),
                                      _batches(spec, reader, 2, 0, direct=False))):
        _same_bits(a, b, f"plain {kind} step {step}")


@pytest.mark.parametrize("normalize", ["none", "manifest"])
def test_read_batch_without_read_into_and_with_normalisation_in_place(fno_train_shards: Path,
                                                                      normalize: str) -> None:
    """Zarr (no `read_into`: read, then written into the slot) and the "yx" data normalised or not."""
    for backend in ("zarr", "webdataset"):
        spec, reader = prepare_stream(_config([fno_train_shards], backend, normalize), seed=3, verify=False)
        assert hasattr(reader, "read_into") == (backend == "webdataset")
        plain = _batches(spec, reader, 5, 0, False)
        for kind in ("thread", "process"):
            for a, b in zip(_batches(spec, reader, 5, 2, True, kind), plain):
                _same_bits(a, b, f"{backend} normalize {normalize} {kind}")


def test_read_batch_reads_each_window_once_into_the_batch_buffer(canonical_shards: Path) -> None:
    """A read_into reader is given the batch buffer's slots: the batch's storage is where the frames were read."""
    spec, reader = prepare_stream(_config([canonical_shards]), seed=0, verify=False)
    slots: list[int] = []
    inner = reader.read_into

    def spy(ref, t0, length, into, mask_into=None):
        fields, mask = inner(ref, t0, length, into, mask_into)
        slots.append(fields.ctypes.data)
        return fields, mask

    reader.read_into = spy  # type: ignore[method-assign]
    reader.read = None  # type: ignore[assignment]  # never called when read_into exists
    plans = EpochPlans(spec)
    picks = [(k, ref, p) for p in range(BATCH) for k, ref, _ in [plans.lookup(p)]]
    batch = read_batch(spec, reader, picks)
    base, step = batch["x"].data_ptr(), batch["x"].stride(0) * 4
    assert slots == [base + i * step for i in range(BATCH)]


def test_mask_slots_take_nonzero_as_true_like_astype() -> None:
    mask = np.array([[0, 1], [2, 255]], np.uint8)
    buffers = BatchBuffers(2, None)
    assert buffers.stored_window(0, (3, 1, 2, 2), "xy", "a") is not None
    np.copyto(buffers.model_mask(1, mask.shape, "a"), mask, casting="unsafe")
    assert buffers.model_masks is not None
    assert np.array_equal(buffers.model_masks[1].numpy(), mask.astype(bool))


def test_a_window_of_another_shape_in_one_batch_is_a_one_line_error() -> None:
    buffers = BatchBuffers(2, None)
    buffers.stored_window(0, (3, 4, 8, 8), "xy", "s0.tar: d:0")
    with pytest.raises(DataError, match=r"^s1.tar: d:1 window of shape \(3, 4, 8, 16\); the batch's first is "
                                        r"\(3, 4, 8, 8\)") as err:
        buffers.stored_window(1, (3, 4, 8, 16), "xy", "s1.tar: d:1")
    assert "\n" not in str(err.value)


def _shard_refs(shards: Path):
    from dpot_train.data.datasets import read_manifests
    from dpot_train.data.readers import WebDatasetReader

    ds = read_manifests([str(shards)])[0]
    return ds, WebDatasetReader().refs(ds, "train")


def test_windows_copied_from_the_shard_map_equal_read_windows(canonical_shards: Path) -> None:
    """The reader's mapped copy gives every window of every trajectory exactly as a read() of the file does."""
    from dpot_train.data.readers import WebDatasetReader, read_window

    ds, refs = _shard_refs(canonical_shards)
    reader = WebDatasetReader()
    for ref in refs:
        for t0 in (0, ds.frames - 5):
            fields, mask = reader.read(ref, t0, 5)
            assert reader._handles.mapped(ref.url) is not None  # the map was there to copy from
            with open(ref.url, "rb") as f:
                plain, plain_mask = read_window(f, ref, t0, 5)
            assert fields.tobytes() == plain.tobytes() and np.array_equal(mask, plain_mask)


def test_a_shard_cut_after_it_was_mapped_is_reported_not_read_past_its_end(canonical_shards: Path,
                                                                          tmp_path: Path) -> None:
    """Copying from a map past the end of a file cut since would kill the process (SIGBUS): the read checks the
    file's size and reports the short file as a read() does."""
    import dataclasses
    import mmap
    import shutil

    from dpot_train.data.readers import read_window

    _, refs = _shard_refs(canonical_shards)
    last = max(refs, key=lambda r: r.fields_offset)
    copy = tmp_path / "cut.tar"
    shutil.copyfile(last.url, copy)
    ref = dataclasses.replace(last, url=str(copy))
    with open(copy, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        fields, _ = read_window(f, ref, 0, 3, mapped=mapped)
        os.truncate(copy, ref.fields_offset + 512)  # the header stays, the frames go
        with pytest.raises(DataError, match=r"fields.npy ends early: read \d+ of \d+ bytes for frames \[0, 3\)"):
            read_window(f, ref, 0, 3, mapped=mapped)
        mapped.close()
    assert fields.shape[0] == 3


def test_evicted_and_closed_handles_unmap_their_shards(canonical_shards: Path, tmp_path: Path) -> None:
    import shutil

    from dpot_train.data.readers import _Handles

    _, refs = _shard_refs(canonical_shards)
    urls = []
    for i in range(3):
        urls.append(str(tmp_path / f"s{i}.tar"))
        shutil.copyfile(refs[0].url, urls[-1])
    handles = _Handles(size=2)
    maps = []
    for url in urls:
        handles.get(url)
        maps.append(handles.mapped(url))
    assert maps[0].closed and not maps[1].closed and not maps[2].closed  # s0 left the LRU with its file
    handles.close()
    assert all(m.closed for m in maps) and not handles.files


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked batches need CUDA")
def test_pinned_thread_batches_are_built_page_locked_and_equal_the_plain_ones(canonical_shards: Path) -> None:
    from dpot_train.data.prefetch import pin_batch

    spec, reader = prepare_stream(_config([canonical_shards]), seed=2, verify=False)
    stream = WindowStream(spec, reader, start=3, global_batch=BATCH)
    it = iter(make_loader(stream, 2, pin_memory=True, kind="thread"))
    pinned = [next(it) for _ in range(STEPS)]
    del it
    for step, (a, b) in enumerate(zip(pinned, _batches(spec, reader, 3, 0, direct=False))):
        assert a["x"].is_pinned() and a["mask"].is_pinned()
        assert pin_batch(a)["x"].data_ptr() == a["x"].data_ptr()  # pinning it again copies nothing
        _same_bits(a, b, f"pinned step {step}")


def test_only_shards_on_local_filesystems_are_mapped(canonical_shards: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A map's page fault that meets a network filesystem's I/O error is SIGBUS, not an OSError: shards there are
    read(), with the same windows."""
    from dpot_train.data import readers

    mounts = ("/dev/vda / ext4 rw 0 0\nserver:/export /data nfs4 rw 0 0\n/dev/vdb /data/local xfs rw 0 0\n"
              "/dev/vdc /mnt/my\\040disk ext4 rw 0 0\nlustre@o2ib:/fs /lus lustre rw 0 0\n")
    assert readers.filesystem_type("/data/shards/a.tar", mounts) == "nfs4"
    assert readers.filesystem_type("/data/local/a.tar", mounts) == "xfs"  # the longest mount point above it
    assert readers.filesystem_type("/datax/a.tar", mounts) == "ext4"
    assert readers.filesystem_type("/mnt/my disk/a.tar", mounts) == "ext4"
    assert readers.filesystem_type("/lus/a.tar", mounts) == "lustre"
    assert readers.filesystem_type("/a.tar", "") == ""
    _, refs = _shard_refs(canonical_shards)
    ref = refs[0]
    mapped = readers.WebDatasetReader()
    fields, _ = mapped.read(ref, 1, 4)
    assert readers.on_local_fs(ref.url) and mapped._handles.mapped(ref.url) is not None  # pytest's tmp: local
    monkeypatch.setattr(readers, "on_local_fs", lambda path: False)
    unmapped = readers.WebDatasetReader()
    again, _ = unmapped.read(ref, 1, 4)
    assert unmapped._handles.mapped(ref.url) is None and again.tobytes() == fields.tobytes()


def _tar_of(tmp_path: Path, fields: np.ndarray, mask: np.ndarray, name: str = "t.tar"):
    """A one-trajectory shard of `fields` and `mask` (np.save'd members) and its TrajRef."""
    import io
    import tarfile

    from dpot_train.data.readers import TrajRef

    path = tmp_path / name
    with tarfile.open(path, "w") as tar:
        for member, array in (("s0000000.fields.npy", fields), ("s0000000.mask.npy", mask)):
            buf = io.BytesIO()
            np.save(buf, array)
            info = tarfile.TarInfo(member)
            info.size = len(buf.getvalue())
            tar.addfile(info, io.BytesIO(buf.getvalue()))
    with tarfile.open(path) as tar:
        f, m = tar.getmember("s0000000.fields.npy"), tar.getmember("s0000000.mask.npy")
        return TrajRef("d", 0, str(path), f.offset_data, m.offset_data, m.size, -1)


@pytest.mark.parametrize("mask", [np.array([[0, 1, 2], [3, 0, 255]], np.uint8), np.array([[0, 1, 1], [1, 0, 0]], bool),
                                  np.array([[0, 256, -1], [1, 0, 512]], np.int16),
                                  np.asfortranarray(np.array([[0, 1, 0], [7, 0, 1]], np.uint8))])
def test_mapped_reads_give_the_read_path_windows_and_masks(tmp_path: Path, mask: np.ndarray) -> None:
    """The mapped fast path (headers parsed once, the mask copied straight into a bool slot) gives what the read()
    path gives: the same frames, the same uint8 mask (order and values, astype's wrap of other dtypes), and in a
    bool slot what np.copyto of that mask gives."""
    from dpot_train.data.readers import WebDatasetReader, read_window

    fields = np.random.default_rng(3).standard_normal((6, 2, 2, 3)).astype(np.float32)
    ref = _tar_of(tmp_path, fields, mask)
    with open(ref.url, "rb") as f:
        want, want_mask = read_window(f, ref, 1, 4)
    reader = WebDatasetReader()
    for _ in range(2):  # parsed, then from the reader's member cache
        got, got_mask = reader.read(ref, 1, 4)
        assert reader._handles.mapped(ref.url) is not None
        assert got.tobytes() == want.tobytes() and got_mask.dtype == np.uint8
        assert np.array_equal(got_mask, want_mask) and got_mask.flags.f_contiguous == want_mask.flags.f_contiguous
        slot, bool_slot = np.empty((4, 2, 2, 3), np.float32), np.empty((2, 3), bool)
        reader.read_into(ref, 1, 4, lambda shape: slot, lambda shape: bool_slot)
        expected = np.empty((2, 3), bool)
        np.copyto(expected, want_mask, casting="unsafe")
        assert slot.tobytes() == want.tobytes() and np.array_equal(bool_slot, expected)
    assert len(reader._members) == 1


CUT = """
import os, shutil, sys
import numpy as np
from dpot_train.data.datasets import DataError
from dpot_train.data.readers import TrajRef, WebDatasetReader
src, dst, fields, mask, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
shutil.copyfile(src, dst)
ref = TrajRef("d", 0, dst, fields, mask, size, -1)
reader = WebDatasetReader()
reader.read(ref, 0, 3)  # mapped, headers parsed and kept
for cut, what in ((mask + 8, "mask"), (fields + 512, "window")):
    os.truncate(dst, cut)
    try:
        reader.read(ref, 0, 3)
        print(what, "read")
    except DataError as e:
        print(what, "DataError", str(e).split(": ", 1)[1])
"""


def test_a_shard_cut_under_the_member_cache_is_reported_not_read_past_its_end(canonical_shards: Path,
                                                                              tmp_path: Path) -> None:
    """After its headers were parsed from the map, a shard cut in its mask or its frames is read through read():
    a one-line DataError, never a SIGBUS (checked in a child process, which a SIGBUS would kill)."""
    import subprocess
    import sys

    _, refs = _shard_refs(canonical_shards)
    last = max(refs, key=lambda r: r.fields_offset)
    assert last.mask_offset > last.fields_offset  # the mask member follows the fields
    r = subprocess.run([sys.executable, "-c", CUT, last.url, str(tmp_path / "cut.tar"), str(last.fields_offset),
                        str(last.mask_offset), str(last.mask_size)], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("mask DataError ") and lines[1].startswith("window DataError ")
    assert "fields.npy ends early" in lines[1]


def test_a_header_changed_under_the_member_cache_is_read_again(tmp_path: Path) -> None:
    from dpot_train.data.readers import WebDatasetReader

    ref = _tar_of(tmp_path, np.zeros((4, 1, 2, 2), np.float32), np.ones((2, 2), np.uint8))
    reader = WebDatasetReader()
    reader.read(ref, 0, 2)
    with open(ref.url, "r+b") as f:  # the same header length, another dtype
        f.seek(ref.fields_offset)
        header = f.read(128)
        f.seek(ref.fields_offset)
        f.write(header.replace(b"'<f4'", b"'<f8'"))
    with pytest.raises(DataError, match=r"fields.npy must be float32 C-order"):
        reader.read(ref, 0, 2)
