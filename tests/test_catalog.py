"""The checked-in dataset catalog and the DPOT pre-training mixture: valid, complete, and used to warn on odd input."""

from __future__ import annotations

import re
from pathlib import Path

import dask.array as da
import pytest
import xarray as xr
import yaml

from dpot_data.catalog import CatalogError, compare, load_catalog, load_mixture, manifest_name
from dpot_data.sources.base import ReadResult

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_catalog_has_dpots_twelve_pretraining_sets_and_the_3d_sets(catalog):
    pretrain = [e.dpot_name for e in catalog.pretrain()]
    assert pretrain == [
        "ns2d_fno_1e-5", "ns2d_fno_1e-4", "ns2d_fno_1e-3",
        "ns2d_pdb_M1_eta1e-1_zeta1e-1", "ns2d_pdb_M1_eta1e-2_zeta1e-2",
        "ns2d_pdb_M1e-1_eta1e-1_zeta1e-1", "ns2d_pdb_M1e-1_eta1e-2_zeta1e-2",
        "dr_pdb", "swe_pdb", "ns2d_pda", "ns2d_cond_pda", "cfdbench",
    ]
    three_d = [e for e in catalog.entries.values() if len(e.grid) == 3 and e.source != "the_well"]
    assert {e.dpot_name for e in three_d} == {"ns3d_pdb_M1_rand", "ns3d_pdb_M1e-1_rand", "ns3d_pdb_M1_turb"}
    assert all(e.channels == ("Vx", "Vy", "Vz", "density", "pressure") for e in three_d)


def test_catalog_entries_follow_formats_md(catalog):
    cfd = catalog.get("pdebench-cfd-m1-eta0.1")
    assert cfd.channels == ("Vx", "Vy", "density", "pressure") and cfd.frames == 21 and cfd.samples == 10000
    assert cfd.boundary == "periodic" and cfd.grid == (128, 128) and cfd.parameters == {"M": 1.0, "eta": 0.1, "zeta": 0.1}
    assert catalog.get("pdearena-ns").split.rule == "file"
    assert catalog.get("pdearena-ns-cond").frames == 56 and catalog.get("pdearena-ns").frames == 14
    cfdb = catalog.get("cfdbench")
    assert cfdb.frames is None and cfdb.segment == 20 and cfdb.split.ratios == {"train": 0.8, "valid": 0.1, "test": 0.1}
    assert catalog.get("pdebench-dr").channels == ("u", "v") and catalog.get("pdebench-swe").channels == ("h",)
    for e in catalog.entries.values():
        if e.frames is not None and e.rollout is not None:
            assert 0 < e.rollout < e.frames, e.name


def test_names_map_to_manifest_names_and_back(catalog):
    assert manifest_name("pdebench-cfd-m0.1-eta0.01") == "pdebench-cfd-m0p1-eta0p01"
    assert catalog.get("pdebench-cfd-m0p1-eta0p01") is catalog.get("pdebench-cfd-m0.1-eta0.01")
    with pytest.raises(KeyError, match="unknown dataset 'pdebench-cfd-m9'.*pdebench-cfd-m1-eta0.1"):
        catalog.get("pdebench-cfd-m9")
    with pytest.raises(ValueError, match="cannot be written as a manifest name"):
        manifest_name("bad name!")


def test_files_identify_their_dataset(catalog):
    names = lambda paths: [e.name for e in catalog.match_files(paths)]  # noqa: E731
    assert names(["/data/2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5"]) == ["pdebench-cfd-m0.1-eta0.01"]
    assert names(["/data/2D_rdb_NA_NA.h5"]) == ["pdebench-swe"]
    assert names(["/d/NavierStokes2D_train_1_0.50000_100.h5", "/d/NavierStokes2D_valid_1_0.50000.h5"]) == [
        "pdearena-ns", "pdearena-ns-cond"]
    assert names(["/d/cfdb/dam/bc/case0003/case.json"]) == ["cfdbench"]
    assert names(["/d/unrelated.h5"]) == []


def test_mixture_weights_every_pretraining_set(catalog):
    weights = load_mixture("dpot-pretrain", catalog)
    assert weights == {e.manifest_name: e.weight for e in catalog.pretrain()}  # the catalog and the mixture agree
    assert all(w > 0 for w in weights.values())
    assert all(e.weight is None for e in catalog.entries.values() if not e.pretrain)
    # the training side reads the same file with its own parser: its keys are manifest names
    raw = yaml.safe_load((ROOT / "manifests" / "mixtures" / "dpot-pretrain.yaml").read_text())
    assert set(raw["weights"]) == set(weights)


def test_malformed_catalog_names_entry_and_key(tmp_path):
    bad = {"datasets": [{"name": "x", "source": "pdebench", "files": ["a.h5"], "channels": ["u"], "frames": 0,
                         "samples": 1, "grid": [8, 8], "boundary": "periodic", "split": {"rule": "file"},
                         "pretrain": False, "weight": None, "rollout": None, "parameters": {}}]}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(CatalogError, match=r"datasets\[0\] \(x\): frames must be a positive integer"):
        load_catalog(path)
    bad["datasets"][0].update(frames=3, boundary="open")
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(CatalogError, match="boundary must be one of"):
        load_catalog(path)
    bad["datasets"][0].update(boundary="periodic", split={"rule": "random", "ratios": {"train": 0.5}})
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(CatalogError, match="split.ratios"):
        load_catalog(path)
    bad["datasets"][0].update(split={"rule": "file"}, pretrain=True)
    path.write_text(yaml.safe_dump(bad))
    with pytest.raises(CatalogError, match="weight must be a positive number for a pre-training dataset"):
        load_catalog(path)


def _result(n: int, frames: int, channels: list[str], grid: int, **attrs) -> ReadResult:
    data = xr.Dataset(
        {"fields": (("sample", "time", "channel", "y", "x"), da.zeros((n, frames, len(channels), grid, grid), "f4")),
         "mask": (("sample", "y", "x"), da.ones((n, grid, grid), "u1"))},
        coords={"sample": [f"f.h5#{i}" for i in range(n)], "channel": channels},
        attrs={"source": "pdebench", "dataset": "d", "boundary": "periodic", "parameters": {}, **attrs},
    )
    return ReadResult(data=data, inputs=[Path("f.h5")])


def test_compare_warns_on_counts_shapes_and_channels(catalog):
    entry = catalog.get("pdebench-cfd-m1-eta0.1")
    ok = _result(10000, 21, ["Vx", "Vy", "density", "pressure"], 128, parameters={"M": 1.0, "eta": 0.1})  # lazy
    small = _result(3, 21, ["Vx", "Vy", "density", "pressure"], 128)
    warnings = compare(small, entry)
    assert warnings == ["pdebench-cfd-m1-eta0.1: 3 trajectories read, the complete public set has 10000 (a partial set)"]
    odd = _result(3, 5, ["Vx", "Vy", "density"], 32, parameters={"M": 0.1})
    text = "\n".join(compare(odd, entry))
    assert "channels ['Vx', 'Vy', 'density'] differ" in text
    assert "grid [32, 32] differs from the catalog's [128, 128]" in text
    assert "5 frames per trajectory, the catalog expects 21" in text
    assert "parameter M = 0.1 in the files, the catalog says 1.0" in text
    assert compare(ok, entry) == []
    three_d = compare(small, catalog.get("pdebench-cfd3d-m1-turb"))
    assert "pdebench-cfd3d-m1-turb: 3 trajectories read, the complete public set has 600 (a partial set) " \
           "(catalog value uncertain)" in three_d


def test_detect_source_by_name_and_by_content(tmp_path):
    from dpot_data.errors import InputError
    from dpot_data.sources.detect import detect
    from dpot_data.synth import cfdbench, pdearena, pdebench

    arena = pdearena.write_standard(tmp_path / "arena", n=1, frames=3, res=8)
    assert detect([tmp_path / "arena"]).source == "pdearena"  # a folder expands to its files
    renamed = tmp_path / "renamed.h5"
    renamed.write_bytes(arena[0].read_bytes())
    found = detect([renamed])
    assert (found.source, found.how) == ("pdearena", "content")
    dr = pdebench.write_diff_react(tmp_path / "pdb", n=1, frames=2, res=8)
    assert detect([dr]).source == "pdebench"
    cfdbench.write_cfdbench(tmp_path / "cfdb", problems=("cavity",), cases=1, frames=(3, 3), res=8)
    found = detect([tmp_path / "cfdb"])
    assert found.source == "cfdbench" and found.paths == (tmp_path / "cfdb",)
    with pytest.raises(InputError, match="inputs come from several sources"):
        detect([dr, arena[0]])
    odd = tmp_path / "notes.txt"
    odd.write_text("x")
    with pytest.raises(InputError, match=r"notes.txt: cannot tell its source"):
        detect([odd])


def test_catalog_driven_ingest_names_splits_and_warns(tmp_path):
    from dpot_data.ingest import run_ingest
    from dpot_data.errors import InputError
    from dpot_data.ingest import IngestOptions
    from dpot_data.synth import pdebench, pdearena

    raw = pdebench.write_cfd(tmp_path / "raw", m=0.1, eta=0.01, n=10, frames=3, res=8)
    opts = IngestOptions(formats=("wds",), stats=False, resolution=None, convention="canonical")
    done = run_ingest(None, [raw], tmp_path / "out", opts, dataset="pdebench-cfd-m0.1-eta0.01")
    entry = done.manifest["datasets"][0]
    assert entry["name"] == "pdebench-cfd-m0p1-eta0p01"  # the manifest name of the catalog entry
    assert entry["splits"]["counts"] == {"train": 8, "valid": 1, "test": 1}  # the catalog's 80/10/10
    assert done.warnings == [
        "pdebench-cfd-m0.1-eta0.01: grid [8, 8] differs from the catalog's [128, 128]",
        "pdebench-cfd-m0.1-eta0.01: 3 frames per trajectory, the catalog expects 21",
        "pdebench-cfd-m0.1-eta0.01: 10 trajectories read, the complete public set has 10000 (a partial set)",
    ]
    assert entry["provenance"]["catalog"] == {"entry": "pdebench-cfd-m0.1-eta0.01", "warnings": done.warnings}
    # auto-detected: the source from the files, the entry from the name the reader gives
    arena = pdearena.write_standard(tmp_path / "arena", n=1, frames=14, res=8)
    done = run_ingest(None, [tmp_path / "arena"], tmp_path / "out2", opts)
    assert done.source == "pdearena" and done.entry.name == "pdearena-ns"
    assert done.manifest["datasets"][0]["splits"]["rule"] == "from the files: train, valid and test files"
    with pytest.raises(InputError, match="holds pdearena data, but pdebench-dr is a pdebench dataset"):
        run_ingest(None, arena, tmp_path / "out3", opts, dataset="pdebench-dr")
    with pytest.raises(InputError, match="--dataset: unknown dataset 'nope'"):
        run_ingest(None, [raw], tmp_path / "out4", opts, dataset="nope")


def test_cli_synth_then_ingest_by_catalog_name(tmp_path):
    import json

    from typer.testing import CliRunner

    from dpot_data.cli import app

    runner = CliRunner()
    done = runner.invoke(app, ["synth", "pdebench-dr", "--out", str(tmp_path / "raw"), "--n", "4", "--res", "16"])
    assert done.exit_code == 0, done.output
    raw = tmp_path / "raw" / "2D_diff-react_NA_NA.h5"
    done = runner.invoke(app, ["ingest", "--dataset", "pdebench-dr", str(raw), "--out", str(tmp_path / "out"),
                               "--no-progress", "--format", "wds", "--no-stats"])
    assert done.exit_code == 0, done.output
    assert "warning: pdebench-dr: 4 trajectories read, the complete public set has 1000 (a partial set)" in done.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    entry = manifest["datasets"][0]
    assert entry["name"] == "pdebench-dr" and entry["grid"]["shape"] == [128, 128]
    # the default dpot-reference convention: the reference's split by index (first int(0.9 N) train), not the
    # catalog's seeded ratios (those apply under --convention canonical)
    assert entry["splits"]["rule"].startswith("dpot-reference: per file, the first int(0.9 N)")
    assert entry["splits"]["counts"] == {"train": 3, "valid": 0, "test": 1}
    done = runner.invoke(app, ["ingest", "pdearena", str(raw), "--out", str(tmp_path / "bad"), "--no-progress"])
    assert done.exit_code == 2
    assert f"{raw}: expected exactly one top group named train, valid or test" in done.output


def test_dataset_with_other_parameters_is_refused(tmp_path):
    from dpot_data.ingest import run_ingest
    from dpot_data.errors import InputError
    from dpot_data.ingest import IngestOptions
    from dpot_data.synth import pdebench

    raw = pdebench.write_cfd(tmp_path / "raw", m=0.1, eta=0.01, n=2, frames=2, res=8)
    with pytest.raises(InputError, match=r"does not belong to catalog dataset pdebench-cfd-m1-eta0.1: the files have "
                                         r"M = 0.1, pdebench-cfd-m1-eta0.1 has M = 1.0; the files have eta = 0.01"):
        run_ingest(None, [raw], tmp_path / "out", IngestOptions(formats=("wds",)), dataset="pdebench-cfd-m1-eta0.1")
    assert not (tmp_path / "out").exists()


def test_corpus_sorts_a_download_folder_into_datasets_and_resumes(tmp_path):
    from dpot_data.corpus import ingest_corpus, plan_corpus
    from dpot_data.ingest import IngestOptions
    from dpot_data.synth import cfdbench, pdearena, pdebench

    raw = tmp_path / "downloads"
    pdearena.write_standard(raw / "NavierStokes-2D", n=1, frames=14, res=8)
    pdearena.write_conditioned(raw / "NavierStokes-2D-conditoned", n=1, frames=4, res=8)
    pdebench.write_swe(raw / "pdebench", n=2, frames=3, res=8)
    pdebench.write_cfd(raw / "pdebench", m=0.1, eta=0.01, n=2, frames=3, res=8,
                       name="2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_128_Train.hdf5")
    cfdbench.write_cfdbench(raw / "cfdbench", problems=("cavity", "dam"), cases=2, frames=(20, 22), res=8)
    (raw / "pdebench" / "unrelated.h5").write_bytes(b"")
    plan = plan_corpus([raw])
    assert list(plan.groups) == ["pdebench-cfd-m0.1-eta0.01", "pdebench-swe", "pdearena-ns", "pdearena-ns-cond",
                                 "cfdbench"]
    assert plan.groups["cfdbench"] == [raw / "cfdbench"] and len(plan.groups["pdearena-ns-cond"]) == 5
    assert plan.unknown == [raw / "pdebench" / "unrelated.h5"]
    assert "fno-ns-v1e-3" in plan.missing and "pdebench-dr" in plan.missing and "pdearena-ns" not in plan.missing
    opts = IngestOptions(formats=("wds",), stats=False, resolution=None)
    run = ingest_corpus([raw], tmp_path / "out", opts)
    assert run.failed == [] and [d.entry.name for d in run.done] == list(plan.groups)
    assert all(d.written for d in run.done)
    assert (tmp_path / "out" / "pdebench-cfd-m0p1-eta0p01" / "manifest.json").is_file()
    again = ingest_corpus([raw], tmp_path / "out", opts)
    assert not any(d.written for d in again.done)  # complete datasets are kept: a rerun resumes


def test_every_well_entry_lists_its_published_files_per_split(catalog):
    """The 23 Well datasets of the_well 1.2.0's registry: each entry gives the folder URL and the file names of
    train, valid and test (<url><split>/<name>), names its own pattern accepts, and a note that reads as one."""
    well = [e for e in catalog.entries.values() if e.source == "the_well"]
    assert len(well) == 23
    for e in well:
        download = e.download
        assert download is not None, e.name
        folder = e.files[0].split("/")[0]  # "MHD_64/data/*/*.hdf5"
        assert download["url"] == ("https://sdsc-users.flatironinstitute.org/~polymathic/data/the_well/datasets/"
                                   f"{folder}/data/"), e.name
        assert "registry.yaml" in download["stated"], e.name
        assert set(download["files"]) == {"train", "valid", "test"}, e.name
        for split, names in download["files"].items():
            assert names and len(set(names)) == len(names), (e.name, split)
            assert catalog.match_files([f"{folder}/data/{split}/{n}" for n in names]) == [e], (e.name, split)
        assert not re.search(r"about not stated|: $|trajectories: \"?$", e.notes), e.name
    assert catalog.get("the-well-mhd_64").download["files"]["test"][0] == "MHD_Ma_0.7_Ms_0.5.hdf5"
    assert len(catalog.get("the-well-planetswe").download["files"]["train"]) == 96
    assert catalog.get("the-well-shear_flow").samples == 1120


def test_download_files_must_be_file_names_per_split(tmp_path):
    raw = yaml.safe_load((ROOT / "dpot_data" / "manifests" / "catalog.yaml").read_text())
    entry = next(d for d in raw["datasets"] if d["name"] == "the-well-mhd_64")
    entry["download"]["files"] = {"training": ["a.hdf5"]}
    bad = tmp_path / "catalog.yaml"
    bad.write_text(yaml.safe_dump({"datasets": [entry]}))
    with pytest.raises(CatalogError, match=r"download.files must map"):
        load_catalog(bad)
