"""`dpot-data`: the command-line face of the data toolkit. Thin: every command calls a library function."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(
    name="dpot-data",
    help="Ingest public PDE datasets (FNO, PDEBench, PDEArena, CFDBench) into Zarr stores and WebDataset "
    "shards with a checksummed manifest, and inspect what was written.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
synth_app = typer.Typer(help="Write small raw files in the exact published layout of each source.", no_args_is_help=True)
ingest_app = typer.Typer(help="Read raw files of one source and write shards, a Zarr store and a manifest.", no_args_is_help=True)
app.add_typer(synth_app, name="synth")
app.add_typer(ingest_app, name="ingest")


def _fail(exc: Exception) -> typer.Exit:
    """Bad input: one line on stderr naming the file and what was expected, exit code 2."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(code=2)


def _parse_bytes(text: str) -> int:
    """'256MiB', '64M', '1GB', '1048576' → bytes."""
    units = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2, "mib": 1 << 20,
             "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}
    value = text.strip().lower()
    number = value.rstrip("kmgib")
    unit = value[len(number):]
    try:
        return int(float(number) * units[unit])
    except (ValueError, KeyError):
        raise typer.BadParameter(f"expected a byte size such as 256MiB, got {text!r}") from None


@synth_app.command("fno")
def synth_fno_command(
    out: Path = typer.Option(..., "--out", help="Folder for the raw .mat files."),
    n: int = typer.Option(8, "--n", help="Trajectories."),
    frames: int = typer.Option(20, "--frames", help="Recorded frames after t=0 (one per unit time)."),
    viscosity: float = typer.Option(1e-3, "--viscosity", help="Kinematic viscosity nu."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random initial vorticity."),
    resolution: int = typer.Option(64, "--resolution", help="Grid size s (s x s), solved directly."),
    dt: Optional[float] = typer.Option(None, "--dt", help="Solver time step (default: fast and stable for nu)."),
) -> None:
    """FNO Navier–Stokes vorticity: the same solutions as MAT v5 (NavierStokes_*.mat) and v7.3 (ns_*.mat)."""
    from dpot_data.synth.fno import synth_fno

    try:
        paths = synth_fno(out, n=n, frames=frames, viscosity=viscosity, seed=seed, resolution=resolution, dt=dt)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    for path in paths:
        typer.echo(str(path))


def _ingest_command(source: str, help_text: str) -> None:
    """Register `dpot-data ingest <source>` with the options every source shares (the reader is found by name)."""

    def command(
        files: List[Path] = typer.Argument(..., help="Raw files of this source."),
        out: Path = typer.Option(..., "--out", help="Output folder (manifest.json, data.zarr, shards/)."),
        resolution: int = typer.Option(128, "--resolution", help="Target size of each spatial axis (0: native)."),
        channels: int = typer.Option(4, "--channels", help="Pad channels up to this count."),
        fill: float = typer.Option(1.0, "--fill", help="Value of padded channels."),
        resample: str = typer.Option("auto", "--resample", help="auto | fourier | bilinear | bicubic."),
        mask_resample: str = typer.Option("nearest", "--mask-resample", help="nearest | area-threshold."),
        formats: str = typer.Option("zarr,wds", "--format", help="Comma list of outputs: zarr, wds."),
        split: str = typer.Option("0.9", "--split", help="Train fraction, or 'train,valid' fractions; rest is test."),
        seed: int = typer.Option(0, "--seed", help="Seed of the trajectory split."),
        name: Optional[str] = typer.Option(None, "--name", help="Dataset name (default: from the source)."),
        shard_size: str = typer.Option("256MiB", "--shard-size", help="Target bytes per WebDataset shard."),
        segment: Optional[int] = typer.Option(None, "--segment", help="Cut trajectories into pieces of this many frames."),
        block: Optional[int] = typer.Option(None, "--block", help="Trajectories per task (default: ~64 MiB)."),
        workers: Optional[int] = typer.Option(None, "--workers", help="Local threads (default: one per core)."),
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="dask.distributed scheduler address."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a complete earlier ingest in --out."),
        stats: bool = typer.Option(True, "--stats/--no-stats", help="Normalisation statistics of the train split."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
    ) -> None:
        from dpot_data.errors import InputError
        from dpot_data.ingest import IngestOptions, parse_split, run_ingest

        try:
            options = IngestOptions(
                resolution=resolution or None, channels=channels, fill=fill, resample=resample,
                mask_resample=mask_resample, formats=tuple(f.strip() for f in formats.split(",") if f.strip()),
                split=parse_split(split), seed=seed, name=name, shard_size=_parse_bytes(shard_size), segment=segment,
                block=block, overwrite=overwrite, progress=progress, stats=stats, workers=workers, scheduler=scheduler,
            )
            outcome = run_ingest(source, files, out, options)
        except InputError as exc:
            raise _fail(exc) from None
        for note in outcome.notes:
            typer.echo(note, err=True)
        for d in outcome.manifest["datasets"]:
            counts = ", ".join(f"{k} {v}" for k, v in d["splits"]["counts"].items() if v)
            size = sum(s["bytes"] for s in d["shards"])
            typer.echo(f"{'wrote' if outcome.written else 'kept'} {outcome.path}: {d['name']}, {d['trajectories']} "
                       f"trajectories ({counts}), {d['frames']} frames, grid {'x'.join(map(str, d['grid']['shape']))}, "
                       f"{len(d['shards'])} shards ({size} bytes)")

    command.__doc__ = help_text
    ingest_app.command(source)(command)


_ingest_command("fno", "FNO Navier–Stokes .mat files (v5 or v7.3): a then u along time, viscosity from the name.")


@app.command("inspect")
def inspect_command(
    folder: Path = typer.Argument(..., help="An ingest output folder (holding manifest.json)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    verify: bool = typer.Option(False, "--verify", help="Re-hash every shard and Zarr array (sha256)."),
) -> None:
    """A table per dataset: trajectories per split, frames, channels, grid, resampling, shards, bytes, checksums."""
    import json

    from dpot_data.errors import InputError
    from dpot_data.inspect import inspect_dir, render

    try:
        report = inspect_dir(folder, verify=verify)
    except InputError as exc:
        raise _fail(exc) from None
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        import sys

        from rich.console import Console

        Console(width=None if sys.stdout.isatty() else 160).print(render(report))
    if not report["ok"]:
        raise typer.Exit(code=1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
