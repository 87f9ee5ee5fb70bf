"""`dpot-train report`: the table of datasets x runs, the horizon columns, the paper's figures with ratios and
signs and its caveats; the HTML form; one-line errors. Also the 3D picture (mid-plane) and evaluate's option checks."""

from __future__ import annotations

import json
import re
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
    from dpot_train.evaluate import EVAL_SCHEMA
    from dpot_train.report import check_schema

    assert check_schema(Path("e.json"), {"schema": EVAL_SCHEMA}) is None  # what evaluate writes is read
    a = _eval(tmp_path / "run" / "eval.json", {DS: 0.01})
    for schema, said in (("dpot-eval/1", "schema dpot-eval/1; this version of dpot-train reads dpot-eval/2"),
                         ("dpot-eval/9", "schema dpot-eval/9; this version of dpot-train reads dpot-eval/2"),
                         (None, "no 'schema'; expected an eval.json of `dpot-train evaluate` (schema dpot-eval/2)"),
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
