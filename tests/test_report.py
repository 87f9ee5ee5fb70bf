"""`dpot-train report`: the table of datasets x runs, the horizon columns, the paper's figures with ratios and
signs and its caveats; the HTML form; one-line errors. Also the 3D picture (mid-plane) and evaluate's option checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from dpot_train.cli import app
from dpot_train.report import build, load_paper, load_runs, to_markdown


def _eval(path: Path, scores: dict[str, float], steps: int = 3, recipe: str = "dpot") -> Path:
    per_step = [0.01 * (k + 1) for k in range(steps)]
    doc = {"schema": "dpot-eval/2", "split": "test", "t_in": 10, "recipe": recipe, "datasets": {
        name: {"trajectories": 2, "rollout_steps": steps,
               "model": {"rollout_l2re": v, "one_step_l2re": v / 2, "l2re_per_step": per_step},
               "persistence": {"rollout_l2re": 2 * v, "one_step_l2re": v}} for name, v in scores.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_paper_data_is_complete_and_consistent() -> None:
    doc = load_paper()
    cols = doc["columns"]
    assert len(cols) == 14 and all(len(r["values"]) == len(cols) for r in doc["rows"])
    names = [r["name"] for r in doc["rows"]]
    for want in ("FNO", "UNet", "FFNO", "GNOT", "FNO-m", "MPP-Ti", "MPP-S", "MPP-L", "DPOT-Ti", "DPOT-M", "DPOT-L",
                 "DPOT-H", "DPOT-T-200", "DPOT-L-500"):
        assert want in names
    assert names.count("DPOT-S") == 2
    from dpot_data.catalog import load_catalog

    catalog = load_catalog().entries
    for col in cols:
        for d in col["datasets"]:
            assert d in catalog, d
    # the paper's M1 / M0.1 columns are the means of the two columns before them (within its rounding)
    for row in doc["rows"]:
        v = row["values"]
        for a, b, m in ((3, 4, 5), (6, 7, 8)):
            if None not in (v[a], v[b], v[m]):
                assert abs((v[a] + v[b]) / 2 - v[m]) <= 0.006 * v[m] + 1e-4, (row["name"], v[a], v[b], v[m])
    assert any("nRMSE" in c for c in doc["caveats"]) and any("DPOT-S" in c for c in doc["caveats"])


def test_report_table_horizons_and_paper(tmp_path: Path) -> None:
    a = _eval(tmp_path / "a" / "eval.json", {"fno-ns-v1e-3": 0.0128 * 2, "pdebench-cfd-m1-eta0p1": 0.02}, steps=50)
    b = _eval(tmp_path / "b" / "eval.json", {"fno-ns-v1e-3": 0.0064, "pdebench-cfd-m1-eta0p01": 0.03})
    rep = build(load_runs([a, b]), paper=True)
    md = to_markdown(rep)
    assert "| fno-ns-v1e-3 | 0.0256 | 0.0064 |" in md
    horizon = [s for s in rep.sections if s[0].startswith("Rollout L2RE at horizon")][0]
    assert horizon[1][2:] == ["20", "50", "100", "200", "500"]
    assert horizon[2] == [["fno-ns-v1e-3", "a", "0.2", "0.5", "–", "–", "–"],
                          ["pdebench-cfd-m1-eta0p1", "a", "0.2", "0.5", "–", "–", "–"]]
    fno = [s for s in rep.sections if s[0].startswith("Paper: FNO-nu 1e-3")][0]
    row = [r for r in fno[2] if r[0] == "FNO"][0]
    assert row[4] == "0.0128" and row[5] == "2 (+)" and row[6] == "0.5 (-)"
    # a column with several datasets needs all of them in one run (M1: neither run has both)
    assert not [s for s in rep.sections if s[0].startswith("Paper: PDEBench CNS M1 ")]
    assert [s for s in rep.sections if s[0].startswith("Paper: PDEBench CNS 1,0.1 ")]
    assert "Caveat: MPP rows" in md and "dpot recipe" in md and "not shipped" in md
    assert not [s for s in rep.sections if "PDEArena" in s[0]]  # no run filled it


def test_report_cli_html_and_errors(tmp_path: Path) -> None:
    a = _eval(tmp_path / "run" / "eval.json", {"fno-ns-v1e-3": 0.01})
    png = tmp_path / "run" / "pic.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 20)
    doc = json.loads(a.read_text())
    doc["plots"] = [str(png)]
    a.write_text(json.dumps(doc))
    runner = CliRunner()
    r = runner.invoke(app, ["report", str(a), "--paper", "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    html = (tmp_path / "r.html").read_text()
    assert "<table>" in html and html.count("data:image/png;base64,") == 1 and "0.0128" in html
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = runner.invoke(app, ["report", str(bad), "--out", str(tmp_path / "x.md")])
    assert r.exit_code == 2 and r.output.strip().startswith(f"error: {bad}: not a readable eval.json")
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "x.md").exists()


def test_evaluate_video_needs_plot(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["evaluate", str(tmp_path / "none.pt"), "--manifest", str(tmp_path), "--out",
                                 str(tmp_path / "e.json"), "--video"])
    assert r.exit_code == 2 and r.output.strip() == "error: --video: name the folder for it with --plot DIR"


def test_3d_fields_picture_shows_the_mid_plane(tmp_path: Path) -> None:
    import xarray as xr

    from dpot_train.eval_plots import plot_fields

    rng = np.random.default_rng(0)
    pred = rng.standard_normal((1, 4, 2, 6, 5, 7)).astype(np.float32)
    true = rng.standard_normal(pred.shape).astype(np.float32)
    mask = np.ones((1, 6, 5, 7), dtype=bool)
    mask[0, :, 1:3, 2:4] = False
    field = ("trajectory", "step", "channel", "z", "y", "x")
    group = xr.Dataset({"prediction": (field, pred), "truth": (field, true),
                        "mask": (("trajectory", "z", "y", "x"), mask)},
                       coords={"trajectory": ["d:0"], "step": [1, 2, 3, 4], "channel": ["rho", "pad"]},
                       attrs={"dataset": "d", "channel_valid": [True, False]})
    drawn = plot_fields(group, tmp_path / "f.png")
    assert sorted(drawn) == sorted(f"rho/{k}/{s}" for k in ("truth", "prediction", "error") for s in (1, 2, 4))
    for s in (1, 2, 4):
        np.testing.assert_array_equal(drawn[f"rho/prediction/{s}"], pred[0, s - 1, 0, 3])
        np.testing.assert_array_equal(drawn[f"rho/truth/{s}"], true[0, s - 1, 0, 3])
    assert (tmp_path / "f.png").stat().st_size > 0


def test_picked_steps() -> None:
    from dpot_train.eval_plots import picked_steps

    assert [picked_steps(n) for n in (1, 2, 5, 500)] == [[0], [0, 1], [0, 2, 4], [0, 249, 499]]


def test_predictions_path_that_is_not_a_store_is_refused(tmp_path: Path) -> None:
    keep = tmp_path / "results"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    r = CliRunner().invoke(app, ["evaluate", str(tmp_path / "none.pt"), "--manifest", str(tmp_path), "--out",
                                 str(tmp_path / "e.json"), "--predictions", str(keep)])
    assert r.exit_code == 2 and r.output.strip() == (f"error: --predictions {keep}: exists and is not a store "
                                                     "`dpot-train evaluate --predictions` wrote (no dpot mark in its "
                                                     "zarr.json); name a new path (only a store it wrote is replaced)")
    assert (keep / "notes.txt").read_text() == "mine"
