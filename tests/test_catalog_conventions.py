"""The catalog tells the truth about the default ingest: every pre-training set has a download location, and what
`reference` states (frames, split rule and counts, grid) is what `dpot-data ingest` with default options writes;
the downstream PDEBench sets (3D turbulence 64³, 3D random 128³, 2D turbulence 512²) ingest with the reference's
splits, and default resolution keeps 3D grids native while 2D data is resized to 128."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpot_data.catalog import Entry, load_catalog
from dpot_data.cli import app as data_app
from dpot_data.ingest import IngestOptions, run_ingest
from dpot_data.ingest.options import PER_SOURCE, default_resolution
from dpot_data.synth import cfdbench, pdearena, pdebench
from dpot_data.synth.fno import synth_fno

CATALOG = load_catalog()
PUBLISHED = ("fno", "pdebench", "pdearena", "cfdbench")  # the sources of DPOT's pre-training and downstream sets
ENTRIES = [name for name, e in CATALOG.entries.items() if e.source in PUBLISHED]


def test_every_pretraining_dataset_has_a_published_download_location() -> None:
    done = CliRunner().invoke(data_app, ["catalog", "--pretrain", "--json"])
    assert done.exit_code == 0, done.output
    listed = json.loads(done.stdout)
    assert len(listed) == 12
    for item in listed:
        download = item["download"]
        assert download is not None and download["url"].startswith("https://"), item["name"]
        assert "md5" in download or download.get("stated"), item["name"]  # a checksum or where it is stated
        assert re.fullmatch(r"[0-9a-f]{32}", download.get("md5", "0" * 32)), item["name"]
    by_name = {item["name"]: item["download"] for item in listed}
    assert by_name["fno-ns-v1e-3"]["url"] == \
        "https://drive.google.com/drive/folders/1UnbQh2WWc6knEHbLn-ZaXrKUZhp7pjt-"
    assert by_name["pdearena-ns-cond"]["url"] == "https://huggingface.co/datasets/pdearena/NavierStokes-2D-conditoned"
    assert by_name["cfdbench"]["url"] == "https://huggingface.co/datasets/chen-yingfa/CFDBench"


def test_catalog_json_states_the_default_convention_first() -> None:
    done = CliRunner().invoke(data_app, ["catalog", "fno-ns-v1e-5", "--json"])
    (item,) = json.loads(done.stdout)
    assert item["default_convention"] == "dpot-reference" and list(item["conventions"]) == ["dpot-reference",
                                                                                              "canonical"]
    default, canonical = item["conventions"]["dpot-reference"], item["conventions"]["canonical"]
    assert default["frames"] == 20 and "`a` is left out" in default["first_frame"]
    assert default["split"].startswith("dpot-reference: by index in the file, trajectories 0..999 train")
    assert default["counts"] == {"train": 1000, "test": 200} and default["t_test"] == 10
    assert canonical["frames"] == 21 and canonical["first_frame"].startswith("the initial vorticity `a`")
    assert canonical["split"].startswith("by trajectory: numpy default_rng(0).permutation") and \
        "train 0.8, valid 0.1, test rest" in canonical["split"]
    assert item["published_frames"] == 21 and "split" not in item and "frames" not in item


def test_every_catalog_entry_states_its_default_ingest() -> None:
    assert len(ENTRIES) >= 19 and all(CATALOG.get(name).reference is not None for name in ENTRIES)


def _raw(entry: Entry, folder: Path) -> list[Path]:
    """Small raw files in the published layout of `entry`, with the frame count its default ingest stores."""
    frames = int(entry.reference["frames"])
    if entry.source == "fno":
        nu = float(entry.parameters["viscosity"])
        return synth_fno(folder, n=2, frames=frames, viscosity=nu, resolution=8, dt=0.05)[:1]
    if entry.name == "pdebench-dr":
        return [pdebench.write_diff_react(folder, n=10, frames=frames, res=8)]
    if entry.name == "pdebench-swe":
        return [pdebench.write_swe(folder, n=10, frames=frames, res=8)]
    if entry.source == "pdebench":
        return [pdebench.write_cfd_published(folder, entry.files[0], n=10, frames=frames, res=6)]
    if entry.name == "pdearena-ns":
        return pdearena.write_standard(folder, n=2, frames=frames, res=8)
    if entry.name == "pdearena-ns-cond":
        return pdearena.write_conditioned(folder, n=1, frames=frames, res=8)
    assert entry.source == "cfdbench", entry.name
    cfdbench.write_cfdbench(folder, problems=("cavity",), cases=3, frames=(21, 30), res=8)
    return [folder]


def _full_set_counts(entry: Entry) -> dict[str, int] | None:
    """The split counts the reader's own rule gives for the complete public set (None: not computable by index)."""
    from dpot_data.sources import fno, pdebench as pdb

    n = entry.samples
    if entry.source == "fno":
        split, _ = fno.reference_split([f"f.mat#{i}" for i in range(n)], float(entry.parameters["viscosity"]))
    elif entry.source == "pdebench":
        split, _ = pdb.reference_split([(i, n) for i in range(n)])
    else:
        return None
    return {s: int(np.count_nonzero(split == s)) for s in ("train", "valid", "test") if np.any(split == s)}


def _plan(entry: Entry, paths: list[Path], opts: IngestOptions):
    """What `dpot-data ingest --dataset NAME` would write, planned without writing (no I/O)."""
    from dpot_data.ingest.dry_run import plan_only

    return plan_only(None, [str(p) for p in paths], opts, out=str(paths[0].parent / "out"), dataset=entry.name)[1]


@pytest.mark.parametrize("name", ENTRIES)
def test_catalog_reference_is_what_the_default_ingest_plans(name: str, tmp_path: Path) -> None:
    entry = CATALOG.get(name)
    ref = entry.reference
    raw = _raw(entry, tmp_path / "raw")
    p = _plan(entry, raw, IngestOptions())  # the defaults of `dpot-data ingest`
    assert p.frames == ref["frames"]
    if entry.source == "fno":  # frame 0 is u at t = 1: `a` (t = 0) is left out, as `first_frame` says
        assert p.time[0] == 1.0 and "`a` is left out" in ref["first_frame"]
    assert p.entry["splits"]["rule"] == ref["split"]
    assert p.entry["convention"] == {**p.entry["convention"], "name": "dpot-reference", "deviations": {}}
    if len(entry.grid) == 3:  # 3D: the native grid is kept (here the small synthetic one), as the catalog states
        assert p.grid.target == p.grid.native and ref["grid"] == list(entry.grid)
    else:
        assert list(p.grid.target) == ref["grid"] == [128, 128]
    if "t_test" in p.entry["convention"]:
        assert p.entry["convention"]["t_test"] == ref["t_test"]
    expected = _full_set_counts(entry)
    if expected is not None:
        assert ref["counts"] == expected
    canonical = entry.conventions()["canonical"]
    p = _plan(entry, raw, IngestOptions(convention="canonical"))
    assert p.frames == canonical["frames"]  # FNO: `a` kept as frame 0, one more than under dpot-reference
    if entry.source == "fno":
        assert p.time[0] == 0.0 and canonical["first_frame"].startswith("the initial vorticity `a`")
    assert p.entry["splits"]["rule"] == canonical["split"]
    assert list(p.grid.target) == (list(p.grid.native) if len(entry.grid) == 3 else canonical["grid"])


def test_default_fno_ingest_writes_what_the_catalog_states(tmp_path: Path) -> None:
    entry = CATALOG.get("fno-ns-v1e-5")
    raw = synth_fno(tmp_path / "raw", n=2, frames=20, viscosity=1e-5, resolution=8, dt=0.05)[0]
    done = run_ingest(None, [raw], tmp_path / "out", IngestOptions(formats=("wds",), stats=False))
    written = done.manifest["datasets"][0]
    assert done.entry.name == entry.name
    assert written["frames"] == entry.reference["frames"] == 20
    assert written["splits"]["rule"] == entry.reference["split"]
    assert written["grid"]["shape"] == entry.reference["grid"]
    assert written["convention"]["t_test"] == entry.reference["t_test"]


@pytest.mark.parametrize("name,split", [
    ("pdebench-cfd3d-m1-turb", {"train": 540, "test": 60}),
    ("pdebench-cfd3d-m1-rand", {"train": 90, "test": 10}),
    ("pdebench-cfd3d-m0.1-rand", {"train": 90, "test": 10}),
])
def test_downstream_3d_sets_ingest_natively_with_the_reference_split(name: str, split: dict, tmp_path: Path) -> None:
    entry = CATALOG.get(name)
    assert entry.reference["counts"] == split and entry.reference["t_test"] == 11
    raw = pdebench.write_cfd_published(tmp_path / "raw", entry.files[0], n=10, frames=21, res=6)
    done = run_ingest(None, [raw], tmp_path / "out", IngestOptions(formats=("zarr",), stats=False))
    written = done.manifest["datasets"][0]
    assert done.entry.name == entry.name
    assert done.warnings[0].startswith(f"{name}: grid [6, 6, 6] differs from the catalog's {list(entry.grid)}")
    assert written["grid"] == {"dims": ["z", "y", "x"], "shape": [6, 6, 6], "native_shape": [6, 6, 6]}
    assert written["resample"]["fields"] == "none" and written["frames"] == 21
    assert written["channels"] == ["Vx", "Vy", "Vz", "density", "pressure"]
    assert written["splits"]["rule"] == entry.reference["split"]
    assert written["splits"]["counts"] == {"train": 9, "valid": 0, "test": 1}  # the first int(0.9 N) by index
    assert written["splits"]["ids"]["test"] == [f"{raw.name}#9"]


@pytest.mark.parametrize("m", ["1.0", "0.1"])
def test_downstream_2d_turbulence_512_is_resized_to_128_by_the_reference_bilinear(m: str, tmp_path: Path) -> None:
    entry = CATALOG.get(f"pdebench-cfd-turb-m{m.rstrip('0').rstrip('.')}-eta1e-8-512")
    assert entry.dpot_name == f"ns2d_pdb_M{'1' if m == '1.0' else '1e-1'}_eta1e-8_zeta1e-8_turb_512"
    assert entry.reference["counts"] == {"train": 900, "test": 100} and entry.reference["t_test"] == 11
    raw = pdebench.write_cfd_published(tmp_path / "raw", entry.files[0], n=3, frames=21, res=16)
    done = run_ingest(None, [raw], tmp_path / "out", IngestOptions(formats=("wds",), stats=False))
    written = done.manifest["datasets"][0]
    assert done.entry.name == entry.name and len(written["channels"]) == 4 and written["frames"] == 21
    assert written["grid"]["shape"] == [128, 128] and written["grid"]["native_shape"] == [16, 16]
    assert written["resample"] == {"fields": "bilinear", "mask": "nearest", "antialias": False}
    assert written["splits"]["rule"] == entry.reference["split"]
    assert written["splits"]["counts"] == {"train": 2, "valid": 0, "test": 1}


def test_resolution_default_is_per_source() -> None:
    assert IngestOptions().resolution == PER_SOURCE
    assert default_resolution(PER_SOURCE, 2) == 128 and default_resolution(PER_SOURCE, 3) is None
    assert default_resolution(64, 3) == 64 and default_resolution(0, 2) is None and default_resolution(None, 3) is None
    from dpot_data.errors import InputError

    with pytest.raises(InputError, match="--resolution: expected a grid size >= 0"):
        default_resolution(-8, 2)


def test_cli_resolution_default_keeps_a_3d_grid_and_says_so(tmp_path: Path) -> None:
    import typer.main

    ingest = typer.main.get_command(data_app).commands["ingest"].commands["pdebench"]
    (option,) = [p for p in ingest.params if p.name == "resolution"]
    assert option.default is None and "Default per source: 128 for 2D data, native for 3D." in option.help
    runner = CliRunner()
    raw = pdebench.write_cfd(tmp_path / "raw", dims=3, m=1.0, eta=1e-8, n=2, frames=3, res=6)
    done = runner.invoke(data_app, ["ingest", "pdebench", str(raw), "--out", str(tmp_path / "out"), "--no-progress",
                                    "--format", "wds", "--no-stats"])
    assert done.exit_code == 0, done.output
    written = json.loads((tmp_path / "out" / "manifest.json").read_text())["datasets"][0]
    assert written["grid"]["shape"] == [6, 6, 6]
    done = runner.invoke(data_app, ["ingest", "pdebench", str(raw), "--out", str(tmp_path / "bad"), "--no-progress",
                                    "--resolution", "-2"])
    assert done.exit_code == 2 and "--resolution: expected a grid size >= 0" in done.output
    assert not (tmp_path / "bad").exists()
