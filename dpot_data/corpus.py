"""Ingest a whole folder of downloaded raw files: sort the files into catalog datasets, then ingest each dataset into
its own output folder (OUT/<manifest name>/), so that one command turns a download of the DPOT pre-training corpus
into shards. Datasets already complete in OUT are left alone, so an interrupted run resumes where it stopped."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from dpot_data.catalog import Catalog, load_catalog
from dpot_data.errors import InputError
from dpot_data.sources.detect import RAW_SUFFIXES

_CONDITIONED = re.compile(r"condit?i?oned", re.IGNORECASE)


@dataclass
class CorpusPlan:
    """Raw inputs per catalog dataset (catalog order), raw files no dataset claims, pre-training sets not found."""

    groups: dict[str, list[Path]] = field(default_factory=dict)
    unknown: list[Path] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


@dataclass
class CorpusRun:
    """The outcome of every dataset ingested, the datasets that failed (name, error) and the plan."""

    done: list[Any]  # dpot_data.ingest.IngestOutcome, one per dataset ingested or kept
    failed: list[tuple[str, str]]
    plan: CorpusPlan


def plan_corpus(paths: Sequence[str | Path], catalog: Catalog | None = None) -> CorpusPlan:
    """Sort raw files and CFDBench trees below `paths` into catalog datasets, by file name (PDEArena standard and
    conditioned files share a name pattern: a folder named "...conditoned"/"...conditioned" marks the latter)."""
    catalog = catalog or load_catalog()
    found: dict[str, list[Path]] = {}
    unknown: list[Path] = []
    for root in map(Path, paths):
        if not root.exists():
            raise InputError(root, "not found")
        files = [root] if root.is_file() else sorted(q for q in root.rglob("*") if q.is_file())
        # CFDBench trees: <root>/<problem>/<subset>/caseNNNN/case.json
        cfd_roots = {q.parents[3] for q in files if q.name == "case.json" and q.parent.name.startswith("case")}
        for q in files:
            if any(r in q.parents for r in cfd_roots) or q.suffix.lower() not in RAW_SUFFIXES:
                continue
            entries = [e for e in catalog.match_files([q]) if e.source != "cfdbench"]
            if len(entries) > 1 and {e.source for e in entries} == {"pdearena"}:
                cond = any(_CONDITIONED.search(part) for part in q.parent.parts)
                entries = [e for e in entries if (e.name == "pdearena-ns-cond") == cond]
            if len(entries) == 1:
                found.setdefault(entries[0].name, []).append(q)
            else:
                unknown.append(q)
        if cfd_roots:
            found.setdefault("cfdbench", []).extend(sorted(cfd_roots))
    order = list(catalog.entries)
    groups = {name: found[name] for name in sorted(found, key=order.index)}
    missing = [e.name for e in catalog.pretrain() if e.name not in groups]
    return CorpusPlan(groups, unknown, missing)


def ingest_corpus(paths: Sequence[str | Path], out: str | Path, options: object | None = None, *,
                  dataset: str | None = None, catalog_split: bool = True,
                  catalog: Catalog | None = None) -> CorpusRun:
    """Ingest every catalog dataset found below `paths` into OUT/<manifest name>/ (only `dataset` when given).

    Each dataset uses the catalog's split (unless `catalog_split` is False) and at least as many channels as it
    has (the 3D sets have 5). A dataset that fails is reported and the others still run.
    """
    from dpot_data.ingest import IngestOptions, run_ingest

    catalog = catalog or load_catalog()
    opts = options if options is not None else IngestOptions()
    plan = plan_corpus(paths, catalog)
    groups = plan.groups
    if dataset is not None:
        entry = catalog.find(dataset)
        if entry is None or entry.name not in groups:
            raise InputError(str(paths[0]) if paths else "<no paths>",
                             f"no raw files of {dataset} found (found: {', '.join(groups) or 'none'})")
        groups = {entry.name: groups[entry.name]}
    if not groups:
        raise InputError(str(paths[0]) if paths else "<no paths>", "found no raw files of any catalog dataset")
    done, failed = [], []
    for name, inputs in groups.items():
        entry = catalog.get(name)
        per = replace(opts, channels=max(opts.channels or 4, len(entry.channels)), name=None)
        try:
            done.append(run_ingest(None, inputs, Path(out) / entry.manifest_name, per, dataset=name,
                                   catalog=catalog, catalog_split=catalog_split))
        except InputError as exc:
            failed.append((name, str(exc)))
    return CorpusRun(done, failed, plan)


@dataclass
class DownloadCheck:
    """What `catalog --check DIR` found: the report (`--json`), its lines, and the exit code (1: an MD5 differs)."""

    report: dict[str, Any]
    lines: list[str]
    code: int


def _md5(path: Path) -> str:
    """The MD5 of a file, read in blocks."""
    import hashlib

    h = hashlib.md5()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def check_downloads(folder: Path, md5: bool) -> DownloadCheck:
    """Which catalog datasets a download folder holds, which pre-training ones it lacks, files no dataset claims;
    with `md5`, each file compared with its published MD5. InputError for a folder that cannot be read."""
    catalog = load_catalog()
    plan = plan_corpus([folder], catalog)
    report: dict[str, Any] = {"folder": str(folder), "datasets": {}, "missing_pretrain": plan.missing,
                              "unknown": [str(p) for p in plan.unknown]}
    bad = 0
    for name, paths in plan.groups.items():
        entry = catalog.get(name)
        files = []
        for path in sorted(p for q in paths for p in ([q] if q.is_file() else sorted(q.rglob("*"))) if p.is_file()):
            item: dict[str, Any] = {"path": str(path), "bytes": path.stat().st_size}
            published = entry.download if entry.download and path.name == entry.files[0] else None
            if md5 and published and "md5" in published:
                item["md5_ok"] = _md5(path) == published["md5"]
                bad += not item["md5_ok"]
            files.append(item)
        report["datasets"][name] = files
    return DownloadCheck(report, _download_lines(report, catalog), 1 if bad else 0)


def _download_lines(report: dict[str, Any], catalog: Catalog) -> list[str]:
    """The lines of `catalog --check DIR`: found, missing and unknown, one a line."""
    lines = []
    for name, files in report["datasets"].items():
        checked = [f for f in files if "md5_ok" in f]
        note = "" if not checked else (" (published MD5 matches)" if all(f["md5_ok"] for f in checked)
                                       else " (published MD5 DIFFERS)")
        lines.append(f"found   {name}: {len(files)} file(s), {sum(f['bytes'] for f in files)} bytes{note}")
    lines += [f"missing {name} (pre-training): expected {catalog.get(name).files[0]}"
              for name in report["missing_pretrain"]]
    return lines + [f"unknown {path}: no catalog dataset has this file name" for path in report["unknown"]]
