"""What the own-data readers (`ingest xarray`, `ingest the-well`) and the ingest refuse: an input replaced while it
is read, data stored outside the input (HDF5 external links, external raw storage, virtual datasets, Zarr chunks
linked out of the store; the paper's HDF5 readers make the same HDF5 check), FIFOs, sizes declared far beyond what
is stored, and malformed files that used to end in a traceback. Each is one `error:` line, exit code 2, and nothing
left in OUT."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import dask.array as dsa
import h5netcdf
import h5py
import numpy as np
import pytest
import xarray as xr
import zarr
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.errors import InputError
from dpot_data.ingest import IngestOptions
from dpot_data.ingest import run as run_module
from dpot_data.ingest.input_hashes import InputHashes
from dpot_data.ingest.pipeline import run_ingest
from dpot_data.sources import the_well
from dpot_data.sources import xarray as xsrc
from dpot_data.synth.gridded import write_netcdf, write_the_well

SECRET = b"DPOT-SECRET-BYTES-" * 64  # outside every input: must never reach a shard
OPTS = dict(resolution=0, workers=1, split=(1.0,), command="test", formats=("zarr", "wds"), stats=False)


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--no-progress"])
    return result.exit_code, result.output


def _refused(out: Path, code: int, output: str, *needles: str) -> None:
    """Exit 2, exactly one `error:` line holding every needle, no traceback, nothing left in OUT."""
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert code == 2 and "Traceback" not in output, output
    assert len(errors) == 1, output
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.iterdir())


def _outputs_hold(out: Path, data: bytes) -> bool:
    return out.exists() and any(data in p.read_bytes() for p in out.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------ 1. input identity

def _swap_after_first_block(monkeypatch, swap) -> list[int]:
    """Run `swap()` once, after the first block task has read its trajectories (the later ones reopen by name)."""
    calls: list[int] = []
    original = run_module.process_block

    def hooked(task, rng):
        result = original(task, rng)
        calls.append(rng[0])
        if len(calls) == 1:
            swap()
        return result

    monkeypatch.setattr(run_module, "process_block", hooked)
    return calls


def test_a_netcdf_file_replaced_between_blocks_is_refused_and_nothing_is_published(tmp_path, monkeypatch):
    path = write_netcdf(tmp_path / "raw", members=6, frames=3, ny=8, nx=8, seed=1, name="a.nc")
    new = write_netcdf(tmp_path / "new", members=6, frames=3, ny=8, nx=8, seed=2, name="a.nc")
    calls = _swap_after_first_block(monkeypatch, lambda: os.replace(new, path))
    out = tmp_path / "out"
    with warnings.catch_warnings(), pytest.raises(InputError) as err:
        warnings.simplefilter("ignore")
        run_ingest("xarray", [path], out, IngestOptions(block=1, **OPTS))
    assert calls and err.value.path == str(path.resolve()) and "changed while this ingest read it" in err.value.message
    assert not out.exists()  # no manifest, no staging, and OUT (created by this ingest) gone


@pytest.mark.parametrize("how", ["mv", "cp"])
def test_a_well_file_replaced_or_rewritten_between_blocks_is_refused(tmp_path, monkeypatch, how):
    write_the_well(tmp_path / "raw", n=4, frames=3, res=8, alphas=(0.5,), seed=1)
    write_the_well(tmp_path / "new", n=4, frames=3, res=8, alphas=(0.5,), seed=7)
    path = tmp_path / "raw/data/train/waves_alpha_0.5.hdf5"
    new = tmp_path / "new/data/train/waves_alpha_0.5.hdf5"
    swap = (lambda: os.replace(new, path)) if how == "mv" else (lambda: shutil.copyfile(new, path))
    _swap_after_first_block(monkeypatch, swap)
    out = tmp_path / "out"
    code, output = _cli("ingest", "the-well", str(path), "--out", str(out), "--block", "1", "--workers", "1",
                        "--resolution", "0")
    _refused(out, code, output, str(path), "changed while this ingest read it")


def test_the_manifest_never_certifies_the_hash_of_a_file_other_than_the_one_read(tmp_path):
    path = write_netcdf(tmp_path / "raw", members=2, frames=3, ny=8, nx=8, seed=1, name="a.nc")
    new = write_netcdf(tmp_path / "new", members=2, frames=3, ny=8, nx=8, seed=2, name="a.nc")
    hashes = InputHashes([path])
    hashes.entries([path])  # the old file is hashed (the CLI starts hashing before anything else) ...
    os.replace(new, path)  # ... then replaced before the job is resolved and read
    out = tmp_path / "out"
    with warnings.catch_warnings(), pytest.raises(InputError, match="changed while this ingest read it"):
        warnings.simplefilter("ignore")
        run_ingest("xarray", [path], out, IngestOptions(**OPTS), hashes=hashes)
    hashes.close()
    assert not out.exists()


def test_an_input_left_alone_is_ingested_as_before(tmp_path):
    path = write_netcdf(tmp_path / "raw", members=3, frames=3, ny=8, nx=8, name="a.nc")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = run_ingest("xarray", [tmp_path / "raw"], tmp_path / "raw" / "out", IngestOptions(block=1, **OPTS))
    assert outcome.manifest["datasets"][0]["trajectories"] == 3  # OUT inside the input folder is not an input


# ------------------------------------------------------------------------------------------ 2. reads outside the input

def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "secret.bin"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(SECRET)
    return path


def _h5_outside(tmp_path: Path, how: str) -> Path:
    """An HDF5 input whose dataset `u` (sample, time, y, x) lives outside it, as `how` says."""
    secret = _secret(tmp_path)
    shape = (1, 2, 4, 4)
    nbytes = int(np.prod(shape)) * 4
    raw = tmp_path / "in"
    raw.mkdir()
    path = raw / "a.h5"
    if how == "external storage":
        with h5py.File(path, "w") as f:
            f.create_dataset("u", shape, np.float32, external=[(str(secret), 0, nbytes)])
    elif how == "virtual dataset":
        other = secret.parent / "other.h5"
        with h5py.File(other, "w") as g:
            g["u"] = np.frombuffer(SECRET[:nbytes], np.float32).reshape(shape)
        layout = h5py.VirtualLayout(shape, np.float32)
        layout[...] = h5py.VirtualSource(str(other), "u", shape)
        with h5py.File(path, "w") as f:
            f.create_virtual_dataset("u", layout)
    else:
        other = secret.parent / "other.h5"
        with h5py.File(other, "w") as g:
            g["u"] = np.frombuffer(SECRET[:nbytes], np.float32).reshape(shape)
        with h5py.File(path, "w") as f:
            f["u"] = h5py.ExternalLink(str(other), "/u")
    return path


@pytest.mark.parametrize("how, needle", [("external storage", "external raw files"),
                                         ("virtual dataset", "virtual dataset"),
                                         ("external link", "external link")])
def test_hdf5_data_stored_outside_the_input_is_refused(tmp_path, how, needle):
    path = _h5_outside(tmp_path, how)
    out = tmp_path / "out"
    code, output = _cli("ingest", "xarray", str(path), "--axes", "NTYX", "--out", str(out), "--resolution", "0")
    _refused(out, code, output, str(path), needle)
    assert not _outputs_hold(out, SECRET[:64])


def _zarr_store(path: Path, values: np.ndarray) -> Path:
    xr.Dataset({"u": (("time", "y", "x"), values)}).to_zarr(path, zarr_format=2, consolidated=False,
                                                             encoding={"u": {"compressors": None,
                                                                             "chunks": values.shape}})
    return path


@pytest.mark.parametrize("what", ["chunk", "folder"])
def test_a_zarr_chunk_linked_outside_the_store_is_refused(tmp_path, what):
    secret = _secret(tmp_path)
    store = _zarr_store(tmp_path / "in" / "s.zarr", np.zeros((2, 4, 4), np.float32))
    chunk = store / "u" / "0.0.0"
    if what == "chunk":
        chunk.unlink()
        chunk.symlink_to(secret)
    else:
        outside = secret.parent / "u"
        shutil.move(str(store / "u"), outside)
        (outside / "0.0.0").write_bytes(SECRET[:2 * 4 * 4 * 4])
        (store / "u").symlink_to(outside, target_is_directory=True)
    out = tmp_path / "out"
    code, output = _cli("ingest", "xarray", str(store), "--out", str(out), "--resolution", "0")
    _refused(out, code, output, "outside the Zarr store")
    assert not _outputs_hold(out, SECRET[:64])


def test_a_well_field_that_is_an_external_link_is_refused(tmp_path):
    write_the_well(tmp_path / "raw", n=2, frames=3, res=8, alphas=(0.5,))
    path = tmp_path / "raw/data/train/waves_alpha_0.5.hdf5"
    other = tmp_path / "elsewhere.h5"
    with h5py.File(path, "a") as f, h5py.File(other, "w") as g:
        g["density"] = f["t0_fields/density"][()]
        attrs = dict(f["t0_fields/density"].attrs)
        del f["t0_fields/density"]
        f["t0_fields/density"] = h5py.ExternalLink(str(other), "/density")
        for k, v in attrs.items():
            g["density"].attrs[k] = v
    with pytest.raises(InputError) as err:
        the_well.read([path])
    assert err.value.path == str(path) and "t0_fields/density: an external link" in err.value.message


def _paper_file(tmp_path: Path, source: str) -> tuple[Path, str]:
    """A small raw file of one of the paper's HDF5 sources in its published layout, and the key of a field in it."""
    from dpot_data.synth import pdearena as synth_arena
    from dpot_data.synth import pdebench as synth_bench
    from dpot_data.synth.fno import synth_fno

    raw = tmp_path / "raw"
    if source == "fno":  # MAT v7.3: HDF5 behind MATLAB's 512-byte userblock
        return synth_fno(raw, n=3, frames=3, resolution=8)[1], "u"
    if source == "pdebench":
        return synth_bench.write_cfd(raw, n=2, frames=3, res=8), "Vx"
    if source == "pdebench-dr":
        return synth_bench.write_diff_react(raw, n=2, frames=3, res=8), "0001/data"
    return synth_arena.write_ns(raw, n=2, frames=3, res=8), "train/vx"


def _store_outside(tmp_path: Path, path: Path, key: str, how: str) -> None:
    """Replace dataset `key` of `path` by the same shape whose values (42.0) live outside the file, as `how` says."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    with h5py.File(path, "a") as f:
        shape, dtype = f[key].shape, f[key].dtype
        del f[key]
        values = np.full(shape, 42.0, dtype)
        if how == "external storage":
            (elsewhere / "raw.bin").write_bytes(values.tobytes())
            f.create_dataset(key, shape, dtype, external=[(str(elsewhere / "raw.bin"), 0, values.nbytes)])
            return
        with h5py.File(elsewhere / "other.h5", "w") as g:
            g["x"] = values
        if how == "external link":
            f[key] = h5py.ExternalLink(str(elsewhere / "other.h5"), "/x")
        else:
            layout = h5py.VirtualLayout(shape, dtype)
            layout[...] = h5py.VirtualSource(str(elsewhere / "other.h5"), "x", shape)
            f.create_virtual_dataset(key, layout)


@pytest.mark.parametrize("how, needle", [("external link", "an external link to"),
                                         ("virtual dataset", "a virtual dataset"),
                                         ("external storage", "stored in external raw files")])
@pytest.mark.parametrize("source", ["fno", "pdebench", "pdebench-dr", "pdearena"])
def test_paper_sources_refuse_data_stored_outside_the_file(tmp_path, source, how, needle):
    """The FNO (MAT v7.3), PDEBench and PDEArena readers make the containment check of `ingest xarray` and The
    Well: a field linked to, mapped onto or stored in another file is refused in one line naming the file and the
    dataset (before this check, an external link was followed and its values ingested)."""
    path, key = _paper_file(tmp_path, source)
    _store_outside(tmp_path, path, key, how)
    out = tmp_path / "out"
    code, output = _cli("ingest", source.split("-")[0], str(path), "--out", str(out), "--resolution", "0")
    _refused(out, code, output, f"{path}: {key}: {needle}", "expected")
    assert not out.exists()


def test_a_soft_link_inside_the_file_is_followed(tmp_path):
    """Links that stay inside the file are not refused: a field reached through a soft link is read."""
    from dpot_data.sources import pdebench

    path, key = _paper_file(tmp_path, "pdebench")
    with h5py.File(path, "a") as f:
        want = f[key][()]
        f.move(key, "stored/Vx")
        f[key] = h5py.SoftLink("/stored/Vx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fields = pdebench.read([path]).data["fields"].values
    assert np.array_equal(fields[:, :, 0], want.transpose(0, 1, 3, 2).astype(np.float32))


# ------------------------------------------------------------------------------------------ 3. hangs and sizes

def _ingest_in_subprocess(args: list[str]) -> subprocess.CompletedProcess:
    """The CLI in a subprocess with a timeout: an input that blocks fails the test instead of hanging it."""
    try:
        return subprocess.run([sys.executable, "-m", "dpot_data.cli", *args, "--no-progress"], capture_output=True,
                              text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ingest {' '.join(args)} did not finish: it blocked on a FIFO")


@pytest.mark.parametrize("name", ["b.nc", "b.npy", "chunk"])
def test_a_fifo_among_the_inputs_is_refused_without_blocking(tmp_path, name):
    folder = tmp_path / "in"
    folder.mkdir()
    axes: list[str] = []
    if name == "chunk":
        store = _zarr_store(folder / "s.zarr", np.zeros((2, 4, 4), np.float32))
        fifo, target = store / "u" / "0.0.0", store
        fifo.unlink()
    elif name == "b.nc":  # beside a NetCDF file that opens
        write_netcdf(folder, members=1, frames=3, ny=4, nx=4, name="a.nc")
        fifo, target = folder / name, folder
    else:  # beside an .npy file that opens
        np.save(folder / "a.npy", np.zeros((3, 4, 4), np.float32))
        fifo, target, axes = folder / name, folder, ["--axes", "TYX"]
    os.mkfifo(fifo)
    out = tmp_path / "out"
    done = _ingest_in_subprocess(["ingest", "xarray", str(target), "--out", str(out), *axes, "--resolution", "0"])
    _refused(out, done.returncode, done.stderr + done.stdout, str(fifo), "FIFO")


def _declared_only(tmp_path: Path, kind: str, shape: tuple[int, ...], dims: tuple[str, ...]) -> Path:
    """A small input declaring `shape` float32 values, none of them written."""
    if kind == "zarr":
        path = tmp_path / "big.zarr"
        root = zarr.open_group(str(path), mode="w", zarr_format=2)
        array = root.create_array("u", shape=shape, chunks=(1,) + shape[1:], dtype="float32")
        array.attrs["_ARRAY_DIMENSIONS"] = list(dims)
    elif kind == "netcdf":
        path = tmp_path / "big.nc"
        with h5netcdf.File(path, "w") as f:
            f.dimensions = dict(zip(dims, shape))
            f.create_variable("u", dims, np.float32, chunks=(1,) + shape[1:])
    else:
        path = tmp_path / "big.h5"
        with h5py.File(path, "w") as f:
            f.create_dataset("u", shape, np.float32, chunks=(1,) + shape[1:])
    return path


@pytest.mark.parametrize("kind", ["netcdf", "hdf5", "zarr"])
def test_a_small_input_declaring_a_huge_array_is_refused_before_anything_is_written(tmp_path, kind):
    path = _declared_only(tmp_path, kind, (10 ** 6, 10, 64, 64), ("sample", "time", "y", "x"))
    assert sum(p.stat().st_size for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()) < 1 << 20
    with pytest.raises(InputError) as err:  # the reader refuses it: no ingest that would write ~330 GB is started
        xsrc.read([path], axes="NTYX")
    assert err.value.path == str(path) and "\n" not in str(err.value)
    assert "u: declares shape (1000000, 10, 64, 64)" in err.value.message and "MAX_INFLATION" in err.value.message


def test_thousands_of_channels_are_refused_from_the_header(tmp_path):
    np.save(tmp_path / "c.npy", np.zeros((1, 2, 4, 4, 5000), np.float32))
    with pytest.raises(InputError, match=r"c\.npy: data: declares 5000 channels .* at most 256"):
        xsrc.read([tmp_path / "c.npy"], axes="NTYXC")


def test_an_input_of_thousands_of_arrays_is_refused_before_it_is_opened(tmp_path):
    path = tmp_path / "many.h5"
    with h5py.File(path, "w") as f:
        for i in range(600):
            f[f"v{i}"] = np.zeros((2, 3, 4, 4), np.float32)
    with pytest.raises(InputError, match="holds more than 512 datasets"):
        xsrc.read([path], axes="NTYX")


# ------------------------------------------------------------------------------------------ 5. one line, not a traceback

def _xr_file(tmp: Path, name: str, shape: tuple[int, ...]) -> Path:
    xr.Dataset({"u": (("sample", "time", "y", "x"), np.ones(shape))}).to_netcdf(tmp / name, engine="h5netcdf")
    return tmp / name


def _fno_empty(tmp: Path) -> Path:
    from dpot_data.synth.fno import write_mat_v5

    path = tmp / "NavierStokes_V1e-3_N2_T2.mat"
    write_mat_v5(path, np.zeros((2, 0, 8), np.float32), np.zeros((2, 0, 8, 2), np.float32),
                 np.arange(1, 3, dtype=np.float32)[None])
    return path


def _cns_empty(tmp: Path) -> Path:
    from dpot_data.synth.pdebench import write_cfd

    return write_cfd(tmp, res=0, n=2, frames=3)


def _npz(tmp: Path, name: str, broken: str) -> Path:
    import zipfile

    path = tmp / name
    if broken == "truncated":
        np.savez(path, a=np.ones((2, 3, 4, 5), np.float32))
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return path
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, archive.open("a.npy", "w") as fh:
        header = {"descr": "<f4", "fortran_order": False, "shape": (300, 10, 128, 128)}
        np.lib.format.write_array_header_1_0(fh, header)
        block = bytes(1 << 20)
        for _ in range(300 * 10 * 128 * 128 * 4 >> 20):
            fh.write(block)
    return path


def _zarr_damaged(tmp: Path) -> Path:
    path = tmp / "damaged.zarr"
    xr.Dataset({"u": (("time", "y", "x"), np.ones((3, 4, 5)))}).to_zarr(path, zarr_format=2, consolidated=False)
    for chunk in (path / "u").iterdir():
        if not chunk.name.startswith("."):
            chunk.write_bytes(b"garbage" * 3)
    return path


def _zarr_deep_attrs(tmp: Path) -> Path:
    path = tmp / "deep.zarr"
    xr.Dataset({"u": (("time", "y", "x"), np.ones((3, 4, 5)))}).to_zarr(path, zarr_format=2, consolidated=False)
    (path / ".zattrs").write_text("[" * 100_000 + "]" * 100_000)
    return path


def _huge_index(tmp: Path) -> Path:
    path = tmp / "coords.zarr"
    n = 5 * 10 ** 6
    xr.Dataset({"u": (("time", "y", "x"), dsa.zeros((3, 4, n), chunks=(1, 4, n), dtype=np.float32))},
               coords={"x": ("x", dsa.arange(n, chunks=n, dtype=np.float64))}
               ).to_zarr(path, compute=False, zarr_format=2, consolidated=False)
    return path


def _well_bad_attribute(tmp: Path) -> Path:
    write_the_well(tmp / "w", n=2, frames=3, res=8, alphas=(0.5,))
    path = tmp / "w/data/train/waves_alpha_0.5.hdf5"
    with h5py.File(path, "a") as f:
        f.attrs["n_trajectories"] = "two"
    return path


def _well_same_name(tmp: Path) -> list[Path]:
    write_the_well(tmp / "a", n=2, frames=3, res=8, alphas=(0.5,), seed=1)
    write_the_well(tmp / "b", n=2, frames=3, res=8, alphas=(0.5,), seed=2)
    return [tmp / "a/data/train/waves_alpha_0.5.hdf5", tmp / "b/data/train/waves_alpha_0.5.hdf5"]


def _well_long_name(tmp: Path) -> Path:
    path = _well_bad_attribute(tmp)
    with h5py.File(path, "a") as f:
        f.attrs["n_trajectories"] = 2
        f.attrs["dataset_name"] = "a" * 100_000  # the dataset's name, hence folder names: too long for any
    return path


def _no_frames(tmp: Path) -> Path:
    xr.Dataset({"u": (("time", "y", "x"), np.zeros((0, 4, 5), np.float32))},
               coords={"time": ("time", np.zeros(0), {"units": "s"})}).to_netcdf(tmp / "t0.nc", engine="h5netcdf")
    return tmp / "t0.nc"


def _netcdf3_cut(tmp: Path) -> Path:
    xr.Dataset({"u": (("time", "y", "x"), np.ones((3, 4, 5), np.float32))}).to_netcdf(tmp / "c.nc", engine="scipy")
    with open(tmp / "c.nc", "r+b") as fh:
        fh.truncate(32)
    return tmp / "c.nc"


def _cns_huge_value(tmp: Path) -> Path:
    """A compressible-NS file whose pressure holds 3.5e23 in trajectory 1, frame 2: what a damaged chunk decodes to
    (HDF5 chunks, lzf or uncompressed, carry no checksum)."""
    from dpot_data.synth.pdebench import write_cfd

    path = write_cfd(tmp, n=3, frames=4, res=8)
    with h5py.File(path, "a") as f:
        frames = f["pressure"][1]
        frames[2, 3, 5] = 3.5e23
        f["pressure"][1] = frames
    return path


BAD = {  # case: (make(tmp) -> path(s), CLI arguments after the paths, text expected in the one line)
    "a value of 3.5e23": (_cns_huge_value, ["pdebench"], "periodic_8_Train.hdf5: trajectory 2D_CFD_Rand_M1.0_Eta0.1_"
                          "Zeta0.1_periodic_8_Train.hdf5#1, frame 2, pressure: value 3.5e+23, beyond --max-abs 1e+15"),
    "--max-abs nan": (lambda t: _xr_file(t, "m.nc", (2, 3, 4, 5)), ["xarray", "--max-abs", "nan"],
                      "--max-abs: expected a magnitude above 0 (inf: no bound), got nan"),
    "Well dataset_name of 100 kB": (_well_long_name, ["the-well"], "dataset_name: an attribute of 100000 characters"),
    "xarray time axis of 0 frames": (_no_frames, ["xarray"], "t0.nc: time: a time axis of 0 frames; expected"),
    "NetCDF-3 file cut to 32 bytes": (_netcdf3_cut, ["xarray"], "c.nc: cannot open as NetCDF"),
    "missing local:// input": (lambda t: f"local://{t}/nothing.nc", ["xarray"],
                               "nothing.nc: not found; expected a file or folder at this URL"),
    "--workers -3": (lambda t: _xr_file(t, "w.nc", (2, 3, 4, 5)), ["xarray", "--workers", "-3"],
                     "--workers: expected a number of threads of at least 1, got -3"),
    "xarray X=0": (lambda t: _xr_file(t, "x0.nc", (2, 3, 4, 0)), ["xarray"], "at least one cell along every axis"),
    "xarray Y=0": (lambda t: _xr_file(t, "y0.nc", (2, 3, 0, 5)), ["xarray"], "at least one cell along every axis"),
    "xarray 0 trajectories": (lambda t: _xr_file(t, "n0.nc", (0, 3, 4, 5)), ["xarray"], "holds no trajectory"),
    "fno v5 X=0": (_fno_empty, ["fno"], "at least one cell along every axis"),
    "cns X=Y=0": (_cns_empty, ["pdebench"], "at least one cell along every axis"),
    "truncated npz": (lambda t: _npz(t, "t.npz", "truncated"), ["xarray", "--axes", "NTYX"], "cannot read as .npz"),
    "bombed npz": (lambda t: _npz(t, "b.npz", "bomb"), ["xarray", "--axes", "NTYX"], "compressed for it"),
    "damaged zarr chunks": (_zarr_damaged, ["xarray"], "u: cannot read its values"),
    "deep .zattrs": (_zarr_deep_attrs, ["xarray"], "nested too deeply"),
    "huge index coordinate": (_huge_index, ["xarray"], "declares an axis of 5000000 points"),
    "non-numeric Well attribute": (_well_bad_attribute, ["the-well"], "not of the type the Well's layout declares"),
    "two Well files of one name": (_well_same_name, ["the-well"], "has the same name as"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_input_is_one_line_and_leaves_nothing(tmp_path, case):
    make, args, expected = BAD[case]
    raw = tmp_path / "raw"
    raw.mkdir()
    made = make(raw)
    paths = [str(p) for p in (made if isinstance(made, list) else [made])]
    out = tmp_path / "out"
    code, output = _cli("ingest", args[0], *paths, *args[1:], "--out", str(out))
    _refused(out, code, output, expected)


def test_a_larger_max_abs_stores_such_a_value_as_read(tmp_path):
    path = _cns_huge_value(tmp_path)
    out = tmp_path / "out"
    code, output = _cli("ingest", "pdebench", str(path), "--out", str(out), "--resolution", "0", "--split", "1",
                        "--max-abs", "1e30", "--format", "zarr")
    assert code == 0, output
    fields = zarr.open_group(str(out / "data.zarr"), mode="r")["pdebench-cfd-m1-eta0p1-8/fields"][:]
    assert fields.max() == np.float32(3.5e23) and np.count_nonzero(fields == np.float32(3.5e23)) == 1


@pytest.mark.parametrize("name", ["x", "y", "sample"])
@pytest.mark.parametrize("kind", ["data variable", "2-D coordinate", "other dimension"])
def test_variables_named_like_the_canonical_dimensions_are_read(tmp_path, name, kind):
    """A data variable or a 2-D coordinate named x, y or sample beside dimensions of other names (lat, lon,
    member) used to end in xarray's name conflict when the dimensions were renamed, and a coordinate of another
    dimension so named gave the trajectories its length; the values are now read under the file's own dimension
    names, as stored."""
    dims = ("member", "time", "lat", "lon")
    rng = np.random.default_rng(0)
    u, other = rng.random((2, 3, 4, 5), dtype=np.float32), rng.random((2, 3, 4, 5), dtype=np.float32)
    ds = xr.Dataset({"u": (dims, u)}, coords={"time": ("time", np.arange(3.0), {"units": "s"}),
                                              "lat": np.linspace(-40, 40, 4), "lon": np.linspace(0, 200, 5)})
    ds = ds.assign({name: (dims, other)}) if kind == "data variable" else \
        ds.assign_coords({name: (("lat", "lon"), rng.random((4, 5)))}) if kind == "2-D coordinate" else \
        ds.assign_coords({name: (name, np.arange(7.0))})
    path = tmp_path / "in.nc"
    ds.to_netcdf(path, engine="h5netcdf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = xsrc.read([path])
    fields = result.data["fields"].values
    want = [u, other] if kind == "data variable" else [u]
    assert list(result.data["channel"].values) == (["u", name] if kind == "data variable" else ["u"])
    assert np.array_equal(fields, np.stack(want, axis=2))


def test_a_card_of_a_manifest_file_is_one_line_and_writes_nothing(tmp_path):
    path = _xr_file(tmp_path, "a.nc", (2, 3, 4, 5))
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_ingest("xarray", [path], out, IngestOptions(**OPTS))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = CliRunner().invoke(app, ["card", str(out / "manifest.json")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.splitlines() == [f"error: {out / 'manifest.json'}: a file; expected an output folder "
                                          f"holding manifest.json (give {out})"]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


# ------------------------------------------------------------------------------------------ 6. leftovers and noise

def test_an_inf_refusal_leaves_no_staging_folder(tmp_path):
    values = np.ones((2, 3, 4, 5))
    values[1, 2, 0, 0] = np.inf
    xr.Dataset({"u": (("sample", "time", "y", "x"), values)}).to_netcdf(tmp_path / "inf.nc", engine="h5netcdf")
    out = tmp_path / "out"
    code, output = _cli("ingest", "xarray", str(tmp_path / "inf.nc"), "--out", str(out), "--block", "1",
                        "--workers", "1")
    _refused(out, code, output, "holds +-Inf")
    assert not out.exists()


def test_a_zarr_store_without_consolidated_metadata_opens_without_a_warning(tmp_path):
    store = _zarr_store(tmp_path / "s.zarr", np.ones((3, 4, 5), np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = xsrc.read([store])
        result.data["fields"].values
    assert not [w for w in caught if "consolidated" in str(w.message)], [str(w.message) for w in caught]


# ------------------------------------------------------------------------------------------ 4. two machines, one URL

def test_a_loser_removing_the_winners_upload_before_its_commit_is_said_after_the_commit(tmp_path, monkeypatch):
    """Two machines ingest into one URL (their locks are local): the loser's start-up clean-up removes the
    folders the winner uploaded but had not committed yet. The winner's commit then names files it did not write,
    which the check after the commit says in one line, instead of reporting the output as written."""
    import uuid

    from dpot_data import fs
    from dpot_data.ingest import remote

    path = write_netcdf(tmp_path / "raw", members=2, frames=3, ny=8, nx=8, name="a.nc")
    url = f"memory://race-{uuid.uuid4().hex[:8]}"
    looks: list[str] = []
    original = remote._current

    def loser_starts_meanwhile(where: str, seen):
        looks.append(where)
        if len(looks) == 2:  # the winner's last look before its commit: the loser's upload starts now
            fsys, base = fs.filesystem(where)
            remote._remove_owned(fsys, base.rstrip("/"), original(where, None))  # what its upload() does first
        return original(where, seen)

    monkeypatch.setattr(remote, "_current", loser_starts_meanwhile)
    with warnings.catch_warnings(), pytest.raises(InputError) as err:
        warnings.simplefilter("ignore")
        run_ingest("xarray", [path], url, IngestOptions(**OPTS), workdir=tmp_path / "work")
    assert len(looks) == 2 and err.value.path == url and "another ingest into the same URL" in err.value.message
    assert "\n" not in str(err.value)


def test_an_undisturbed_upload_passes_the_check_after_the_commit(tmp_path):
    import uuid

    from dpot_format.validate import validate_output

    path = write_netcdf(tmp_path / "raw", members=2, frames=3, ny=8, nx=8, name="a.nc")
    url = f"memory://calm-{uuid.uuid4().hex[:8]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outcome = run_ingest("xarray", [path], url, IngestOptions(**OPTS), workdir=tmp_path / "work")
    assert outcome.written and validate_output(url) == []


@pytest.mark.parametrize("change", ["chunk rewritten", "chunk appears", "unrelated file appears"])
def test_the_check_before_publishing_compares_every_file_of_an_input_folder(tmp_path, change):
    from dpot_data.ingest.identity import InputIdentity

    store = _zarr_store(tmp_path / "in" / "s.zarr", np.ones((3, 4, 5), np.float32))
    (tmp_path / "in" / "a.nc").write_bytes(b"x")
    identity = InputIdentity.of([tmp_path / "in"])
    identity.check(full=True)
    if change == "chunk rewritten":
        chunk = store / "u" / "0.0.0"
        chunk.write_bytes(chunk.read_bytes()[::-1] + b"!")
    elif change == "chunk appears":
        (store / "u" / "1.0.0").write_bytes(b"new")
    else:
        (tmp_path / "in" / "notes.txt").write_text("not an input")
    identity.check()  # the folder itself is the same one
    if change == "unrelated file appears":
        identity.check(full=True)
    else:
        with pytest.raises(InputError, match="changed while this ingest read it"):
            identity.check(full=True)
