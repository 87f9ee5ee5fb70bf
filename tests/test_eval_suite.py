"""The evaluation's outputs end to end: a tiny model trained a few steps, evaluated with --predictions --plot
--video; the predictions store opened with xarray gives back eval.json's per-step numbers; the pictures show the
predictions; `report --paper` sets the paper's figures beside the run. Also: the two L2RE scalars are computed
exactly as before, and the store's arrays are in the manifest's orientation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.core.config import DataConfig
from dpot_train.data.readers import WebDatasetReader
from dpot_train.data.datasets import read_manifest
from dpot_train.data.windows import to_model_layout
from dpot_train.evaluation.predictions import mask_to_stored, to_stored_order
from dpot_train.evaluation.evaluate import evaluate_model
from dpot_train.core.metrics import l2re, one_step, persistence, predicted_entries, rollout
from tests import train_runs

DS = "fno-ns-v1e-3"


class _Scaled(torch.nn.Module):
    """A deterministic stand-in model: 0.9 x the last frame plus 0.1 x the first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.9 * x[..., -1:, :] + 0.1 * x[..., :1, :]


def test_the_two_scalars_are_computed_as_before(fno_train_shards: Path) -> None:
    """one_step_l2re and rollout_l2re equal, bit for bit, the computation evaluate ran before the suite existed."""
    res = evaluate_model(_Scaled(), DataConfig(manifests=[str(fno_train_shards)]), rollout_steps=3)["datasets"][DS]
    ds = read_manifest(str(fno_train_shards))[0]
    reader = WebDatasetReader()
    refs = reader.refs(ds, "test")
    arrays = [reader.read(r, 0, 13) for r in refs]
    frames = torch.from_numpy(np.stack([to_model_layout(f, ds.model_layout) for f, _ in arrays]))
    mask = torch.from_numpy(np.stack([m.T for _, m in arrays]).astype(bool))
    cv = torch.tensor([ds.channel_valid] * len(refs), dtype=torch.bool)
    true = frames[..., 10:13, :]
    keep = predicted_entries(mask, cv, frames[..., :1, :])
    model = _Scaled()
    assert res["model"]["rollout_l2re"] == float(l2re(rollout(model, frames, 10, 3, keep), true, mask, cv).mean())
    assert res["model"]["one_step_l2re"] == float(l2re(one_step(model, frames, 10, 3, keep), true, mask, cv).mean())
    assert res["persistence"]["rollout_l2re"] == float(l2re(rollout(persistence, frames, 10, 3), true, mask,
                                                            cv).mean())
    assert res["model"]["l2re_per_step"][-1] == pytest.approx(res["model"]["rollout_l2re"], rel=1e-6)
    assert res["channels"] == ["vorticity"] and res["padded_channels"] == ds.channels[1:]


@pytest.mark.parametrize(("layout", "shape"), [("xy", (5, 6)), ("yx", (5, 6)), ("xy", (3, 5, 6))])
def test_store_order_inverts_the_model_layout(layout: str, shape: tuple[int, ...]) -> None:
    stored = np.random.default_rng(0).standard_normal((4, 2, *shape)).astype(np.float32)  # (T, C, *S)
    model = torch.from_numpy(to_model_layout(stored, layout))[None]  # (1, *S_model, T, C)
    np.testing.assert_array_equal(to_stored_order(model, layout)[0], stored)
    mask = np.random.default_rng(1).uniform(size=shape) > 0.5
    m_model = torch.from_numpy(to_model_layout(mask[None, None].astype(np.float32), layout)[..., 0, 0] > 0.5)[None]
    np.testing.assert_array_equal(mask_to_stored(m_model, layout)[0], mask)


@pytest.mark.slow
def test_evaluate_predictions_plots_video_and_report(fno_train_shards: Path, tmp_path: Path) -> None:
    import xarray as xr

    run = tmp_path / "run"
    r = train_runs.run(train_runs.launch_args(fno_train_shards, run, "--no-eval", steps=2, nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ckpt = run / "checkpoints" / "step-00000002.pt"
    out, store, plots = tmp_path / "eval.json", tmp_path / "pred.zarr", tmp_path / "plots"
    r = train_runs.run([sys.executable, "-m", "dpot_train", "evaluate", str(ckpt), "--manifest", str(fno_train_shards),
                        "--out", str(out), "--predictions", str(store), "--plot", str(plots), "--video"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ev = json.loads(out.read_text())
    assert ev["schema"] == "dpot-eval/3" and ev["predictions"] == str(store)
    scores = ev["datasets"][DS]

    group = xr.open_zarr(str(store), group=DS)
    assert group["prediction"].dims == ("trajectory", "step", "channel", "y", "x")
    assert group["mask"].dims == ("trajectory", "y", "x")
    assert group.sizes["trajectory"] == 2 and group.sizes["step"] == 3
    assert group["channel"].values.tolist() == read_manifest(str(fno_train_shards))[0].channels
    valid = np.array(group.attrs["channel_valid"])
    pred = group["prediction"].values[:, :, valid].astype(np.float64)
    true = group["truth"].values[:, :, valid].astype(np.float64)
    w = group["mask"].values[:, None, None].astype(np.float64)
    sse, sst = (((pred - true) * w) ** 2).sum(axis=(3, 4)), ((true * w) ** 2).sum(axis=(3, 4))  # (N, T, C)
    cum = np.sqrt(sse.cumsum(axis=1)) / (np.sqrt(sst.cumsum(axis=1)) + 1e-8)
    np.testing.assert_allclose(scores["model"]["l2re_per_step"], cum.mean(axis=2).mean(axis=0), rtol=1e-6)
    n = w.sum(axis=(3, 4))
    mean = (true * w).sum(axis=(3, 4), keepdims=True) / n[..., None, None]
    var = (((true - mean) * w) ** 2).sum(axis=(3, 4)) / (n - 1)
    vr = np.sqrt((sse / n) / (var + 1e-7)).mean(axis=0)  # (T, C)
    np.testing.assert_allclose(scores["model"]["channels"]["vorticity"]["vrmse_per_step"], vr[:, 0], rtol=1e-6)

    names = {Path(p).name for p in ev["plots"]}
    assert names == {f"{DS}_fields.png", f"{DS}_error.png", f"{DS}_spectrum.png", f"{DS}_rollout.gif"}
    assert not list(plots.glob(".dpot-predictions-*"))  # the scratch store of --plot is gone

    from dpot_train.evaluation.plots import plot_error_curve, plot_fields, plot_spectra, power_spectrum, write_video

    drawn = plot_fields(group, tmp_path / "f.png")
    p0 = group["prediction"].isel(trajectory=0).sel(channel="vorticity").values
    t0 = group["truth"].isel(trajectory=0).sel(channel="vorticity").values
    for s in (1, 2, 3):
        np.testing.assert_array_equal(drawn[f"vorticity/prediction/{s}"], p0[s - 1])
        np.testing.assert_array_equal(drawn[f"vorticity/truth/{s}"], t0[s - 1])
        np.testing.assert_allclose(drawn[f"vorticity/error/{s}"], p0[s - 1] - t0[s - 1], atol=1e-6)
        assert np.ptp(drawn[f"vorticity/truth/{s}"]) > 0
    curves = plot_error_curve(DS, scores, tmp_path / "e.png")
    np.testing.assert_array_equal(curves["model/l2re_per_step"], scores["model"]["l2re_per_step"])
    np.testing.assert_array_equal(curves["persistence/frame_l2re_per_step"],
                                  scores["persistence"]["frame_l2re_per_step"])
    spectra = plot_spectra(group, tmp_path / "s.png")
    np.testing.assert_allclose(spectra["vorticity/prediction/3"], power_spectrum(p0[-1].astype(np.float64))[1][1:])
    frames = write_video(group, tmp_path / "v.gif").drawn["vorticity/prediction"]
    assert len(frames) == 3 and all(np.array_equal(f, p0[i]) for i, f in enumerate(frames))

    report = tmp_path / "report.md"
    r = train_runs.run([sys.executable, "-m", "dpot_train", "report", str(out), "--paper", "--out", str(report)])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "FNO-nu 1e-3" in r.stdout and "0.00954" in r.stdout and "0.0128" in r.stdout  # DPOT-Ti and FNO
    assert "nRMSE" in r.stdout or "MPP" in r.stdout
    assert "## Paper checkpoint table (README): DPOT model sizes" in r.stdout  # the sizes, as the data file has them
    assert "| Huge | 2048 | 8092 | 27 | 8 | 1.03B |" in r.stdout
    assert "The paper's Table 10 (fno-ns-v1e-3, steps 20, 50, 100, 200, 500) is set beside runs" in r.stdout \
        or "## Paper Table 10, fno-ns-v1e-3" in r.stdout  # the long-trajectory table: beside the run or named
    assert report.read_text() in r.stdout
    html = tmp_path / "report.html"
    r = train_runs.run([sys.executable, "-m", "dpot_train", "report", str(out), "--out", str(html)])
    assert r.returncode == 0 and html.read_text().count("data:image/") == 4
