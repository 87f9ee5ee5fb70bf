"""`dpot-train report EVAL.json... [--paper] --out report.md|report.html`: one table of datasets x runs, the paper's
published figures beside them, and the rollout-horizon columns.

Each run is an eval.json of `dpot-train evaluate` or of a finished `launch`. The figure per run and dataset is the
model's rollout L2RE (eval.json `model.rollout_l2re`). With `paper`, the figures of dpot_train/paper/dpot_icml2024.yaml
are matched to the runs' datasets by catalog name (a manifest writes "." as "p"), and each run's ratio to each paper
row is given with its sign: "-" the run's error is lower (better), "+" higher. The HTML form embeds the pictures of
`evaluate --plot` that eval.json lists.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

HORIZONS = (20, 50, 100, 200, 500)
PAPER_FILE = "dpot_icml2024.yaml"


@dataclass
class Run:
    """One eval.json: its label and what it holds."""

    label: str
    path: Path
    result: dict[str, Any]

    def score(self, dataset: str) -> float | None:
        """The model's rollout L2RE on `dataset`, None where the run did not evaluate it."""
        r = self.result.get("datasets", {}).get(dataset)
        return None if r is None else float(r["model"]["rollout_l2re"])


@dataclass
class Report:
    """The report's content, rendered as Markdown or HTML."""

    runs: list[Run]
    datasets: list[str]
    paper: dict[str, Any] | None = None
    sections: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    images: list[Path] = field(default_factory=list)


def load_paper() -> dict[str, Any]:
    """The paper's figures shipped with the package (dpot_train/paper/dpot_icml2024.yaml)."""
    text = resources.files("dpot_train").joinpath("paper", PAPER_FILE).read_text(encoding="utf-8")
    return yaml.safe_load(text)


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Read each eval.json; ValueError naming the file when it is not one. Labels: the run folder's name (the
    file's stem when that repeats), numbered when still ambiguous."""
    runs: list[Run] = []
    for p in paths:
        path = Path(p)
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a readable eval.json ({exc})") from None
        if not isinstance(result, dict) or not isinstance(result.get("datasets"), dict):
            raise ValueError(f"{path}: not an eval.json of `dpot-train evaluate` (no 'datasets' object)")
        runs.append(Run(path.parent.name or path.stem, path, result))
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.label] = seen.get(run.label, 0) + 1
    for i, run in enumerate(runs):
        if seen[run.label] > 1:
            run.label = f"{run.label}/{run.path.stem}#{i + 1}"
    return runs


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g}"


def manifest_name(catalog_name: str) -> str:
    """The name a manifest stores a catalog dataset under ("." -> "p", docs/format.md)."""
    return catalog_name.replace(".", "p")


def _column_value(run: Run, datasets: list[str]) -> float | None:
    """A run's figure for a paper column: the dataset's, or the mean over the column's datasets when it has them
    all."""
    vals = [run.score(manifest_name(d)) for d in datasets]
    return None if any(v is None for v in vals) else sum(vals) / len(vals)  # type: ignore[arg-type]


def build(runs: list[Run], paper: bool = False) -> Report:
    """The report of `runs`: their table, the horizon columns where the rollouts reach them, and with `paper` the
    paper's rows for every column a run's datasets fill."""
    datasets = sorted({d for r in runs for d in r.result["datasets"]})
    rep = Report(runs, datasets)
    header = ["dataset"] + [f"{r.label} ({r.result.get('recipe', '?')})" for r in runs]
    rows = [[d] + [_fmt(r.score(d)) for r in runs] for d in datasets]
    rep.sections.append(("Rollout L2RE of the model (lower is better)", header, rows))
    rep.sections.append(("Persistence baseline, rollout L2RE", ["dataset"] + [r.label for r in runs],
                         [[d] + [_fmt(r.result["datasets"][d]["persistence"]["rollout_l2re"]
                                      if d in r.result["datasets"] else None) for r in runs] for d in datasets]))
    horizon_rows = []
    for d in datasets:
        for r in runs:
            per_step = r.result["datasets"].get(d, {}).get("model", {}).get("l2re_per_step")
            if per_step and any(h <= len(per_step) for h in HORIZONS):
                horizon_rows.append([d, r.label] + [_fmt(per_step[h - 1]) if h <= len(per_step) else "–"
                                                    for h in HORIZONS])
    if horizon_rows:
        rep.sections.append(("Rollout L2RE at horizon (steps after the inputs)",
                             ["dataset", "run"] + [str(h) for h in HORIZONS], horizon_rows))
    for r in runs:
        rep.images += [Path(p) if Path(p).is_absolute() else r.path.parent / p for p in r.result.get("plots", [])]
    if paper:
        _paper_sections(rep, load_paper())
    return rep


def _paper_sections(rep: Report, doc: dict[str, Any]) -> None:
    """One section per paper column that some run fills: the paper's rows with each run's ratio and sign."""
    rep.paper = doc
    filled = 0
    for ci, col in enumerate(doc["columns"]):
        ours = {r.label: _column_value(r, col["datasets"]) for r in rep.runs}
        if all(v is None for v in ours.values()):
            continue
        filled += 1
        header = ["paper row", "part", "params", "metric", "paper"] + [f"{label} / paper" for label in ours]
        rows = []
        for row in doc["rows"]:
            ref = row["values"][ci]
            if ref is None:
                continue
            cells = [row["name"], row["part"], str(row["params"]), row.get("metric", doc["metric"]), _fmt(ref)]
            for v in ours.values():
                cells.append("–" if v is None else f"{v / ref:.3g} ({'-' if v < ref else '+' if v > ref else '='})")
            rows.append(cells)
        runs_line = ", ".join(f"{k} {_fmt(v)}" for k, v in ours.items())
        rep.sections.append((f"Paper: {col['name']} ({', '.join(col['datasets'])}); runs: {runs_line}",
                             header, rows))
    src = doc["source"]
    rep.notes.append(f"Paper figures: {src['paper']}, {src['table']}; from {src['where']}. Ratio = run / paper; "
                     "sign '-': the run's error is lower, '+': higher.")
    if not filled:
        rep.notes.append("None of the runs' datasets is a column of the paper's table "
                         f"({', '.join(c['name'] for c in doc['columns'])}).")
    if any(r.result.get("recipe") != "reference" for r in rep.runs):
        rep.notes.append("Runs evaluated with the dpot recipe score valid channels on fluid cells; the paper's figures "
                         "are the reference recipe's (`evaluate --recipe reference`).")
    rep.notes += [f"Caveat: {c}" for c in doc.get("caveats", [])]
    if not doc.get("horizons"):
        rep.notes.append("The paper's horizon and downstream tables are not shipped (no readable source was found).")


def to_markdown(rep: Report) -> str:
    """The report as GitHub Markdown."""
    out = ["# Evaluation report", "", "Runs: " + ", ".join(f"`{r.label}` ({r.path})" for r in rep.runs), ""]
    for title, header, rows in rep.sections:
        out += [f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(row) + " |" for row in rows]
        out.append("")
    out += [f"- {n}" for n in rep.notes]
    return "\n".join(out).rstrip() + "\n"


def to_html(rep: Report) -> str:
    """The report as one self-contained HTML page, pictures embedded (base64 PNG / GIF)."""
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>Evaluation report</title>",
           "<style>table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"
           "td:first-child{text-align:left}</style></head><body><h1>Evaluation report</h1>"]
    for title, header, rows in rep.sections:
        out.append(f"<h2>{e(title)}</h2><table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows]
        out.append("</table>")
    if rep.notes:
        out.append("<ul>" + "".join(f"<li>{e(n)}</li>" for n in rep.notes) + "</ul>")
    for img in rep.images:
        if img.is_file():
            kind = "gif" if img.suffix.lower() == ".gif" else "png"
            data = base64.b64encode(img.read_bytes()).decode("ascii")
            out.append(f"<figure><img src='data:image/{kind};base64,{data}'><figcaption>{e(img.name)}"
                       "</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(paths: list[str | Path], out: str | Path, paper: bool = False) -> tuple[Path, str]:
    """Build the report of `paths` and write it atomically to `out` (.html: HTML; else Markdown); returns the path
    and the Markdown text."""
    from dpot_format.io import atomic_write
    from dpot_format.output import check_file

    out = check_file(out, "--out", "report.md")  # the one output rule, before anything is read
    rep = build(load_runs(paths), paper=paper)
    md = to_markdown(rep)
    text = to_html(rep) if out.suffix.lower() in (".html", ".htm") else md
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, text.encode("utf-8"))
    return out, md
