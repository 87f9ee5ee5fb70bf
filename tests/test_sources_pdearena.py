"""PDEArena reader: float64 -> float32 values in (y, x) order, the split and buo_y from the files, a truncated file
among several skipped and reported, and errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from dpot_data.errors import InputError
from dpot_data.sources import pdearena
from dpot_data.sources.base import check_result
from dpot_data.synth import pdearena as synth


@pytest.fixture(scope="module")
def standard(tmp_path_factory) -> list[Path]:
    return synth.write_standard(tmp_path_factory.mktemp("ns"), n=2, frames=14, res=16)


@pytest.fixture(scope="module")
def conditioned(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("pdearena") / "NavierStokes-2D-conditoned"
    return synth.write_conditioned(folder, n=2, frames=6, res=16, buoyancies=(0.2, 0.4))


def test_standard_files_read_exactly_with_their_split(standard):
    result = pdearena.read(convention="canonical", paths=standard, block=1)
    check_result(result)
    ds = result.data
    assert ds.attrs["dataset"] == "pdearena-ns" and ds.attrs["boundary"] == "non-periodic"
    assert ds.attrs["parameters"] == {"buo_y": 0.5}
    assert list(ds["channel"].values) == ["u", "vx", "vy"]
    assert ds["fields"].dtype == np.float32 and ds["fields"].shape == (6, 14, 3, 16, 16)
    assert result.split.tolist() == ["train", "train", "valid", "valid", "test", "test"]
    assert list(ds["sample"].values[:3]) == [f"{standard[0].name}#0", f"{standard[0].name}#1", f"{standard[1].name}#0"]
    values = ds["fields"].values
    with h5py.File(standard[1]) as f:
        assert f["valid/u"].dtype == np.float64
        for c, key in enumerate(["u", "vx", "vy"]):
            raw = f[f"valid/{key}"][()]  # (N, T, x, y)
            np.testing.assert_array_equal(values[2:4, :, c], np.swapaxes(raw, 2, 3).astype(np.float32))
        np.testing.assert_array_equal(ds["time"].values, f["valid/t"][0])
        np.testing.assert_array_equal(ds["x"].values, f["valid/x"][0])
    assert result.sample_params["buo_y"].tolist() == [0.5] * 6
    assert ds.attrs["dt"] == 6.0


def test_plume_rises_along_y(standard):
    """Buoyancy acts along y: the smoke's centre of mass must move to larger y rows, not columns."""
    u = pdearena.read(convention="canonical", paths=standard[:1]).data["fields"].values[0, :, 0]  # (T, y, x)
    rows = np.arange(u.shape[1])
    centre_y = (u.sum(axis=2) * rows).sum(axis=1) / u.sum(axis=(1, 2))
    assert centre_y[-1] > centre_y[0] + 1.0


def test_conditioned_set_keeps_buo_y_per_trajectory(conditioned):
    result = pdearena.read(convention="canonical", paths=conditioned)
    ds = result.data
    assert ds.attrs["dataset"] == "pdearena-ns-cond"
    assert ds.attrs["parameters"] == {}
    assert result.sample_params["buo_y"].tolist() == [0.2, 0.2, 0.4, 0.4, 0.2, 0.2, 0.4, 0.4]
    assert result.split.tolist() == ["train"] * 4 + ["valid"] * 2 + ["test"] * 2


def test_truncated_file_among_three_is_skipped_and_reported(standard, tmp_path):
    copies = []
    for p in standard:
        q = tmp_path / p.name
        q.write_bytes(p.read_bytes())
        copies.append(q)
    broken = copies[1]
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size * 2 // 3])
    result = pdearena.read(convention="canonical", paths=copies)
    assert result.skipped and result.skipped[0][0] == broken.name
    assert "truncated" in result.skipped[0][1]
    assert result.split.tolist() == ["train", "train", "test", "test"]
    assert result.inputs == [copies[0], copies[2]]
    assert np.isfinite(result.data["fields"].values).all()


def test_unreadable_file_is_skipped_and_a_missing_key_is_an_error(standard, tmp_path):
    junk = tmp_path / "NavierStokes2D_valid_9_0.50000.h5"
    junk.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    result = pdearena.read(convention="canonical", paths=[standard[0], junk])
    assert [w for w, _ in result.skipped] == [junk.name]
    nokey = tmp_path / "NavierStokes2D_test_5_0.50000.h5"
    with h5py.File(standard[2]) as src, h5py.File(nokey, "w") as dst:
        g = dst.create_group("test")
        for k in ("u", "vx", "t", "x", "y", "buo_y"):
            src.copy(f"test/{k}", g)
    with pytest.raises(InputError, match=rf"{nokey.name}: group 'test': missing key\(s\) \['vy'\]"):
        pdearena.read(convention="canonical", paths=[standard[0], nokey])


def test_standard_and_conditioned_files_do_not_mix(standard, conditioned):
    with pytest.raises(InputError, match=r"expected 14 frames on a 16x16 grid .* different datasets"):
        pdearena.read(convention="canonical", paths=[standard[0], conditioned[0]])


def test_file_names_parse():
    assert pdearena.parse_name(Path("NavierStokes2D_train_101_0.50000_100.h5")) == {
        "split": "train", "seed": 101, "buo_y": 0.5, "n": 100}
    assert pdearena.parse_name(Path("NavierStokes2D_test_7_0.31250.h5"))["buo_y"] == 0.3125
    assert pdearena.parse_name(Path("other.h5")) is None


# ------------------------------------------------------------------------------------------------ through ingest

def _ingest(paths, out, **options):
    import zarr

    from dpot_data.ingest import IngestOptions, ingest

    opts = IngestOptions(convention="canonical", stats=False, **{"formats": ("zarr",), **options})
    manifest = ingest(pdearena.read(convention="canonical", paths=paths), out, opts).manifest
    entry = manifest["datasets"][0]
    return entry, zarr.open_group(str(out / "data.zarr" / entry["name"]), mode="r")


def test_ingest_native_exact_and_split_from_files(standard, tmp_path):
    entry, group = _ingest(standard, tmp_path / "out", resolution=None)
    assert entry["splits"]["counts"] == {"train": 2, "valid": 2, "test": 2}
    assert entry["splits"]["rule"] == "from the files: train, valid and test files"
    ids, splits = list(group["sample"][:]), list(group["split"][:])
    with h5py.File(standard[2]) as f:
        raw = np.stack([np.swapaxes(f[f"test/{k}"][()], 2, 3) for k in ("u", "vx", "vy")], axis=2).astype(np.float32)
    rows = [ids.index(f"{standard[2].name}#{i}") for i in range(2)]
    np.testing.assert_array_equal(group["fields"][:][rows, :, :3], raw)
    assert [splits[r] for r in rows] == ["test", "test"]
    assert group["buo_y"][:].tolist() == [0.5] * 6


def test_ingest_at_128_shards_carry_buo_y(conditioned, tmp_path):
    import io
    import json
    import tarfile

    entry, group = _ingest(conditioned, tmp_path / "out", formats=("zarr", "wds"))
    assert group["fields"].shape == (8, 6, 4, 128, 128)
    assert entry["channels"] == ["u", "vx", "vy", "pad3"] and entry["channel_valid"] == [True, True, True, False]
    assert entry["resample"] == {"fields": "bilinear-antialias", "mask": "nearest", "antialias": False}
    metas = []
    for shard in entry["shards"]:
        with tarfile.open(tmp_path / "out" / shard["path"]) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".meta.json"):
                    metas.append(json.load(tar.extractfile(member)))
                if member.name.endswith(".fields.npy"):
                    arr = np.load(io.BytesIO(tar.extractfile(member).read()), allow_pickle=False)
                    assert arr.shape == (6, 4, 128, 128) and arr.dtype == np.float32
    assert sorted(m["params"]["buo_y"] for m in metas) == [0.2] * 4 + [0.4] * 4


def test_ingest_truncated_file_among_three_is_skipped_in_the_manifest(standard, tmp_path):
    copies = []
    for p in standard:
        q = tmp_path / p.name
        q.write_bytes(p.read_bytes())
        copies.append(q)
    copies[0].write_bytes(copies[0].read_bytes()[:5000])
    entry, group = _ingest(copies, tmp_path / "out")
    assert [s["what"] for s in entry["skipped"]] == [copies[0].name]
    assert "truncated" in entry["skipped"][0]["reason"]
    assert entry["trajectories"] == 4 and entry["splits"]["counts"] == {"train": 0, "valid": 2, "test": 2}
    assert sorted(Path(i["path"]).name for i in entry["inputs"]) == sorted(p.name for p in copies[1:])


def test_nonfinite_trajectory_is_left_out_and_counted(standard, tmp_path):
    copy = tmp_path / standard[0].name
    copy.write_bytes(standard[0].read_bytes())
    with h5py.File(copy, "a") as f:
        f["train/vx"][1, 5, 3, 4] = np.nan
        f["train/u"][1, 7, 0, 0] = np.inf
    result = pdearena.read(convention="canonical", paths=[copy, standard[1]])
    assert result.skipped == [(f"{copy.name}#1", "NaN or Inf in 2 of 14 frames (first: frame 5)")]
    assert list(result.data["sample"].values) == [f"{copy.name}#0", f"{standard[1].name}#0", f"{standard[1].name}#1"]
    assert result.split.tolist() == ["train", "valid", "valid"] and len(result.sample_params["buo_y"]) == 3
    entry, group = _ingest([copy, standard[1]], tmp_path / "out")
    assert entry["trajectories"] == 3
    assert entry["skipped"] == [{"what": f"{copy.name}#1", "reason": "NaN or Inf in 2 of 14 frames (first: frame 5)"}]
    assert np.isfinite(group["fields"][:]).all()
    kept = pdearena.read(convention="canonical", paths=[copy], check_finite=False)
    assert kept.n_samples == 2 and kept.skipped == []


def test_synth_layout_follows_formats_md(standard, conditioned):
    assert [p.name for p in standard] == ["NavierStokes2D_train_0_0.50000_2.h5", "NavierStokes2D_valid_1_0.50000.h5",
                                          "NavierStokes2D_test_2_0.50000.h5"]
    with h5py.File(standard[0]) as f:
        assert list(f.keys()) == ["train"]
        g = f["train"]
        assert sorted(g.keys()) == ["buo_y", "dt", "dx", "dy", "t", "u", "vx", "vy", "x", "y"]
        assert g["u"].shape == (2, 14, 16, 16) and g["u"].dtype == np.float64 and g["u"].compression is None
        assert g["t"].shape == (2, 14) and g["x"].shape == (2, 16) and g["buo_y"].shape == (2,)
        assert g["x"][0, 0] == 0.0 and g["x"][0, -1] == 32.0
    assert conditioned[0].parent.name == "NavierStokes-2D-conditoned"


def test_values_beyond_float32_count_as_nonfinite(standard, tmp_path):
    copy = tmp_path / standard[1].name
    copy.write_bytes(standard[1].read_bytes())
    with h5py.File(copy, "a") as f:
        f["valid/vy"][0, 2, 1, 1] = 1e300  # finite in the float64 file, Inf once stored as float32
    result = pdearena.read(convention="canonical", paths=[copy])
    assert result.skipped == [(f"{copy.name}#0", "NaN or Inf in 1 of 14 frames (first: frame 2)")]
