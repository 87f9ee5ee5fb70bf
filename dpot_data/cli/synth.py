"""`dpot-data synth ...`: small raw files in the exact published layout of each source (dpot_data.synth)."""

from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from dpot_data.cli.options import (FramesOf101, Frames, GridOf128, PerFile, RawOut, Samples, Seed, Trajectories,
                                   echo_paths)

app = typer.Typer(help="Write small raw files in the exact published layout of each source.", no_args_is_help=True)


def _comma_items(text: str) -> tuple[str, ...]:
    """The non-empty items of a comma list option."""
    return tuple(p.strip() for p in text.split(",") if p.strip())


@app.command("fno")
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
    echo_paths(paths)


@app.command("pdebench-cfd")
def synth_pdebench_cfd_command(
    out: RawOut, m: Annotated[float, typer.Option("--m", help="Mach number M (in the name and attributes).")] = 1.0,
    eta: Annotated[float, typer.Option("--eta", help="Shear viscosity eta.")] = 0.1,
    zeta: Annotated[Optional[float], typer.Option("--zeta", help="Bulk viscosity zeta (default: eta).")] = None,
    kind: Annotated[str, typer.Option("--kind", help="Rand or Turb (initial condition family, in the name).")] = "Rand",
    n: Trajectories = 3, frames: Frames = 21,
    res: Annotated[int, typer.Option("--res", help="Grid size per axis (published: 128 or 512).")] = 32,
    attrs: Annotated[bool, typer.Option("--attrs/--no-attrs", help="Write the M, eta, zeta file attributes.")] = True,
    seed: Seed = 0,
) -> None:
    """PDEBench 2D compressible NS: 2D_CFD_<kind>_M.._Eta.._Zeta.._periodic_<res>_Train.hdf5 (flat HDF5)."""
    from dpot_data.synth.pdebench import write_cfd

    echo_paths(write_cfd(out, m=m, eta=eta, zeta=zeta, kind=kind, n=n, frames=frames, res=res, with_attrs=attrs,
                         seed=seed))


@app.command("pdebench-cfd3d")
def synth_pdebench_cfd3d_command(
    out: RawOut, m: Annotated[float, typer.Option("--m", help="Mach number M.")] = 1.0,
    kind: Annotated[str, typer.Option("--kind", help="Rand or Turb.")] = "Rand",
    n: Trajectories = 2, frames: Frames = 6,
    res: Annotated[int, typer.Option("--res", help="Grid size per axis (published: 64 or 128).")] = 16,
    seed: Seed = 0,
) -> None:
    """PDEBench 3D compressible NS: 3D_CFD_<kind>_M.._Eta1e-08_Zeta1e-08_periodic_Train.hdf5 with Vz."""
    from dpot_data.synth.pdebench import write_cfd

    echo_paths(write_cfd(out, dims=3, m=m, eta=1e-8, kind=kind, n=n, frames=frames, res=res, seed=seed))


def _grid_writer(name: str) -> Callable[..., object]:
    """The writer of a `synth` command of (n, frames, res, seed) grids, imported when the command runs."""
    from dpot_data.synth import pdearena, pdebench

    return {"pdebench-swe": pdebench.write_swe,
            "pdearena-ns": pdearena.write_standard, "pdearena-ns-cond": pdearena.write_conditioned}[name]


def _grid_command(name: str, doc: str, n: tuple[Any, int], frames: tuple[Any, int]) -> None:
    """Register `synth NAME` over its grid writer; `n`, `frames`: (option declaration, default)."""
    (n_option, n_default), (frames_option, frames_default) = n, frames

    def command(out: RawOut, n: n_option = n_default, frames: frames_option = frames_default, res: GridOf128 = 32,
                seed: Seed = 0) -> None:
        echo_paths(_grid_writer(name)(out, n=n, frames=frames, res=res, seed=seed))

    command.__doc__ = doc
    app.command(name)(command)




@app.command("pdebench-dr")
def synth_pdebench_dr_command(
    out: RawOut, n: Samples = 3, frames: FramesOf101 = 11, res: GridOf128 = 32, seed: Seed = 0,
    t_end: Annotated[float, typer.Option("--t-end", help="Time of the last frame (published: 5); later: frames "
                                         "further apart, the fields changing more between them.")] = 5.0,
) -> None:
    """PDEBench diffusion–reaction: 2D_diff-react_NA_NA.h5, one lzf group per sample with a YAML config."""
    from dpot_data.synth.pdebench import write_diff_react

    if not t_end > 0:  # before anything is written
        raise typer.BadParameter(f"expected a time > 0, got {t_end}", param_hint="--t-end")
    echo_paths(write_diff_react(out, n=n, frames=frames, res=res, seed=seed, t_end=t_end))


_grid_command("pdebench-swe", "PDEBench shallow water (radial dam break): 2D_rdb_NA_NA.h5, one lzf group per sample.",
              n=(Samples, 3), frames=(FramesOf101, 11))
_grid_command("pdearena-ns", "PDEArena NS: one train, valid and test NavierStokes2D_*.h5 file (float64, buo_y 0.5).",
              n=(PerFile, 3), frames=(Annotated[int, typer.Option("--frames", help="Frames (published: 14).")], 14))
_grid_command("pdearena-ns-cond", "PDEArena conditioned NS: train files at several buo_y, one valid and one test "
              "file.", n=(PerFile, 2),
              frames=(Annotated[int, typer.Option("--frames", help="Frames (published: 56).")], 12))


@app.command("cfdbench")
def synth_cfdbench_command(
    out: RawOut, cases: Annotated[int, typer.Option("--cases", help="Cases per problem and subset.")] = 2,
    problems: Annotated[str, typer.Option("--problems", help="Comma list of problems.")] = "cavity,tube,cylinder,dam",
    subsets: Annotated[str, typer.Option("--subsets", help="Comma list of subsets (bc, geo, prop).")] = "bc",
    min_frames: Annotated[int, typer.Option("--min-frames", help="Fewest frames of a case.")] = 24,
    max_frames: Annotated[int, typer.Option("--max-frames", help="Most frames of a case.")] = 45, seed: Seed = 0,
) -> None:
    """CFDBench tree <problem>/<subset>/caseNNNN/{u.npy, v.npy, case.json}, cases of different lengths."""
    from dpot_data.synth.cfdbench import write_cfdbench

    try:
        folders = write_cfdbench(out, problems=_comma_items(problems), subsets=_comma_items(subsets), cases=cases,
                                 frames=(min_frames, max_frames), seed=seed)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo(f"{out}: {len(folders)} cases")


@app.command("xarray")
def synth_xarray_command(
    out: RawOut, members: Annotated[int, typer.Option("--members", help="Ensemble members (trajectories).")] = 3,
    frames: Frames = 6, ny: Annotated[int, typer.Option("--ny", help="Latitudes.")] = 24,
    nx: Annotated[int, typer.Option("--nx", help="Longitudes (periodic, 360 degrees).")] = 32,
    land: Annotated[bool, typer.Option("--land/--no-land", help="NaN over a block of land cells.")] = True,
    seed: Seed = 0,
) -> None:
    """A CF-style NetCDF-4 file written by xarray: u, v (member, time, lat, lon) with units and long names."""
    from dpot_data.synth.gridded import write_netcdf

    echo_paths(write_netcdf(out, members=members, frames=frames, ny=ny, nx=nx, land=land, seed=seed))


@app.command("the-well")
def synth_the_well_command(
    out: RawOut, n: PerFile = 2, frames: Frames = 5,
    res: Annotated[int, typer.Option("--res", help="Grid side.")] = 16,
    dims: Annotated[int, typer.Option("--dims", help="2 or 3 spatial dimensions.")] = 2,
    periodic: Annotated[bool, typer.Option("--periodic/--wall", help="Boundary conditions.")] = True, seed: Seed = 0,
) -> None:
    """A Well-layout dataset (h5py): OUT/data/{train,valid,test}/waves_alpha_*.hdf5, scalar, vector, tensor fields."""
    from dpot_data.synth.gridded import write_the_well

    if dims not in (2, 3):
        raise typer.BadParameter("--dims: expected 2 or 3")
    echo_paths(write_the_well(out, n=n, frames=frames, res=res, dims=dims, periodic=periodic, seed=seed))
