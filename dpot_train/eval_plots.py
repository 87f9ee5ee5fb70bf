"""`evaluate --plot DIR [--video]`: pictures of an evaluation, per dataset, drawn from the predictions store
(eval_predictions) and eval.json's numbers.

  DATASET_fields.png    truth / prediction / error of each valid channel at the first, middle and last rollout step
                        of the first test trajectory; truth and prediction share one colour scale per channel, the
                        error a symmetric one; solid cells outlined; 3D data: the mid-plane of the first stored axis
  DATASET_error.png     L2RE per step of the model and of the persistence baseline (each frame alone, solid; the
                        rollout up to that step, dashed)
  DATASET_spectrum.png  isotropic power spectra of truth and prediction at the last step, per channel
  DATASET_rollout.gif   (--video) truth, prediction and error of the first valid channel over the rollout
Arrays are shown in the manifest's stored orientation (the last axis x to the right, the one before it upwards).
Every function returns the arrays its artists hold, read back from the figure, so that tests compare them with
the predictions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


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


def _aspect(group: Any, plane: np.ndarray) -> float:
    """imshow's aspect for a `plane` of the group's grid: the native grid's proportions (dpot_format.grid)."""
    from dpot_format.grid import cell_aspect

    return cell_aspect(plane.shape, group.attrs.get("native_shape"))


def picked_steps(steps: int) -> list[int]:
    """Indices of the first, middle and last rollout step (fewer when the rollout is shorter)."""
    return sorted({0, (steps - 1) // 2, steps - 1})


def plot_fields(group: Any, out: Path, trajectory: int = 0) -> dict[str, np.ndarray]:
    """DATASET_fields.png of one dataset's predictions group (an xarray Dataset); returns {"CHANNEL/KIND/STEP":
    the array drawn} with KIND truth, prediction or error and STEP the 1-based rollout step."""
    plt = _pyplot()
    valid = [c for c, v in zip(group["channel"].values.tolist(), group.attrs["channel_valid"]) if v]
    steps = picked_steps(group.sizes["step"])
    traj = group.isel(trajectory=trajectory)
    mask = _plane(np.asarray(traj["mask"].values))
    fig, axes = plt.subplots(3 * len(valid), len(steps), figsize=(3.2 * len(steps), 2.6 * 3 * len(valid)),
                             squeeze=False)
    for ci, ch in enumerate(valid):
        pick = traj.sel(channel=ch).isel(step=steps)
        truth = np.stack([_plane(a) for a in np.asarray(pick["truth"].values)])
        pred = np.stack([_plane(a) for a in np.asarray(pick["prediction"].values)])
        err = pred - truth
        fluid = np.broadcast_to(mask, truth.shape)
        lo = float(min(truth[fluid].min(), pred[fluid].min())) if fluid.any() else 0.0
        hi = float(max(truth[fluid].max(), pred[fluid].max())) if fluid.any() else 1.0
        e = float(np.abs(err[fluid]).max()) if fluid.any() else 1.0
        for si, s in enumerate(steps):
            for ki, (kind, a, vmin, vmax, cmap) in enumerate((("truth", truth[si], lo, hi, "viridis"),
                                                               ("prediction", pred[si], lo, hi, "viridis"),
                                                               ("error", err[si], -e or -1.0, e or 1.0, "RdBu_r"))):
                ax = axes[3 * ci + ki, si]
                shown = np.ma.masked_where(~mask, a)
                im = ax.imshow(shown, origin="lower", vmin=vmin, vmax=vmax, cmap=cmap, interpolation="nearest",
                               aspect=_aspect(group, mask))
                if not mask.all():
                    ax.contour(mask.astype(float), levels=[0.5], colors="k", linewidths=0.8)
                ax.set_title(f"{ch} {kind}, step {s + 1}", fontsize=8)
                ax.set_xticks([])
                ax.set_yticks([])
                if si == len(steps) - 1:
                    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"{group.attrs['dataset']}: trajectory {traj['trajectory'].item()}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    drawn = {}
    for ci, ch in enumerate(valid):
        for si, s in enumerate(steps):
            for ki, kind in enumerate(("truth", "prediction", "error")):
                drawn[f"{ch}/{kind}/{s + 1}"] = np.ma.getdata(axes[3 * ci + ki, si].images[0].get_array()).copy()
    plt.close(fig)
    return drawn


def plot_error_curve(dataset: str, scores: dict[str, Any], out: Path) -> dict[str, np.ndarray]:
    """DATASET_error.png from eval.json's per-step L2RE; returns {"WHO/KEY": the y values drawn}."""
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
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    drawn = {line.get_gid(): np.asarray(line.get_ydata()) for line in ax.get_lines()}
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


def plot_spectra(group: Any, out: Path, trajectory: int = 0) -> dict[str, np.ndarray]:
    """DATASET_spectrum.png: spectra of truth and prediction at the last step; returns {"CHANNEL/KIND": y drawn}."""
    plt = _pyplot()
    valid = [c for c, v in zip(group["channel"].values.tolist(), group.attrs["channel_valid"]) if v]
    last = group.isel(trajectory=trajectory, step=group.sizes["step"] - 1)
    fig, axes = plt.subplots(1, len(valid), figsize=(4 * len(valid), 3.5), squeeze=False)
    for ci, ch in enumerate(valid):
        ax = axes[0, ci]
        for kind, style in (("truth", "-"), ("prediction", "--")):
            k, p = power_spectrum(np.asarray(last[kind].sel(channel=ch).values, dtype=np.float64))
            ax.loglog(k[1:], p[1:], style, label=kind, gid=f"{ch}/{kind}")
        ax.set_title(f"{ch}, step {group.sizes['step']}", fontsize=9)
        ax.set_xlabel("|k|")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    drawn = {line.get_gid(): np.asarray(line.get_ydata()) for ax in axes[0] for line in ax.get_lines()}
    plt.close(fig)
    return drawn


def write_video(group: Any, out: Path, trajectory: int = 0, fps: int = 4) -> list[np.ndarray]:
    """DATASET_rollout.gif of the first valid channel (matplotlib's PillowWriter); frames are read from the store
    one step at a time. Returns the prediction planes drawn, one per step."""
    plt = _pyplot()
    from matplotlib.animation import FuncAnimation, PillowWriter

    ch = [c for c, v in zip(group["channel"].values.tolist(), group.attrs["channel_valid"]) if v][0]
    traj = group.isel(trajectory=trajectory).sel(channel=ch)
    mask = _plane(np.asarray(traj["mask"].values))
    first = _plane(np.asarray(traj["truth"].isel(step=0).values))
    lo, hi = float(first[mask].min()), float(first[mask].max())
    hi = hi if hi > lo else lo + 1.0
    fig, axes = plt.subplots(1, 3, figsize=(9, 3.2))
    ims = [ax.imshow(np.zeros_like(first), origin="lower", vmin=v0, vmax=v1, cmap=cm, interpolation="nearest",
                     aspect=_aspect(group, mask))
           for ax, (v0, v1, cm) in zip(axes, ((lo, hi, "viridis"), (lo, hi, "viridis"),
                                              (-(hi - lo) / 2, (hi - lo) / 2, "RdBu_r")))]
    for ax in axes:
        ax.set_xticks([])
        ax.set_yticks([])
    drawn: list[np.ndarray] = []

    def frame(s: int) -> list[Any]:
        t = _plane(np.asarray(traj["truth"].isel(step=s).values))
        p = _plane(np.asarray(traj["prediction"].isel(step=s).values))
        for im, a in zip(ims, (t, p, p - t)):
            im.set_data(np.ma.masked_where(~mask, a))
        for ax, kind in zip(axes, ("truth", "prediction", "error")):
            ax.set_title(f"{ch} {kind}, step {s + 1}", fontsize=8)
        drawn.append(np.ma.getdata(ims[1].get_array()).copy())
        return ims

    anim = FuncAnimation(fig, frame, frames=group.sizes["step"], blit=False)
    anim.save(str(out), writer=PillowWriter(fps=fps), dpi=60)
    plt.close(fig)
    return drawn[-group.sizes["step"]:]


def write_plots(store: str | Path, result: dict[str, Any], out_dir: str | Path, video: bool = False
                ) -> list[Path]:
    """Every picture of every dataset in `result` (an eval.json) from the predictions `store`; returns the files
    written."""
    import xarray as xr

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, scores in result["datasets"].items():
        group = xr.open_zarr(str(store), group=name)
        for path, draw in ((out_dir / f"{name}_fields.png", lambda p: plot_fields(group, p)),
                           (out_dir / f"{name}_error.png", lambda p: plot_error_curve(name, scores, p)),
                           (out_dir / f"{name}_spectrum.png", lambda p: plot_spectra(group, p))):
            draw(path)
            written.append(path)
        if video:
            path = out_dir / f"{name}_rollout.gif"
            write_video(group, path)
            written.append(path)
    return written

