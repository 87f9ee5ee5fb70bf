"""`dpot-data ingest ...`: one command per source with the options every source shares; the work is
dpot_data.ingest.command's (options checked, dry run, ingest, corpus)."""

import inspect
from pathlib import Path
from typing import List, Optional

import click
import typer
from typer.core import TyperGroup

from dpot_data.cli.options import Scheduler, fail
from dpot_data.errors import CatalogError, InputError
from dpot_data.ingest.command import SizeError, ingest_command


class _IngestGroup(TyperGroup):
    """`dpot-data ingest --dataset NAME FILES...` / `dpot-data ingest FILES...`: without a source, run `ingest auto`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            _refuse_unknown_source(args[0], sorted(self.commands))
            args = ["auto", *args]
        return super().parse_args(ctx, args)


def _refuse_unknown_source(word: str, sources: list[str]) -> None:
    """A first argument that is a bare word (no path separator, suffix or URL) naming no file is a misspelled source:
    one line naming the sources (and the closest one), exit code 2."""
    import difflib

    if word.startswith("-") or any(c in word for c in "/\\.:*?[") or Path(word).exists():
        return
    close = difflib.get_close_matches(word, sources, n=1)
    hint = f"did you mean `dpot-data ingest {close[0]}`? " if close else ""
    typer.echo(f"error: {word}: neither a source nor an existing file; {hint}sources: {', '.join(sources)} "
               "(or give only files: the source is detected)", err=True)
    raise typer.Exit(code=2)


app = typer.Typer(help="Read raw files of one source and write shards, a Zarr store and a manifest. Without a "
                  "source (`dpot-data ingest [--dataset NAME] FILES...`) the source is detected from the files.",
                  no_args_is_help=True, cls=_IngestGroup)


def _ingest_command(source: str, help_text: str, command_name: Optional[str] = None,
                    extra: Optional[dict] = None) -> None:
    """Register `dpot-data ingest <source>` with the options every source shares (the reader is found by name);
    `extra`: {reader option: typer.Option} of options only this source's reader takes (passed to it by name)."""

    def command(
        files: List[str] = typer.Argument(..., help="Raw files of this source (paths or fsspec URLs)."),
        out: str = typer.Option(..., "--out", help="Output folder or fsspec URL (manifest.json, data.zarr, shards/)."),
        resolution: Optional[str] = typer.Option(None, "--resolution", help="Target grid: N for every spatial axis, "
                                                 "or H,W (D,H,W for 3D) in the stored axis order (0: native). "
                                                 "Default per source: 128 for 2D data, native for 3D. Own data "
                                                 "(xarray, the-well) keeps its native grid, whatever its aspect."),
        channels: Optional[int] = typer.Option(None, "--channels", help="Pad channels up to this count (default 4, "
                                               "or the native count when larger: 5 for 3D compressible NS)."),
        fill: float = typer.Option(1.0, "--fill", help="Value of padded channels."),
        convention: str = typer.Option(
            "dpot-reference", "--convention",
            help="dpot-reference: orientation, frames, channels, split and resampling as the released DPOT checkpoints "
                 "saw them (docs/conventions.md); canonical: ours (Fourier resampling of periodic data, FNO's `a` as "
                 "frame 0, seeded split)."),
        resample: str = typer.Option("auto", "--resample", help="auto (bilinear under dpot-reference; Fourier for "
                                     "periodic data under canonical) | fourier | bilinear (no antialiasing, as the "
                                     "reference) | bilinear-antialias | bicubic."),
        mask_resample: str = typer.Option("nearest", "--mask-resample", help="nearest | area-threshold."),
        formats: str = typer.Option("zarr,wds", "--format", help="Comma list of outputs: zarr, wds."),
        split: Optional[str] = typer.Option(None, "--split", help="Train fraction, or 'train,valid' fractions; rest "
                                            "is test, by a seeded permutation. Default: the convention's rule (the "
                                            "reference's index-based split where known), else 0.9 (or the catalog's "
                                            "split with --dataset)."),
        dataset: Optional[str] = typer.Option(None, "--dataset", help="Catalog dataset (manifests/catalog.yaml), e.g. "
                                              "pdebench-cfd-m1-eta0.1: its name, split and expected counts."),
        seed: int = typer.Option(0, "--seed", help="Seed of the trajectory split."),
        name: Optional[str] = typer.Option(None, "--name", help="Dataset name (default: from the source)."),
        shard_size: str = typer.Option("256MiB", "--shard-size", help="Target bytes per WebDataset shard."),
        segment: Optional[int] = typer.Option(None, "--segment", help="Cut trajectories into pieces of this many frames."),
        block: Optional[int] = typer.Option(None, "--block", help="Trajectories per task (default: ~64 MiB)."),
        workers: Optional[int] = typer.Option(None, "--workers", help="Local threads (default: one per core)."),
        scheduler: Scheduler = None,
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace a complete earlier ingest in --out."),
        stats: bool = typer.Option(True, "--stats/--no-stats", help="Normalisation statistics of the train split."),
        nonfinite: str = typer.Option("skip", "--nonfinite", help="Trajectories holding NaN/Inf: skip (left out and "
                                      "listed in the manifest; found by one scan of the files when opened, or for "
                                      "pdebench, fno and pdearena by the block reads, the ingest then starting "
                                      "again from the scan) or raise (no scan, values checked as they are read; "
                                      "the ingest stops naming the trajectory)."),
        max_abs: Optional[float] = typer.Option(None, "--max-abs", help="The largest magnitude a stored value may "
                                                "have (default 1e15): a value beyond it (a damaged chunk decodes to "
                                                "values like 1e23) stops the ingest naming the file, trajectory and "
                                                "value; inf: no bound."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar."),
        card: bool = typer.Option(False, "--card", help="Once the manifest is published, write the dataset card "
                                  "(README.md and card/<dataset>.png beside it), as `dpot-data card OUT` does."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print what would be read (files, source, dataset, "
                                     "trajectories, frames, native grid) and written (stored shape, channels, split "
                                     "counts, formats, approximate bytes) without writing anything."),
        **reader: object,
    ) -> None:
        given = dict(channels=channels, fill=fill, resample=resample, mask_resample=mask_resample, formats=formats,
                     split=split, convention=convention, seed=seed, name=name, shard_size=shard_size, segment=segment,
                     block=block, overwrite=overwrite, progress=progress, stats=stats, workers=workers,
                     scheduler=scheduler, nonfinite=nonfinite, card=card)
        _run(source, files, out, given, dict(resolution=resolution, max_abs=max_abs, dataset=dataset,
                                             reader={k: v for k, v in reader.items() if v is not None},
                                             dry_run=dry_run))

    command.__doc__ = help_text
    command.__signature__ = _with_options(command, extra or {})  # type: ignore[attr-defined]
    app.command(command_name or source)(command)


def _with_options(function: object, extra: dict) -> inspect.Signature:
    """The function's signature with its **kwargs replaced by the `extra` options (each an Optional[str] option,
    or Optional[bool] where the option's default is a bool flag pair), so that typer offers them."""
    sig = inspect.signature(function, eval_str=True)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for key, option in extra.items():
        kind = Optional[bool] if "/" in (option.param_decls or ("",))[0] else Optional[str]
        params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind))
    return sig.replace(parameters=params)


def _run(source: str, files: List[str], out: str, given: dict, how: dict) -> None:
    """dpot_data.ingest.command.ingest_command (`how`: its keyword options), and what it reports said; bad input:
    one line, exit code 2."""
    try:
        report = ingest_command(source, files, out, given, warn=lambda line: typer.echo(line, err=True), **how)
    except SizeError as exc:
        raise typer.BadParameter(str(exc)) from None
    except (InputError, CatalogError) as exc:
        raise fail(exc) from None
    except KeyboardInterrupt:  # Ctrl-C: the staged part and its journal stay, and say how to go on
        if how["dry_run"]:
            raise
        typer.echo(f"interrupted: nothing was published in {out}; run the same command again to resume from the "
                   "shards already completed", err=True)
        raise typer.Exit(code=130) from None
    for line, on_stderr in report.lines:
        typer.echo(line, err=on_stderr)
    if report.failed:
        raise typer.Exit(code=2)


_ingest_command("fno", "FNO Navier–Stokes .mat files (v5 or v7.3): u at t = 1..T (with --convention canonical, a "
                       "as frame 0 before it), viscosity from the name.")
_ingest_command("pdebench", "PDEBench HDF5: 2D/3D compressible NS (flat; Vx, Vy, [Vz,] density, pressure), "
                "diffusion–reaction (u, v) or shallow water (h) with one group per sample.")
_ingest_command("pdearena", "PDEArena NavierStokes2D_*.h5 files or folders (standard or conditioned): u, vx, vy; "
                "the split and buo_y of every trajectory come from its file; unreadable files are skipped.")
_ingest_command("cfdbench", "CFDBench case trees (cavity, tube, cylinder, dam): u, v and the geometry mask from "
                "case.json; split by case, then cut into --segment pieces (default 20 frames).")
_ingest_command("corpus", "Folders of downloaded raw files of several datasets: each catalog dataset found is "
                "ingested into OUT/<dataset>/ with the catalog's name and split (--dataset: only that one); datasets "
                "already complete are kept, so a rerun resumes. Lists files no dataset claims and missing "
                "pre-training sets.")
_ingest_command("auto", "Raw files of any source, detected from names or content; with --dataset NAME the catalog "
                "entry gives the source, name and split. Warns where the files differ from the catalog.")
_ingest_command("xarray", "Your own grid data: NetCDF, HDF5, Zarr stores (anything xarray opens) or .npy/.npz arrays "
                "(with --axes). Variables and dimensions are guessed from CF attributes and common names (one line "
                "says what was chosen) or named with the options below; NaN cells become mask 0.", extra={
                    "variables": typer.Option(None, "--vars", help="Comma list of variables (channels), e.g. u,v; "
                                              "with a C axis in --axes: the names of its components."),
                    "time_dim": typer.Option(None, "--time-dim", help="The time dimension (default: guessed)."),
                    "time_var": typer.Option(None, "--time-var", help="A 1-D variable holding the frame times "
                                             "(default: the time coordinate, else a 1-D times/time/t variable, e.g. "
                                             "py-pde's `times`; none: frame indices, dt unknown)."),
                    "space_dims": typer.Option(None, "--space-dims", help="Spatial dimensions in (z,) y, x order, "
                                               "e.g. lat,lon (default: guessed)."),
                    "sample_dim": typer.Option(None, "--sample-dim", help="The trajectory dimension, e.g. member "
                                               "(default: guessed; none: one trajectory per file)."),
                    "axes": typer.Option(None, "--axes", help="Axis order of .npy/.npz arrays and of HDF5 datasets "
                                         "without dimension names: letters N (sample), T, C, Z, Y, X, e.g. NTYXC."),
                    "boundary": typer.Option(None, "--boundary", help="The boundary the file cannot state: periodic "
                                             "or non-periodic (every axis), or per axis, e.g. x=periodic,y=non-periodic "
                                             "(default: from the coordinates; periodic when every spatial axis is). "
                                             "Recorded in the manifest; chooses the resampling as a stated one does."),
                    "periodic": typer.Option(None, "--periodic/--non-periodic", hidden=True,
                                             help="The same as --boundary periodic / non-periodic."),
                    "window": typer.Option(None, "--window", help="Cut every trajectory into samples of this many "
                                           "consecutive frames (one long run streams in bounded memory; the frames "
                                           "past the last whole window are left out)."),
                    "concat": typer.Option(None, "--concat", help="Several inputs are more trajectories (sample, "
                                           "the default) or more frames of the same ones (time: files split by "
                                           "time, given in time order, as xarray.open_mfdataset combines them)."),
                })
_ingest_command("the_well", "The Well (PolymathicAI) HDF5 files or folders (a dataset's data/ with train/, valid/, "
                "test/): fields as channels (vector/tensor components velocity_x, ...), constant fields broadcast over "
                "time, the folder split kept, boundary conditions recorded.", command_name="the-well")
