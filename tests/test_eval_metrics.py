"""The evaluation's metric suite against independent implementations on the same arrays: The Well's own NRMSE,
VRMSE and binned spectral MSE (values computed with the_well 1.2.0 by tests/golden/make_well_metrics.py and kept in
tests/golden/well_metrics.npz), and per-step L2RE against numpy and against metrics.l2re."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.evaluation.metrics import DatasetSuite, SuiteAccumulator, nrmse, spectral_mse, vrmse
from dpot_train.core.metrics import l2re

GOLDEN = Path(__file__).parent / "golden" / "well_metrics.npz"
CASES = ("random_2d", "masked_2d", "masked_3d", "odd_2d")


def _case(name: str) -> dict[str, np.ndarray]:
    with np.load(GOLDEN, allow_pickle=False) as z:
        return {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith(name + "/")}


def _t(c: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    mask = torch.from_numpy(c["mask"]) if "mask" in c else None
    return torch.from_numpy(c["pred"]), torch.from_numpy(c["true"]), mask


@pytest.mark.parametrize("name", CASES)
def test_frame_metrics_equal_the_wells(name: str) -> None:
    c = _case(name)
    pred, true, mask = _t(c)
    np.testing.assert_allclose(nrmse(pred, true, mask).numpy(), c["well_nrmse"], rtol=2e-5)
    np.testing.assert_allclose(vrmse(pred, true, mask).numpy(), c["well_vrmse"], rtol=2e-5)
    np.testing.assert_allclose(spectral_mse(pred, true, mask).numpy(), c["well_spectral_mse"], rtol=2e-5, atol=1e-9)


def _numpy_l2re_steps(pred: np.ndarray, true: np.ndarray, mask: np.ndarray | None, valid: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Independent per-step L2RE, (B, T): cumulative (rollout over steps 1..k) and of frame k alone."""
    p, t = pred.astype(np.float64)[..., valid], true.astype(np.float64)[..., valid]
    if mask is not None:
        w = mask.astype(np.float64)[..., None, None]
        p, t = p * w, t * w
    axes = tuple(range(1, p.ndim - 2))
    sse, sst = ((p - t) ** 2).sum(axis=axes), (t ** 2).sum(axis=axes)  # (B, T, C)
    cum = np.sqrt(np.cumsum(sse, axis=1)) / (np.sqrt(np.cumsum(sst, axis=1)) + 1e-8)
    return cum.mean(axis=2), (np.sqrt(sse) / (np.sqrt(sst) + 1e-8)).mean(axis=2)


@pytest.mark.parametrize("name", CASES)
def test_suite_means_over_trajectories_chunked(name: str) -> None:
    """The accumulator fed in two chunks of steps gives the means over trajectories of the referee's values, on
    valid channels only; padded channels are absent, a constant channel is named."""
    c = _case(name)
    pred, true, mask = _t(c)
    valid = c["channel_valid"].astype(bool)
    names = [f"c{i}" for i in range(len(valid))]
    acc = SuiteAccumulator(names, valid.tolist(), pred.shape[-2])
    acc.start_batch(pred.shape[0])
    cut = max(1, pred.shape[-2] // 2)
    acc.add_rollout(pred[..., :cut, :], true[..., :cut, :], mask)
    acc.add_rollout(pred[..., cut:, :], true[..., cut:, :], mask)
    acc.add_one_step(pred, true, mask)
    res = acc.result()
    kept = [n for n, v in zip(names, valid) if v]
    assert list(res["channels"]) == kept
    for i, n in enumerate(names):
        if not valid[i]:
            continue
        ch = res["channels"][n]
        np.testing.assert_allclose(ch["nrmse_per_step"], c["well_nrmse"][:, :, i].mean(axis=0), rtol=2e-5)
        np.testing.assert_allclose(ch["vrmse_per_step"], c["well_vrmse"][:, :, i].mean(axis=0), rtol=2e-5)
        np.testing.assert_allclose(ch["spectral_mse_per_bin"], c["well_spectral_mse"][..., i].mean(axis=(0, 1)),
                                   rtol=2e-5)
        assert len(ch["spectral_mse_per_bin"]) == 3
    assert res["one_step_nrmse"] == pytest.approx(float(c["well_nrmse"][..., valid].mean()), rel=2e-5)
    cum, frame = _numpy_l2re_steps(c["pred"], c["true"], c.get("mask"), valid)
    np.testing.assert_allclose(res["l2re_per_step"], cum.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(res["frame_l2re_per_step"], frame.mean(axis=0), rtol=1e-9)
    assert acc.constant_channels() == (["c2"] if name == "masked_2d" else [])


@pytest.mark.parametrize("name", CASES)
def test_l2re_per_step_reproduces_rollout_l2re(name: str) -> None:
    """The documented relation: l2re_per_step[k-1] is the rollout L2RE of the first k steps (metrics.l2re on that
    block, the way eval.json's rollout_l2re is computed), so its last entry is rollout_l2re."""
    c = _case(name)
    pred, true, mask = _t(c)
    valid = c["channel_valid"].astype(bool).tolist()
    cv = torch.tensor([valid] * pred.shape[0])
    acc = SuiteAccumulator([f"c{i}" for i in range(len(valid))], valid, pred.shape[-2])
    acc.start_batch(pred.shape[0])
    acc.add_rollout(pred, true, mask)
    per_step = acc.result()["l2re_per_step"]
    for k in range(1, pred.shape[-2] + 1):
        whole = float(l2re(pred[..., :k, :], true[..., :k, :], mask, cv).mean())
        assert per_step[k - 1] == pytest.approx(whole, rel=1e-6)


def test_masked_cells_and_padded_channels_never_count() -> None:
    """Whatever the prediction holds on solid cells or in padded channels, every number stays the same."""
    c = _case("masked_2d")
    pred, true, mask = _t(c)
    valid = c["channel_valid"].astype(bool).tolist()

    def run(p: torch.Tensor) -> dict:
        suite = DatasetSuite(["u", "v", "w", "pad"], valid, p.shape[-2])
        suite.add("model", p, p, true, mask)
        suite.add("persistence", p, p, true, mask)
        return suite.result()

    base = run(pred)
    other = pred.clone()
    assert mask is not None
    other[~mask] = -123.0
    other[..., 3] = 55.0
    assert run(other) == base
    assert base["padded_channels"] == ["pad"] and base["channels"] == ["u", "v", "w"]
    assert base["constant_channels"] == ["w"]
    changed = pred.clone()
    changed[mask] += 0.01
    assert run(changed)["model"]["channels"]["u"] != base["model"]["channels"]["u"]
