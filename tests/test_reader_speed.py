"""How the HDF5 readers read (no timings here: docs/sources.md and the commit log give the figures).

Each field value is copied from the file once per pass (h5py `read_direct` into a reused buffer, then once into
the output block); `check_finite="raise"` makes one pass, the default two (the scan when opened, then the ingest).
The block reads give exactly the values of a plain numpy read for every storage the published files use or might
use: contiguous or chunked (chunks across trajectories, blocks across chunks), compressed, float64, big-endian."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from dpot_data.ingest import IngestOptions, ingest_files
from dpot_data.sources import pdearena, pdebench
from dpot_data.synth import pdearena as synth_arena
from dpot_data.synth import pdebench as synth_bench

FIELDS = ("Vx", "Vy", "density", "pressure")


def _restore(src: Path, dst: Path, **create) -> Path:
    """A copy of a compressible-NS file with its fields stored as `create` says (chunks, compression, dtype)."""
    with h5py.File(src) as f, h5py.File(dst, "w") as g:
        for k in f:
            if k in FIELDS or k == "Vz":
                g.create_dataset(k, data=f[k][()].astype(create.get("dtype", f[k].dtype)),
                                 **{a: v for a, v in create.items() if a != "dtype"})
            else:
                f.copy(k, g)
        g.attrs.update(f.attrs)
    return dst


def _expected_cns(path: Path) -> np.ndarray:
    with h5py.File(path) as f:
        names = [k for k in ("Vx", "Vy", "Vz", "density", "pressure") if k in f]
        with np.errstate(over="ignore"):
            return np.stack([np.transpose(f[k][()], (0, 1, *range(f[k].ndim - 1, 1, -1))).astype(np.float32)
                             for k in names], axis=2)


@pytest.fixture(scope="module")
def cns(tmp_path_factory) -> Path:
    return synth_bench.write_cfd(tmp_path_factory.mktemp("cns"), n=5, frames=4, res=8)


@pytest.mark.parametrize("storage", [
    {},
    {"chunks": (2, 4, 8, 8), "compression": "gzip"},  # a chunk holds two trajectories; blocks of 3 cut chunks
    {"chunks": (1, 2, 4, 8), "compression": "lzf"},
    {"dtype": np.float64},
    {"dtype": ">f4"},
    {"dtype": np.float16},
])
def test_cns_block_reads_equal_a_plain_read(tmp_path, cns, storage):
    path = _restore(cns, tmp_path / cns.name, **storage)
    for check in (True, "raise", False):
        values = pdebench.read([path], block=3, check_finite=check, convention="canonical").data["fields"].values
        assert values.dtype == np.float32
        np.testing.assert_array_equal(values, _expected_cns(path))


def test_3d_cns_block_reads_equal_a_plain_read(tmp_path):
    path = synth_bench.write_cfd(tmp_path, dims=3, n=3, frames=2, res=4)
    values = pdebench.read([path], block=2).data["fields"].values
    np.testing.assert_array_equal(values, _expected_cns(path))


def test_values_beyond_float32_become_inf_when_kept_and_are_left_out_by_default(tmp_path, cns):
    path = _restore(cns, tmp_path / cns.name, dtype=np.float64)
    with h5py.File(path, "a") as f:
        f["pressure"][3, 1, 2, 2] = 1e300
    kept = pdebench.read([path], check_finite=False, convention="canonical").data["fields"].values
    assert np.isposinf(kept[3, 1, 3, 2, 2]) and np.isfinite(np.delete(kept, 3, axis=0)).all()
    result = pdebench.read([path], block=2, convention="canonical")
    assert [w for w, _ in result.skipped] == [f"{path.name}#3"]
    np.testing.assert_array_equal(result.data["fields"].values, np.delete(_expected_cns(path), 3, axis=0))


def test_blocks_around_a_left_out_trajectory_hold_the_right_values(tmp_path, cns):
    path = _restore(cns, tmp_path / cns.name)
    with h5py.File(path, "a") as f:
        f["Vy"][1, 0, 0, 0] = np.inf
    result = pdebench.read([path], block=4, convention="canonical")
    assert list(result.data["sample"].values) == [f"{path.name}#{i}" for i in (0, 2, 3, 4)]
    np.testing.assert_array_equal(result.data["fields"].values, _expected_cns(path)[[0, 2, 3, 4]])


@pytest.mark.parametrize("dtype,storage", [(np.float32, {"chunks": (2, 4, 4, 1), "compression": "lzf"}),
                                           (np.float64, {})])
def test_grouped_block_reads_equal_a_plain_read(tmp_path, dtype, storage):
    src = synth_bench.write_diff_react(tmp_path / "src", n=3, frames=4, res=8)
    path = tmp_path / src.name
    with h5py.File(src) as f, h5py.File(path, "w") as g:
        for name in f:
            f.copy(name, g)
            del g[f"{name}/data"]
            g[name].create_dataset("data", data=f[f"{name}/data"][()].astype(dtype), **storage)
    values = pdebench.read([path], block=2).data["fields"].values
    with h5py.File(path) as f:
        expected = np.stack([np.moveaxis(f[f"{i:04d}/data"][()], -1, 1) for i in range(3)]).astype(np.float32)
    np.testing.assert_array_equal(values, expected)


@pytest.mark.parametrize("storage", [{}, {"chunks": (3, 2, 8, 8), "compression": "gzip"}])
def test_pdearena_block_reads_equal_a_plain_read(tmp_path, storage):
    src = synth_arena.write_ns(tmp_path / "src", n=5, frames=3, res=8)
    path = tmp_path / src.name
    with h5py.File(src) as f, h5py.File(path, "w") as g:
        f.copy("train", g)
        for k in ("u", "vx", "vy"):
            del g[f"train/{k}"]
            g["train"].create_dataset(k, data=f[f"train/{k}"][()], **storage)
    values = pdearena.read([path], block=2).data["fields"].values
    with h5py.File(path) as f:
        expected = np.stack([np.swapaxes(f[f"train/{k}"][()], 2, 3) for k in ("u", "vx", "vy")], axis=2)
    np.testing.assert_array_equal(values, expected.astype(np.float32))


def _bytes_read() -> int:
    """Bytes this process has read through read(2)/pread(2) so far, page-cache hits included (Linux)."""
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
@pytest.mark.parametrize("check,passes", [("raise", 1), (True, 2)])
def test_field_data_is_read_once_per_pass(tmp_path, monkeypatch, check, passes):
    """"raise" reads every field byte from the file once, the default twice (the scan when opened, then the
    ingest); ingest itself reads the file once more, to hash it. Nothing reads whole fields through h5py slicing."""
    path = synth_bench.write_cfd(tmp_path / "raw", n=8, frames=5, res=64)
    getitem = h5py.Dataset.__getitem__

    def no_field_slicing(self, args, new_dtype=None):
        assert self.name.lstrip("/") not in FIELDS, f"{self.name} read by slicing"
        return getitem(self, args, new_dtype)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", no_field_slicing)
    with h5py.File(path) as f:
        fields = sum(f[k].nbytes for k in FIELDS)
    opts = IngestOptions(resolution=None, formats=("zarr",), stats=False, block=3)
    ingest_files("pdebench", [path], tmp_path / "warm", opts, check_finite=check)  # modules imported on first use
    before = _bytes_read()
    ingest_files("pdebench", [path], tmp_path / "out", opts, check_finite=check)
    extra = _bytes_read() - before - passes * fields - path.stat().st_size
    assert 0 <= extra < 0.1 * fields, (extra, fields)


# ------------------------------------------------------------------------------------------------ plain-byte reads

@pytest.mark.parametrize("storage,plain", [
    ({}, True),
    ({"dtype": np.float64}, True),  # read as stored, then cast
    ({"dtype": ">f4"}, False),  # not native order: HDF5 converts
    ({"dtype": np.float16}, False),  # narrower than float32: HDF5 converts
    ({"chunks": (1, 4, 8, 8)}, False),
    ({"compression": "gzip"}, False),
])
def test_only_plain_contiguous_native_data_is_read_as_bytes(tmp_path, cns, storage, plain):
    """`raw_offset` takes the pread path (no GIL held by h5py while the disk reads) only where the stored bytes are
    the values themselves; the block reads give the plain read's values either way (test above)."""
    from dpot_data.sources._blocks import raw_offset

    path = _restore(cns, tmp_path / cns.name, **storage)
    with h5py.File(path) as f:
        assert (raw_offset(f["Vx"]) is not None) is plain


def test_plain_byte_reads_find_the_data_behind_a_user_block(tmp_path, cns):
    """MAT v7.3 files are HDF5 behind a 512-byte user block: HDF5's data address counts it, and so does the read."""
    from dpot_data.sources._blocks import h5_rows, raw_offset

    path = tmp_path / "ub.h5"
    with h5py.File(cns) as f, h5py.File(path, "w", userblock_size=512) as g:
        g.create_dataset("Vx", data=f["Vx"][()])
        expected = f["Vx"][()]
    with open(path, "r+b") as fh:
        fh.write(b"MATLAB 7.3 MAT-file".ljust(128, b" "))
    with h5py.File(path) as f:
        assert raw_offset(f["Vx"]) is not None
        rows = {s0: raw.copy() for s0, raw in h5_rows(f["Vx"], 1, 4)}
    assert sorted(rows) == [1, 2, 3]
    np.testing.assert_array_equal(np.concatenate([rows[i] for i in (1, 2, 3)]), expected[1:4])


def test_a_file_cut_short_inside_plain_data_is_one_line_naming_the_field(tmp_path, cns):
    from dpot_data.errors import InputError
    from dpot_data.sources._blocks import checked_rows

    path = _restore(cns, tmp_path / cns.name)
    with h5py.File(path) as f:
        end = f["pressure"].id.get_offset() + 2 * f["pressure"][0].nbytes + 100  # inside trajectory 2
    with h5py.File(path) as f:
        os.truncate(path, end)  # the open file's metadata stays readable; its data is gone past `end`
        with pytest.raises(InputError, match=r"pressure: trajectory 0\.\.4 cannot be read .*short read"):
            list(checked_rows(f["pressure"], 0, 5, path, "pressure", check=True))
