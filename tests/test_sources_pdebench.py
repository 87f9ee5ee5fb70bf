"""PDEBench reader: exact values from the synth writers and the real-format diffusion–reaction fixture, parameters,
safe handling of the `config` attribute, and errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from dpot_data.errors import InputError
from dpot_data.sources import pdebench
from dpot_data.sources.base import check_result
from dpot_data.synth import pdebench as synth

FIXTURE = "2D_diff-react_NA_NA.h5"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pdebench")
    return {
        "cfd": synth.write_cfd(d, m=0.1, eta=0.01, n=3, frames=5, res=16),
        "cfd_noattrs": synth.write_cfd(d / "noattrs", m=1.0, eta=0.1, n=2, frames=3, res=8, with_attrs=False),
        "cfd3d": synth.write_cfd(d, dims=3, m=1.0, eta=1e-8, n=2, frames=3, res=6),
        "dr": synth.write_diff_react(d, n=3, frames=4, res=16),
        "swe": synth.write_swe(d, n=3, frames=4, res=16),
    }


def test_cfd_reads_raw_values_exactly_in_dpot_channel_order(files):
    result = pdebench.read(convention="canonical", paths=[files["cfd"]], block=2)
    check_result(result)
    ds = result.data
    assert ds.attrs["dataset"] == "pdebench-cfd-m0p1-eta0p01-16"
    assert ds.attrs["parameters"] == {"M": 0.1, "eta": 0.01, "zeta": 0.01, "kind": "Rand"}
    assert ds.attrs["boundary"] == "periodic"
    assert list(ds["channel"].values) == ["Vx", "Vy", "density", "pressure"]
    assert ds["fields"].dtype == np.float32 and ds["fields"].shape == (3, 5, 4, 16, 16)
    assert ds["fields"].chunks[0] == (2, 1)  # lazy, in blocks of whole trajectories
    values = ds["fields"].values
    with h5py.File(files["cfd"]) as f:
        for c, name in enumerate(["Vx", "Vy", "density", "pressure"]):
            np.testing.assert_array_equal(values[:, :, c], np.swapaxes(f[name][()], 2, 3))  # (N,T,X,Y) -> (y, x)
        np.testing.assert_array_equal(ds["time"].values, f["t-coordinate"][:5].astype(np.float64))  # 6 stored
        np.testing.assert_array_equal(ds["x"].values, f["x-coordinate"][()].astype(np.float64))
    assert list(ds["sample"].values) == [f"{files['cfd'].name}#{i}" for i in range(3)]
    assert ds["mask"].values.min() == 1


def test_cfd_axis_order_is_physical(files):
    """The synth field is an analytic function of (x, y): the reader's (y, x) frame must equal it on the grid."""
    ds = pdebench.read(convention="canonical", paths=[files["cfd"]]).data
    yy, xx = np.meshgrid(ds["y"].values, ds["x"].values, indexing="ij")
    expected = synth.cfd_channel(1, 2)((xx, yy), float(ds["time"].values[3]))
    np.testing.assert_allclose(ds["fields"].values[1, 3, 2], expected, atol=1e-6)


def test_cfd_parameters_from_name_when_no_attributes(files):
    ds = pdebench.read(convention="canonical", paths=[files["cfd_noattrs"]]).data
    assert ds.attrs["parameters"]["M"] == 1.0 and ds.attrs["parameters"]["eta"] == 0.1
    assert ds.attrs["provenance"]["files"][files["cfd_noattrs"].name]["parameters_from"] == "file name"
    assert ds.attrs["dataset"] == "pdebench-cfd-m1-eta0p1-8"


def test_cfd3d_is_written_as_3d_fields(files):
    result = pdebench.read(convention="canonical", paths=[files["cfd3d"]])
    check_result(result)
    ds = result.data
    assert ds["fields"].dims == ("sample", "time", "channel", "z", "y", "x")
    assert ds["mask"].dims == ("sample", "z", "y", "x")
    assert list(ds["channel"].values) == ["Vx", "Vy", "Vz", "density", "pressure"]
    assert ds.attrs["dataset"] == "pdebench-cfd3d-m1-rand"
    with h5py.File(files["cfd3d"]) as f:
        raw = f["Vz"][()]  # (N, T, X, Y, Z)
    np.testing.assert_array_equal(ds["fields"].values[:, :, 2], np.transpose(raw, (0, 1, 4, 3, 2)))


@pytest.mark.parametrize("kind,channels,name", [("dr", ["u", "v"], "pdebench-dr"), ("swe", ["h"], "pdebench-swe")])
def test_grouped_files_read_exactly(files, kind, channels, name):
    result = pdebench.read(convention="canonical", paths=[files[kind]])
    check_result(result)
    ds = result.data
    assert ds.attrs["dataset"] == name and ds.attrs["boundary"] == "non-periodic"
    assert list(ds["channel"].values) == channels
    with h5py.File(files[kind]) as f:
        # the SWE synth writes groups in reverse order, as workers finishing out of order do: ids are sorted
        assert list(f.keys()) == ["0000", "0001", "0002"]
        assert list(ds["sample"].values) == [f"{files[kind].name}#{g:04d}" for g in range(3)]
        for i in range(3):
            np.testing.assert_array_equal(ds["fields"].values[i], np.moveaxis(f[f"{i:04d}/data"][()], -1, 1))
        np.testing.assert_array_equal(ds["time"].values, f["0000/grid/t"][()].astype(np.float64))
        np.testing.assert_array_equal(ds["y"].values, f["0000/grid/y"][()].astype(np.float64))
        config = f["0000"].attrs["config"]
    assert result.sample_params["seed"].tolist() == [0, 1, 2]
    assert ds.attrs["provenance"]["files"][files[kind].name]["config"] == config  # verbatim


def test_real_diffusion_reaction_fixture(raw_fixtures):
    path = raw_fixtures / FIXTURE
    result = pdebench.read(convention="canonical", paths=[path])
    check_result(result)
    ds = result.data
    assert ds["fields"].shape == (3, 21, 2, 128, 128)
    assert ds.attrs["parameters"] == {"pde": "diffusion-reaction", "Du": 0.001, "Dv": 0.005, "k": 0.005}
    assert ds.attrs["dt"] == 0.25 and ds["x"].values[0] == -0.9921875
    with h5py.File(path) as f:
        np.testing.assert_array_equal(ds["fields"].values[2, 7], np.moveaxis(f["0002/data"][7], -1, 0))
        config = f["0000"].attrs["config"]
    # the attribute really carries a Python tag that a safe loader refuses and an unsafe one would execute
    with pytest.raises(yaml.constructor.ConstructorError):
        yaml.safe_load(config)
    assert ds.attrs["provenance"]["files"][FIXTURE]["config"] == config
    parsed = pdebench.parse_config(config)
    assert parsed["output_path"] == {"tag": "tag:yaml.org,2002:python/object/apply:pathlib.PosixPath",
                                     "value": ["/", "data", "pdebench", "2D_diff-react_NA_NA",
                                               "2D_diff-react_NA_NA.h5"]}
    assert parsed["work_dir"] == "${hydra:runtime.cwd}"
    assert result.sample_params["seed"].tolist() == [0, 1, 2]


def test_parse_config_never_builds_objects():
    text = "a: !!python/object/apply:os.system ['echo unsafe']\nb: !!python/name:builtins.print ''\nc: 1\n"
    assert pdebench.parse_config(text) == {
        "a": {"tag": "tag:yaml.org,2002:python/object/apply:os.system", "value": ["echo unsafe"]},
        "b": {"tag": "tag:yaml.org,2002:python/name:builtins.print", "value": ""}, "c": 1}


def test_missing_key_and_wrong_shape_name_the_file_and_key(tmp_path, files):
    bad = tmp_path / "2D_CFD_Rand_M1.0_Eta0.1_Zeta0.1_periodic_128_Train.hdf5"
    with h5py.File(files["cfd"]) as src, h5py.File(bad, "w") as dst:
        for k in ("Vx", "Vy", "density", "t-coordinate"):
            src.copy(k, dst)
    with pytest.raises(InputError, match=rf"{bad.name}: expected datasets .* missing \['pressure'\]"):
        pdebench.read(convention="canonical", paths=[bad])
    with h5py.File(bad, "a") as f:
        f.create_dataset("pressure", data=np.zeros((3, 5, 16, 8), np.float32))
    with pytest.raises(InputError, match=r"expected 'pressure' of shape \(3, 5, 16, 16\) like 'density', "
                                         r"found \(3, 5, 16, 8\)"):
        pdebench.read(convention="canonical", paths=[bad])
    grouped = tmp_path / "2D_diff-react_NA_NA.h5"
    with h5py.File(grouped, "w") as f:
        f.create_group("0000").create_dataset("data", data=np.zeros((2, 4, 4, 2), np.float32))
        f.create_group("0001").create_group("grid")
    with pytest.raises(InputError, match=r"2D_diff-react_NA_NA.h5: group '0001': expected dataset 'data'"):
        pdebench.read(convention="canonical", paths=[grouped])


def test_truncated_single_file_is_an_error_naming_it(tmp_path, files):
    cut = tmp_path / files["cfd"].name
    cut.write_bytes(files["cfd"].read_bytes()[: files["cfd"].stat().st_size // 2])
    with pytest.raises(InputError, match=rf"{cut.name}: .*truncated"):
        pdebench.read(convention="canonical", paths=[cut])


def test_dataset_names_follow_the_catalog():
    assert pdebench.cfd_dataset_name(kind="Rand", m=1.0, eta=0.01, zeta=0.01, res=128, dims=2) == \
        "pdebench-cfd-m1-eta0.01"
    assert pdebench.cfd_dataset_name(kind="Turb", m=0.1, eta=1e-8, zeta=1e-8, res=512, dims=2) == \
        "pdebench-cfd-turb-m0.1-eta1e-8-512"
    assert pdebench.cfd_dataset_name(kind="Rand", m=0.1, eta=1e-8, zeta=1e-8, res=None, dims=3) == \
        "pdebench-cfd3d-m0.1-rand"
    assert pdebench.parse_cfd_name(Path("2D_CFD_Rand_M0.1_Eta1e-08_Zeta1e-08_periodic_512_Train.hdf5")) == {
        "M": 0.1, "eta": 1e-8, "zeta": 1e-8, "kind": "Rand", "dims": 2, "res": 512}


# ------------------------------------------------------------------------------------------------ through ingest

def _ingest(paths, out, **options):
    import zarr

    from dpot_data.ingest import IngestOptions, ingest

    opts = IngestOptions(convention="canonical", formats=("zarr",), stats=False, **options)
    manifest = ingest(pdebench.read(convention="canonical", paths=paths), out, opts).manifest
    entry = manifest["datasets"][0]
    return entry, zarr.open_group(str(out / "data.zarr" / entry["name"]), mode="r")


def test_ingest_at_native_resolution_reproduces_raw_values(files, tmp_path):
    entry, group = _ingest([files["cfd"]], tmp_path / "cfd", resolution=None)
    assert entry["resample"] == {"fields": "none", "mask": "none", "antialias": False}
    with h5py.File(files["cfd"]) as f:
        raw = np.stack([np.swapaxes(f[k][()], 2, 3) for k in ("Vx", "Vy", "density", "pressure")], axis=2)
    ids = list(group["sample"][:])
    order = [ids.index(f"{files['cfd'].name}#{i}") for i in range(3)]
    np.testing.assert_array_equal(group["fields"][:][order], raw)
    assert entry["channel_valid"] == [True] * 4

    entry, group = _ingest([files["dr"]], tmp_path / "dr", resolution=None)
    with h5py.File(files["dr"]) as f:
        raw = np.stack([np.moveaxis(f[f"{i:04d}/data"][()], -1, 1) for i in range(3)])
    ids = list(group["sample"][:])
    fields = group["fields"][:][[ids.index(f"{files['dr'].name}#{i:04d}") for i in range(3)]]
    np.testing.assert_array_equal(fields[:, :, :2], raw)
    assert np.all(fields[:, :, 2:] == 1.0)  # padded with the recorded fill value
    assert entry["channels"] == ["u", "v", "pad2", "pad3"] and entry["channel_valid"] == [True, True, False, False]


@pytest.mark.parametrize("kind,channels,method", [
    ("cfd", ["Vx", "Vy", "density", "pressure"], "fourier"),
    ("dr", ["u", "v", "pad2", "pad3"], "bilinear-antialias"),  # the canonical convention's name
    ("swe", ["h", "pad1", "pad2", "pad3"], "bilinear-antialias"),
])
def test_ingest_at_128_has_dpots_layout(files, tmp_path, kind, channels, method):
    entry, group = _ingest([files[kind]], tmp_path / kind)
    assert group["fields"].shape[2:] == (4, 128, 128) and group["mask"].shape[1:] == (128, 128)
    assert entry["channels"] == channels
    assert entry["channel_valid"] == [not c.startswith("pad") for c in channels]
    assert entry["grid"] == {"dims": ["y", "x"], "shape": [128, 128], "native_shape": [16, 16]}
    assert entry["resample"]["fields"] == method
    assert np.isfinite(group["fields"][:]).all()


def test_ingest_3d_keeps_three_spatial_axes(files, tmp_path):
    entry, group = _ingest([files["cfd3d"]], tmp_path / "cfd3d", resolution=None, channels=5)
    assert group["fields"].shape == (2, 3, 5, 6, 6, 6) and entry["grid"]["dims"] == ["z", "y", "x"]
    with h5py.File(files["cfd3d"]) as f:
        raw = np.transpose(f["density"][()], (0, 1, 4, 3, 2))
    ids = list(group["sample"][:])
    np.testing.assert_array_equal(group["fields"][:][[ids.index(f"{files['cfd3d'].name}#{i}") for i in range(2)], :, 3],
                                  raw)


def test_real_fixture_ingests_with_its_config_as_provenance(raw_fixtures, tmp_path):
    path = raw_fixtures / FIXTURE
    entry, group = _ingest([path], tmp_path / "dr")
    assert entry["name"] == "pdebench-dr" and entry["trajectories"] == 3 and entry["frames"] == 21
    assert entry["parameters"]["Du"] == 0.001 and entry["dt"] == 0.25 and entry["skipped"] == []
    assert entry["resample"]["fields"] == "none"
    with h5py.File(path) as f:
        assert entry["provenance"]["files"][FIXTURE]["config"] == f["0001"].attrs["config"].replace(
            "seed: 1", "seed: 0")  # the first group's text, verbatim
        raw = np.moveaxis(f["0001/data"][()], -1, 1)
    ids = list(group["sample"][:])
    np.testing.assert_array_equal(group["fields"][ids.index(f"{FIXTURE}#0001")][:, :2], raw)
    assert entry["inputs"][0]["sha256"] == "d921d968951ce025361f06db702c6467aca23d0634faaef061e88673ce664b9b"


def test_synth_layouts_follow_formats_md(files):
    with h5py.File(files["cfd"]) as f:
        assert sorted(f.keys()) == ["Vx", "Vy", "density", "pressure", "t-coordinate", "x-coordinate", "y-coordinate"]
        assert f["density"].shape == (3, 5, 16, 16) and f["density"].dtype == np.float32
        assert f["density"].compression is None
        assert f["t-coordinate"].shape == (6,)  # one more time than stored frames, as the generator writes
        assert 0 < f["x-coordinate"][0] < f["x-coordinate"][-1] < 1
        assert dict(f.attrs) == {"M": 0.1, "eta": 0.01, "zeta": 0.01}
    with h5py.File(files["cfd3d"]) as f:
        assert files["cfd3d"].name == "3D_CFD_Rand_M1.0_Eta1e-08_Zeta1e-08_periodic_Train.hdf5"
        assert f["Vz"].shape == (2, 3, 6, 6, 6) and "z-coordinate" in f
    for kind, channels, lo in (("dr", 2, -1.0), ("swe", 1, -2.5)):
        with h5py.File(files[kind]) as f:
            assert list(f.attrs) == [] and "grid" not in f  # no top-level grid
            g = f["0001"]
            assert g["data"].shape == (4, 16, 16, channels) and g["data"].dtype == np.float32
            assert g["data"].compression == "lzf" and g["data"].chunks is not None
            assert all(g[f"grid/{a}"].compression == "lzf" for a in "xyt")
            assert g["grid/x"][0] == pytest.approx(lo + (-lo) / 16)
            config = g.attrs["config"]
            assert isinstance(config, str) and "!!python/object/apply:pathlib.PosixPath" in config
            assert "${hydra:runtime.cwd}" in config and "seed: 1" in config


def test_corrupt_chunk_skips_only_its_trajectory(tmp_path):
    path = synth.write_diff_react(tmp_path, n=3, frames=8, res=16)
    with h5py.File(path) as f:
        chunk = f["0001/data"].id.get_chunk_info(0)
    with open(path, "r+b") as fh:  # the file still opens; one compressed chunk of sample 0001 is garbage
        fh.seek(chunk.byte_offset)
        fh.write(b"\xff" * chunk.size)
    result = pdebench.read(convention="canonical", paths=[path], block=3)
    assert [w for w, _ in result.skipped] == [f"{path.name}#0001"]
    assert result.skipped[0][1].startswith("unreadable (corrupt data): OSError")
    assert list(result.data["sample"].values) == [f"{path.name}#0000", f"{path.name}#0002"]
    assert result.sample_params["seed"].tolist() == [0, 2]
    with h5py.File(path) as f:  # the kept trajectories are read without touching the corrupt one
        np.testing.assert_array_equal(result.data["fields"].values[1], np.moveaxis(f["0002/data"][()], -1, 1))


def test_truncated_file_among_three_is_skipped(files, tmp_path):
    copies = []
    for k in range(3):
        q = tmp_path / f"part{k}" / files["dr"].name.replace("NA_NA", f"NA_NA_{k}")
        q.parent.mkdir()
        q.write_bytes(files["dr"].read_bytes())
        copies.append(q)
    copies[2].write_bytes(copies[2].read_bytes()[:4096])
    result = pdebench.read(convention="canonical", paths=copies)
    assert [w for w, _ in result.skipped] == [copies[2].name] and "truncated" in result.skipped[0][1]
    assert result.n_samples == 6 and result.inputs == copies[:2]
    same = tmp_path / "other" / copies[0].name
    same.parent.mkdir()
    same.write_bytes(copies[0].read_bytes())
    with pytest.raises(InputError, match="has the same file name as"):
        pdebench.read(convention="canonical", paths=[copies[0], same])


def test_synth_dr_t_end_spaces_the_frames_and_a_bad_one_exits_2(tmp_path):
    """`dpot-data synth pdebench-dr --t-end 20`: frames at 0..20 (the published t = 5 by default), the fields the
    exact diffusion solution at those times, the config saying t: 20; --t-end 0 is one line, exit 2, no file."""
    from typer.testing import CliRunner

    from dpot_data.cli import app

    runner = CliRunner()
    done = runner.invoke(app, ["synth", "pdebench-dr", "--out", str(tmp_path / "raw"), "--n", "2", "--frames", "5",
                               "--res", "8", "--t-end", "20"])
    assert done.exit_code == 0, done.output
    with h5py.File(tmp_path / "raw" / "2D_diff-react_NA_NA.h5") as f:
        t = f["0001/grid/t"][()]
        np.testing.assert_array_equal(t, np.float32([0, 5, 10, 15, 20]))
        x = f["0001/grid/x"][()]
        np.testing.assert_array_equal(f["0001/data"][()], synth.dr_fields(1, x, x, t))
        assert "  t: 20.0\n" in f["0001"].attrs["config"]
    assert not np.array_equal(synth.dr_fields(1, x, x, t), synth.dr_fields(1, x, x, np.linspace(0, 5, 5)))
    bad = runner.invoke(app, ["synth", "pdebench-dr", "--out", str(tmp_path / "bad"), "--t-end", "0"])
    assert bad.exit_code == 2 and "Invalid value for --t-end: expected a time > 0, got 0.0" in bad.output
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="t_end: expected a time > 0, got -1"):
        synth.write_diff_react(tmp_path / "lib", t_end=-1)
    assert not (tmp_path / "lib").exists()
