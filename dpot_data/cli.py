"""`dpot-data`: the command-line face of the data toolkit. Thin: every command calls a library function."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import click
import typer

from dpot_format.cli_help import TidyGroup, add_version_option
from typer.core import TyperGroup

app = typer.Typer(
    name="dpot-data",
    help="Ingest public PDE datasets (FNO, PDEBench, PDEArena, CFDBench) into Zarr stores and WebDataset "
    "shards with a checksummed manifest, and inspect what was written.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=TidyGroup,
)
add_version_option(app, "dpot-data")
synth_app = typer.Typer(help="Write small raw files in the exact published layout of each source.", no_args_is_help=True)


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


ingest_app = typer.Typer(help="Read raw files of one source and write shards, a Zarr store and a manifest. Without a "
                         "source (`dpot-data ingest [--dataset NAME] FILES...`) the source is detected from the files.",
                         no_args_is_help=True, cls=_IngestGroup)
app.add_typer(synth_app, name="synth")
app.add_typer(ingest_app, name="ingest")


def _fail(exc: Exception) -> typer.Exit:
    """Bad input: one line on stderr naming the file and what was expected, exit code 2."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(code=2)


def _absolute(path: str | Path) -> str:
    """A local path made absolute, so that dask workers with another working directory find it; URLs are kept.
    Symbolic links are kept as given (errors name the file the user named; a link loop is refused by the ingest)."""
    text = str(path)
    return text if "://" in text else os.path.abspath(Path(text).expanduser())


def _output_roots(folder: str) -> list[str]:
    """The ingest outputs at `folder`: itself when it holds manifest.json, else (an `ingest corpus` folder) every
    sub-folder holding one, sorted; itself again when there is neither (the command then says what is missing)."""
    if "://" in folder or (Path(folder) / "manifest.json").exists():
        return [folder]
    subs = sorted(str(p.parent) for p in Path(folder).glob("*/manifest.json"))
    return subs or [folder]


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


def _echo_paths(paths: object) -> None:
    for path in paths if isinstance(paths, (list, tuple)) else [paths]:
        typer.echo(str(path))


_OUT = typer.Option(..., "--out", help="Folder for the raw files.")
_SEED = typer.Option(0, "--seed", help="Seed of the random smooth fields.")


@synth_app.command("pdebench-cfd")
def synth_pdebench_cfd_command(
    out: Path = _OUT, m: float = typer.Option(1.0, "--m", help="Mach number M (in the name and attributes)."),
    eta: float = typer.Option(0.1, "--eta", help="Shear viscosity eta."),
    zeta: Optional[float] = typer.Option(None, "--zeta", help="Bulk viscosity zeta (default: eta)."),
    kind: str = typer.Option("Rand", "--kind", help="Rand or Turb (initial condition family, in the name)."),
    n: int = typer.Option(3, "--n", help="Trajectories."), frames: int = typer.Option(21, "--frames", help="Frames."),
    res: int = typer.Option(32, "--res", help="Grid size per axis (published: 128 or 512)."),
    attrs: bool = typer.Option(True, "--attrs/--no-attrs", help="Write the M, eta, zeta file attributes."),
    seed: int = _SEED,
) -> None:
    """PDEBench 2D compressible NS: 2D_CFD_<kind>_M.._Eta.._Zeta.._periodic_<res>_Train.hdf5 (flat HDF5)."""
    from dpot_data.synth.pdebench import write_cfd

    _echo_paths(write_cfd(out, m=m, eta=eta, zeta=zeta, kind=kind, n=n, frames=frames, res=res, with_attrs=attrs,
                          seed=seed))


@synth_app.command("pdebench-cfd3d")
def synth_pdebench_cfd3d_command(
    out: Path = _OUT, m: float = typer.Option(1.0, "--m", help="Mach number M."),
    kind: str = typer.Option("Rand", "--kind", help="Rand or Turb."),
    n: int = typer.Option(2, "--n", help="Trajectories."), frames: int = typer.Option(6, "--frames", help="Frames."),
    res: int = typer.Option(16, "--res", help="Grid size per axis (published: 64 or 128)."), seed: int = _SEED,
) -> None:
    """PDEBench 3D compressible NS: 3D_CFD_<kind>_M.._Eta1e-08_Zeta1e-08_periodic_Train.hdf5 with Vz."""
    from dpot_data.synth.pdebench import write_cfd

    _echo_paths(write_cfd(out, dims=3, m=m, eta=1e-8, kind=kind, n=n, frames=frames, res=res, seed=seed))


@synth_app.command("pdebench-dr")
def synth_pdebench_dr_command(
    out: Path = _OUT, n: int = typer.Option(3, "--n", help="Samples (groups)."),
    frames: int = typer.Option(11, "--frames", help="Frames (published: 101)."),
    res: int = typer.Option(32, "--res", help="Grid size (published: 128)."), seed: int = _SEED,
    t_end: float = typer.Option(5.0, "--t-end", help="Time of the last frame (published: 5); later: frames further "
                                "apart, the fields changing more between them."),
) -> None:
    """PDEBench diffusion–reaction: 2D_diff-react_NA_NA.h5, one lzf group per sample with a YAML config."""
    from dpot_data.synth.pdebench import write_diff_react

    if not t_end > 0:  # before anything is written
        raise typer.BadParameter(f"expected a time > 0, got {t_end}", param_hint="--t-end")
    _echo_paths(write_diff_react(out, n=n, frames=frames, res=res, seed=seed, t_end=t_end))


@synth_app.command("pdebench-swe")
def synth_pdebench_swe_command(
    out: Path = _OUT, n: int = typer.Option(3, "--n", help="Samples (groups)."),
    frames: int = typer.Option(11, "--frames", help="Frames (published: 101)."),
    res: int = typer.Option(32, "--res", help="Grid size (published: 128)."), seed: int = _SEED,
) -> None:
    """PDEBench shallow water (radial dam break): 2D_rdb_NA_NA.h5, one lzf group per sample."""
    from dpot_data.synth.pdebench import write_swe

    _echo_paths(write_swe(out, n=n, frames=frames, res=res, seed=seed))


@synth_app.command("pdearena-ns")
def synth_pdearena_ns_command(
    out: Path = _OUT, n: int = typer.Option(3, "--n", help="Trajectories per file."),
    frames: int = typer.Option(14, "--frames", help="Frames (published: 14)."),
    res: int = typer.Option(32, "--res", help="Grid size (published: 128)."), seed: int = _SEED,
) -> None:
    """PDEArena NS: one train, valid and test NavierStokes2D_*.h5 file (float64, buo_y 0.5)."""
    from dpot_data.synth.pdearena import write_standard

    _echo_paths(write_standard(out, n=n, frames=frames, res=res, seed=seed))


@synth_app.command("pdearena-ns-cond")
def synth_pdearena_ns_cond_command(
    out: Path = _OUT, n: int = typer.Option(2, "--n", help="Trajectories per file."),
    frames: int = typer.Option(12, "--frames", help="Frames (published: 56)."),
    res: int = typer.Option(32, "--res", help="Grid size (published: 128)."), seed: int = _SEED,
) -> None:
    """PDEArena conditioned NS: train files at several buo_y, one valid and one test file."""
    from dpot_data.synth.pdearena import write_conditioned

    _echo_paths(write_conditioned(out, n=n, frames=frames, res=res, seed=seed))


@synth_app.command("cfdbench")
def synth_cfdbench_command(
    out: Path = _OUT, cases: int = typer.Option(2, "--cases", help="Cases per problem and subset."),
    problems: str = typer.Option("cavity,tube,cylinder,dam", "--problems", help="Comma list of problems."),
    subsets: str = typer.Option("bc", "--subsets", help="Comma list of subsets (bc, geo, prop)."),
    min_frames: int = typer.Option(24, "--min-frames", help="Fewest frames of a case."),
    max_frames: int = typer.Option(45, "--max-frames", help="Most frames of a case."), seed: int = _SEED,
) -> None:
    """CFDBench tree <problem>/<subset>/caseNNNN/{u.npy, v.npy, case.json}, cases of different lengths."""
    from dpot_data.synth.cfdbench import write_cfdbench

    try:
        folders = write_cfdbench(out, problems=tuple(p.strip() for p in problems.split(",") if p.strip()),
                                 subsets=tuple(p.strip() for p in subsets.split(",") if p.strip()), cases=cases,
                                 frames=(min_frames, max_frames), seed=seed)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(f"{out}: {len(folders)} cases")


@synth_app.command("xarray")
def synth_xarray_command(
    out: Path = _OUT, members: int = typer.Option(3, "--members", help="Ensemble members (trajectories)."),
    frames: int = typer.Option(6, "--frames", help="Frames."), ny: int = typer.Option(24, "--ny", help="Latitudes."),
    nx: int = typer.Option(32, "--nx", help="Longitudes (periodic, 360 degrees)."),
    land: bool = typer.Option(True, "--land/--no-land", help="NaN over a block of land cells."), seed: int = _SEED,
) -> None:
    """A CF-style NetCDF-4 file written by xarray: u, v (member, time, lat, lon) with units and long names."""
    from dpot_data.synth.gridded import write_netcdf

    _echo_paths(write_netcdf(out, members=members, frames=frames, ny=ny, nx=nx, land=land, seed=seed))


@synth_app.command("the-well")
def synth_the_well_command(
    out: Path = _OUT, n: int = typer.Option(2, "--n", help="Trajectories per file."),
    frames: int = typer.Option(5, "--frames", help="Frames."), res: int = typer.Option(16, "--res", help="Grid side."),
    dims: int = typer.Option(2, "--dims", help="2 or 3 spatial dimensions."),
    periodic: bool = typer.Option(True, "--periodic/--wall", help="Boundary conditions."), seed: int = _SEED,
) -> None:
    """A Well-layout dataset (h5py): OUT/data/{train,valid,test}/waves_alpha_*.hdf5, scalar, vector, tensor fields."""
    from dpot_data.synth.gridded import write_the_well

    if dims not in (2, 3):
        raise typer.BadParameter("--dims: expected 2 or 3")
    _echo_paths(write_the_well(out, n=n, frames=frames, res=res, dims=dims, periodic=periodic, seed=seed))


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
        scheduler: Optional[str] = typer.Option(None, "--scheduler", help="dask.distributed scheduler address."),
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
        options = dict(channels=channels, fill=fill, resample=resample,
                       mask_resample=mask_resample, formats=tuple(f.strip() for f in formats.split(",") if f.strip()),
                       split=split, convention=convention, seed=seed, name=name, shard_size=shard_size,
                       segment=segment, block=block, overwrite=overwrite, progress=progress, stats=stats,
                       workers=workers, scheduler=scheduler, nonfinite=nonfinite, card=card)
        if max_abs is not None:  # else IngestOptions' default (dpot_data.ingest.options.MAX_ABS)
            options["max_abs"] = max_abs
        if resolution is not None:  # else IngestOptions' default: per source
            from dpot_data.errors import InputError
            from dpot_data.ingest.options import parse_resolution

            try:
                options["resolution"] = parse_resolution(resolution)
            except InputError as exc:
                raise _fail(exc) from None
        reader_options = {k: v for k, v in reader.items() if v is not None}
        if dry_run:
            _dry_run(source, files, out, options, dataset, reader_options)
            return
        runs, failed = _run_ingest(source, files, out, options, dataset, reader_options)
        _report_ingest(runs, failed)

    command.__doc__ = help_text
    command.__signature__ = _with_options(command, extra or {})  # type: ignore[attr-defined]
    ingest_app.command(command_name or source)(command)


def _with_options(function: object, extra: dict) -> "inspect.Signature":
    """The function's signature with its **kwargs replaced by the `extra` options (each an Optional[str] option,
    or Optional[bool] where the option's default is a bool flag pair), so that typer offers them."""
    import inspect

    sig = inspect.signature(function, eval_str=True)
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    for key, option in extra.items():
        kind = Optional[bool] if "/" in (option.param_decls or ("",))[0] else Optional[str]
        params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind))
    return sig.replace(parameters=params)


def _run_ingest(source: str, files: List[str], out: str, given: dict, dataset: Optional[str],
                reader: Optional[dict] = None) -> tuple[list, list]:
    """Run `dpot-data ingest <source>` (every source, corpus and auto): the outcomes and the datasets that failed.
    Ingest warnings are printed as "warning:" lines as they happen; bad input is one error line and exit code 2."""
    import contextlib

    from dpot_data.ingest.allocator import reuse_freed_memory
    from dpot_data.ingest.input_hashes import InputHashes
    from dpot_data.ingest.startup import ingest_process

    reuse_freed_memory()  # this process is the ingest's: block buffers are reused, not faulted in again per block
    # the local input files are hashed from here on, beside the imports below (half a second)
    hashes = InputHashes([f for f in files if "://" not in f] if source != "corpus" else [])
    try:
        with contextlib.closing(hashes), ingest_process(source if source not in ("auto", "corpus") else None):
            return _run_ingest_with(source, files, out, given, dataset, hashes, reader or {})
    except KeyboardInterrupt:  # Ctrl-C: the staged part and its journal stay, and say how to go on
        typer.echo(f"interrupted: nothing was published in {out}; run the same command again to resume from the "
                   "shards already completed", err=True)
        raise typer.Exit(code=130) from None


def _run_ingest_with(source: str, files: List[str], out: str, given: dict, dataset: Optional[str],
                     hashes: object, reader: dict) -> tuple[list, list]:
    """`_run_ingest` once the input hashing has started."""
    import warnings

    from dpot_data.catalog import CatalogError
    from dpot_data.errors import InputError
    from dpot_data.ingest import IngestOptions, parse_split, run_ingest

    split = given.pop("split")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *_a, **_k: typer.echo(f"warning: {message}", err=True)
        try:
            options = IngestOptions(**{**given, "shard_size": _parse_bytes(given["shard_size"])},
                                    split=parse_split(split) if split else None)
            if source == "corpus":
                return _run_corpus(files, out, options, dataset, split is None)
            files, out = [_absolute(f) for f in files], _absolute(out)  # workers may run elsewhere
            return [run_ingest(None if source == "auto" else source, files, out, options, dataset=dataset,
                               catalog=True, catalog_split=split is None, hashes=hashes, **reader)], []
        except (InputError, CatalogError) as exc:
            raise _fail(exc) from None


def _dry_run(source: str, files: List[str], out: str, given: dict, dataset: Optional[str], reader: dict) -> None:
    """`ingest --dry-run`: the plan of one dataset's ingest into OUT, printed; nothing is written."""
    import warnings

    from dpot_data.catalog import CatalogError
    from dpot_data.errors import InputError
    from dpot_data.ingest import IngestOptions, parse_split
    from dpot_data.ingest.dry_run import dry_run

    if source == "corpus":
        raise _fail(InputError("--dry-run", "expected one dataset's files (`ingest corpus` plans each dataset; "
                                            "dry-run them one at a time with --dataset NAME)"))
    split = given.pop("split")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda message, *_a, **_k: typer.echo(f"warning: {message}", err=True)
        try:
            options = IngestOptions(**{**given, "shard_size": _parse_bytes(given["shard_size"])},
                                    split=parse_split(split) if split else None)
            lines = dry_run(source, [_absolute(f) for f in files], options, out=_absolute(out), dataset=dataset,
                            catalog_split=split is None, reader=reader)
        except (InputError, CatalogError) as exc:
            raise _fail(exc) from None
    for line in lines:
        typer.echo(line)
    typer.echo(f"dry run: nothing was written; without --dry-run the output goes to {out}")


def _run_corpus(files: List[str], out: str, options: object, dataset: Optional[str],
                catalog_split: bool) -> tuple[list, list]:
    """`dpot-data ingest corpus`: every catalog dataset found, each into OUT/<dataset>/."""
    from dpot_data.catalog import load_catalog
    from dpot_data.corpus import ingest_corpus
    from dpot_data.errors import InputError

    if any("://" in p for p in [*files, out]):
        raise InputError(out, "expected local folders for `ingest corpus` (URLs work per dataset)")
    catalog = load_catalog()  # once, for the corpus plan, every dataset's job and the warnings below
    run = ingest_corpus([Path(p) for p in files], Path(out), options, dataset=dataset, catalog_split=catalog_split,
                        catalog=catalog)
    for path in run.plan.unknown:
        typer.echo(f"warning: {path}: no catalog dataset has this file name; not ingested", err=True)
    if run.plan.missing:
        typer.echo(missing_line(run.plan.missing, len(catalog.pretrain())), err=True)
    return run.done, run.failed


def missing_line(missing: List[str], pretrain: int) -> str:
    """One warning line for the pre-training datasets a corpus folder has no raw files of (one line, not one each:
    a folder of a few datasets is the usual case, not a problem)."""
    return (f"warning: {len(missing)} of the {pretrain} pre-training datasets have no raw files here: "
            f"{', '.join(missing)} (`dpot-data catalog NAME` names each one's files and where they come from)")


def _report_ingest(runs: list, failed: list) -> None:
    """One line per dataset written or kept, its warnings and notes; exit code 2 when a dataset failed."""
    for outcome in runs:
        for warning in outcome.warnings:
            typer.echo(f"warning: {warning}", err=True)
        for note in outcome.notes:
            typer.echo(note, err=True)
        for d in outcome.manifest["datasets"]:
            counts = ", ".join(f"{k} {v}" for k, v in d["splits"]["counts"].items() if v)
            size = sum(s["bytes"] for s in d["shards"])
            typer.echo(f"{'wrote' if outcome.written else 'kept'} {outcome.path}: {d['name']}, {d['trajectories']} "
                       f"trajectories ({counts}), {d['frames']} frames, "
                       f"grid {'x'.join(map(str, d['grid']['shape']))}, {len(d['shards'])} shards ({size} bytes)")
    for name, error in failed:
        typer.echo(f"error: {name}: {error}", err=True)
    if failed:
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


@app.command("catalog")
def catalog_command(
    name: Optional[str] = typer.Argument(None, help="One dataset (catalog or manifest name): all its facts."),
    pretrain: bool = typer.Option(False, "--pretrain", help="Only the 12 datasets of the DPOT pre-training corpus."),
    as_json: bool = typer.Option(False, "--json", help="Print the entries as JSON."),
    check: Optional[Path] = typer.Option(None, "--check", help="A download folder: which catalog datasets it holds, "
                                         "which pre-training datasets it lacks, files no dataset claims."),
    md5: bool = typer.Option(False, "--md5", help="With --check: compare each found file with its published MD5."),
) -> None:
    """The public datasets dpot-data knows: source, expected file names, trajectories, frames, grid, channels,
    the published download location and MD5 where there is one, and whether DPOT pre-trains on them; with a NAME, the
    ingest command for it; with --check DIR, what a download folder holds."""
    import json

    from dpot_data.catalog import CatalogError, load_catalog

    if check is not None:
        raise typer.Exit(code=_check_downloads(check, md5, as_json))

    try:
        catalog = load_catalog()
        entries = list(catalog.entries.values())
        if name is not None:
            found = catalog.find(name)
            if found is None:
                raise CatalogError(f"no catalog dataset {name!r}; `dpot-data catalog` lists them")
            entries = [found]
    except CatalogError as exc:
        raise _fail(exc) from None
    if pretrain:
        entries = [e for e in entries if e.pretrain]
    if as_json:
        typer.echo(json.dumps([_catalog_facts(e) for e in entries], indent=1, default=str))
        return
    if name is not None:
        (e,) = entries
        for key, value in _catalog_facts(e).items():
            typer.echo(f"{key:<12} {value}")
        typer.echo(f"ingest:      dpot-data ingest --dataset {e.name} {e.files[0]} --out out/{e.manifest_name}")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(entries)} datasets ({catalog.path}); `dpot-data catalog NAME` for one")
    for column in ("dataset", "source", "files", "trajectories", "frames", "grid", "channels", "pre-train"):
        table.add_column(column)
    for e in entries:
        table.add_row(e.name, e.source, e.files[0] + (f" (+{e.file_count - 1})" if (e.file_count or 1) > 1 else ""),
                      str(e.samples or "-"), str((e.reference or {}).get("frames") or e.frames or e.segment),
                      "x".join(map(str, e.grid)), ", ".join(e.channels), "yes" if e.pretrain else "")
    Console(width=200).print(table)


def _catalog_facts(entry: object) -> dict:
    """One catalog entry as `catalog --json` prints it: the published set's facts, then what each convention's
    ingest stores (`conventions`, the default dpot-reference first), so that frames and split are never ambiguous."""
    from dataclasses import asdict

    facts = {k: v for k, v in asdict(entry).items() if k not in ("frames", "segment", "split", "reference")}
    return {**facts, "manifest_name": entry.manifest_name, "published_frames": entry.frames,
            "default_convention": "dpot-reference", "conventions": entry.conventions()}


def _check_downloads(folder: Path, md5: bool, as_json: bool) -> int:
    """Report which catalog datasets a folder holds (exit 1 when a published MD5 differs)."""
    import hashlib
    import json

    from dpot_data.catalog import load_catalog
    from dpot_data.corpus import plan_corpus
    from dpot_data.errors import InputError

    catalog = load_catalog()
    try:
        plan = plan_corpus([folder], catalog)
    except InputError as exc:
        raise _fail(exc) from None
    report: dict = {"folder": str(folder), "datasets": {}, "missing_pretrain": plan.missing,
                    "unknown": [str(p) for p in plan.unknown]}
    bad = 0
    for name, paths in plan.groups.items():
        entry = catalog.get(name)
        files = []
        for path in sorted(p for q in paths for p in ([q] if q.is_file() else sorted(q.rglob("*"))) if p.is_file()):
            item: dict = {"path": str(path), "bytes": path.stat().st_size}
            published = entry.download if entry.download and path.name == entry.files[0] else None
            if md5 and published and "md5" in published:
                h = hashlib.md5()
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 22), b""):
                        h.update(block)
                item["md5_ok"] = h.hexdigest() == published["md5"]
                bad += not item["md5_ok"]
            files.append(item)
        report["datasets"][name] = files
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        for name, files in report["datasets"].items():
            checked = [f for f in files if "md5_ok" in f]
            note = "" if not checked else (" (published MD5 matches)" if all(f["md5_ok"] for f in checked)
                                           else " (published MD5 DIFFERS)")
            typer.echo(f"found   {name}: {len(files)} file(s), {sum(f['bytes'] for f in files)} bytes{note}")
        for name in report["missing_pretrain"]:
            files = catalog.get(name).files
            typer.echo(f"missing {name} (pre-training): expected {files[0]}")
        for path in report["unknown"]:
            typer.echo(f"unknown {path}: no catalog dataset has this file name")
    return 1 if bad else 0


@app.command("inspect")
def inspect_command(
    folder: str = typer.Argument(..., help="An ingest output folder or fsspec URL (holding manifest.json)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    verify: bool = typer.Option(False, "--verify", help="Re-hash every shard and Zarr array (sha256)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG grid of first/middle/last frames of a few "
                                        "trajectories per dataset (channel names, colour bars, mask outlined)."),
    plot_trajectories: int = typer.Option(2, "--plot-trajectories", help="Trajectories per dataset in --plot."),
) -> None:
    """A table per dataset: trajectories per split, frames, channels, grid, resampling, shards, bytes, checksums."""
    import json

    from dpot_data.errors import InputError
    from dpot_data.inspection import inspect_dir, render
    from dpot_format.errors import FormatError

    try:
        if plot is not None and "://" not in str(plot):
            from dpot_format.output import check_file

            check_file(plot, "--plot", "frames.png")  # the one output rule, before the output is inspected
        roots = _output_roots(folder)
        reports = [inspect_dir(root, verify=verify) for root in roots]
    except (InputError, FormatError) as exc:
        raise _fail(exc) from None
    report = reports[0] if len(reports) == 1 else {
        "ok": all(r["ok"] for r in reports), "folder": str(folder),
        "datasets": [d for r in reports for d in r["datasets"]], "outputs": reports}
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        import sys

        from rich.console import Console

        console = Console(width=None if sys.stdout.isatty() else 160)
        for one in reports:
            console.print(render(one))
            prefix = "" if len(reports) == 1 else f"{Path(one['path']).name}/"
            for line in one["problems"] + one["warnings"]:
                typer.echo(prefix + line)
    if plot is not None:
        from dpot_data.plot import PlotOptions, plot_output

        try:
            plot_output(str(folder), str(plot), PlotOptions(trajectories=plot_trajectories))
        except (InputError, FormatError) as exc:
            raise _fail(exc) from None
        typer.echo(f"wrote {plot}", err=True)
    if not report["ok"]:
        raise typer.Exit(code=1)


@app.command("card")
def card_command(
    folder: str = typer.Argument(..., help="An ingest output folder or fsspec URL (holding manifest.json), or an "
                                 "`ingest corpus` folder (one card per dataset folder in it)."),
) -> None:
    """Write a dataset card beside each manifest: README.md in the Hugging Face dataset-card form (YAML front matter:
licence, pretty_name, tags, task_categories, size_categories, configs with the shards of each split) and a body
saying what the data is (equation, source, licence and BibTeX citation from the catalog; "not given" for data the
catalog does not know), its grid and axis order, frames, dt, channels with units, geometry mask, splits (trajectories,
shards, bytes), the manifest's statistics, the sha256 of every shard, the ingest command and dpot version, and a
preview picture (card/<dataset>.png: the first frame of the first test, else train, trajectory). Each file is
written atomically; an output without a manifest, or one that fails the format's check, is refused (exit 2)."""
    from dpot_data.card import write_card
    from dpot_data.errors import InputError

    if "://" not in folder and Path(folder).is_file():  # e.g. shards/manifest.json
        hint = f" (give {Path(folder).parent})" if Path(folder).name == "manifest.json" else ""
        raise _fail(InputError(folder, f"a file; expected an output folder holding manifest.json{hint}"))
    for root in _output_roots(folder):
        try:
            written = write_card(root)
        except InputError as exc:
            raise _fail(exc) from None
        typer.echo(f"wrote {written[-1]}", err=True)


@app.command("verify")
def verify_command(
    folder: str = typer.Argument(..., help="An ingest output folder or fsspec URL (holding manifest.json)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local threads hashing in parallel."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="dask.distributed scheduler address."),
    as_json: bool = typer.Option(False, "--json", help="Print the problems as JSON."),
) -> None:
    """Check the output against docs/format.md (dpot_format.validate): re-hash every shard and Zarr array, check
member names, .npy headers and meta.json, paths and the manifest; exit 1 naming each problem (files the manifest
does not list, and temporary leftovers, are reported as warnings)."""
    import json

    from dpot_data.errors import InputError
    from dpot_data.ingest.scheduler import SchedulerOptions, scheduler_context
    from dpot_format.validate import as_json as problems_json
    from dpot_format.validate import summarise, validate_output

    roots = _output_roots(_absolute(folder))
    problems: list = []
    items: list = []
    try:
        with scheduler_context(SchedulerOptions(workers=workers, address=scheduler)) as runner:
            for root in roots:
                found = validate_output(root, runner=runner, progress=lambda item, _found: items.append(item))
                prefix = "" if len(roots) == 1 else f"{Path(root).name}/"
                problems += [replace(p, what=prefix + p.what) for p in found]
    except InputError as exc:
        raise _fail(exc) from None
    checked = None if any(p.kind in ("manifest", "schema") for p in problems) else len(items)
    code, lines = summarise(problems, checked)
    if as_json:
        typer.echo(json.dumps({"ok": code == 0, "problems": problems_json(problems)}, indent=2))
    else:
        for line in lines:
            typer.echo(line)
    raise typer.Exit(code=code)


@app.command("stats")
def stats_command(
    folder: str = typer.Argument(..., help="An ingest output folder or fsspec URL (holding manifest.json)."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Local threads."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="dask.distributed scheduler address."),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
) -> None:
    """Recompute the normalisation statistics (train split, valid channels, fluid cells, float64) from the stored
    trajectories, print them, and compare them with the manifest's (exit 1 when they differ)."""
    import json

    from dpot_data.errors import InputError
    from dpot_data.output import recompute_stats
    from dpot_data.ingest.scheduler import SchedulerOptions, scheduler_context
    from dpot_data.stats import compare
    from dpot_format.errors import FormatError
    from dpot_format.manifest import read_manifest

    folder = _absolute(folder)
    try:
        manifest = read_manifest(folder)
        with scheduler_context(SchedulerOptions(workers=workers, address=scheduler)) as runner:
            recomputed = recompute_stats(folder, runner)
    except (FormatError, InputError) as exc:
        raise _fail(exc) from None
    problems = {}
    for entry in manifest["datasets"]:
        stored = entry.get("stats")
        problems[entry["name"]] = (["the manifest holds no statistics"] if stored is None
                                   else compare(stored, recomputed[entry["name"]]))
    if as_json:
        typer.echo(json.dumps({"datasets": recomputed, "differences": problems}, indent=2))
    else:
        for name, doc in recomputed.items():
            typer.echo(f"{name}: {doc['trajectories']} train trajectories, float64, fluid cells, ddof 0")
            typer.echo(f"  {'channel':<12} {'kind':<6} {'count':>12} {'mean':>13} {'std':>13} {'rms':>13} "
                       f"{'min':>13} {'max':>13}")
            for family, label in (("fields", "value"), ("diff", "dt")):
                for ch in doc["channels"]:
                    v = doc[family][ch]
                    nums = " ".join(f"{v[k]:>13.6g}" if v[k] is not None else f"{'-':>13}"
                                    for k in ("mean", "std", "rms", "min", "max"))
                    typer.echo(f"  {ch:<12} {label:<6} {v['count']:>12} {nums}")
            diffs = problems[name]
            typer.echo(f"  manifest: {'matches' if not diffs else 'DIFFERS: ' + '; '.join(diffs[:5])}")
    if any(problems.values()):
        raise typer.Exit(code=1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
