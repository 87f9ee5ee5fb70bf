"""Stability figures of eval.json (dpot-eval/3): the share of trajectories blown up by each step (VRMSE, mean over
valid channels, past 1; once passed, counted as passed) and The Well's VRMSE averaged over windows of steps (1-10,
11-30, 31-end), against hand computations; and the same figures recomputed from a saved predictions store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.core.config import DataConfig
from dpot_train.evaluation.metrics import SuiteAccumulator, vrmse, window_means
from dpot_train.evaluation.predictions import PredictionWriter
from dpot_train.evaluation.evaluate import evaluate_model

DS = "fno-ns-v1e-3"


def _errors_of_vrmse(true: np.ndarray, mask: np.ndarray, scale: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """pred - true whose VRMSE per (trajectory, step, channel) is scale (B, T, C) to 1e-6: a field of mean square 1
    over the fluid cells times the truth's unbiased std there; solid cells get garbage (never counted)."""
    b, h, w, t, c = true.shape
    z = rng.standard_normal(true.shape)
    fluid = mask[..., None, None]
    z = z / np.sqrt((z ** 2 * fluid).sum(axis=(1, 2), keepdims=True) / fluid.sum(axis=(1, 2), keepdims=True))
    n = mask.sum(axis=(1, 2))[:, None, None]
    mean = (true * fluid).sum(axis=(1, 2)) / n
    var = (((true - mean[:, None, None]) * fluid) ** 2).sum(axis=(1, 2)) / (n - 1)
    err = z * (scale * np.sqrt(var))[:, None, None]
    return np.where(fluid, err, 1e6)


def test_blowup_fraction_equals_a_hand_computation() -> None:
    """Trajectory 2 passes VRMSE 1 at step 5 only (then falls back: still counted), trajectory 3 at step 9 through
    the mean over channels (one channel alone at 2.5, the other 0.1; at step 7 the mean is 0.8: not passed); the
    padded channel's huge error and the solid cells' garbage never count."""
    rng = np.random.default_rng(0)
    b, t = 4, 12
    true = rng.standard_normal((b, 9, 10, t, 3)) * 3 + 1
    mask = np.ones((b, 9, 10), dtype=bool)
    mask[:, :3, :2] = False
    scale = np.full((b, t, 3), 0.5)
    scale[2, 4] = 2.0  # step 5
    scale[3, :, 1] = 0.1
    scale[3, 6, 0], scale[3, 8, 0] = 1.5, 2.5  # steps 7 (mean 0.8) and 9 (mean 1.3)
    scale[:, :, 2] = 50.0  # the padded channel
    pred = true + _errors_of_vrmse(true, mask, scale, rng)
    acc = SuiteAccumulator(["u", "v", "pad"], [True, True, False], t)
    acc.start_batch(b)
    for t0, t1 in ((0, 3), (3, 8), (8, 12)):  # chunks of steps, as a streamed rollout feeds them
        acc.add_rollout(torch.from_numpy(pred[..., t0:t1, :]), torch.from_numpy(true[..., t0:t1, :]),
                        torch.from_numpy(mask))
    assert acc.first_blowup.tolist() == [-1, -1, 5, 9]
    fraction = acc.result()["blowup_fraction_per_step"]
    assert fraction == [0.0] * 4 + [0.25] * 4 + [0.5] * 4
    assert all(a <= b for a, b in zip(fraction, fraction[1:]))  # monotone: once blown up, counted as blown up
    # a second batch of one trajectory that blows up at step 1: the fractions are over all five trajectories
    acc.start_batch(1)
    acc.add_rollout(torch.from_numpy(true[:1] * 0 + 10.0 + pred[:1]), torch.from_numpy(true[:1]),
                    torch.from_numpy(mask[:1]))
    assert acc.result()["blowup_fraction_per_step"] == [0.2] * 4 + [0.4] * 4 + [0.6] * 4


def test_vrmse_windows_average_the_steps_each_window_holds() -> None:
    """1-10, 11-30 and 31-end, each present when the rollout reaches its first step, the mean of vrmse_per_step
    over the steps of the window the rollout holds."""
    rng = np.random.default_rng(1)
    true = torch.from_numpy(rng.standard_normal((2, 6, 5, 35, 2)))
    pred = true + torch.from_numpy(rng.standard_normal((2, 6, 5, 35, 2))) * torch.linspace(0.1, 2, 35)[:, None]
    per_step = vrmse(pred, true).mean(dim=0).numpy()  # (T, C): eval_metrics' own, checked against The Well's
    for steps, keys in ((35, ["1-10", "11-30", "31-end"]), (12, ["1-10", "11-30"]), (5, ["1-10"])):
        acc = SuiteAccumulator(["a", "b"], [True, True], steps)
        acc.start_batch(2)
        acc.add_rollout(pred[..., :steps, :], true[..., :steps, :], None)
        for c, name in enumerate(("a", "b")):
            got = acc.result()["channels"][name]["vrmse_window"]
            assert list(got) == keys
            want = {"1-10": per_step[:min(10, steps), c].mean(), "11-30": per_step[10:30, c][:max(0, steps - 10)],
                    "31-end": per_step[30:steps, c]}
            for k in keys:
                assert got[k] == pytest.approx(float(np.mean(want[k])), rel=1e-12)
    assert window_means(np.array([])) == {}


class _Drifting(torch.nn.Module):
    """A stand-in model whose rollout drifts from the truth by an offset per step that depends on the trajectory
    (its first input frame's largest value, squared): of the two test trajectories one passes VRMSE 1 at step 2,
    the other at step 3."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., -1:, :] + 1.25 * x[..., :1, :].abs().amax(dim=(1, 2), keepdim=True) ** 2


def _store_vrmse(group) -> np.ndarray:  # noqa: ANN001 - an xarray Dataset
    """(N, T, C_valid) The Well's VRMSE of the stored prediction over the fluid cells, in numpy."""
    valid = np.array(group.attrs["channel_valid"])
    p = group["prediction"].values[:, :, valid].astype(np.float64)
    t = group["truth"].values[:, :, valid].astype(np.float64)
    w = group["mask"].values[:, None, None].astype(np.float64)
    n = w.sum(axis=(3, 4))
    mean = (t * w).sum(axis=(3, 4), keepdims=True) / n[..., None, None]
    var = (((t - mean) * w) ** 2).sum(axis=(3, 4)) / (n - 1)
    return np.sqrt(((((p - t) * w) ** 2).sum(axis=(3, 4)) / n) / (var + 1e-7))


def test_stability_fields_equal_the_predictions_store(fno_train_shards: Path, tmp_path: Path) -> None:
    """vrmse_window, blowup_fraction_per_step and first_blowup_step recomputed in numpy from the saved store."""
    import xarray as xr

    sink = PredictionWriter(tmp_path / "p.zarr")
    result = evaluate_model(_Drifting(), DataConfig(manifests=[str(fno_train_shards)]), rollout_steps=3, sink=sink,
                            batch_size=1)
    assert result["schema"] == "dpot-eval/3"
    group = xr.open_zarr(str(sink.close()), group=DS)
    scores = result["datasets"][DS]["model"]
    vr = _store_vrmse(group)  # (N, T, 1)
    assert scores["channels"]["vorticity"]["vrmse_window"]["1-10"] == pytest.approx(float(vr[..., 0].mean()),
                                                                                   rel=1e-5)
    passed = vr.mean(axis=2) > 1.0
    first = np.where(passed.any(axis=1), passed.argmax(axis=1) + 1, -1)
    assert group["first_blowup_step"].values.tolist() == first.tolist()
    assert sorted(first.tolist()) == [2, 3]  # the case is not trivial: both blow up, at different steps
    want = [float(((first > 0) & (first <= k)).mean()) for k in (1, 2, 3)]
    assert scores["blowup_fraction_per_step"] == want == [0.0, 0.5, 1.0]
    assert result["datasets"][DS]["persistence"]["blowup_fraction_per_step"] == [0.0, 0.0, 0.0]


def test_error_picture_marks_the_blowups(tmp_path: Path) -> None:
    """DATASET_error.png draws each predictor's blow-up share per step on a second axis (a dpot-eval/2 result,
    without it, draws the L2RE curves alone)."""
    from dpot_train.evaluation.plots import plot_error_curve

    curve = {"l2re_per_step": [0.1, 0.2, 0.4, 0.9], "frame_l2re_per_step": [0.1, 0.3, 0.6, 1.4]}
    scores = {"model": {**curve, "blowup_fraction_per_step": [0.0, 0.0, 0.5, 1.0]},
              "persistence": {**curve, "blowup_fraction_per_step": [0.0, 0.0, 0.0, 0.5]}}
    drawn = plot_error_curve(DS, scores, tmp_path / "e.png")
    assert drawn["model/blowup_fraction_per_step"].tolist() == [0.0, 0.0, 0.5, 1.0]
    assert drawn["persistence/blowup_fraction_per_step"].tolist() == [0.0, 0.0, 0.0, 0.5]
    assert (tmp_path / "e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    old = plot_error_curve(DS, {"model": curve, "persistence": curve}, tmp_path / "old.png")
    assert set(old) == {"model/l2re_per_step", "model/frame_l2re_per_step", "persistence/l2re_per_step",
                        "persistence/frame_l2re_per_step"}
