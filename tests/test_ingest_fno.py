"""`dpot-data ingest fno`: reading both MAT containers, resampling, Zarr + WebDataset + manifest, bad input."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import webdataset as wds
import xarray as xr
import zarr
from typer.testing import CliRunner

from dpot_data import manifest_io as mf
from dpot_data.cli import app
from dpot_data.errors import InputError
from dpot_data.ingest import IngestOptions, assign_splits, ingest, ingest_files, run_ingest
from dpot_data.sources import fno
from dpot_format.io import sha256_array, sha256_file
from dpot_format.manifest import validation_errors
from dpot_format.validate import validate_output

FIXTURE_SHA = "c42052445b817221041697bb77b1bcedc0a037efbd79b03cc287b4ee6c40eb34"
NAME = "fno-ns-v1e-3"


def _opts(**kw) -> IngestOptions:
    return IngestOptions(**{"stats": False, "convention": "canonical", **kw})


def _group(out: Path) -> zarr.Group:
    return zarr.open_group(str(out / "data.zarr"), mode="r", path=NAME)


def _raw(path: Path) -> tuple[np.ndarray, np.ndarray]:
    m = scipy.io.loadmat(path)
    return m["a"], m["u"]


@pytest.fixture(scope="module")
def native(fno_pair, tmp_path_factory) -> dict:
    """The v5 and the v7.3 file ingested at the native 64x64 grid."""
    base = tmp_path_factory.mktemp("ingest_native")
    out = {}
    for kind in ("v5", "v73"):
        out[kind] = base / kind
        ingest_files("fno", [fno_pair[kind]], out[kind], _opts(resolution=64, shard_size=1 << 20))
    return out


@pytest.fixture(scope="module")
def fourier(fno_pair, tmp_path_factory) -> dict:
    """Both files ingested at 128x128 (auto → Fourier)."""
    base = tmp_path_factory.mktemp("ingest_128")
    out = {}
    for kind in ("v5", "v73"):
        out[kind] = base / kind
        ingest_files("fno", [fno_pair[kind]], out[kind], IngestOptions(convention="canonical", split=(0.5, 0.25), seed=3))
    return out


def test_real_fixture_ingests_with_frame0_equal_to_a(raw_fixtures, tmp_path):
    path = raw_fixtures / "NavierStokes_V1e-3_N6_T20.mat"
    manifest = ingest_files("fno", [path], tmp_path / "out", _opts(resolution=64))
    entry = manifest["datasets"][0]
    assert entry["name"] == NAME and entry["source"] == "fno" and entry["boundary"] == "periodic"
    assert entry["parameters"] == {"viscosity": 1e-3}
    assert entry["frames"] == 21 and entry["dt"] == 1.0 and entry["trajectories"] == 6
    assert entry["inputs"] == [{"path": str(path.resolve()), "sha256": FIXTURE_SHA, "bytes": 2064776}]
    assert entry["provenance"]["files"][path.name]["container"] == "mat-v5"
    assert entry["provenance"]["files"][path.name]["dtype"] == "float32"
    a, u = _raw(path)
    fields = _group(tmp_path / "out")["fields"][:]
    ids = _group(tmp_path / "out")["sample"][:]
    assert list(ids) == [f"{path.name}#{i}" for i in range(6)]
    for n in range(6):  # stored (y, x) frames are the generator's (x, y) arrays transposed
        np.testing.assert_array_equal(fields[n, 0, 0], a[n].T)
        np.testing.assert_array_equal(fields[n, 1:, 0], np.transpose(u[n], (2, 1, 0)))
    assert (fields[:, :, 1:] == 1.0).all()


def test_v5_and_v73_ingest_to_byte_identical_fields(native, fourier):
    for outs in (native, fourier):
        g5, g73 = _group(outs["v5"]), _group(outs["v73"])
        assert g5["fields"][:].tobytes() == g73["fields"][:].tobytes()
        m5, m73 = (mf.read(outs[k])["datasets"][0] for k in ("v5", "v73"))
        assert m5["zarr"]["arrays"] == m73["zarr"]["arrays"]
        # shards differ only in meta.json (the ids name the raw file); the arrays in them are the same bytes
        assert [s["samples"] for s in m5["shards"]] == [s["samples"] for s in m73["shards"]]
        for s5, s73 in zip(m5["shards"], m73["shards"]):
            assert _npy_members(outs["v5"] / s5["path"]) == _npy_members(outs["v73"] / s73["path"])
        assert m5["inputs"][0]["sha256"] != m73["inputs"][0]["sha256"]
        assert m73["provenance"]["files"][Path(m73["inputs"][0]["path"]).name]["container"] == "mat-v7.3"


def _npy_members(path: Path) -> dict[str, bytes]:
    import tarfile

    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".npy")}


def test_native_resolution_stores_raw_values_exactly(native, fno_pair):
    a, u = _raw(fno_pair["v5"])
    entry = mf.read(native["v5"])["datasets"][0]
    assert entry["resample"] == {"fields": "none", "mask": "none", "antialias": False}
    assert entry["grid"] == {"dims": ["y", "x"], "shape": [64, 64], "native_shape": [64, 64]}
    fields = _group(native["v5"])["fields"][:]
    np.testing.assert_array_equal(fields[:, 0, 0], np.transpose(a, (0, 2, 1)))
    np.testing.assert_array_equal(fields[:, 1:, 0], np.transpose(u, (0, 3, 2, 1)))


def test_fourier_upsampling_truncates_back_to_the_raw_field(fourier, fno_pair):
    a, u = _raw(fno_pair["v5"])
    entry = mf.read(fourier["v5"])["datasets"][0]
    assert entry["resample"] == {"fields": "fourier", "mask": "nearest", "antialias": False}
    assert entry["grid"]["shape"] == [128, 128] and entry["grid"]["native_shape"] == [64, 64]
    fields = _group(fourier["v5"])["fields"][:, :, 0].astype(np.float64)  # (sample, time, 128, 128)
    raw = np.concatenate([np.transpose(a, (0, 2, 1))[:, None], np.transpose(u, (0, 3, 2, 1))], axis=1)
    spec = np.fft.fft2(fields)
    keep = np.r_[0:32, 96:128]
    nyq = spec[..., 32, :] + spec[..., 96, :]  # fold +-N/2 of the 128 grid into the 64 grid's Nyquist row/column
    small = spec[..., keep, :]
    small[..., 32, :] = nyq
    small2 = small[..., keep]
    small2[..., 32] = small[..., 32] + small[..., 96]
    back = np.fft.ifft2(small2).real / 4.0
    rel = np.linalg.norm(back - raw) / np.linalg.norm(raw)
    assert rel < 1e-5, rel
    mask = _group(fourier["v5"])["mask"][:]
    assert mask.shape == (4, 128, 128) and mask.dtype == np.uint8 and (mask == 1).all()


def test_manifest_validates_and_hashes_match_the_files(fourier):
    out = fourier["v5"]
    manifest = mf.read(out)  # validated against the packaged schema
    assert not validation_errors(manifest)
    entry = manifest["datasets"][0]
    assert entry["channels"] == ["vorticity", "pad1", "pad2", "pad3"]
    assert entry["channel_valid"] == [True, False, False, False] and entry["fill_value"] == 1.0
    assert entry["splits"]["counts"] == {"train": 2, "valid": 1, "test": 1} and entry["splits"]["seed"] == 3
    for shard in entry["shards"]:
        assert sha256_file(out / shard["path"]) == (shard["sha256"], shard["bytes"])
        assert (out / shard["path"]).stat().st_size == shard["bytes"]
    group = _group(out)
    for name, digest in entry["zarr"]["arrays"].items():
        assert sha256_array(group[name]) == digest
    assert sha256_array(group["fields"]) == sha256_array(group["fields"][:])  # independent of chunking/codec
    assert validate_output(str(out)) == []
    assert entry["stats"]["channels"] == ["vorticity"] and entry["stats"]["trajectories"] == 2
    assert not list(out.rglob("*.tmp")) and not list(out.glob(".staging-*"))


def test_zarr_opens_with_xarray_with_cf_attributes(fourier):
    ds = xr.open_zarr(fourier["v5"] / "data.zarr", group=NAME)
    assert ds["fields"].dims == ("sample", "time", "channel", "y", "x")
    assert ds["fields"].shape == (4, 5, 4, 128, 128) and ds["fields"].dtype == np.float32
    assert ds["mask"].dims == ("sample", "y", "x") and ds["mask"].dtype == np.uint8
    assert list(ds["channel"].values) == ["vorticity", "pad1", "pad2", "pad3"]
    assert list(ds["channel_valid"].values) == [True, False, False, False]
    assert set(ds["split"].values) == {"train", "valid", "test"}
    assert ds["fields"].encoding["chunks"] == (1, 5, 4, 128, 128)
    for key in ("title", "source", "history"):
        assert ds.attrs[key]
    assert "NavierStokes_V1e-3_N4_T4.mat" in ds.attrs["source"]
    for var in ("fields", "mask", "channel_valid", "sample", "split", "time", "x", "y"):
        assert ds[var].attrs["long_name"]
    np.testing.assert_allclose(ds["x"].values, np.arange(128) / 128)
    np.testing.assert_allclose(ds["time"].values, [0, 1, 2, 3, 4])


def test_webdataset_shards_hold_one_trajectory_per_sample(fourier):
    out = fourier["v5"]
    entry = mf.read(out)["datasets"][0]
    group = _group(out)
    fields, splits = group["fields"][:], group["split"][:]
    seen = []
    for shard in entry["shards"]:
        assert shard["path"].startswith(f"shards/{NAME}/{shard['split']}-")
        samples = list(wds.WebDataset(str(out / shard["path"]), shardshuffle=False))
        assert len(samples) == shard["samples"]
        for s in samples:
            meta = json.loads(s["meta.json"])
            index = meta["index"]
            assert s["__key__"] == f"s{index:07d}" and meta["split"] == shard["split"] == splits[index]
            arr = np.load(io.BytesIO(s["fields.npy"]), allow_pickle=False)
            assert arr.dtype == np.float32 and arr.shape == (5, 4, 128, 128)
            np.testing.assert_array_equal(arr, fields[index])
            mask = np.load(io.BytesIO(s["mask.npy"]), allow_pickle=False)
            assert mask.dtype == np.uint8 and mask.shape == (128, 128)
            assert meta["id"] == f"NavierStokes_V1e-3_N4_T4.mat#{index}" and meta["dataset"] == NAME
            assert meta["channels"][0] == "vorticity" and meta["channel_valid"] == [True, False, False, False]
            assert meta["frames"] == 5 and meta["params"] == {}
            seen.append(index)
    assert sorted(seen) == [0, 1, 2, 3]


def test_tar_members_are_deterministic(native):
    import tarfile

    entry = mf.read(native["v5"])["datasets"][0]
    with tarfile.open(native["v5"] / entry["shards"][0]["path"]) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and names[0].endswith(".fields.npy")
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (0, 0, 0, "", "", 0o644)
        assert m.isfile() and "/" not in m.name and ".." not in m.name


def test_reingest_gives_identical_bytes_and_small_shards_roll_over(native, fno_pair, tmp_path):
    again = ingest_files("fno", [fno_pair["v5"]], tmp_path / "again", _opts(resolution=64, shard_size=1 << 20))
    first = mf.read(native["v5"])
    a, b = first["datasets"][0], again["datasets"][0]
    assert [(s["path"], s["sha256"]) for s in a["shards"]] == [(s["path"], s["sha256"]) for s in b["shards"]]
    assert a["zarr"]["arrays"] == b["zarr"]["arrays"]
    # each 64x64x5x4 trajectory is ~330 kB: a 1 MiB target gives at most 3 per shard
    assert all(s["samples"] <= 3 for s in a["shards"]) and sum(s["samples"] for s in a["shards"]) == 4


def test_split_is_seeded_by_trajectory_id():
    ids = [f"f.mat#{i}" for i in range(100)]
    s1 = assign_splits(ids, (0.8, 0.1), 0)
    assert (s1 == "train").sum() == 80 and (s1 == "valid").sum() == 10 and (s1 == "test").sum() == 10
    np.testing.assert_array_equal(s1, assign_splits(ids, (0.8, 0.1), 0))
    assert (s1 != assign_splits(ids, (0.8, 0.1), 1)).any()
    # the assignment follows the ids, not their order
    rev = assign_splits(ids[::-1], (0.8, 0.1), 0)
    np.testing.assert_array_equal(rev[::-1], s1)
    assert list(assign_splits(ids[:6], (0.9,), 0)).count("train") == 5


def test_existing_output_is_left_alone_unless_overwrite(native, fno_pair, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(native["v5"], out)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    outcome = run_ingest("fno", [fno_pair["v5"]], out, _opts(resolution=64))  # the same ingest: kept
    assert not outcome.written and "left alone" in outcome.notes[0]
    assert outcome.manifest["datasets"][0]["grid"]["shape"] == [64, 64]
    with pytest.raises(InputError, match="on a 64x64 grid, not the 32x32 that --resolution 32 asks for"):
        run_ingest("fno", [fno_pair["v5"]], out, _opts(resolution=32))  # another ingest: refused, not "kept"
    assert before == {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    outcome = run_ingest("fno", [fno_pair["v5"]], out, _opts(resolution=32, overwrite=True))
    assert outcome.written and mf.read(out)["datasets"][0]["grid"]["shape"] == [32, 32]
    # the replacement moved in beside the old output, which went once the new manifest was in place
    assert mf.read(out)["datasets"][0]["zarr"]["path"] == "data.1.zarr" and not (out / "data.zarr").exists()
    assert zarr.open_group(str(out / "data.1.zarr"), mode="r", path=NAME)["fields"].shape == (4, 5, 4, 32, 32)


def _with_hook(result, hook):
    """Route every computed fields chunk of a reader's result through hook(chunk index)."""
    def fn(block, block_info=None):
        if block_info:
            hook(block_info[0]["chunk-location"][0])
        return block

    result.data["fields"] = (result.data["fields"].dims,
                             result.data["fields"].data.map_blocks(fn, dtype=np.float32))
    return result


def test_interrupted_ingest_resumes_to_the_same_bytes(fno_pair, tmp_path):
    # one trajectory per shard; a shard is complete once the next trajectory of its split arrives
    opts = IngestOptions(convention="canonical", resolution=64, workers=1, shard_size=1, split=(1.0,), command="test")
    reference = ingest(fno.read(convention="canonical", paths=[fno_pair["v5"]], block=1), tmp_path / "ref", opts).manifest

    def explode(chunk):
        if chunk == 2:
            raise KeyboardInterrupt("interrupted mid-ingest")  # resumable; an error of the data is not

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt, match="interrupted mid-ingest"):
        ingest(_with_hook(fno.read(convention="canonical", paths=[fno_pair["v5"]], block=1), explode), out, opts)
    # nothing under a final name: no manifest, no data.zarr, no shards; only the hidden staging folder
    assert [p.name for p in out.iterdir()] == [".staging-fno-ns-v1e-3"]

    computed = []
    outcome = ingest(_with_hook(fno.read(convention="canonical", paths=[fno_pair["v5"]], block=1), computed.append), out, opts)
    # blocks 0 and 1 were journalled (2 and 3 failed together in one window); trajectory 0's shard is complete
    assert outcome.written
    assert "resumed an interrupted ingest at trajectory 1 (block 1); kept 1 completed shard(s)" in outcome.notes[0]
    assert sorted(computed) == [1, 2, 3]  # block 0 was not read again
    got, ref = outcome.manifest["datasets"][0], reference["datasets"][0]
    assert [(s["path"], s["sha256"]) for s in got["shards"]] == [(s["path"], s["sha256"]) for s in ref["shards"]]
    assert got["zarr"] == ref["zarr"] and got["stats"] == ref["stats"] and len(got["shards"]) == 4
    assert sorted(p.name for p in out.iterdir()) == ["data.zarr", "manifest.json", "shards"]


# ------------------------------------------------------------------------------------------------ CLI and bad input

def _cli(*args: str):
    return CliRunner().invoke(app, list(map(str, args)))


def test_cli_ingest_and_synth(tmp_path):
    result = _cli("synth", "fno", "--out", tmp_path / "raw", "--n", 2, "--frames", 2, "--resolution", 32)
    assert result.exit_code == 0, result.output
    assert "NavierStokes_V1e-3_N2_T2.mat" in result.output and "ns_V1e-3_N2_T2.mat" in result.output
    result = _cli("ingest", "fno", tmp_path / "raw" / "ns_V1e-3_N2_T2.mat", "--out", tmp_path / "out",
                  "--resolution", 48, "--resample", "bicubic", "--channels", 2, "--fill", 0, "--split", "0.5",
                  "--name", "tiny", "--format", "wds", "--no-progress", "--no-stats")
    assert result.exit_code == 0, result.output
    assert "tiny, 2 trajectories (train 1, test 1)" in result.output
    entry = mf.read(tmp_path / "out")["datasets"][0]
    assert entry["resample"] == {"fields": "bicubic", "mask": "nearest", "antialias": False}
    assert entry["zarr"] is None and not (tmp_path / "out" / "data.zarr").exists()
    assert entry["channels"] == ["vorticity", "pad1"] and entry["fill_value"] == 0.0
    assert entry["grid"]["shape"] == [48, 48] and len(entry["shards"]) == 2
    result = _cli("ingest", "fno", tmp_path / "raw" / "ns_V1e-3_N2_T2.mat", "--out", tmp_path / "out")
    assert result.exit_code == 0 and "left alone" in result.output


def _bad_files(folder: Path, fno_pair: dict) -> dict[str, tuple[Path, str]]:
    """Each kind of bad input and a phrase its one-line error must contain."""
    folder.mkdir()
    a, u = _raw(fno_pair["v5"])
    text = folder / "NavierStokes_V1e-3_N4_T4.txt"
    text.write_text("not a mat file\n")
    garbage = folder / "NavierStokes_V1e-3_garbage.mat"
    garbage.write_bytes(b"\x00" * 4096)
    no_u = folder / "NavierStokes_V1e-3_noU.mat"
    scipy.io.savemat(no_u, {"a": a})
    cut_v5 = folder / "NavierStokes_V1e-3_cut.mat"
    cut_v5.write_bytes(fno_pair["v5"].read_bytes()[: fno_pair["v5"].stat().st_size // 2])
    cut_v73 = folder / "ns_V1e-3_cut.mat"
    cut_v73.write_bytes(fno_pair["v73"].read_bytes()[: fno_pair["v73"].stat().st_size // 2])
    u3 = folder / "NavierStokes_V1e-3_u3.mat"
    scipy.io.savemat(u3, {"a": a, "u": u[..., 0]})
    grid = folder / "NavierStokes_V1e-3_grid.mat"
    scipy.io.savemat(grid, {"a": a[:, :32, :32], "u": u})
    return {
        "not-mat": (text, "expected a MATLAB .mat file"),
        "garbage": (garbage, "found no MAT v5/v7.3 header"),
        "no-u": (no_u, "expected variable 'u' (N, x, y, T) in the .mat file; found a"),
        "truncated-v5": (cut_v5, "truncated"),
        "truncated-v73": (cut_v73, "truncated or corrupt"),
        "u-not-4d": (u3, "expected 'u' to be 4-D (N, x, y, T), found shape (4, 64, 64)"),
        "grid": (grid, "expected 'a' of shape (N, x, y) = (4, 64, 64) to match 'u' (4, 64, 64, 4), found (4, 32, 32)"),
    }


def test_bad_inputs_exit_2_with_one_line_and_touch_nothing(fno_pair, native, tmp_path):
    bad = _bad_files(tmp_path / "bad", fno_pair)
    done = tmp_path / "done"
    shutil.copytree(native["v5"], done)
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in done.rglob("*") if p.is_file()}
    for kind, (path, phrase) in bad.items():
        fresh = tmp_path / f"out-{kind}"
        result = CliRunner().invoke(app, ["ingest", "fno", str(fno_pair["v5"]), str(path), "--out", str(fresh)])
        assert result.exit_code == 2, (kind, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (kind, result.stderr)
        assert lines[0].startswith(f"error: {path}: ") and phrase in lines[0], (kind, lines[0])
        assert not (fresh / "manifest.json").exists()
        assert not fresh.exists() or not any(fresh.iterdir())
        # an earlier complete ingest stays exactly as it was, even with --overwrite
        result = CliRunner().invoke(app, ["ingest", "fno", str(path), "--out", str(done), "--overwrite"])
        assert result.exit_code == 2, (kind, result.output)
    assert before == {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in done.rglob("*") if p.is_file()}


def test_files_with_different_grids_or_viscosities_are_refused(fno_pair, tmp_path):
    other = tmp_path / "NavierStokes_V1e-4_N4_T4.mat"
    shutil.copy(fno_pair["v5"], other)
    result = _cli("ingest", "fno", fno_pair["v5"], other, "--out", tmp_path / "out")
    assert result.exit_code == 2 and f"{other}: expected viscosity 1e-3" in result.stderr
    anonymous = tmp_path / "vorticity.mat"
    shutil.copy(fno_pair["v5"], anonymous)
    result = _cli("ingest", "fno", anonymous, "--out", tmp_path / "out2")
    assert result.exit_code == 2 and "expected the viscosity in the file name" in result.stderr


def test_compressed_v5_reads_like_the_uncompressed_file(fno_pair, tmp_path):
    a, u = _raw(fno_pair["v5"])
    packed = tmp_path / "NavierStokes_V1e-3_N4_T4.mat"
    scipy.io.savemat(packed, {"a": a, "u": u, "t": np.arange(1, 5, dtype=np.float32)[None]}, do_compression=True)
    plain = fno.read(convention="canonical", paths=[fno_pair["v5"]]).data["fields"].values
    result = fno.read(convention="canonical", paths=[packed])
    assert result.data.attrs["provenance"]["files"][packed.name]["compressed"] is True
    np.testing.assert_array_equal(result.data["fields"].values, plain)


@pytest.mark.parametrize("container", ["v5", "v73"])
def test_trajectories_with_nan_or_inf_are_left_out_and_reported(fno_pair, tmp_path, container):
    from dpot_data.synth.fno import write_mat_v5, write_mat_v73

    a, u = _raw(fno_pair["v5"])
    u = u.copy()
    u[1, 5, 7, 2] = np.nan  # trajectory 1, frame 3 (frame 0 is `a`)
    a = a.copy()
    a[3, 0, 0] = np.inf  # trajectory 3, frame 0
    t = np.arange(1, u.shape[-1] + 1, dtype=np.float32)[None]
    bad = tmp_path / "NavierStokes_V1e-3_N4_T4.mat"
    (write_mat_v5 if container == "v5" else write_mat_v73)(bad, a, u, t)
    result = fno.read(convention="canonical", paths=[bad])
    assert list(result.data["sample"].values) == [f"{bad.name}#0", f"{bad.name}#2"]
    assert [w for w, _ in result.skipped] == [f"{bad.name}#1", f"{bad.name}#3"]
    assert "frame 3" in result.skipped[0][1] and "frame 0" in result.skipped[1][1]
    fields = result.data["fields"].values
    np.testing.assert_array_equal(fields[1, 0, 0], a[2].T)  # the kept trajectories are the right ones
    manifest = ingest_files("fno", [bad], tmp_path / "out", _opts(resolution=None))
    entry = manifest["datasets"][0]
    assert entry["trajectories"] == 2
    assert [s["what"] for s in entry["skipped"]] == [f"{bad.name}#1", f"{bad.name}#3"]


def test_block_option_reaches_the_reader_and_sets_the_task_size(fno_pair, tmp_path, monkeypatch):
    seen = []
    real_read = fno.read

    def recording_read(paths, **kw):
        seen.append(kw.get("block"))
        return real_read(paths, **kw)

    monkeypatch.setattr(fno, "read", recording_read)
    result = _cli("ingest", "fno", fno_pair["v5"], "--out", tmp_path / "out", "--block", "1", "--resolution", "64")
    assert result.exit_code == 0, result.output
    assert seen == [1]
    assert real_read([fno_pair["v5"]], block=1).data["fields"].data.chunks[0] == (1, 1, 1, 1)


def test_a_v5_variable_header_with_damaged_sizes_is_one_line(fno_pair, tmp_path):
    """Flipped bytes in the header of the last variable (its flags sub-element's size now points far past the
    header): one line naming the file and the offset, exit 2, nothing written (it was a struct.error traceback)."""
    import struct

    data = bytearray(fno_pair["v5"].read_bytes())
    pos, last = 128, 128
    while pos < len(data):  # the top-level elements: tag (type, bytes) then the padded body
        last = pos
        pos += 8 + (struct.unpack_from("<II", data, pos)[1] + 7) // 8 * 8
    for i in range(last + 8, last + 16):
        data[i] ^= 0xFF
    bad = tmp_path / fno_pair["v5"].name
    bad.write_bytes(bytes(data))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["ingest", "fno", str(bad), "--out", str(out), "--no-progress"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"error: {bad}: the variable header at offset {last + 8} is damaged (its element sizes point past its 64 "
        "bytes); expected a MAT v5 matrix element"], result.stderr
    assert not out.exists()
