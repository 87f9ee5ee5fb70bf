"""`inspect`: what an ingest output folder (a local path or an fsspec URL) holds, read from its manifest and
checked against the files by dpot_format's validator, the one `dpot-data verify` runs."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from dpot_data.errors import InputError
from dpot_format.errors import FormatError
from dpot_format.io import filesystem, is_local, join, local_path
from dpot_format.manifest import read_manifest
from dpot_format.names import MANIFEST_NAME
from dpot_format.validate import Problem, validate_output


def _tree_bytes(root: str, rel: str) -> int:
    """Total size of the regular files under a folder of the output, links not followed (0 when absent)."""
    if is_local(root):
        path = Path(local_path(root)) / rel
        if not path.is_dir() or path.is_symlink():
            return 0
        return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    fsys, base = filesystem(join(root, rel))
    try:
        found = fsys.find(base, detail=True)
    except FileNotFoundError:
        return 0
    return sum(int(info.get("size") or 0) for info in found.values() if info.get("type") == "file")


def _file_bytes(root: str, rel: str) -> int:
    """Size of a regular file of the output (0 when absent, a link or anything else)."""
    if is_local(root):
        try:
            st = os.lstat(os.path.join(local_path(root), rel))
        except OSError:
            return 0
        return st.st_size if stat.S_ISREG(st.st_mode) else 0
    fsys, path = filesystem(join(root, rel))
    try:
        info = fsys.info(path)
    except FileNotFoundError:
        return 0
    return int(info.get("size") or 0) if info.get("type") == "file" else 0


def _failed(problem: Problem) -> dict[str, Any]:
    """One fatal problem in the report's shape: kind, path (the file, member or array), expected, actual."""
    return {"kind": problem.kind, "path": problem.what, "expected": problem.expected,
            "actual": "missing" if problem.kind == "missing" else problem.actual, "ok": False}


def dataset_report(root: str, entry: dict[str, Any], problems: list[Problem], verify: bool = False
                   ) -> dict[str, Any]:
    """One dataset: its manifest facts, the bytes found on disk, and the validator's findings for it."""
    checked = len(entry["shards"]) + (len(entry["zarr"]["arrays"]) if entry["zarr"] else 0)
    failed = [_failed(p) for p in problems if p.fatal and p.dataset == entry["name"]]
    shard_bytes_disk = sum(_file_bytes(root, s["path"]) for s in entry["shards"])
    zarr_bytes = _tree_bytes(root, f"{entry['zarr']['path']}/{entry['zarr']['group']}") if entry["zarr"] else 0
    if not checked:
        status = "nothing to check"
    elif failed:
        status = f"FAILED ({len(failed)} of {checked})"
    else:
        status = "sha256 ok" if verify else "sizes ok"
    return {
        "name": entry["name"],
        "source": entry["source"],
        "boundary": entry["boundary"],
        "parameters": entry["parameters"],
        "trajectories": entry["trajectories"],
        "splits": entry["splits"]["counts"],
        "frames": entry["frames"],
        "dt": entry["dt"],
        "channels": [{"name": n, "valid": v} for n, v in zip(entry["channels"], entry["channel_valid"])],
        "fill_value": entry["fill_value"],
        "grid": entry["grid"],
        "resample": entry["resample"],
        "shards": {
            "count": len(entry["shards"]),
            "samples": sum(s["samples"] for s in entry["shards"]),
            "bytes_manifest": sum(s["bytes"] for s in entry["shards"]),
            "bytes_on_disk": shard_bytes_disk,
        },
        "zarr": None if not entry["zarr"] else {"path": f"{entry['zarr']['path']}/{entry['zarr']['group']}",
                                                "arrays": sorted(entry["zarr"]["arrays"]), "bytes_on_disk": zarr_bytes},
        "bytes_on_disk": shard_bytes_disk + zarr_bytes,
        "inputs": len(entry["inputs"]),
        "skipped": len(entry["skipped"]),
        "checksums": {"verified": verify, "checked": checked, "status": status, "ok": not failed,
                      "failed": failed},
    }


def inspect_dir(path: str | os.PathLike[str], verify: bool = False) -> dict[str, Any]:
    """Report on an ingest output folder (a local path or an fsspec URL): manifest header, one `dataset_report` per
    dataset, and the validator's findings (`dpot_format.validate.validate_output`: sha256 when `verify`, else its
    cheap mode). InputError when the manifest cannot be read."""
    root = os.fspath(path)
    try:
        manifest = read_manifest(root)
    except FormatError as exc:
        raise InputError(exc.where or join(root, MANIFEST_NAME), exc.expected) from None
    problems = validate_output(root, rehash=verify, trust_index=not verify)  # --verify: the index against the tars
    datasets = [dataset_report(root, entry, problems, verify) for entry in manifest["datasets"]]
    other = [p for p in problems if p.fatal and not p.dataset]
    return {
        "path": root,
        "manifest": join(root, MANIFEST_NAME),
        "schema_version": manifest["schema_version"],
        "tool": manifest["tool"],
        "created": manifest["created"],
        "command": manifest["command"],
        "datasets": datasets,
        "problems": [str(p) for p in problems if p.fatal],
        "warnings": [str(p) for p in problems if not p.fatal],
        "ok": all(d["checksums"]["ok"] for d in datasets) and not other,
    }


def human_bytes(n: int) -> str:
    """1536 → '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def render(report: dict[str, Any]) -> Any:
    """A rich Table of the report: one row per dataset."""
    from rich.table import Table

    table = Table(title=f"{report['path']}  (manifest v{report['schema_version']}, {report['created']})")
    for column in ("dataset", "source", "trajectories", "frames", "channels", "grid", "resample", "shards", "bytes",
                   "checksums"):
        table.add_column(column)
    for d in report["datasets"]:
        splits = " / ".join(f"{k} {v}" for k, v in d["splits"].items() if v)
        names = [c["name"] for c in d["channels"] if c["valid"]]
        pads = len(d["channels"]) - len(names)
        channels = ", ".join(names) + (f" + {pads} pad" if pads else "")
        grid = "x".join(map(str, d["grid"]["shape"]))
        native = "x".join(map(str, d["grid"]["native_shape"]))
        grid_text = grid if grid == native else f"{grid} (from {native})"
        resample = d["resample"]["fields"] + ("" if d["resample"]["mask"] == "none" else f", mask {d['resample']['mask']}")
        status = d["checksums"]["status"]
        table.add_row(d["name"], d["source"], f"{d['trajectories']} ({splits})", str(d["frames"]), channels, grid_text,
                      resample, str(d["shards"]["count"]), human_bytes(d["bytes_on_disk"]),
                      status if d["checksums"]["ok"] else f"[red]{status}[/red]")
    return table


def inspect_outputs(folder: str, verify: bool = False, plot: str | None = None) -> tuple[dict[str, Any], list[dict]]:
    """`dpot-data inspect`: the report of every output at `folder` (one, or each dataset folder of a corpus) and
    the one that sums them up; a local --plot file is checked by the output rule first. InputError / FormatError."""
    from dpot_data.paths import output_roots

    if plot is not None and "://" not in str(plot):
        from dpot_format.output import check_file

        check_file(plot, "--plot", "frames.png")  # the one output rule, before the output is inspected
    reports = [inspect_dir(root, verify=verify) for root in output_roots(folder)]
    report = reports[0] if len(reports) == 1 else {
        "ok": all(r["ok"] for r in reports), "folder": str(folder),
        "datasets": [d for r in reports for d in r["datasets"]], "outputs": reports}
    return report, reports


def verify_outputs(folder: str, workers: int | None = None, scheduler: str | None = None
                   ) -> tuple[list[Problem], int | None]:
    """`dpot-data verify`: the problems of every output at `folder` against docs/format.md (named by dataset folder
    in a corpus) and how many items were checked (None when the manifest itself failed). InputError."""
    from dataclasses import replace

    from dpot_data.ingest.scheduler import SchedulerOptions, scheduler_context
    from dpot_data.paths import absolute_path, output_roots

    roots = output_roots(absolute_path(folder))
    problems: list[Problem] = []
    items: list = []
    with scheduler_context(SchedulerOptions(workers=workers, address=scheduler)) as runner:
        for root in roots:
            found = validate_output(root, runner=runner, progress=lambda item, _found: items.append(item))
            prefix = "" if len(roots) == 1 else f"{Path(root).name}/"
            problems += [replace(p, what=prefix + p.what) for p in found]
    checked = None if any(p.kind in ("manifest", "schema") for p in problems) else len(items)
    return problems, checked
