"""`evaluate --plot DIR [--video]`: pictures of an evaluation, per dataset, drawn from the predictions store
(eval_predictions) and eval.json's numbers.

  DATASET_fields.png    truth / prediction / error of each valid channel at the first, middle and last rollout step
                        of the first test trajectory; truth and prediction share one colour scale per channel, the
                        error a symmetric one; solid cells outlined; 3D data: the mid-plane of the first stored axis
  DATASET_error.png     L2RE per step of the model and of the persistence baseline (each frame alone, solid; the
                        rollout up to that step, dashed) and, on a second axis, the share of trajectories blown up
                        (VRMSE past 1) by each step (dotted, triangles; dpot-eval/3)
  DATASET_spectrum.png  isotropic power spectra of truth and prediction, and of the error, at the first, middle and
                        last step, per channel
  DATASET_rollout.gif   (--video) truth, prediction and error of every valid channel over the rollout, one colour
                        scale per channel and kind for the whole rollout
Every picture says what it shows as dpot_format.display does for the data: colour bars named with the channel and
its unit (`temperature [K]`), axes in the dataset's coordinates (`x [m]`), titles with the step's time (`t = 5.5 s`)
where the dataset states times, colour ranges over fluid cells only (solid cells grey, outside the scale).
Arrays are shown in the manifest's stored orientation (the last axis x to the right, the one before it upwards).
The `*_figure` functions return the matplotlib figure (the caller closes it); the `plot_*` functions save it and
return the arrays its artists hold, read back from the figure, so that tests compare them with the predictions.
Each picture bears PLOT_MARK in its metadata (PNG `Software`, GIF comment) and is written under a temporary name,
then renamed: a file in DIR named like a picture (PLOT_NAME) that does not bear it (a user's file, a link) is refused
before the evaluation (`check_plot_folder`), never overwritten, and nothing is written through a link.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpot_format.io import atomic_path
from dpot_format.output import OutputError, check_folder, check_marked, marked_file_problem, remove_stale_in
from dpot_format.display import Plane, colour_scale, draw_field, error_scale, fluid_range, plane_of, time_title
from dpot_format.units import UNKNOWN, label

KINDS = ("truth", "prediction", "error")
PLOT_MARK = "dpot-train evaluate --plot"
PLOT_NAME = re.compile(r"^[a-z0-9_-]+_(fields\.png|error\.png|spectrum\.png|rollout\.gif)$")  # DATASET_<kind>
SCRATCH_STEM = "dpot-predictions"  # `--plot` without --predictions: the store drawn from, DIR/.dpot-predictions.tmp-*
_PNG = {"format": "png", "metadata": {"Software": PLOT_MARK}}


def check_plot_folder(folder: str | Path) -> Path:
    """Before the evaluation: `--plot DIR` is a folder or a new name (not a link or a file, not inside an ingest
    output or a run's data), every file in it named like a picture bears PLOT_MARK, and the temporary names a killed
    evaluation left in it are removed. OutputError (one line) naming what is refused."""
    folder = check_folder(folder, "--plot")
    check_marked(folder, PLOT_NAME, PLOT_MARK.encode(), "--plot")
    remove_stale_in(folder, lambda stem: stem == SCRATCH_STEM or bool(PLOT_NAME.match(stem)))
    return folder


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plane(a: np.ndarray) -> np.ndarray:
    """A 2D picture of a stored-order spatial block: itself in 2D, the mid-plane of the first axis in 3D."""
    while a.ndim > 2:
        a = a[a.shape[0] // 2]
    return a


def picked_steps(steps: int) -> list[int]:
    """Indices of the first, middle and last rollout step (fewer when the rollout is shorter)."""
    return sorted({0, (steps - 1) // 2, steps - 1})


@dataclass(frozen=True)
class Shown:
    """What the pictures of one predictions group name: its valid channels with their units, the time of each step
    (None: the dataset states no times) and the plane the fields are drawn on."""

    dataset: str
    channels: list[str]
    units: dict[str, str]
    times: np.ndarray | None
    time_unit: str | None
    plane: Plane

    def label(self, channel: str, kind: str = "") -> str:
        """`temperature [K]`, `temperature error [K]`."""
        return label(f"{channel} error" if kind == "error" else channel, self.units.get(channel, UNKNOWN))

    def when(self, step: int) -> str:
        """Rollout step `step` (0-based) as a title says it: `t = 5.5 s (step 1)`, or `step 1`."""
        if self.times is None:
            return f"step {step + 1}"
        return f"{time_title(step, self.times, self.time_unit)} (step {step + 1})"


def shown(group: Any) -> Shown:
    """The Shown of a predictions group (an xarray Dataset): units and coordinates as eval_predictions stores them;
    a store without them (written before they were) gives unknown units, step numbers and cell indices."""
    names = group["channel"].values.tolist()
    valid = [c for c, v in zip(names, group.attrs["channel_valid"]) if v]
    per_channel = group["prediction"].attrs.get("channel_units") or [UNKNOWN] * len(names)
    units = {c: str(u) for c, u in zip(names, per_channel)}
    spatial = [str(d) for d in group["mask"].dims[1:]][-2:]
    coords = {d: np.asarray(group[d].values, dtype=np.float64) for d in spatial if d in group.coords}
    axis_units = {d: str(group[d].attrs.get("units", UNKNOWN)) for d in coords}
    times = np.asarray(group["time"].values, dtype=np.float64) if "time" in group.coords else None
    time_unit = str(group["time"].attrs.get("units", UNKNOWN)) if times is not None else None
    return Shown(str(group.attrs.get("dataset", "")), valid, units, times, time_unit,
                 plane_of(spatial, coords, axis_units, native=group.attrs.get("native_shape")))


def fields_figure(group: Any, trajectory: int = 0) -> Any:
    """The figure of DATASET_fields.png: per valid channel three rows (truth, prediction, error), one column per
    picked step; truth and prediction on one colour scale over their fluid cells, the error on a symmetric one."""
    plt = _pyplot()
    info = shown(group)
    steps = picked_steps(group.sizes["step"])
    traj = group.isel(trajectory=trajectory)
    mask = _plane(np.asarray(traj["mask"].values)).astype(bool)
    fig, axes = plt.subplots(3 * len(info.channels), len(steps), figsize=(3.4 * len(steps) + 1.0,
                                                                          2.7 * 3 * len(info.channels)),
                             squeeze=False, constrained_layout=True)
    for ci, ch in enumerate(info.channels):
        pick = traj.sel(channel=ch).isel(step=steps)
        truth = np.stack([_plane(a) for a in np.asarray(pick["truth"].values)])
        pred = np.stack([_plane(a) for a in np.asarray(pick["prediction"].values)])
        lo, hi = fluid_range(np.stack([truth, pred]), mask)
        scales = (colour_scale(lo, hi), colour_scale(lo, hi), error_scale(pred - truth, mask))
        for ki, (kind, values) in enumerate(zip(KINDS, (truth, pred, pred - truth))):
            row = axes[3 * ci + ki]
            for si, s in enumerate(steps):
                image = draw_field(row[si], values[si], mask, info.plane, *scales[ki])
                row[si].set_title(f"{kind}, {info.when(s)}", fontsize=8)
            fig.colorbar(image, ax=list(row), shrink=0.9, pad=0.02).set_label(info.label(ch, kind), fontsize=8)
    fig.suptitle(f"{info.dataset}: trajectory {traj['trajectory'].item()}; solid cells grey, outlined in black",
                 fontsize=10)
    return fig


def plot_fields(group: Any, out: Path, trajectory: int = 0) -> dict[str, np.ndarray]:
    """DATASET_fields.png of one dataset's predictions group (an xarray Dataset); returns {"CHANNEL/KIND/STEP":
    the array drawn} with KIND truth, prediction or error and STEP the 1-based rollout step."""
    plt = _pyplot()
    fig = fields_figure(group, trajectory)
    try:
        fig.savefig(out, dpi=80, **_PNG)
        info, steps = shown(group), picked_steps(group.sizes["step"])
        panels = [ax for ax in fig.axes if ax.images]
        drawn = {}
        for ci, ch in enumerate(info.channels):
            for ki, kind in enumerate(KINDS):
                for si, s in enumerate(steps):
                    ax = panels[(3 * ci + ki) * len(steps) + si]
                    drawn[f"{ch}/{kind}/{s + 1}"] = np.ma.getdata(ax.images[0].get_array()).copy()
        return drawn
    finally:
        plt.close(fig)


def plot_error_curve(dataset: str, scores: dict[str, Any], out: Path) -> dict[str, np.ndarray]:
    """DATASET_error.png from eval.json's per-step L2RE and blow-up shares; returns {"WHO/KEY": the y values
    drawn}."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    keys = (("frame_l2re_per_step", "-", "frame"), ("l2re_per_step", "--", "rollout to step"))
    for who, colour in (("model", "C0"), ("persistence", "C1")):
        for key, style, what in keys:
            y = scores[who][key]
            ax.plot(np.arange(1, len(y) + 1), y, style, color=colour, label=f"{who}, {what}", gid=f"{who}/{key}")
    ax.set_xlabel("rollout step")
    ax.set_ylabel("L2RE")
    ax.set_title(f"{dataset}: error per step")
    ax.legend(fontsize=8, loc="upper left")
    axes = [ax]
    if any(scores[who].get("blowup_fraction_per_step") for who in ("model", "persistence")):
        share = ax.twinx()  # the blow-ups: trajectories whose VRMSE passed 1, on their own axis
        for who, colour in (("model", "C0"), ("persistence", "C1")):
            y = scores[who].get("blowup_fraction_per_step") or []
            share.plot(np.arange(1, len(y) + 1), y, ":", marker="v", markersize=4, color=colour, alpha=0.8,
                       label=f"{who}, blown up (VRMSE > 1)", gid=f"{who}/blowup_fraction_per_step")
        share.set_ylim(-0.02, 1.02)
        share.set_ylabel("share of trajectories blown up")
        share.legend(fontsize=8, loc="lower right")
        axes.append(share)
    fig.tight_layout()
    fig.savefig(out, dpi=80, **_PNG)
    drawn = {line.get_gid(): np.asarray(line.get_ydata()) for a in axes for line in a.get_lines()}
    plt.close(fig)
    return drawn


def power_spectrum(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Isotropic power spectrum of a spatial block: integer wavenumber shells |k| (grid units) and the mean |FFT|^2
    in each."""
    power = np.abs(np.fft.fftn(a)) ** 2 / a.size
    k = np.sqrt(sum(np.meshgrid(*[np.fft.fftfreq(n) * n for n in a.shape], indexing="ij")[i] ** 2
                    for i in range(a.ndim)))
    shell = np.rint(k).astype(int).ravel()
    sums = np.bincount(shell, weights=power.ravel())
    counts = np.bincount(shell)
    keep = counts > 0
    return np.arange(len(sums))[keep], sums[keep] / counts[keep]


def fluctuation(a: np.ndarray, fluid: np.ndarray) -> np.ndarray:
    """A field's departure from its mean over fluid cells, 0 on solid cells: what its spectrum should show (a
    293 K field with a 0 K obstacle would otherwise show the obstacle's edges)."""
    a = np.asarray(a, dtype=np.float64)
    fluid = np.broadcast_to(np.asarray(fluid, dtype=bool), a.shape)
    return np.where(fluid, a - a[fluid].mean(), 0.0) if fluid.any() else np.zeros_like(a)


def spectra_figure(group: Any, trajectory: int = 0) -> Any:
    """The figure of DATASET_spectrum.png: per valid channel, the power spectra of truth (solid) and prediction
    (dashed) above, and of the error below, at the first, middle and last step (one colour each)."""
    plt = _pyplot()
    info = shown(group)
    steps = picked_steps(group.sizes["step"])
    traj = group.isel(trajectory=trajectory)
    fluid = np.asarray(traj["mask"].values).astype(bool)
    fig, axes = plt.subplots(2, len(info.channels), figsize=(max(6.0, 4.6 * len(info.channels)), 7.0),
                             squeeze=False, constrained_layout=True)
    for ci, ch in enumerate(info.channels):
        power = squared(info.units.get(ch, UNKNOWN))
        for si, s in enumerate(steps):
            at = traj.sel(channel=ch).isel(step=s)
            truth, pred = np.asarray(at["truth"].values), np.asarray(at["prediction"].values)
            for row, kind, values, style in ((0, "truth", truth, "-"), (0, "prediction", pred, "--"),
                                             (1, "error", pred - truth, "-")):
                k, p = power_spectrum(fluctuation(values, fluid))
                axes[row, ci].loglog(k[1:], p[1:], style, color=f"C{si}", gid=f"{ch}/{kind}/{s + 1}",
                                     label=f"{kind}, {info.when(s)}")
        for row, what in ((0, f"{ch}: truth (solid), prediction (dashed)"), (1, f"{ch}: error (prediction - truth)")):
            ax = axes[row, ci]
            ax.set_title(what, fontsize=9)
            ax.set_xlabel("|k| [cycles per domain]", fontsize=8)
            ax.set_ylabel(f"mean |FFT|² / cells [{power}]", fontsize=8)
            ax.legend(fontsize=7)
    fig.suptitle(f"{info.dataset}: power spectra, trajectory {traj['trajectory'].item()}\n(fluid cells less their "
                 "mean, solid cells 0)", fontsize=9)
    return fig


def squared(unit: str) -> str:
    """The unit of a power spectrum of a quantity in `unit`: K -> K², m s-1 -> (m s-1)²; 1 and unknown as they are."""
    if unit in (UNKNOWN, "1"):
        return unit
    return f"({unit})²" if any(c in unit for c in " /*.") else f"{unit}²"


def plot_spectra(group: Any, out: Path, trajectory: int = 0) -> dict[str, np.ndarray]:
    """DATASET_spectrum.png (spectra_figure); returns {"CHANNEL/KIND/STEP": the y values drawn}, KIND truth,
    prediction or error, STEP 1-based."""
    plt = _pyplot()
    fig = spectra_figure(group, trajectory)
    try:
        fig.savefig(out, dpi=80, **_PNG)
        return {line.get_gid(): np.asarray(line.get_ydata()) for ax in fig.axes for line in ax.get_lines()}
    finally:
        plt.close(fig)


def rollout_scales(traj: Any, channels: list[str], mask: np.ndarray) -> dict[str, tuple[float, float, str]]:
    """{"CHANNEL/KIND": (vmin, vmax, colour map)} over the whole rollout of one trajectory (its fluid cells), read
    one step at a time: truth and prediction share one scale per channel, the error a symmetric one."""
    ranges: dict[str, list[float]] = {}
    for s in range(traj.sizes["step"]):
        at = traj.isel(step=s)
        for ch in channels:
            t = _plane(np.asarray(at["truth"].sel(channel=ch).values))
            p = _plane(np.asarray(at["prediction"].sel(channel=ch).values))
            lo, hi = fluid_range(np.stack([t, p]), mask)
            e_lo, e_hi = fluid_range(p - t, mask)
            r, e = ranges.setdefault(ch, [lo, hi]), ranges.setdefault(f"{ch}/error", [e_lo, e_hi])
            r[:] = [min(r[0], lo), max(r[1], hi)]
            e[:] = [min(e[0], e_lo), max(e[1], e_hi)]
    out = {}
    for ch in channels:
        scale = colour_scale(*ranges[ch])
        top = max(abs(v) for v in ranges[f"{ch}/error"])
        out.update({f"{ch}/truth": scale, f"{ch}/prediction": scale,
                    f"{ch}/error": (-(top or 1.0), top or 1.0, "RdBu_r")})
    return out


@dataclass
class Video:
    """What write_video drew: per "CHANNEL/KIND" the plane of each step and the colour limits it was drawn with."""

    drawn: dict[str, list[np.ndarray]]
    limits: dict[str, list[tuple[float, float]]]
    colour_bars: list[str]  # their labels, `temperature [K]`, one per panel


def write_video(group: Any, out: Path, trajectory: int = 0, fps: int = 4) -> Video:
    """DATASET_rollout.gif (matplotlib's PillowWriter): one row per valid channel (truth, prediction, error), each
    with its colour bar and one colour scale for the whole rollout (rollout_scales); frames are read from the store
    one step at a time."""
    plt = _pyplot()
    from matplotlib.animation import FuncAnimation

    info = shown(group)
    traj = group.isel(trajectory=trajectory)
    mask = _plane(np.asarray(traj["mask"].values)).astype(bool)
    scales = rollout_scales(traj, info.channels, mask)
    blank = np.zeros(mask.shape)
    fig, axes = plt.subplots(len(info.channels), 3, figsize=(10.5, 3.1 * len(info.channels)), squeeze=False,
                             constrained_layout=True)
    images = {}
    for ci, ch in enumerate(info.channels):
        for ki, kind in enumerate(KINDS):
            key = f"{ch}/{kind}"
            images[key] = draw_field(axes[ci, ki], blank, mask, info.plane, *scales[key])
            fig.colorbar(images[key], ax=axes[ci, ki], shrink=0.85).set_label(info.label(ch, kind), fontsize=8)
    video = Video({k: [] for k in images}, {k: [] for k in images}, [])

    def frame(s: int) -> list[Any]:
        at = traj.isel(step=s)
        for ci, ch in enumerate(info.channels):
            t = _plane(np.asarray(at["truth"].sel(channel=ch).values))
            p = _plane(np.asarray(at["prediction"].sel(channel=ch).values))
            for ki, (kind, a) in enumerate(zip(KINDS, (t, p, p - t))):
                key = f"{ch}/{kind}"
                images[key].set_data(np.ma.masked_where(~mask | ~np.isfinite(a), a))
                axes[ci, ki].set_title(f"{kind}, {info.when(s)}", fontsize=8)
                video.drawn[key].append(np.ma.getdata(images[key].get_array()).copy())
                video.limits[key].append(tuple(float(v) for v in images[key].get_clim()))
        return list(images.values())

    fig.suptitle(f"{info.dataset}: trajectory {traj['trajectory'].item()}", fontsize=10)
    anim = FuncAnimation(fig, frame, frames=group.sizes["step"], blit=False)
    anim.save(str(out), writer=_marked_gif(fps=fps), dpi=80)
    bars = [ax.get_ylabel() for ax in fig.axes if not ax.images]
    plt.close(fig)
    n = group.sizes["step"]  # the animation may draw the first frame more than once: keep the last pass
    return Video({k: v[-n:] for k, v in video.drawn.items()}, {k: v[-n:] for k, v in video.limits.items()}, bars)


def _marked_gif(fps: int) -> Any:
    """matplotlib's PillowWriter, writing a GIF (whatever the file's name) that bears PLOT_MARK as its comment."""
    from matplotlib.animation import PillowWriter

    class MarkedGif(PillowWriter):
        def finish(self) -> None:
            self._frames[0].save(self.outfile, format="GIF", save_all=True, append_images=self._frames[1:],
                                 duration=int(1000 / self.fps), loop=0, comment=PLOT_MARK.encode())

    return MarkedGif(fps=fps)


def _write_picture(path: Path, draw: Any) -> None:
    """Draw into a new temporary file beside `path`, then rename it onto `path`, which must be missing or a picture
    dpot drew (OutputError otherwise: checked again here, as a file may have appeared since the evaluation began)."""
    problem = marked_file_problem(path, PLOT_MARK.encode())
    if problem:
        raise OutputError(f"--plot {path}", problem)
    with atomic_path(path) as tmp:
        draw(Path(tmp))


def write_plots(store: str | Path, result: dict[str, Any], out_dir: str | Path, video: bool = False
                ) -> list[Path]:
    """Every picture of every dataset in `result` (an eval.json) from the predictions `store`; returns the files
    written."""
    import xarray as xr

    out_dir = check_plot_folder(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, scores in result["datasets"].items():
        group = xr.open_zarr(str(store), group=name)
        for path, draw in ((out_dir / f"{name}_fields.png", lambda p: plot_fields(group, p)),
                           (out_dir / f"{name}_error.png", lambda p: plot_error_curve(name, scores, p)),
                           (out_dir / f"{name}_spectrum.png", lambda p: plot_spectra(group, p))):
            _write_picture(path, draw)
            written.append(path)
        if video:
            path = out_dir / f"{name}_rollout.gif"
            _write_picture(path, lambda p: write_video(group, p))
            written.append(path)
    return written

