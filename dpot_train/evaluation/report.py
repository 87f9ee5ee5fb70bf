"""`dpot-train report EVAL.json... [--paper] --out report.md|report.html`: one table of datasets x runs, the paper's
published figures beside them, and the rollout-horizon columns.

Each run is an eval.json of `dpot-train evaluate` or of a finished `launch` (its `schema` checked: a major version
this module does not read is refused). The figure per run and dataset is the model's rollout L2RE (eval.json
`model.rollout_l2re`). With `paper`, the tables of dpot_train/evaluation/paper/dpot_icml2024.yaml are added, each with
its source (`check_paper` is the file's schema): a `datasets` table's columns are matched to the runs' datasets by
catalog name (a manifest writes "." as "p") and each run's ratio to each paper row is given with its sign ("-" the run's
error is lower (better), "+" higher); a `horizon` table's rows are set beside the runs' `l2re_per_step` at its steps;
a `figures` table is printed as the paper gives it. Runs of schema dpot-eval/3 add the stability tables: The Well's
VRMSE per channel averaged over steps 1-10, 11-30 and 31-end, and the share of trajectories blown up (VRMSE past 1)
by steps 10, 30 and the last; a dpot-eval/2 run has neither (said in a note). The HTML form embeds the pictures of
`evaluate --plot` that eval.json lists, only those under the eval.json's own folder, named as evaluate names them and holding PNG,
GIF or JPEG bytes; every other entry is named as refused or missing. Every text taken from an eval.json is bounded
and escaped (dpot_format.text); runs are named by their path relative to the report.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import yaml

from dpot_format.text import TEXT_LIMIT, bound, file_name, html_text, md, relative_name

HORIZONS = (20, 50, 100, 200, 500)
WINDOWS = ("1-10", "11-30", "31-end")  # eval.json's vrmse_window keys (dpot-eval/3; eval_metrics.VRMSE_WINDOWS)
BLOWUP_STEPS = (10, 30)  # the blow-up shares shown besides the one at the last step
PAPER_FILE = "dpot_icml2024.yaml"
PAPER_KINDS = ("datasets", "horizon", "figures")  # how a table of the paper data file is set beside the runs
SCHEMA_NAME = "dpot-eval"
# eval.json major versions this report reads -> the highest minor version it knows of each (docs/training.md)
SCHEMA_READS = {2: 0, 3: 0}
OUT_SUFFIXES = (".md", ".html")
# the first bytes of each picture kind the HTML embeds, by file suffix, and its MIME subtype
PICTURES = {".png": ("png", (b"\x89PNG\r\n\x1a\n",)), ".gif": ("gif", (b"GIF87a", b"GIF89a")),
            ".jpg": ("jpeg", (b"\xff\xd8\xff",)), ".jpeg": ("jpeg", (b"\xff\xd8\xff",))}
MAX_PICTURE_BYTES = 64 << 20
_SCHEMA = re.compile(r"^dpot-eval/(\d+)(?:\.(\d+))?$")


@dataclass
class Run:
    """One eval.json: its label and what it holds."""

    label: str
    path: Path
    result: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        """The eval.json's own folder, resolved: the only place its pictures are embedded from."""
        return self.path.resolve().parent

    def score(self, dataset: str) -> float | None:
        """The model's rollout L2RE on `dataset`, None where the run did not evaluate it (or scored nothing)."""
        r = self.result.get("datasets", {}).get(dataset)
        v = None if r is None else r["model"].get("rollout_l2re")
        return None if v is None else float(v)


@dataclass
class Picture:
    """One entry of a run's `plots`: the run's label, how the report names it (relative to the eval.json's
    folder, else its file name), the file to embed and its MIME subtype, or why it is not shown."""

    run: str
    name: str
    path: Path | None = None
    kind: str = ""
    problem: str | None = None


@dataclass
class Report:
    """The report's content, rendered as Markdown or HTML. Every text from an input is bounded here and escaped
    when rendered."""

    runs: list[Run]
    datasets: list[str]
    paper: dict[str, Any] | None = None
    sections: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    pictures: list[Picture] = field(default_factory=list)
    run_paths: dict[str, str] = field(default_factory=dict)  # label -> the eval.json relative to the report
    warnings: list[str] = field(default_factory=list)  # one line each, for stderr


def load_paper() -> dict[str, Any]:
    """The paper's tables shipped with the package (dpot_train/evaluation/paper/dpot_icml2024.yaml); ValueError naming
    the first problem when the file does not hold to `check_paper`."""
    text = resources.files("dpot_train.evaluation").joinpath("paper", PAPER_FILE).read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    problems = check_paper(doc)
    if problems:
        raise ValueError(f"dpot_train/evaluation/paper/{PAPER_FILE}: {problems[0]}")
    return doc


def _figure(value: Any, compared: bool) -> bool:
    """A figure a table may hold: a number or null; in a `figures` table also a short text ("7M")."""
    return _number(value) or (not compared and isinstance(value, str) and 0 < len(value) <= 40)


def check_paper(doc: Any) -> list[str]:
    """The problems of a paper data file, one line each (none: it is sound): every table names its source
    (`table`, `caption`, `where`) and a kind of PAPER_KINDS, has columns, and each row a name and one figure per
    column; a `datasets` column names its datasets (a list, empty for a column no run can fill), a `horizon` table
    its dataset and its columns are rollout steps (positive whole numbers, increasing); each table left out
    (`not_shipped`) says where it was looked for."""
    if not isinstance(doc, dict) or not isinstance(doc.get("tables"), list) or not doc["tables"]:
        return ["expected a mapping with a non-empty list 'tables'"]
    problems: list[str] = []
    for i, tbl in enumerate(doc["tables"]):
        where = f"tables[{i}]"
        if not isinstance(tbl, dict):
            problems.append(f"{where}: expected a mapping")
            continue
        where = f"tables[{i}] ({tbl.get('id', '?')})"
        for key in ("id", "table", "caption", "where"):
            if not isinstance(tbl.get(key), str) or not tbl[key].strip():
                problems.append(f"{where}: '{key}' must be a non-empty text (the table's source)")
        kind, cols, rows = tbl.get("kind"), tbl.get("columns"), tbl.get("rows")
        if kind not in PAPER_KINDS:
            problems.append(f"{where}: 'kind' must be one of {', '.join(PAPER_KINDS)}, not {kind!r}")
        if not isinstance(cols, list) or not cols:
            problems.append(f"{where}: 'columns' must be a non-empty list")
            continue
        if kind == "datasets" and not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                          and isinstance(c.get("datasets"), list) for c in cols):
            problems.append(f"{where}: each column needs a 'name' and a list 'datasets'")
        if kind == "figures" and not all(isinstance(c, str) and c.strip() for c in cols):
            problems.append(f"{where}: each column needs a name")
        if kind == "horizon":
            if not isinstance(tbl.get("dataset"), str):
                problems.append(f"{where}: 'dataset' must name the catalog dataset the steps were rolled out on")
            steps_ok = all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in cols)
            if not steps_ok or cols != sorted(set(cols)):  # `or`: the set is taken of whole numbers only
                problems.append(f"{where}: 'columns' must be increasing rollout steps (positive whole numbers)")
        if not isinstance(rows, list) or not rows:
            problems.append(f"{where}: 'rows' must be a non-empty list")
            continue
        for j, row in enumerate(rows):
            values = row.get("values") if isinstance(row, dict) else None
            name = row.get("name") if isinstance(row, dict) else None
            if not isinstance(name, str) or not isinstance(values, list):
                problems.append(f"{where}: rows[{j}]: expected a 'name' and a list 'values'")
            elif len(values) != len(cols):
                problems.append(f"{where}: row {name}: {len(values)} values for {len(cols)} columns")
            elif not all(_figure(v, kind != "figures") for v in values):
                problems.append(f"{where}: row {name}: expected numbers or null" +
                                ("" if kind != "figures" else " or short texts"))
    for i, missing in enumerate(doc.get("not_shipped") or []):
        if not isinstance(missing, dict) or not isinstance(missing.get("table"), str) or \
                not isinstance(missing.get("looked"), list) or not missing["looked"]:
            problems.append(f"not_shipped[{i}]: expected the 'table' left out and the list of where it was "
                            "'looked' for")
    return problems


def check_out(out: str | Path) -> str:
    """The form `--out` asks for by its suffix ("md" or "html"); ValueError (one line) for any other suffix."""
    suffix = Path(out).suffix.lower()
    if suffix not in OUT_SUFFIXES:
        raise ValueError(f"--out {out}: expected a file name ending in .md (Markdown) or .html (HTML, pictures "
                         "embedded)")
    return suffix[1:]


def check_schema(path: Path, result: dict[str, Any]) -> str | None:
    """ValueError (one line) when eval.json's `schema` is missing or a major version this report does not read;
    a one-line warning (without the file) when its minor version is newer than this report knows (what it adds is
    left out)."""
    reads = " or ".join(f"{SCHEMA_NAME}/{m}" for m in sorted(SCHEMA_READS))
    schema = result.get("schema")
    found = _SCHEMA.match(schema) if isinstance(schema, str) else None
    if found is None:
        said = "no 'schema'" if schema is None else f"schema {bound(json.dumps(schema), 60)}"
        raise ValueError(f"{path}: {said}; expected an eval.json of `dpot-train evaluate` (schema {reads})")
    major, minor = int(found.group(1)), int(found.group(2) or 0)
    if major not in SCHEMA_READS:
        raise ValueError(f"{path}: schema {schema}; this version of dpot-train reads {reads} (evaluate the "
                         "checkpoint again with it)")
    if minor > SCHEMA_READS[major]:
        return (f"schema {schema} is newer than {SCHEMA_NAME}/{major}.{SCHEMA_READS[major]} this version knows; "
                "the fields it adds are left out")
    return None


def _number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def check_figures(path: Path, result: dict[str, Any]) -> None:
    """ValueError (one line) naming the first figure the report reads that is not a number (or null)."""
    for name, entry in result["datasets"].items():
        where = f"{path}: datasets.{bound(name, 60)}"
        if not isinstance(entry, dict) or not isinstance(entry.get("model"), dict):
            raise ValueError(f"{where}: expected an object with 'model' figures")
        for who in ("model", "persistence"):
            figures = entry.get(who) or {}
            if not isinstance(figures, dict) or not _number(figures.get("rollout_l2re")):
                raise ValueError(f"{where}.{who}.rollout_l2re: expected a number or null")
        per_step = entry["model"].get("l2re_per_step")
        if per_step is not None and not (isinstance(per_step, list) and all(_number(v) for v in per_step)):
            raise ValueError(f"{where}.model.l2re_per_step: expected a list of numbers")
        for who in ("model", "persistence"):
            figures = entry.get(who) or {}
            blown = figures.get("blowup_fraction_per_step")
            if blown is not None and not (isinstance(blown, list) and all(_number(v) for v in blown)):
                raise ValueError(f"{where}.{who}.blowup_fraction_per_step: expected a list of numbers")
            channels = figures.get("channels")
            for channel, scores in (channels.items() if isinstance(channels, dict) else []):
                windows = scores.get("vrmse_window") if isinstance(scores, dict) else None
                if windows is not None and not (isinstance(windows, dict) and all(_number(v) for v in
                                                                                  windows.values())):
                    raise ValueError(f"{where}.{who}.channels.{bound(str(channel), 60)}.vrmse_window: expected an "
                                     "object of numbers")


def load_runs(paths: list[str | Path]) -> list[Run]:
    """Read each eval.json; ValueError naming the file when it is not one of a schema this report reads. Labels:
    the run folder's name (the file's stem when that repeats), numbered when still ambiguous, bounded."""
    runs: list[Run] = []
    for p in paths:
        path = Path(p)
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path}: not a readable eval.json ({exc})") from None
        if not isinstance(result, dict) or not isinstance(result.get("datasets"), dict):
            raise ValueError(f"{path}: not an eval.json of `dpot-train evaluate` (no 'datasets' object)")
        warning = check_schema(path, result)
        check_figures(path, result)
        runs.append(Run(bound(path.parent.name or path.stem), path, result, [warning] if warning else []))
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.label] = seen.get(run.label, 0) + 1
    for i, run in enumerate(runs):
        if seen[run.label] > 1:
            run.label = f"{run.label}/{bound(run.path.stem)}#{i + 1}"
    return runs


def _fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g}"


def _paper_fmt(v: Any) -> str:
    """A figure of the paper data file as printed: every digit it holds (no rounding), "–" for null."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return repr(v)  # the shortest text that reads back as this float
    return bound(v)


def _ratio(v: float | None, ref: float | None) -> str:
    """A run's figure over the paper's with its sign ("-": the run's error is lower, "+": higher)."""
    if v is None or not ref:
        return "–"
    return f"{v / ref:.3g} ({'-' if v < ref else '+' if v > ref else '='})"


def manifest_name(catalog_name: str) -> str:
    """The name a manifest stores a catalog dataset under ("." -> "p", docs/format.md)."""
    return catalog_name.replace(".", "p")


def _column_value(run: Run, datasets: list[str]) -> float | None:
    """A run's figure for a paper column: the dataset's, or the mean over the column's datasets when it has them
    all."""
    vals = [run.score(manifest_name(d)) for d in datasets]
    return None if any(v is None for v in vals) else sum(vals) / len(vals)  # type: ignore[arg-type]


def _picture(run: Run, entry: Any) -> Picture:
    """Check one entry of a run's `plots`: a regular file under the eval.json's own folder (symlinks resolved),
    named as `evaluate --plot` names a picture of one of the run's datasets (DATASET_KIND.png|gif|jpg), whose
    first bytes are those of its kind and whose size is bounded."""
    if not isinstance(entry, str) or not entry:
        return Picture(run.label, bound(json.dumps(entry), 40), problem="refused: not a file path")
    root = run.folder
    try:
        listed = Path(entry) if os.path.isabs(entry) else root / entry
        resolved = listed.resolve()
    except (OSError, RuntimeError, ValueError):  # a NUL byte, a symlink loop
        return Picture(run.label, bound(file_name(entry), 200), problem="refused: not a file path")
    inside = resolved.is_relative_to(root)
    pic = Picture(run.label, bound(resolved.relative_to(root).as_posix() if inside else file_name(entry), 200))
    try:
        pic.problem = _picture_problem(listed, resolved, inside, run.result["datasets"])
    except OSError as exc:
        pic.problem = f"refused: cannot be read ({exc.strerror or exc})"
    if pic.problem is None:
        pic.path, pic.kind = resolved, PICTURES[resolved.suffix.lower()][0]
    return pic


def _picture_problem(listed: Path, resolved: Path, inside: bool, datasets: dict[str, Any]) -> str | None:
    """Why a listed picture is not shown (None: it is shown); see `_picture`."""
    if not os.path.lexists(listed):
        return "missing: no file where eval.json lists it (moved or deleted)"
    if not inside:
        return "refused: not under the folder of its eval.json"
    if not resolved.is_file():
        return "refused: not a regular file"
    if not _picture_name(resolved.name, datasets):
        return "refused: not named as a picture of evaluate --plot (DATASET_KIND.png, .gif or .jpg)"
    if resolved.stat().st_size > MAX_PICTURE_BYTES:
        return f"refused: larger than {MAX_PICTURE_BYTES >> 20} MiB"
    kind, magic = PICTURES[resolved.suffix.lower()]
    with open(resolved, "rb") as f:
        head = f.read(16)
    return None if head.startswith(magic) else f"refused: not a {kind.upper()} file"


def _picture_name(name: str, datasets: dict[str, Any]) -> bool:
    """Whether `name` is DATASET_KIND.SUFFIX for one of `datasets`, KIND a lower-case word, SUFFIX a picture's."""
    stem, dot, suffix = name.rpartition(".")
    dataset, _, kind = stem.rpartition("_")
    return bool(dot) and f".{suffix.lower()}" in PICTURES and dataset in datasets and kind.isalpha() and \
        kind.islower()


def build(runs: list[Run], paper: bool = False, base: str | Path | None = None,
          doc: dict[str, Any] | None = None) -> Report:
    """The report of `runs`: their table, the horizon columns where the rollouts reach them, the pictures their
    eval.json lists (checked, not read), and with `paper` the paper's tables beside them (`doc`: a paper data file
    other than the shipped one, checked as it is). `base`: the folder the report is written to (runs are named
    relative to it; default the working folder)."""
    datasets = sorted({d for r in runs for d in r.result["datasets"]})
    rep = Report(runs, datasets)
    base = Path.cwd() if base is None else Path(base)
    rep.run_paths = {r.label: relative_name(r.path, base) for r in runs}
    header = ["dataset"] + [f"{r.label} ({bound(r.result.get('recipe', '?'), 40)})" for r in runs]
    rows = [[bound(d)] + [_fmt(r.score(d)) for r in runs] for d in datasets]
    rep.sections.append(("Rollout L2RE of the model (lower is better)", header, rows))
    rep.sections.append(("Persistence baseline, rollout L2RE", ["dataset"] + [r.label for r in runs],
                         [[bound(d)] + [_fmt((r.result["datasets"][d].get("persistence") or {}).get("rollout_l2re")
                                             if d in r.result["datasets"] else None) for r in runs]
                          for d in datasets]))
    horizon_rows = []
    for d in datasets:
        for r in runs:
            per_step = r.result["datasets"].get(d, {}).get("model", {}).get("l2re_per_step")
            if per_step and any(h <= len(per_step) for h in HORIZONS):
                horizon_rows.append([bound(d), r.label] + [_fmt(per_step[h - 1]) if h <= len(per_step) else "–"
                                                           for h in HORIZONS])
    if horizon_rows:
        rep.sections.append(("Rollout L2RE at horizon (steps after the inputs)",
                             ["dataset", "run"] + [str(h) for h in HORIZONS], horizon_rows))
    _stability_sections(rep, datasets)
    for r in runs:
        rep.warnings += [f"{r.path}: {w}" for w in r.warnings]
        rep.notes += [f"{rep.run_paths[r.label]}: {w}" for w in r.warnings]
        plots = r.result.get("plots") or []
        for entry in plots if isinstance(plots, list) else [plots]:
            pic = _picture(r, entry)
            rep.pictures.append(pic)
            if pic.problem is not None:
                rep.warnings.append(f"{r.path}: plots: {bound(entry, 300)}: {pic.problem}")
                rep.notes.append(f"Picture of run {r.label} not shown: {pic.name}: {pic.problem}")
    if paper:
        if doc is not None and check_paper(doc):
            raise ValueError(f"paper data: {check_paper(doc)[0]}")
        _paper_sections(rep, load_paper() if doc is None else doc)
    return rep


def _stability_sections(rep: Report, datasets: list[str]) -> None:
    """The runs' VRMSE by window of steps per channel and their blow-up shares (dpot-eval/3), model and persistence;
    runs without them (dpot-eval/2) named in a note."""
    windows, blowups, without = [], [], []
    for r in rep.runs:
        found = False
        for d in datasets:
            entry = r.result["datasets"].get(d)
            if not isinstance(entry, dict):
                continue
            model, persist = entry.get("model") or {}, entry.get("persistence") or {}
            for channel, scores in (model.get("channels") or {}).items():
                if not isinstance(scores, dict) or "vrmse_window" not in scores:
                    continue
                found = True
                other = ((persist.get("channels") or {}).get(channel) or {}).get("vrmse_window") or {}
                windows.append([bound(d), r.label, bound(str(channel))] +
                               [_fmt(scores["vrmse_window"].get(w)) for w in WINDOWS] +
                               [_fmt(other.get(w)) for w in WINDOWS])
            if "blowup_fraction_per_step" in model:
                found = True
                blowups.append([bound(d), r.label, str(len(model["blowup_fraction_per_step"]))] +
                               _shares(model["blowup_fraction_per_step"]) +
                               _shares(persist.get("blowup_fraction_per_step") or [])[-1:])
        if not found and r.result["datasets"]:
            without.append(r.label)
    if windows:
        rep.sections.append(("The Well's VRMSE averaged over rollout steps 1-10, 11-30, 31-end (lower is better; "
                             "– where the rollout does not reach them)",
                             ["dataset", "run", "channel"] + [f"model {w}" for w in WINDOWS] +
                             [f"persistence {w}" for w in WINDOWS], windows))
    if blowups:
        rep.sections.append(("Blow-ups: share of trajectories whose VRMSE (mean over channels) passed 1 by a step",
                             ["dataset", "run", "steps"] + [f"model by {s}" for s in BLOWUP_STEPS] +
                             ["model by the last", "persistence by the last"], blowups))
    if without and (windows or blowups):
        rep.notes.append(f"No VRMSE windows or blow-ups in {', '.join(without)} (schema dpot-eval/2: evaluate again "
                         "for them).")


def _shares(per_step: list[Any]) -> list[str]:
    """A blow-up curve at BLOWUP_STEPS and at its last step ("–" past its end)."""
    at = [per_step[s - 1] if s <= len(per_step) else None for s in BLOWUP_STEPS]
    return [_fmt(v) for v in at + [per_step[-1] if per_step else None]]


def _paper_sections(rep: Report, doc: dict[str, Any]) -> None:
    """The paper's tables beside the runs, each by its kind, with the source of each table and its caveats."""
    rep.paper = doc
    compared = False
    for tbl in doc["tables"]:
        name = bound(tbl["table"])
        rep.notes.append(f"Paper {name}: {bound(tbl['caption'], TEXT_LIMIT)} (source: {bound(tbl['where'], 300)})")
        if tbl["kind"] == "datasets":
            compared |= _paper_datasets(rep, tbl)
        elif tbl["kind"] == "horizon":
            compared |= _paper_horizon(rep, tbl)
        else:
            rep.sections.append((f"Paper {name}: {bound(tbl.get('title', tbl['id']))}",
                                 ["row"] + [bound(c) for c in tbl["columns"]],
                                 [[bound(r["name"])] + [_paper_fmt(v) for v in r["values"]] for r in tbl["rows"]]))
        rep.notes += [f"Caveat ({name}): {bound(c, TEXT_LIMIT)}" for c in tbl.get("caveats", [])]
    rep.notes.append(f"Paper: {bound(doc.get('paper', ''), 300)}. Ratio = run / paper; sign '-': the run's error is "
                     "lower, '+': higher.")
    if compared and any(r.result.get("recipe") != "reference" for r in rep.runs):
        rep.notes.append("Runs evaluated with the dpot recipe score valid channels on fluid cells; the paper's figures "
                         "are the reference recipe's (evaluate --recipe reference).")
    for missing in doc.get("not_shipped", []):
        rep.notes.append(f"Not shipped: the paper's {bound(missing['table'], 300)}: not found in a source that can be "
                         f"read and cited (where we looked: dpot_train/evaluation/paper/{PAPER_FILE}).")


def _paper_datasets(rep: Report, tbl: dict[str, Any]) -> bool:
    """One section per column of a `datasets` table that some run fills: the paper's rows with each run's ratio and
    sign; the columns no dataset can fill, as the paper's figures alone. Whether a run was compared."""
    name, metric = bound(tbl["table"]), tbl.get("metric", "")
    filled, unfilled = 0, []
    for ci, col in enumerate(tbl["columns"]):
        if not col["datasets"]:
            unfilled.append(ci)
            continue
        ours = {r.label: _column_value(r, col["datasets"]) for r in rep.runs}
        if all(v is None for v in ours.values()):
            continue
        filled += 1
        header = ["paper row", "part", "params", "metric", "paper"] + [f"{label} / paper" for label in ours]
        rows = []
        for row in tbl["rows"]:
            ref = row["values"][ci]
            if ref is None:
                continue
            rows.append([bound(row["name"]), bound(row.get("part", "")), bound(row.get("params", "")),
                         bound(row.get("metric", metric)), _paper_fmt(ref)] + [_ratio(v, ref) for v in ours.values()])
        runs_line = ", ".join(f"{k} {_fmt(v)}" for k, v in ours.items())
        rep.sections.append((f"Paper {name}, {bound(col['name'])} ({bound(', '.join(col['datasets']), 300)}); "
                             f"runs: {runs_line}",
                             header, rows))
    if unfilled:
        rep.sections.append((f"Paper {name}: {', '.join(bound(tbl['columns'][ci]['name']) for ci in unfilled)} "
                             "(no dataset of the catalog; the paper's figures alone)",
                             ["paper row", "metric"] + [bound(tbl["columns"][ci]["name"]) for ci in unfilled],
                             [[bound(r["name"]), bound(r.get("metric", metric))] +
                              [_paper_fmt(r["values"][ci]) for ci in unfilled] for r in tbl["rows"]]))
    if not filled and len(unfilled) < len(tbl["columns"]):
        rep.notes.append(f"None of the runs' datasets is a column of the paper's {name} "
                         f"({', '.join(bound(c['name']) for c in tbl['columns'] if c['datasets'])}).")
    return filled > 0


def _paper_horizon(rep: Report, tbl: dict[str, Any]) -> bool:
    """A `horizon` table beside every run on its dataset whose rollout reaches its first step: the paper's rows,
    each run's `l2re_per_step` at the table's steps ("–" past the run's rollout) and its ratio to each paper row.
    Whether a run was compared."""
    name, steps, dataset = bound(tbl["table"]), tbl["columns"], tbl["dataset"]
    ours = {}
    for r in rep.runs:
        per_step = (r.result["datasets"].get(manifest_name(dataset)) or {}).get("model", {}).get("l2re_per_step")
        if per_step and len(per_step) >= steps[0]:
            ours[r.label] = [None if s > len(per_step) else per_step[s - 1] for s in steps]
    if not ours:
        rep.notes.append(f"The paper's {name} ({bound(dataset)}, steps {', '.join(map(str, steps))}) is set beside "
                         f"runs on {bound(dataset)} whose rollout reaches {steps[0]} steps; none of these runs does.")
        return False
    rows = [[bound(r["name"]), "paper"] + [_paper_fmt(v) for v in r["values"]] for r in tbl["rows"]]
    for label, values in ours.items():
        rows.append([label, "run"] + [_fmt(v) for v in values])
        rows += [[f"{label} / {bound(r['name'])}", "ratio"] + [_ratio(v, ref) for v, ref in zip(values, r["values"])]
                 for r in tbl["rows"]]
    rep.sections.append((f"Paper {name}, {bound(dataset)}: {bound(tbl.get('metric', 'L2RE'))} up to each rollout step",
                         ["row", "from"] + [str(s) for s in steps], rows))
    return True


def to_markdown(rep: Report) -> str:
    """The report as GitHub Markdown; every text escaped (dpot_format.text.md), so a table keeps its rows."""
    runs = ", ".join(f"{md(r.label, None)} ({md(rep.run_paths.get(r.label, r.path.name), None)})" for r in rep.runs)
    out = ["# Evaluation report", "", "Runs: " + runs, ""]
    for title, header, rows in rep.sections:
        out += [f"## {md(title, None)}", "", "| " + " | ".join(md(h, None) for h in header) + " |",
                "|" + "---|" * len(header)]
        out += ["| " + " | ".join(md(c, None) for c in row) + " |" for row in rows]
        out.append("")
    out += [f"- {md(n, None)}" for n in rep.notes]
    return "\n".join(out).rstrip() + "\n"


def _embedded(pic: Picture) -> str | None:
    """The picture's file as a data: URL, None when it cannot be read now or is no longer what was checked."""
    try:
        with open(pic.path, "rb") as f:  # type: ignore[arg-type]
            data = f.read(MAX_PICTURE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_PICTURE_BYTES or not data.startswith(PICTURES[pic.path.suffix.lower()][1]):  # type: ignore
        return None
    return f"data:image/{pic.kind};base64,{base64.b64encode(data).decode('ascii')}"


def to_html(rep: Report) -> str:
    """The report as one self-contained HTML page, every text escaped (dpot_format.text.html_text); the pictures
    that passed the checks embedded (base64 PNG / GIF / JPEG) under their run, the others named."""
    e = html_text
    runs = ", ".join(f"{e(r.label, None)} ({e(rep.run_paths.get(r.label, r.path.name), None)})" for r in rep.runs)
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>Evaluation report</title>",
           "<style>table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"
           "td:first-child{text-align:left}</style></head><body><h1>Evaluation report</h1>",
           f"<p>Runs: {runs}</p>"]
    for title, header, rows in rep.sections:
        out.append(f"<h2>{e(title, None)}</h2><table><tr>" + "".join(f"<th>{e(h, None)}</th>" for h in header)
                   + "</tr>")
        out += ["<tr>" + "".join(f"<td>{e(c, None)}</td>" for c in row) + "</tr>" for row in rows]
        out.append("</table>")
    if rep.notes:
        out.append("<ul>" + "".join(f"<li>{e(n, None)}</li>" for n in rep.notes) + "</ul>")
    for run in rep.runs:
        shown = [p for p in rep.pictures if p.run == run.label and p.path is not None]
        if shown:
            out.append(f"<h2>Pictures of run {e(run.label, None)} "
                       f"({e(rep.run_paths.get(run.label, run.path.name), None)})</h2>")
        for pic in shown:
            caption = f"{e(run.label, None)}: {e(pic.name, None)}"
            url = _embedded(pic)
            out.append(f"<figure><img src='{url}' alt='{caption}'><figcaption>{caption}</figcaption></figure>"
                       if url is not None else
                       f"<p>{caption}: not shown (could not be read again, or changed since it was checked)</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_report(paths: list[str | Path], out: str | Path, paper: bool = False,
                 warn: Callable[[str], None] | None = None) -> tuple[Path, str]:
    """Build the report of `paths` and write it atomically to `out` (.md: Markdown, .html: HTML; ValueError for
    another suffix, before anything is read); returns the path and the Markdown text. `warn` gets each one-line
    warning (a newer minor schema, a picture refused or missing)."""
    from dpot_format.io import atomic_write
    from dpot_format.output import check_file

    out = check_file(out, "--out", "report.md")  # the one output rule first (a link, a FIFO, a dataset's folder)
    form = check_out(out)  # then the suffix; both before anything is read
    rep = build(load_runs(paths), paper=paper, base=out.absolute().parent)
    for line in rep.warnings:
        (warn or (lambda _line: None))(line)
    markdown = to_markdown(rep)
    text = to_html(rep) if form == "html" else markdown
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, text.encode("utf-8"))
    return out, markdown
