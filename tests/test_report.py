"""`dpot-train report`: the table of datasets x runs, the horizon columns, the paper's figures with ratios and
signs and its caveats; the HTML form; one-line errors. Also the 3D picture (mid-plane) and evaluate's option checks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from dpot_train.cli import app
from dpot_train.evaluation.report import build, check_paper, load_paper, load_runs, manifest_name, to_markdown


def _eval(path: Path, scores: dict[str, float], steps: int = 3, recipe: str = "dpot",
          per_step: list[float] | None = None) -> Path:
    per_step = [0.01 * (k + 1) for k in range(steps)] if per_step is None else per_step
    doc = {"schema": "dpot-eval/2", "split": "test", "t_in": 10, "recipe": recipe, "datasets": {
        name: {"trajectories": 2, "rollout_steps": steps,
               "model": {"rollout_l2re": v, "one_step_l2re": v / 2, "l2re_per_step": per_step},
               "persistence": {"rollout_l2re": 2 * v, "one_step_l2re": v}} for name, v in scores.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _table(doc: dict, table_id: str) -> dict:
    return next(t for t in doc["tables"] if t["id"] == table_id)


def test_paper_data_is_complete_and_consistent() -> None:
    main = _table(load_paper(), "main")
    assert main["table"] == "Table 1" and main["caption"].startswith("Results of main experiments")
    cols = main["columns"]
    assert len(cols) == 14 and all(len(r["values"]) == len(cols) for r in main["rows"])
    names = [r["name"] for r in main["rows"]]
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
    for row in main["rows"]:
        v = row["values"]
        for a, b, m in ((3, 4, 5), (6, 7, 8)):
            if None not in (v[a], v[b], v[m]):
                assert abs((v[a] + v[b]) / 2 - v[m]) <= 0.006 * v[m] + 1e-4, (row["name"], v[a], v[b], v[m])
    assert any("nRMSE" in c for c in main["caveats"]) and any("DPOT-S" in c for c in main["caveats"])


def test_paper_data_file_schema() -> None:
    """Every table of the shipped file names its source and caption, is of a kind the report reads, and each row
    holds one figure per column; the tables left out say where they were looked for. check_paper finds each kind
    of fault."""
    doc = load_paper()
    assert check_paper(doc) == []
    assert [t["id"] for t in doc["tables"]] == ["main", "model-sizes", "downstream", "resolution", "long-trajectory"]
    for tbl in doc["tables"]:
        assert tbl["table"] and tbl["caption"] and tbl["where"]
        assert "commit dcd2f9a" in tbl["where"] or "transcribed from its PDF (sha256 8eb0ffbf" in tbl["where"]
        assert all(len(r["values"]) == len(tbl["columns"]) for r in tbl["rows"])
    assert "not_shipped" not in doc  # every table the paper has that dpot can set beside a run is shipped
    from dpot_data.catalog import load_catalog

    catalog = load_catalog().entries
    for tbl in doc["tables"]:
        for col in tbl["columns"] if tbl["kind"] == "datasets" else []:
            assert all(d in catalog for d in col["datasets"]), col

    def broken(**change: object) -> list[str]:
        tbl = {"id": "t", "kind": "horizon", "table": "Table 9", "caption": "c", "where": "w", "dataset": "d",
               "columns": [20, 50], "rows": [{"name": "A", "values": [0.1, None]}]}
        tbl.update(change)
        return check_paper({"tables": [tbl]})

    assert broken() == []
    assert broken(caption="") == ["tables[0] (t): 'caption' must be a non-empty text (the table's source)"]
    assert broken(where=None) == ["tables[0] (t): 'where' must be a non-empty text (the table's source)"]
    assert broken(rows=[{"name": "A", "values": [0.1]}]) == ["tables[0] (t): row A: 1 values for 2 columns"]
    assert broken(rows=[{"name": "A", "values": [0.1, "7M"]}]) == ["tables[0] (t): row A: expected numbers or null"]
    assert broken(columns=[50, 20], rows=[{"name": "A", "values": [1, 2]}]) == [
        "tables[0] (t): 'columns' must be increasing rollout steps (positive whole numbers)"]
    assert broken(kind="plot") == ["tables[0] (t): 'kind' must be one of datasets, horizon, figures, not 'plot'"]
    assert broken(kind="figures", columns=["Layers", "Model size"], rows=[{"name": "A", "values": [1, "7M"]}]) == []
    assert broken(kind="figures") == ["tables[0] (t): each column needs a name"]
    assert broken(kind="datasets", columns=["a"], rows=[{"name": "A", "values": [1]}]) == [
        "tables[0] (t): each column needs a 'name' and a list 'datasets'"]
    assert check_paper({"columns": []}) == ["expected a mapping with a non-empty list 'tables'"]
    assert check_paper({**doc, "not_shipped": [{"table": "resolution table", "looked": []}]}) == [
        "not_shipped[0]: expected the 'table' left out and the list of where it was 'looked' for"]


def test_model_size_table_agrees_with_the_presets() -> None:
    """The README's checkpoint table against dpot_train's presets, which load the released weights: attention dim,
    MLP dim (but Huge's printed 8092, a caveat), layers, heads, and the model size to its rounding (within 10 %)."""
    from dpot_train.model.config import PRESETS
    from dpot_train.model_info import parameter_breakdown

    tbl = _table(load_paper(), "model-sizes")
    assert tbl["columns"] == ["Attention dim", "MLP dim", "Layers", "Heads", "Model size"]
    size = {"M": 1e6, "B": 1e9}
    for row, key in zip(tbl["rows"], ("Ti", "S", "M", "L", "H")):
        attn, mlp, layers, heads, params = row["values"]
        cfg = PRESETS[key]
        assert (attn, layers, heads) == (cfg.embed_dim, cfg.depth, cfg.n_blocks), row
        assert mlp == (8092 if key == "H" else cfg.embed_dim * cfg.mlp_ratio), row
        counted = sum(parameter_breakdown(cfg).values())
        assert abs(counted - float(params[:-1]) * size[params[-1]]) <= 0.1 * counted, (row, counted)
    assert any("8092" in c and "8192" in c for c in tbl["caveats"])


def _unescape(cell: str) -> str:
    import html

    return html.unescape(re.sub(r"\\(.)", r"\1", cell.strip()))


def _md_sections(text: str) -> dict[str, list[list[str]]]:
    """The tables of a Markdown report by their heading: rows of cells (the header first), unescaped."""
    out: dict[str, list[list[str]]] = {}
    title = None
    for line in text.splitlines():
        if line.startswith("## "):
            title = _unescape(line[3:])
            out[title] = []
        elif title is not None and line.startswith("|") and not line.startswith("|---"):
            out[title].append([_unescape(c) for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])])
    return out


ALL_TABLE1 = ["fno-ns-v1e-5", "fno-ns-v1e-4", "fno-ns-v1e-3", "pdebench-cfd-m1-eta0.1", "pdebench-cfd-m1-eta0.01",
              "pdebench-cfd-m0.1-eta0.1", "pdebench-cfd-m0.1-eta0.01", "pdebench-dr", "pdebench-swe", "pdearena-ns",
              "pdearena-ns-cond", "cfdbench"]


def test_every_printed_paper_figure_is_the_data_files(tmp_path: Path) -> None:
    """`report --paper` on a run filling every column of Table 1: the printed report, read back, holds each figure
    of the data file, in its row and column, and the model-size table as the data file has it; each table's
    source is named."""
    a = _eval(tmp_path / "a" / "eval.json", {manifest_name(d): 0.01 * (i + 1) for i, d in enumerate(ALL_TABLE1)})
    r = _report(str(a), "--paper", "--out", str(tmp_path / "r.md"))
    assert r.exit_code == 0, r.output
    printed = r.stdout.rsplit("\nwrote ", 1)[0]
    sections = _md_sections(printed)
    doc = load_paper()
    main = _table(doc, "main")
    seen = 0
    for ci, col in enumerate(main["columns"]):
        title = next(t for t in sections if t.startswith(f"Paper Table 1, {col['name']} ("))
        header, *rows = sections[title]
        assert header[:5] == ["paper row", "part", "params", "metric", "paper"] and header[5] == "a / paper"
        want = [row for row in main["rows"] if row["values"][ci] is not None]
        assert [c[0] for c in rows] == [w["name"] for w in want], title
        for cells, row in zip(rows, want):
            assert float(cells[4]) == row["values"][ci] and cells[2] == str(row["params"]), (title, cells)
            assert cells[3] == row.get("metric", "L2RE")
            seen += 1
    assert seen == sum(v is not None for row in main["rows"] for v in row["values"])
    sizes = _table(doc, "model-sizes")
    header, *rows = sections["Paper checkpoint table (README): DPOT model sizes"]
    assert header == ["row"] + sizes["columns"]
    assert rows == [[row["name"]] + [str(v) for v in row["values"]] for row in sizes["rows"]]
    notes = _unescape(printed.split("\n- ", 1)[1])
    assert f"Paper Table 1: {main['caption']} (source: {main['where']})" in notes
    assert f"(source: {sizes['where']})" in notes and "Caveat (checkpoint table (README)): Huge's" in notes
    assert "Not shipped" not in printed


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
    fno = [s for s in rep.sections if s[0].startswith("Paper Table 1, FNO-nu 1e-3")][0]
    row = [r for r in fno[2] if r[0] == "FNO"][0]
    assert row[4] == "0.0128" and row[5] == "2 (+)" and row[6] == "0.5 (-)"
    # a column with several datasets needs all of them in one run (M1: neither run has both)
    assert not [s for s in rep.sections if s[0].startswith("Paper Table 1, PDEBench CNS M1 ")]
    assert [s for s in rep.sections if s[0].startswith("Paper Table 1, PDEBench CNS 1,0.1 ")]
    assert "Caveat (Table 1): MPP rows" in md and "dpot recipe" in md and "Not shipped" not in md
    long = [s for s in rep.sections if s[0].startswith("Paper Table 10, fno-ns-v1e-3")][0]  # a reaches step 20
    assert [r[2] for r in long[2]][:3] == ["0.00188", "0.00148", "0.2"]
    assert not [s for s in rep.sections if "PDEArena" in s[0]]  # no run filled it


def _paper_doc() -> dict:
    """A paper data file with test figures, not the paper's: a long-trajectory table and a downstream table with one
    column of the catalog and one without."""
    return {"paper": "A <b>paper</b>", "tables": [
        {"id": "long", "kind": "horizon", "table": "Table L", "caption": "Long | <i>rollouts</i>\n# not a heading",
         "where": "test", "dataset": "fno-ns-v1e-3", "metric": "L2RE", "columns": [20, 50, 100, 200, 500],
         "rows": [{"name": "DPOT", "values": [0.002, 0.004, 0.008, 0.016, 0.032]},
                  {"name": "DPOT-pretrained", "values": [0.001, None, 0.004, 0.008, 0.016]}]},
        {"id": "down", "kind": "datasets", "table": "Table D", "caption": "Downstream", "where": "test",
         "metric": "L2RE", "columns": [{"name": "3D", "datasets": ["pdebench-cfd3d-m1-turb"]},
                                       {"name": "Turbulence <x>", "datasets": []}],
         "rows": [{"name": "FNO", "values": [0.4, 0.2]}, {"name": "MPP-FT", "values": [None, 0.15]}],
         "caveats": ["a|b"]}]}


def test_long_trajectory_table_beside_the_runs_per_step(tmp_path: Path) -> None:
    """A `horizon` table is set beside each run's l2re_per_step at its steps where the rollout reaches them ("–"
    past it), with the ratio and sign to each paper row; a run whose rollout stops short of the first step, or on
    another dataset, is left out. A downstream column of the catalog gets ratios, one without is printed as the
    paper's figures alone. Texts of the data file are escaped."""
    long = _eval(tmp_path / "long" / "eval.json", {DS: 0.02}, steps=120,
                 per_step=[0.001 * (k + 1) for k in range(120)])  # step k: 0.001 k
    short = _eval(tmp_path / "short" / "eval.json", {DS: 0.02}, steps=19)
    other = _eval(tmp_path / "other" / "eval.json", {"pdebench-dr": 0.02, "pdebench-cfd3d-m1-turb": 0.2}, steps=600)
    rep = build(load_runs([long, short, other]), paper=True, doc=_paper_doc())
    md = to_markdown(rep)
    title, header, rows = [s for s in rep.sections if s[0].startswith("Paper Table L")][0]
    assert title == "Paper Table L, fno-ns-v1e-3: L2RE up to each rollout step"
    assert header == ["row", "from", "20", "50", "100", "200", "500"]
    assert rows == [["DPOT", "paper", "0.002", "0.004", "0.008", "0.016", "0.032"],
                    ["DPOT-pretrained", "paper", "0.001", "–", "0.004", "0.008", "0.016"],
                    ["long", "run", "0.02", "0.05", "0.1", "–", "–"],
                    ["long / DPOT", "ratio", "10 (+)", "12.5 (+)", "12.5 (+)", "–", "–"],
                    ["long / DPOT-pretrained", "ratio", "20 (+)", "–", "25 (+)", "–", "–"]]
    down = [s for s in rep.sections if s[0].startswith("Paper Table D, 3D")][0]
    assert down[0] == "Paper Table D, 3D (pdebench-cfd3d-m1-turb); runs: long –, short –, other 0.2"
    assert down[2] == [["FNO", "", "", "L2RE", "0.4", "–", "–", "0.5 (-)"]]
    alone = [s for s in rep.sections if s[0].startswith("Paper Table D: ")][0]
    assert alone[1] == ["paper row", "metric", "Turbulence <x>"]
    assert alone[2] == [["FNO", "L2RE", "0.2"], ["MPP-FT", "L2RE", "0.15"]]
    assert "Long \\| &lt;i&gt;rollouts&lt;/i&gt; # not a heading" in md and "<i>" not in md and "<x>" not in md
    assert "Caveat (Table D): a\\|b" in md and "Paper: A &lt;b&gt;paper&lt;/b&gt;" in md
    # no run on the table's dataset reaches its first step: the table is named, not printed
    rep = build(load_runs([short, other]), paper=True, doc=_paper_doc())
    assert not [s for s in rep.sections if s[0].startswith("Paper Table L")]
    assert any(n.startswith("The paper's Table L (fno-ns-v1e-3, steps 20, 50, 100, 200, 500) is set beside runs")
               for n in rep.notes)
    bad = _paper_doc()
    bad["tables"][0]["rows"][0]["values"] = [0.1]
    try:
        build(load_runs([long]), paper=True, doc=bad)
    except ValueError as exc:
        assert str(exc) == "paper data: tables[0] (long): row DPOT: 1 values for 5 columns"
    else:
        raise AssertionError("a malformed paper data file was read")


def test_report_cli_html_and_errors(tmp_path: Path) -> None:
    a = _eval(tmp_path / "run" / "eval.json", {"fno-ns-v1e-3": 0.01})
    png = tmp_path / "run" / "plots" / "fno-ns-v1e-3_fields.png"  # as `evaluate --plot` names it
    png.parent.mkdir()
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

    from dpot_train.evaluation.plots import plot_fields

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
    from dpot_train.evaluation.plots import picked_steps

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


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"picture" * 4
DS = "fno-ns-v1e-3"


def _with(path: Path, **fields: object) -> Path:
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))
    return path


def _report(*args: str):  # noqa: ANN202 - click Result
    return CliRunner().invoke(app, ["report", *args])


def test_html_embeds_only_pictures_of_the_runs_own_folder(tmp_path: Path) -> None:
    import base64

    run = tmp_path / "runs" / "a"
    a = _eval(run / "eval.json", {DS: 0.01})
    plots = run / "plots"
    plots.mkdir()
    (plots / f"{DS}_fields.png").write_bytes(PNG)  # the one picture to embed
    secret = tmp_path / "x"  # ../../x from the run folder: a file of the reader's, outside the run
    secret.write_bytes(b"SECRET-BYTES-" * 10)
    outside_png = tmp_path / "mine.png"
    outside_png.write_bytes(PNG + b"PRIVATE-PICTURE")
    (plots / f"{DS}_error.png").symlink_to(outside_png)  # a link out of the folder
    (plots / f"{DS}_spectrum.png").write_bytes(b"NOT-A-PICTURE" * 5)  # named as a picture, holding text
    (plots / "private.png").write_bytes(PNG + b"OTHER-PICTURE")  # a PNG, but no picture of `evaluate --plot`
    listed = ["/etc/passwd", "../../x", str(plots / f"{DS}_fields.png"), f"plots/{DS}_error.png",
              f"plots/{DS}_spectrum.png", "plots/private.png"]
    _with(a, plots=listed)
    r = _report(str(a), "--out", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.output
    html = (tmp_path / "r.html").read_text()
    assert html.count("data:image/") == 1 and base64.b64encode(PNG).decode() in html
    leaked = [Path("/etc/passwd").read_bytes(), secret.read_bytes(), outside_png.read_bytes(),
              (plots / f"{DS}_spectrum.png").read_bytes(), (plots / "private.png").read_bytes()]
    for data in leaked:
        assert base64.b64encode(data).decode() not in html
    assert "root:" not in html and "SECRET" not in html and "PRIVATE" not in html and "NOT-A-PICTURE" not in html
    assert "<figcaption>a: plots/fno-ns-v1e-3_fields.png</figcaption>" in html  # labelled with its run
    warned = r.stderr.strip().splitlines()
    assert len(warned) == 5 and all(line.startswith(f"{a}: plots: ") for line in warned)
    assert f"{a}: plots: /etc/passwd: refused: not under the folder of its eval.json" in warned
    assert f"{a}: plots: ../../x: refused: not under the folder of its eval.json" in warned
    assert f"{a}: plots: plots/{DS}_error.png: refused: not under the folder of its eval.json" in warned
    assert f"{a}: plots: plots/{DS}_spectrum.png: refused: not a PNG file" in warned
    assert any(line.startswith(f"{a}: plots: plots/private.png: refused: not named as a picture") for line in warned)
    for name in ("passwd", "x", f"{DS}_error.png", f"plots/{DS}_spectrum.png", "plots/private.png"):
        assert f"Picture of run a not shown: {name}: " in r.stdout  # the Markdown's notes name each
    assert "Picture of run a not shown: passwd: refused" in html


def test_moved_pictures_are_named_missing(tmp_path: Path) -> None:
    import shutil

    a = _eval(tmp_path / "old" / "run" / "eval.json", {DS: 0.01})
    (a.parent / "plots").mkdir()
    pictures = [a.parent / "plots" / f"{DS}_{kind}.png" for kind in ("fields", "error")]
    for p in pictures:
        p.write_bytes(PNG)
    _with(a, plots=[str(p) for p in pictures])  # absolute, as evaluate writes them
    shutil.move(str(tmp_path / "old"), str(tmp_path / "new"))
    moved = tmp_path / "new" / "run" / "eval.json"
    r = _report(str(moved), "--out", str(tmp_path / "new" / "r.html"))
    assert r.exit_code == 0, r.output
    assert r.stderr.strip().splitlines() == [
        f"{moved}: plots: {p}: missing: no file where eval.json lists it (moved or deleted)" for p in pictures]
    html = (tmp_path / "new" / "r.html").read_text()
    assert "data:image/" not in html
    for kind in ("fields", "error"):
        assert f"Picture of run run not shown: {DS}_{kind}.png: missing" in html
    assert str(tmp_path) not in html


def test_every_text_from_an_eval_json_is_escaped_and_bounded(tmp_path: Path) -> None:
    names = ["<script>alert(1)</script>", "<img src=x onerror=alert(2)>", "a|b|c", "d\n# heading", "z" * 5000]
    a = _eval(tmp_path / "run" / "eval.json", {n: 0.1 * (i + 1) for i, n in enumerate(names)}, steps=25,
              recipe="<script>r</script>|\n# recipe")
    doc = json.loads(a.read_text())
    for entry in doc["datasets"].values():
        entry["channels"] = ["<b onmouseover=alert(3)>u</b>", "v|w\n## x"]
    a.write_text(json.dumps(doc))
    for out in ("r.md", "r.html"):
        r = _report(str(a), "--out", str(tmp_path / out))
        assert r.exit_code == 0, r.output
        text = (tmp_path / out).read_text()
        assert "<script" not in text and "<img" not in text and "<b " not in text and "z" * 101 not in text
        assert not [ln for ln in text.splitlines() if ln.lstrip().startswith("#") and "heading" in ln]
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "z" * 99 + "…" in text
        if out == "r.md":
            assert text == r.stdout.rsplit("\nwrote ", 1)[0]  # what was printed is what was written
            for title in ("Rollout L2RE of the model", "Persistence baseline", "Rollout L2RE at horizon"):
                section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
                rows = [ln for ln in section.splitlines() if ln.startswith("|")]
                cells = {len(re.findall(r"(?<!\\)\|", ln)) for ln in rows}  # unescaped pipes: the cell borders
                assert len(rows) == 2 + len(names) and cells == {len(rows[1]) // 4 + 1}, rows
            assert "| a\\|b\\|c | 0.3 |" in text and "d # heading" in text
        else:
            first = text.split("<table>", 1)[1].split("</table>", 1)[0]
            assert first.count("<tr>") == 1 + len(names)
            assert "&lt;script&gt;r&lt;/script&gt;| # recipe" in text


def test_schema_and_out_suffix_are_checked(tmp_path: Path) -> None:
    from dpot_train.evaluation.evaluate import EVAL_SCHEMA
    from dpot_train.evaluation.report import check_schema

    assert check_schema(Path("e.json"), {"schema": EVAL_SCHEMA}) is None  # what evaluate writes is read
    a = _eval(tmp_path / "run" / "eval.json", {DS: 0.01})
    for schema, said in (("dpot-eval/1", "schema dpot-eval/1; this version of dpot-train reads dpot-eval/2 or "
                                         "dpot-eval/3"),
                         ("dpot-eval/9", "schema dpot-eval/9; this version of dpot-train reads dpot-eval/2 or "
                                         "dpot-eval/3"),
                         (None, "no 'schema'; expected an eval.json of `dpot-train evaluate` (schema dpot-eval/2 or "
                                "dpot-eval/3)"),
                         ("other/2", 'schema "other/2"; expected an eval.json of `dpot-train evaluate`')):
        doc = json.loads(a.read_text())
        doc["schema"] = schema
        if schema is None:
            del doc["schema"]
        bad = tmp_path / f"bad-{str(schema).replace('/', '-')}.json"
        bad.write_text(json.dumps(doc))
        r = _report(str(bad), "--out", str(tmp_path / "r.md"))
        assert r.exit_code == 2 and r.output.strip().startswith(f"error: {bad}: {said}"), r.output
        assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "r.md").exists()
    newer = _with(a, schema="dpot-eval/2.7")
    r = _report(str(newer), "--out", str(tmp_path / "r.md"))
    assert r.exit_code == 0 and r.stderr.strip() == (f"{newer}: schema dpot-eval/2.7 is newer than dpot-eval/2.0 "
                                                     "this version knows; the fields it adds are left out")
    assert "- run/eval.json: schema dpot-eval/2.7 is newer" in (tmp_path / "r.md").read_text()  # noted, relative
    r = _report(str(a), "--out", str(tmp_path / "x.pdf"))
    assert r.exit_code == 2 and r.output.strip() == (f"error: --out {tmp_path / 'x.pdf'}: expected a file name "
                                                     "ending in .md (Markdown) or .html (HTML, pictures embedded)")
    assert not (tmp_path / "x.pdf").exists()
    _with(a, schema="dpot-eval/2", datasets={DS: {"model": {"rollout_l2re": "<b>"}, "persistence": {}}})
    r = _report(str(a), "--out", str(tmp_path / "r.md"))
    assert r.exit_code == 2 and r.output.strip() == (f"error: {a}: datasets.{DS}.model.rollout_l2re: expected a "
                                                     "number or null")


def test_report_names_runs_relative_to_itself(tmp_path: Path) -> None:
    a = _eval(tmp_path / "runs" / "a" / "eval.json", {DS: 0.01})
    b = _eval(tmp_path / "runs" / "b" / "eval.json", {DS: 0.02})
    (a.parent / f"{DS}_fields.png").write_bytes(PNG)
    _with(a, plots=[str(a.parent / f"{DS}_fields.png")])
    for out in ("report/r.md", "report/r.html"):
        r = _report(str(a), str(b), "--paper", "--out", str(tmp_path / out))
        assert r.exit_code == 0, r.output
        text = (tmp_path / out).read_text()
        assert str(tmp_path) not in text and str(tmp_path) not in r.stdout.rsplit("\nwrote ", 1)[0]
        assert "Runs: a (../runs/a/eval.json), b (../runs/b/eval.json)" in text.replace("<p>", "")
    assert "<h2>Pictures of run a (../runs/a/eval.json)</h2>" in text


def _stability(path: Path, steps: int, model: list[float], persistence: list[float],
               windows: dict[str, float]) -> Path:
    """A dpot-eval/3 eval.json: `_eval`'s, with blow-up shares and the vorticity channel's VRMSE windows."""
    doc = json.loads(_eval(path, {DS: 0.02}, steps=steps).read_text())
    entry = doc["datasets"][DS]
    entry["model"].update(blowup_fraction_per_step=model,
                          channels={"vorticity": {"vrmse_window": windows, "rmse": 0.1}})
    entry["persistence"].update(blowup_fraction_per_step=persistence,
                                channels={"vorticity": {"vrmse_window": {k: 2 * v for k, v in windows.items()},
                                                        "rmse": 0.2}})
    doc["schema"] = "dpot-eval/3"
    path.write_text(json.dumps(doc))
    return path


def test_report_reads_schema_2_and_3_and_shows_windows_and_blowups(tmp_path: Path) -> None:
    old = _eval(tmp_path / "old" / "eval.json", {DS: 0.01})
    new = _stability(tmp_path / "new" / "eval.json", 40, [0.0] * 9 + [0.25] * 21 + [0.5] * 10, [0.0] * 39 + [0.75],
                     {"1-10": 0.125, "11-30": 0.5, "31-end": 1.25})
    short = _stability(tmp_path / "short" / "eval.json", 3, [0.0, 0.0, 0.5], [0.0, 0.0, 0.0], {"1-10": 0.3})
    r = _report(str(old), str(new), str(short), "--out", str(tmp_path / "r.md"))
    assert r.exit_code == 0 and r.stderr == "", r.output
    text = (tmp_path / "r.md").read_text()
    assert "| model 1-10 | model 11-30 | model 31-end | persistence 1-10 | persistence 11-30 | persistence 31-end |" \
        in text
    assert f"| {DS} | new | vorticity | 0.125 | 0.5 | 1.25 | 0.25 | 1 | 2.5 |" in text
    assert f"| {DS} | short | vorticity | 0.3 | – | – | 0.6 | – | – |" in text  # windows it does not reach
    assert "| steps | model by 10 | model by 30 | model by the last | persistence by the last |" in text
    assert f"| {DS} | new | 40 | 0.25 | 0.25 | 0.5 | 0.75 |" in text
    assert f"| {DS} | short | 3 | – | – | 0.5 | 0 |" in text
    assert "- No VRMSE windows or blow-ups in old (schema dpot-eval/2: evaluate again for them)." in text
    assert "| old |" not in text.split("VRMSE averaged", 1)[1].split("- No VRMSE", 1)[0]  # no rows for the /2 run
    _with(new, datasets={DS: {**json.loads(new.read_text())["datasets"][DS],
                              "model": {"rollout_l2re": 0.1, "blowup_fraction_per_step": ["x"]}}})
    r = _report(str(new), "--out", str(tmp_path / "r2.md"))
    assert r.exit_code == 2 and r.output.strip() == (f"error: {new}: datasets.{DS}.model.blowup_fraction_per_step: "
                                                     "expected a list of numbers")


# The paper's Tables 2, 9 and 10 typed a second time from their source (the transcription of the paper's PDF that
# dpot_train/evaluation/paper/dpot_icml2024.yaml names), to hold the data file and the printed report against.
PAPER_TABLE_10 = {"DPOT": [0.00188, 0.00192, 0.00592, 0.0241, 0.0912],
                  "DPOT-pretrained": [0.00148, 0.00186, 0.00335, 0.0110, 0.0385]}
PAPER_TABLE_2 = {"(Geo-)FNO": [0.193, 0.410, 0.0357], "MPP-FT": [0.152, None, None],
                 "DPOT-Vanilla": [0.167, 0.262, 0.0331], "DPOT-FT": [0.135, 0.226, 0.0230]}
PAPER_TABLE_9 = {"32": 0.0181, "48": 0.0182, "72": 0.0187, "96": 0.0187, "128": 0.0190}


def test_report_paper_prints_the_long_trajectory_downstream_and_resolution_tables(tmp_path: Path) -> None:
    """`report --paper` on an FNO-nu1e-3 run with a 120-step rollout and a 3D run: the paper's Table 10 rows beside
    the run's l2re_per_step at 20, 50 and 100 steps ("–" past its rollout) with ratios, Table 2's 3D PDB column beside
    the 3D run and its other columns as the paper's figures alone, Table 9 as given; every printed paper figure,
    read back from the Markdown, equals the paper's."""
    doc = load_paper()
    assert {r["name"]: r["values"] for r in _table(doc, "long-trajectory")["rows"]} == PAPER_TABLE_10
    assert {r["name"]: r["values"] for r in _table(doc, "downstream")["rows"]} == PAPER_TABLE_2
    res = _table(doc, "resolution")
    assert dict(zip(res["columns"], res["rows"][0]["values"])) == PAPER_TABLE_9
    fno = _eval(tmp_path / "fno" / "eval.json", {DS: 0.05}, steps=120, per_step=[0.0005 * (k + 1) for k in range(120)])
    cfd3d = _eval(tmp_path / "cfd3d" / "eval.json", {"pdebench-cfd3d-m1-turb": 0.3}, steps=5)
    r = _report(str(fno), str(cfd3d), "--paper", "--out", str(tmp_path / "r.md"))
    assert r.exit_code == 0, r.output
    sections = _md_sections(r.stdout.rsplit("\nwrote ", 1)[0])

    header, *rows = sections["Paper Table 10, fno-ns-v1e-3: L2RE up to each rollout step"]
    assert header == ["row", "from", "20", "50", "100", "200", "500"]
    assert {row[0]: [float(v) for v in row[2:]] for row in rows if row[1] == "paper"} == PAPER_TABLE_10
    run = next(row for row in rows if row[1] == "run")
    assert run == ["fno", "run", "0.01", "0.025", "0.05", "–", "–"]  # step k of the rollout: 0.0005 k
    ratios = {row[0]: row[2:] for row in rows if row[1] == "ratio"}
    assert ratios["fno / DPOT"] == ["5.32 (+)", "13 (+)", "8.45 (+)", "–", "–"]  # 0.01 / 0.00188, 0.025 / 0.00192, ...

    title = next(t for t in sections if t.startswith("Paper Table 2, 3D PDB (pdebench-cfd3d-m1-turb)"))
    header, *rows = sections[title]
    assert header == ["paper row", "part", "params", "metric", "paper", "fno / paper", "cfd3d / paper"]
    assert {row[0]: float(row[4]) for row in rows} == {k: v[1] for k, v in PAPER_TABLE_2.items() if v[1] is not None}
    assert next(row for row in rows if row[0] == "DPOT-FT")[5:] == ["–", "1.33 (+)"]  # 0.3 / 0.226
    header, *rows = sections["Paper Table 2: Turbulence, Steady CNO (no dataset of the catalog; the paper's figures "
                             "alone)"]
    assert header == ["paper row", "metric", "Turbulence", "Steady CNO"]
    assert {row[0]: [None if c == "–" else float(c) for c in row[2:]] for row in rows} == {
        k: [v[0], v[2]] for k, v in PAPER_TABLE_2.items()}

    header, *rows = sections["Paper Table 9: DPOT test L2RE by resolution"]
    assert header == ["row", "32", "48", "72", "96", "128"]
    assert rows == [["Test L2RE"] + [str(v) for v in PAPER_TABLE_9.values()]]
    notes = r.stdout.replace("\\", "")
    for tbl in ("Table 2", "Table 9", "Table 10"):
        assert f"Paper {tbl}: (the paper's caption is not in the transcription)" in notes
        assert "transcribed from its PDF (sha256 8eb0ffbf...45b4" in notes
