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
