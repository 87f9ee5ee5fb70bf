"""Raw files are judged, never trusted: declared sizes are bounded (by the limits of dpot_data.sources.base and by
the bytes really on disk), and odd inputs (a file name that is not UTF-8, one file given twice, a wrong channel
count, NaN/Inf) give one InputError line naming the file and what was expected, through the reader, the library
(`ingest_files`) and the CLI, never a traceback, a hang or unbounded memory."""

from __future__ import annotations

import json
import os
import shutil
import struct
import warnings
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.io
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.errors import InputError
from dpot_data.ingest import IngestOptions, ingest, ingest_files
from dpot_data.sources import base, cfdbench, fno, pdearena, pdebench
from dpot_data.synth import pdearena as synth_arena
from dpot_data.synth import pdebench as synth_bench
from dpot_data.synth.cfdbench import write_cfdbench
from dpot_data.synth.fno import MAT73_USERBLOCK, _matlab73_header, write_mat_v5

CNS_NAME = "2D_CFD_Rand_M1.0_Eta0.1_Zeta0.1_periodic_128_Train.hdf5"
OPTS = dict(resolution=None, formats=("zarr",), stats=False)


def _cli(*args: object):
    return CliRunner().invoke(app, ["ingest", *map(str, args), "--no-progress"])


def _one_error_line(result, *needles: str) -> str:
    """The CLI refused: exit code 2, exactly one `error:` line holding every needle, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def _refused(call, *needles: str) -> str:
    with pytest.raises(InputError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text
    for needle in needles:
        assert needle in text, text
    return text


def _no_manifest(out: Path) -> None:
    assert not (out / "manifest.json").exists()


# ------------------------------------------------------------------------------------------------- part 1: sizes

def _declared_cns(path: Path, n: int, frames: int = 21, res: int = 128) -> Path:
    """A compressible-NS file whose fields declare (n, frames, res, res) in chunks of which none is written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for k in ("Vx", "Vy", "density", "pressure"):
            f.create_dataset(k, shape=(n, frames, res, res), dtype=np.float32, chunks=(1, frames, res, res))
        f["t-coordinate"] = np.linspace(0, 1, frames + 1, dtype=np.float32)
    return path


def test_hdf5_declaring_billions_of_trajectories_is_refused_before_reading(tmp_path):
    path = _declared_cns(tmp_path / CNS_NAME, 2**31 - 1)
    assert path.stat().st_size < 100_000  # declares 5.6 PB
    needles = (path.name, "density", "2147483647 trajectories", "at most 1000000 allowed")
    _refused(lambda: pdebench.read([path]), *needles)
    _refused(lambda: ingest_files("pdebench", [path], tmp_path / "lib", IngestOptions(**OPTS)), *needles)
    _one_error_line(_cli("pdebench", path, "--out", tmp_path / "cli"), *needles)
    _no_manifest(tmp_path / "cli")


def test_hdf5_unwritten_chunks_are_refused_by_stored_bytes(tmp_path):
    path = _declared_cns(tmp_path / CNS_NAME, 2000)  # within the limits, 2.75 GB per field, nothing stored
    needles = (path.name, "Vx", "(2000, 21, 128, 128)", "only 0 bytes are stored", "MAX_INFLATION")
    _refused(lambda: pdebench.read([path], check_finite=False), *needles)
    _one_error_line(_cli("pdebench", path, "--out", tmp_path / "cli"), *needles)


def test_virtual_and_external_datasets_are_refused(tmp_path):
    """Data that lives outside the file given (another HDF5 file, /dev/zero) is not read."""
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros((3, 4, 8, 8), np.float32)
    path = tmp_path / CNS_NAME
    with h5py.File(path, "w") as f:
        for k in ("Vx", "Vy", "pressure"):
            f[k] = np.zeros((3, 4, 8, 8), np.float32)
        layout = h5py.VirtualLayout(shape=(3, 4, 8, 8), dtype=np.float32)
        layout[:] = h5py.VirtualSource(str(other), "x", shape=(3, 4, 8, 8))
        f.create_virtual_dataset("density", layout)
    _refused(lambda: pdebench.read([path]), path.name, "density: a virtual dataset")
    with h5py.File(path, "a") as f:
        del f["density"]
        f.create_dataset("density", shape=(3, 4, 8, 8), dtype=np.float32,
                         external=[("/dev/zero", 0, 3 * 4 * 8 * 8 * 4)])
    _one_error_line(_cli("pdebench", path, "--out", tmp_path / "cli"), path.name,
                    "density: stored in external raw files ['/dev/zero']")


def test_grouped_file_declaring_more_than_its_size_is_refused(tmp_path):
    path = tmp_path / "2D_diff-react_NA_NA.h5"
    with h5py.File(path, "w") as f:  # 200 groups of 13 MB each declared, nothing written
        for i in range(200):
            f.create_group(f"{i:04d}").create_dataset("data", shape=(101, 128, 128, 2), dtype=np.float32,
                                                     chunks=(10, 32, 32, 1), compression="lzf")
    text = _refused(lambda: pdebench.read([path], check_finite=False), path.name, "'data'", "MAX_INFLATION")
    assert "2647654400 bytes" in text
    _one_error_line(_cli("pdebench", path, "--out", tmp_path / "cli"), path.name, "'data'")


def test_grouped_file_declaring_absurd_frames_is_refused(tmp_path):
    path = tmp_path / "2D_rdb_NA_NA.h5"
    with h5py.File(path, "w") as f:
        f.create_group("0000").create_dataset("data", shape=(10**9, 128, 128, 1), dtype=np.float32,
                                              chunks=(1, 128, 128, 1))
    _refused(lambda: pdebench.read([path]), path.name, "0000/data", "1000000000 frames", "at most 100000 allowed")


def test_pdearena_unwritten_fields_are_refused(tmp_path):
    path = tmp_path / "NavierStokes2D_train_0_0.50000_3000.h5"
    n, t, s = 3000, 14, 128
    with h5py.File(path, "w") as f:
        g = f.create_group("train")
        for k in ("u", "vx", "vy"):
            g.create_dataset(k, shape=(n, t, s, s), dtype=float, chunks=(1, t, s, s))
        g["t"] = np.zeros((n, t))
        g["x"] = g["y"] = np.zeros((n, s))
        g["buo_y"] = np.full(n, 0.5)
    needles = (path.name, "train/u", "(3000, 14, 128, 128)", "only 0 bytes are stored")
    _refused(lambda: pdearena.read([path], check_finite=False), *needles)
    _one_error_line(_cli("pdearena", path, "--out", tmp_path / "cli"), *needles)


def _mat73(path: Path, n: int, res: int = 64, frames: int = 20) -> Path:
    """A MAT v7.3 file whose `u` (N, x, y, T) and `a` (N, x, y) declare n trajectories, none written."""
    with h5py.File(path, "w", userblock_size=MAT73_USERBLOCK, libver="earliest") as h5:
        h5.create_dataset("u", shape=(frames, res, res, n), dtype=np.float32, chunks=(frames, res, res, 1))
        h5.create_dataset("a", shape=(res, res, n), dtype=np.float32, chunks=(res, res, 1))
        h5["t"] = np.arange(1, frames + 1, dtype=np.float32)[:, None]
    with open(path, "r+b") as fh:
        fh.write(_matlab73_header())
    return path


def test_mat_v73_declaring_huge_u_is_refused(tmp_path):
    huge = _mat73(tmp_path / "ns_V1e-3_N2147483647_T20.mat", 2**31 - 1)
    needles = (huge.name, "u: declares 2147483647 trajectories", "at most 1000000 allowed")
    _refused(lambda: fno.read([huge]), *needles)
    _one_error_line(_cli("fno", huge, "--out", tmp_path / "cli"), *needles)
    unwritten = _mat73(tmp_path / "ns_V1e-3_N5000_T20.mat", 5000)
    _refused(lambda: fno.read([unwritten], check_finite=False), unwritten.name, "u: declares shape",
             "only 0 bytes are stored")


def test_mat_v5_header_declaring_billions_of_trajectories_is_refused(tmp_path):
    """An uncompressed MAT v5 file of a few KB whose `u` declares 2^31-1 trajectories in its dimensions."""
    path = tmp_path / "NavierStokes_V1e-3_N2_T3.mat"
    write_mat_v5(path, np.zeros((2, 8, 8), np.float32), np.ones((2, 8, 8, 3), np.float32),
                 np.arange(1, 4, dtype=np.float32)[None])
    data = path.read_bytes()
    dims = struct.pack("<4i", 2, 8, 8, 3)
    assert data.count(dims) == 1  # the dimensions sub-element of `u`
    path.write_bytes(data.replace(dims, struct.pack("<4i", 2**31 - 1, 8, 8, 3)))
    assert path.stat().st_size < 4096
    needles = (path.name, "variable 'u'", "(2147483647, 8, 8, 3)")
    _refused(lambda: fno.read([path]), *needles)
    _one_error_line(_cli("fno", path, "--out", tmp_path / "cli"), *needles)
    assert not (tmp_path / "cli").exists()


def test_mat_v5_compressed_element_inflating_without_bound_is_refused(tmp_path):
    path = tmp_path / "NavierStokes_V1e-3_N20_T320.mat"
    u = np.zeros((20, 64, 64, 320), np.float32)  # 105 MB of zeros: zlib makes ~100 kB of it
    scipy.io.savemat(path, {"a": np.zeros((20, 64, 64), np.float32), "u": u, "t": np.zeros((1, 320), np.float32)},
                     format="5", do_compression=True, oned_as="row")
    del u
    assert path.stat().st_size < 1 << 20
    needles = (path.name, "inflates to more than", "MAX_INFLATION")
    _refused(lambda: fno.read([path], check_finite=False), *needles)
    _one_error_line(_cli("fno", path, "--out", tmp_path / "cli"), *needles)


def test_mat_v5_compressed_elements_share_one_allowance(tmp_path):
    """Each element within its own allowance (64 MiB slack), the file's together beyond it: refused as well."""
    path = tmp_path / "NavierStokes_V1e-3_N2_T3.mat"
    zeros = np.zeros((40 << 20) // 4, np.float32)  # 40 MiB each, ~40 kB compressed
    scipy.io.savemat(path, {"a": np.ones((2, 8, 8), np.float32), "u": np.ones((2, 8, 8, 3), np.float32),
                            "t": np.arange(1, 4, dtype=np.float32)[None], "x1": zeros, "x2": zeros, "x3": zeros},
                     format="5", do_compression=True, oned_as="row")
    _refused(lambda: fno.read([path]), path.name, "inflates to more than", "for the whole file")


def _npy_with_header(path: Path, shape: tuple[int, ...], data: bytes = b"\0" * 64) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": shape})
        fh.write(data)
    return path


def _case(root: Path, shape: tuple[int, ...], problem: str = "cavity") -> Path:
    folder = root / problem / "bc" / "case0000"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "case.json").write_text(json.dumps({"vel_top": 1.0, "density": 1.0, "viscosity": 1e-3, "height": 0.1,
                                                  "width": 0.1}))
    for name in ("u.npy", "v.npy"):
        _npy_with_header(folder / name, shape)
    return folder


def test_cfdbench_npy_header_declaring_a_huge_shape_is_refused(tmp_path):
    folder = _case(tmp_path / "tree", (2**40, 64, 64))
    needles = ("u.npy", "u: declares 1099511627776 frames", "at most 100000 allowed")
    _refused(lambda: cfdbench.read([tmp_path / "tree"], convention="canonical"), *needles)
    _refused(lambda: ingest_files("cfdbench", [tmp_path / "tree"], tmp_path / "lib", IngestOptions(**OPTS)),
             *needles)
    _one_error_line(_cli("cfdbench", folder, "--out", tmp_path / "cli"), *needles)


def test_cfdbench_sparse_npy_is_refused(tmp_path):
    folder = _case(tmp_path / "tree", (20_000, 64, 64))  # 327 MB declared
    for name in ("u.npy", "v.npy"):
        with open(folder / name, "r+b") as fh:
            fh.truncate(128 + 20_000 * 64 * 64 * 4)  # the right size, but a hole: nothing on disk
    st = os.stat(folder / "u.npy")
    if st.st_blocks * 512 > st.st_size // 2:
        pytest.skip("this file system does not keep sparse files")
    needles = ("u.npy", "u: declares shape (20000, 64, 64)", "on disk (the file is sparse)")
    _refused(lambda: cfdbench.read([tmp_path / "tree"]), *needles)
    _one_error_line(_cli("cfdbench", tmp_path / "tree", "--out", tmp_path / "cli"), *needles)


def test_limits_are_constants_of_base_and_documented():
    docs = (Path(__file__).resolve().parents[1] / "docs" / "sources.md").read_text(encoding="utf-8")
    for name in ("MAX_TRAJECTORIES", "MAX_FRAMES", "MAX_GRID_SIDE", "MAX_TRAJECTORY_BYTES", "MAX_INFLATION",
                 "INFLATION_SLACK_BYTES"):
        assert isinstance(getattr(base, name), int) and name in docs
    assert base.MAX_INFLATION >= 10  # real float32 PDE data compresses well under 10x


# ------------------------------------------------------------------------------------------------- part 2: names

NOT_UTF8 = os.fsdecode(b"ns_\xff.h5")


def test_file_name_that_is_not_utf8_is_refused_with_one_line(tmp_path):
    good = synth_bench.write_cfd(tmp_path / "raw", n=2, frames=3, res=8)
    bad = good.with_name(NOT_UTF8)
    os.rename(good, bad)
    needles = ("ns_\\xff.h5", "valid UTF-8")
    _refused(lambda: pdebench.read([bad]), *needles)
    _refused(lambda: pdebench.read([os.fsencode(bad)]), *needles)  # the name as bytes
    _refused(lambda: ingest_files("pdebench", [bad], tmp_path / "lib", IngestOptions(**OPTS)), *needles)
    _refused(lambda: ingest_files("pdebench", [bad.parent], tmp_path / "dir", IngestOptions(**OPTS)), *needles)
    _one_error_line(_cli("pdebench", bad, "--out", tmp_path / "cli"), *needles)
    _one_error_line(_cli("pdebench", bad.parent, "--out", tmp_path / "cli2"), *needles)
    for out in ("lib", "dir", "cli", "cli2"):  # refused before anything is written: no folder, no .staging-*
        assert not (tmp_path / out).exists(), out


def test_output_folder_name_that_is_not_utf8_is_refused_with_one_line(tmp_path, cns):
    out = tmp_path / os.fsdecode(b"out_\xfe")
    needles = ("out_\\xfe", "expected an output folder name that is valid UTF-8")
    _refused(lambda: ingest_files("pdebench", [cns], out, IngestOptions(**OPTS)), *needles)
    _one_error_line(_cli("pdebench", cns, "--out", out), *needles)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_other_sources_refuse_names_that_are_not_utf8(tmp_path):
    arena = synth_arena.write_ns(tmp_path / "arena", n=2, frames=3, res=8)
    os.rename(arena, arena.with_name(NOT_UTF8))
    _refused(lambda: pdearena.read([arena.with_name(NOT_UTF8)]), "ns_\\xff.h5", "valid UTF-8")
    _refused(lambda: pdearena.read([os.fsencode(arena.parent)]), "ns_\\xff.h5", "valid UTF-8")
    mat = tmp_path / os.fsdecode(b"NavierStokes_V1e-3_\xfe.mat")
    write_mat_v5(mat, np.zeros((2, 8, 8), np.float32), np.zeros((2, 8, 8, 3), np.float32),
                 np.arange(1, 4, dtype=np.float32)[None])
    _refused(lambda: fno.read([mat]), "NavierStokes_V1e-3_\\xfe.mat", "valid UTF-8")
    _refused(lambda: fno.read([os.fsencode(mat)]), "NavierStokes_V1e-3_\\xfe.mat", "valid UTF-8")
    _one_error_line(_cli("fno", mat, "--out", tmp_path / "cli"), "\\xfe", "valid UTF-8")
    tree = tmp_path / "cfd"
    write_cfdbench(tree, problems=("cavity",), cases=1, frames=(21, 22), res=8)
    os.rename(tree / "cavity" / "bc", tree / "cavity" / os.fsdecode(b"b\xe9"))
    _refused(lambda: cfdbench.read([tree]), "cavity/b\\xe9/case0000", "valid UTF-8")
    _refused(lambda: cfdbench.read([os.fsencode(tree)]), "cavity/b\\xe9/case0000", "valid UTF-8")


# ------------------------------------------------------------------------------------------------- part 2: twice

@pytest.fixture()
def cns(tmp_path) -> Path:
    return synth_bench.write_cfd(tmp_path / "raw", n=3, frames=4, res=8)


def test_same_file_given_twice_is_read_once_with_a_warning(tmp_path, cns):
    (tmp_path / "other").mkdir()
    os.symlink(cns, tmp_path / "other" / cns.name)  # a link under the same name
    dotted = cns.parent / ".." / cns.parent.name / cns.name
    for twice in ([cns, cns], [cns, dotted], [cns, tmp_path / "other" / cns.name], [cns.parent, cns]):
        with pytest.warns(UserWarning, match="read once"):
            result = pdebench.read(twice)
        assert result.n_samples == 3 and len(result.inputs) == 1
    with pytest.warns(UserWarning, match="given more than once; read once"):
        manifest = ingest_files("pdebench", [cns, cns], tmp_path / "lib", IngestOptions(**OPTS))
    assert manifest["datasets"][0]["trajectories"] == 3 and len(manifest["datasets"][0]["inputs"]) == 1
    result = _cli("pdebench", cns, cns, "--out", tmp_path / "cli", "--resolution", "0")
    assert result.exit_code == 0, result.output
    assert sum("read once" in line for line in result.output.splitlines()) == 1
    stored = json.loads((tmp_path / "cli" / "manifest.json").read_text())
    assert stored["datasets"][0]["trajectories"] == 3


def test_same_file_under_another_name_is_refused(tmp_path, cns):
    link = tmp_path / "elsewhere.hdf5"
    os.symlink(cns, link)
    needles = ("elsewhere.hdf5", f"is the same file as {cns}", "under another name")
    _refused(lambda: pdebench.read([cns, link]), *needles)
    _refused(lambda: ingest_files("pdebench", [cns, link], tmp_path / "lib", IngestOptions(**OPTS)), *needles)
    _no_manifest(tmp_path / "lib")


def test_other_sources_read_a_repeated_file_once(tmp_path):
    arena = synth_arena.write_standard(tmp_path / "arena", n=2, frames=3, res=8)
    with pytest.warns(UserWarning, match="read once"):
        assert pdearena.read([arena[0], *arena]).n_samples == 6
    os.symlink(arena[0], tmp_path / "NavierStokes2D_train_9_0.50000_2.h5")
    _refused(lambda: pdearena.read([*arena, tmp_path / "NavierStokes2D_train_9_0.50000_2.h5"]), "under another name")

    mat = tmp_path / "NavierStokes_V1e-3_N2_T3.mat"
    write_mat_v5(mat, np.zeros((2, 8, 8), np.float32), np.ones((2, 8, 8, 3), np.float32),
                 np.arange(1, 4, dtype=np.float32)[None])
    with pytest.warns(UserWarning, match="given more than once; read once"):
        assert fno.read([mat, mat]).n_samples == 2
    (tmp_path / "copy").mkdir()
    shutil.copy(mat, tmp_path / "copy" / mat.name)  # another file of the same name: ids would collide
    _refused(lambda: fno.read([mat, tmp_path / "copy" / mat.name]), "has the same file name as")

    tree = tmp_path / "cfd"
    write_cfdbench(tree, problems=("cavity",), cases=2, frames=(21, 22), res=8)
    with pytest.warns(UserWarning, match="read once"):
        result = cfdbench.read([tree, tree / "cavity" / "bc" / "case0001"], convention="canonical")
    assert result.n_samples == 2
    os.symlink(tree / "cavity" / "bc" / "case0001", tree / "cavity" / "bc" / "case0007")  # not followed in a tree
    _refused(lambda: cfdbench.read([tree, tree / "cavity" / "bc" / "case0007"], convention="canonical"),
             "case0007", "is the same case folder as", "under another name")


# ------------------------------------------------------------------------------------------------- part 2: channels

def _grouped(path: Path, channels: int) -> Path:
    with h5py.File(path, "w") as f:
        for g in ("0000", "0001"):
            f.create_group(g).create_dataset("data", data=np.zeros((4, 8, 8, channels), np.float32))
    return path


@pytest.mark.parametrize("name,channels,expected", [
    ("2D_diff-react_NA_NA.h5", 3, "expected 2 channels (u, v)"),
    ("2D_diff-react_NA_NA.h5", 1, "expected 2 channels (u, v)"),
    ("2D_rdb_NA_NA.h5", 3, "expected 1 channel (h)"),
    ("2D_rdb_NA_NA.h5", 2, "expected 1 channel (h)"),
    ("grouped.h5", 3, "expected 2 channels (diffusion-reaction: u, v) or 1 (shallow water: h)"),
])
def test_grouped_pdebench_channel_count_is_checked(tmp_path, name, channels, expected):
    path = _grouped(tmp_path / name, channels)
    needles = (path.name, "'data'", expected, f"found {channels}")
    _refused(lambda: pdebench.read([path]), *needles)
    _refused(lambda: ingest_files("pdebench", [path], tmp_path / "lib", IngestOptions(**OPTS)), *needles)
    _one_error_line(_cli("pdebench", path, "--out", tmp_path / "cli"), *needles)


def test_compressible_ns_field_count_is_checked(tmp_path, cns):
    two_d = tmp_path / CNS_NAME
    shutil.copy(cns, two_d)
    with h5py.File(two_d, "a") as f:
        f["Vz"] = np.zeros(f["density"].shape, np.float32)
    needles = (two_d.name, "'Vz'", "expected the 4 fields ['Vx', 'Vy', 'density', 'pressure']")
    _refused(lambda: pdebench.read([two_d]), *needles)
    _one_error_line(_cli("pdebench", two_d, "--out", tmp_path / "cli"), *needles)
    three_d = tmp_path / "3D_CFD_Rand_M1.0_Eta1e-08_Zeta1e-08_periodic_Train.hdf5"
    with h5py.File(three_d, "w") as f:
        for k in ("Vx", "Vy", "density", "pressure"):
            f[k] = np.zeros((2, 3, 4, 4, 4), np.float32)
    _refused(lambda: pdebench.read([three_d]), three_d.name, "5 fields of 3D", "missing ['Vz']")


def test_pdearena_field_count_is_checked(tmp_path):
    path = synth_arena.write_ns(tmp_path, n=2, frames=3, res=8)
    with h5py.File(path, "a") as f:
        f["train/vz"] = np.zeros(f["train/u"].shape)
    needles = (path.name, "train/vz", "expected the 3 fields u, vx, vy", "found 4")
    _refused(lambda: pdearena.read([path]), *needles)
    _one_error_line(_cli("pdearena", path, "--out", tmp_path / "cli"), *needles)


# ------------------------------------------------------------------------------------------------- NaN / Inf

def _with_nan(path: Path, key: str, index: tuple) -> Path:
    with h5py.File(path, "a") as f:
        f[key][index] = np.nan
    return path


def test_nonfinite_trajectories_are_still_left_out_by_default(tmp_path, cns):
    _with_nan(cns, "density", (1, 2, 3, 4))
    result = pdebench.read([cns])
    assert result.skipped == [(f"{cns.name}#1", "NaN or Inf in 1 of 4 frames (first: frame 2)")]
    assert result.n_samples == 2
    manifest = ingest_files("pdebench", [cns], tmp_path / "lib", IngestOptions(**OPTS))
    assert manifest["datasets"][0]["skipped"] == [{"what": f"{cns.name}#1",
                                                   "reason": "NaN or Inf in 1 of 4 frames (first: frame 2)"}]
    result = _cli("pdebench", cns, "--out", tmp_path / "cli", "--resolution", "0")
    assert result.exit_code == 0 and "2 trajectories" in result.output, result.output


def test_raise_mode_checks_in_the_block_read_without_a_scan(tmp_path, cns, monkeypatch):
    _with_nan(cns, "pressure", (2, 1, 0, 0))
    from dpot_data.sources import _blocks

    monkeypatch.setattr(_blocks, "scan", lambda *a, **k: pytest.fail("scanned when opened"))
    result = pdebench.read([cns], check_finite="raise")
    assert result.n_samples == 3 and result.skipped == []
    needles = (cns.name, "pressure: trajectory 2 holds NaN or Inf", "1 of 4 frames, first: frame 1")
    _refused(lambda: ingest_files("pdebench", [cns], tmp_path / "lib", IngestOptions(**OPTS), check_finite="raise"),
             *needles)
    _no_manifest(tmp_path / "lib")
    _refused(lambda: pdebench.read([cns], check_finite="sometimes"), "check_finite", "'raise'")


def test_a_file_changed_after_opening_cannot_bring_nan_into_the_output(tmp_path, cns):
    result = pdebench.read([cns])  # scanned: all finite
    _with_nan(cns, "Vy", (0, 3, 1, 1))
    _refused(lambda: ingest(result, tmp_path / "out", IngestOptions(**OPTS)), cns.name,
             "Vy: trajectory 0 holds NaN or Inf")
    _no_manifest(tmp_path / "out")


def _nan_inputs(tmp_path: Path, source: str) -> tuple[list[Path], str]:
    """Small raw files of a source with NaN in one trajectory, and the key the error must name."""
    if source == "pdearena":
        files = synth_arena.write_standard(tmp_path / "arena", n=2, frames=3, res=8)
        _with_nan(files[1], "valid/vx", (1, 0, 2, 2))
        return files, "valid/vx: trajectory 1"
    if source == "pdebench-dr":
        path = synth_bench.write_diff_react(tmp_path / "dr", n=3, frames=4, res=8)
        _with_nan(path, "0002/data", (3, 1, 1, 1))
        return [path], "0002/data: trajectory 0002"
    if source == "fno":
        mat = tmp_path / "NavierStokes_V1e-3_N3_T3.mat"
        u = np.ones((3, 8, 8, 3), np.float32)
        u[1, 2, 2, 2] = np.inf
        write_mat_v5(mat, np.zeros((3, 8, 8), np.float32), u, np.arange(1, 4, dtype=np.float32)[None])
        return [mat], "u: trajectory 1"
    tree = tmp_path / "cfd"
    write_cfdbench(tree, problems=("cavity",), cases=2, frames=(21, 22), res=8)
    v = np.load(tree / "cavity" / "bc" / "case0001" / "v.npy")
    v[4, 0, 0] = np.nan
    np.save(tree / "cavity" / "bc" / "case0001" / "v.npy", v)
    return [tree], "v: trajectory cavity/bc/case0001#0"


@pytest.mark.parametrize("source", ["pdearena", "pdebench-dr", "fno", "cfdbench", "cfdbench-canonical"])
def test_every_reader_checks_values_in_its_block_reads(tmp_path, source):
    paths, key = _nan_inputs(tmp_path, source.replace("-canonical", ""))
    opts = IngestOptions(**OPTS, convention="canonical" if source.endswith("canonical") else "dpot-reference")
    reader = {"pdebench-dr": "pdebench", "cfdbench-canonical": "cfdbench"}.get(source, source)
    _refused(lambda: ingest_files(reader, paths, tmp_path / "out", opts, check_finite="raise"), key, "NaN or Inf")
    _no_manifest(tmp_path / "out")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        manifest = ingest_files(reader, paths, tmp_path / "skip", opts)  # the default leaves it out
    assert manifest["datasets"][0]["skipped"], manifest["datasets"][0]["skipped"]


def test_compressed_v5_elements_within_the_limit_still_inflate(tmp_path):
    """The inflation bound must not refuse ordinary compressed MAT v5 files."""
    path = tmp_path / "NavierStokes_V1e-3_N3_T4.mat"
    rng = np.random.default_rng(0)
    u = rng.normal(size=(3, 16, 16, 4)).astype(np.float32)
    scipy.io.savemat(path, {"a": u[..., 0], "u": u, "t": np.arange(1, 5, dtype=np.float32)[None]}, format="5",
                     do_compression=True, oned_as="row")
    values = fno.read([path], convention="canonical").data["fields"].values
    np.testing.assert_array_equal(values[:, 1:, 0], np.transpose(u, (0, 3, 2, 1)))
    assert zlib  # the MAT v5 compressed elements are zlib streams


def test_nonfinite_option_chooses_skip_or_raise_through_ingest_and_cli(tmp_path, cns, monkeypatch):
    """`--nonfinite raise` (IngestOptions.nonfinite) reads without the scan and stops at the bad trajectory with one
    line; the default `skip` scans and leaves it out; anything else is refused naming the option."""
    _with_nan(cns, "pressure", (2, 1, 0, 0))
    from dpot_data.sources import _blocks

    skipped = ingest_files("pdebench", [cns], tmp_path / "skip", IngestOptions(**OPTS))
    assert [s["what"] for s in skipped["datasets"][0]["skipped"]] == [f"{cns.name}#2"]
    monkeypatch.setattr(_blocks, "scan", lambda *a, **k: pytest.fail("scanned when opened"))
    _refused(lambda: ingest_files("pdebench", [cns], tmp_path / "lib", IngestOptions(**OPTS, nonfinite="raise")),
             cns.name, "pressure: trajectory 2 holds NaN or Inf")
    _no_manifest(tmp_path / "lib")
    _one_error_line(_cli("pdebench", cns, "--out", tmp_path / "cli", "--resolution", "0", "--nonfinite", "raise"),
                    cns.name, "trajectory 2 holds NaN or Inf")
    _no_manifest(tmp_path / "cli")
    _one_error_line(_cli("pdebench", cns, "--out", tmp_path / "bad", "--nonfinite", "sometimes"), "--nonfinite",
                    "expected one of skip, raise")


def test_paths_given_as_bytes_reach_the_reader(tmp_path, cns):
    manifest = ingest_files("pdebench", [os.fsencode(cns)], tmp_path / "out", IngestOptions(**OPTS))
    assert manifest["datasets"][0]["trajectories"] == 3
