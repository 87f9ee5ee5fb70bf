"""`dpot-data inspect`, `verify` and `stats`: read an ingest output back and report on it (dpot_data.inspection,
dpot_data.output, dpot_data.stats)."""

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dpot_data.cli.options import (HashWorkers, OutputFolder, ProblemsJson, ReportJson, Scheduler, StatsJson,
                                   StatsWorkers, fail, say)
from dpot_data.errors import InputError
from dpot_format.errors import FormatError


def inspect_command(
    folder: OutputFolder,
    as_json: ReportJson = False,
    verify: Annotated[bool, typer.Option("--verify", help="Re-hash every shard and Zarr array (sha256).")] = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write a PNG grid of first/middle/last frames of a "
                                                 "few trajectories per dataset (channel names, colour bars, mask "
                                                 "outlined).")] = None,
    plot_trajectories: Annotated[int, typer.Option("--plot-trajectories", help="Trajectories per dataset in "
                                                   "--plot.")] = 2,
) -> None:
    """A table per dataset: trajectories per split, frames, channels, grid, resampling, shards, bytes, checksums."""
    from dpot_data.inspection import inspect_outputs

    try:
        report, reports = inspect_outputs(folder, verify=verify, plot=None if plot is None else str(plot))
    except (InputError, FormatError) as exc:
        raise fail(exc) from None
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _show(reports)
    if plot is not None:
        _plot(folder, plot, plot_trajectories)
    if not report["ok"]:
        raise typer.Exit(code=1)


def _show(reports: list[dict]) -> None:
    """Each output's table (dpot_data.inspection.render), then its problems and warnings, named by its folder
    when there are several."""
    from rich.console import Console

    from dpot_data.inspection import render

    console = Console(width=None if sys.stdout.isatty() else 160)
    for one in reports:
        console.print(render(one))
        prefix = "" if len(reports) == 1 else f"{Path(one['path']).name}/"
        for line in one["problems"] + one["warnings"]:
            typer.echo(prefix + line)


def _plot(folder: str, plot: Path, trajectories: int) -> None:
    """`inspect --plot`: the picture written (dpot_data.plot.plot_output), and said on stderr."""
    from dpot_data.plot import PlotOptions, plot_output

    try:
        plot_output(str(folder), str(plot), PlotOptions(trajectories=trajectories))
    except (InputError, FormatError) as exc:
        raise fail(exc) from None
    typer.echo(f"wrote {plot}", err=True)


def verify_command(folder: OutputFolder, workers: HashWorkers = None,
                   scheduler: Scheduler = None, as_json: ProblemsJson = False) -> None:
    """Check the output against docs/format.md (dpot_format.validate): re-hash every shard and Zarr array, check
member names, .npy headers and meta.json, paths and the manifest; exit 1 naming each problem (files the manifest
does not list, and temporary leftovers, are reported as warnings)."""
    from dpot_data.inspection import verify_outputs
    from dpot_format.validate import as_json as problems_json
    from dpot_format.validate import summarise

    try:
        problems, checked = verify_outputs(folder, workers=workers, scheduler=scheduler)
    except InputError as exc:
        raise fail(exc) from None
    code, lines = summarise(problems, checked)
    say(as_json, {"ok": code == 0, "problems": problems_json(problems)}, lines)
    raise typer.Exit(code=code)


def stats_command(folder: OutputFolder, workers: StatsWorkers = None, scheduler: Scheduler = None,
                  as_json: StatsJson = False) -> None:
    """Recompute the normalisation statistics (train split, valid channels, fluid cells, float64) from the stored
    trajectories, print them, and compare them with the manifest's (exit 1 when they differ)."""
    from dpot_data.output import check_stats
    from dpot_data.stats import stats_lines

    try:
        recomputed, problems = check_stats(folder, workers=workers, scheduler=scheduler)
    except (FormatError, InputError) as exc:
        raise fail(exc) from None
    say(as_json, {"datasets": recomputed, "differences": problems}, stats_lines(recomputed, problems))
    if any(problems.values()):
        raise typer.Exit(code=1)
