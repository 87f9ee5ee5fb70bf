"""`evaluate --ensemble`: the members' CRPS (fair estimator) and spread-skill ratio against scoringrules and numpy on
random and masked arrays (solid cells and padded channels never count), recomputed from a saved predictions store,
independent of the batch size and of the chunking of a long rollout; and the command line end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import scoringrules as sr  # the test extra: the reference CRPS
import torch
from typer.testing import CliRunner

from dpot_train.evaluation import stream as eval_stream, evaluate
from dpot_train.core.checkpoint import checkpoint_payload
from dpot_train.core.config import DataConfig
from dpot_train.evaluation.ensemble import Ensemble
from dpot_train.evaluation.metrics import EnsembleAccumulator, crps_fair
from dpot_train.evaluation.predictions import PredictionWriter
from dpot_train.evaluation.evaluate import evaluate_model


DS = "fno-ns-v1e-3"


def _numpy_scores(members: np.ndarray, true: np.ndarray, mask: np.ndarray | None, valid: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(T, V) CRPS by scoringrules (fair), spread-skill ratio and the ensemble mean's frame L2RE, all from numpy:
    per trajectory the mean over fluid cells, then the mean over trajectories; members (M, B, *S, T, C)."""
    x, y = members[..., valid].astype(np.float64), true[..., valid].astype(np.float64)
    m = x.shape[0]
    w = np.ones(y.shape[:-2]) if mask is None else mask.astype(np.float64)
    w = w[..., None, None]
    axes = tuple(range(1, y.ndim - 2))
    n = w.sum(axis=axes)
    crps = sr.crps_ensemble(y, np.moveaxis(x, 0, -1), estimator="fair", backend="numpy")  # (B, *S, T, V)
    crps = ((crps * w).sum(axis=axes) / n).mean(axis=0)
    var = ((x.var(axis=0, ddof=1) * w).sum(axis=axes) / n).mean(axis=0)
    mean = x.mean(axis=0)
    err2 = (((mean - y) ** 2 * w).sum(axis=axes) / n).mean(axis=0)
    ratio = math.sqrt((m + 1) / m) * np.sqrt(var) / np.sqrt(err2)
    frame = np.sqrt((((mean - y) * w) ** 2).sum(axis=axes)) / (np.sqrt(((y * w) ** 2).sum(axis=axes)) + 1e-8)
    return crps, ratio, frame.mean(axis=2).mean(axis=0)


def _case(masked: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, list[bool]]:
    rng = np.random.default_rng(seed)
    true = rng.standard_normal((3, 7, 6, 5, 3)) * 2 + 0.5  # (B, H, W, T, C)
    members = true + rng.standard_normal((4, *true.shape)) * np.linspace(0.2, 1.5, 5)[:, None]
    mask = None
    if masked:
        mask = rng.uniform(size=true.shape[:3]) > 0.3
        members = np.where(mask[None, ..., None, None], members, 1e6)  # garbage on solid cells
    members[..., 1] = -77.0  # the padded channel
    return members, true, mask, [True, False, True]


def test_crps_fair_equals_scoringrules_elementwise() -> None:
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((5, 4, 6)), rng.standard_normal((4, 6))
    np.testing.assert_allclose(crps_fair(torch.from_numpy(x), torch.from_numpy(y)).numpy(),
                               sr.crps_ensemble(y, np.moveaxis(x, 0, -1), estimator="fair", backend="numpy"),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("masked", [False, True])
def test_ensemble_scores_equal_scoringrules_and_numpy(masked: bool) -> None:
    """Fed in two chunks of steps; CRPS and spread-skill per channel and step, and the ensemble mean's suite."""
    members, true, mask, valid = _case(masked)
    acc = EnsembleAccumulator(["u", "pad", "v"], valid, 5, 4)
    acc.start_batch(3)
    m = None if mask is None else torch.from_numpy(mask)
    for t0, t1 in ((0, 2), (2, 5)):
        acc.add_rollout(torch.from_numpy(members[..., t0:t1, :]), torch.from_numpy(true[..., t0:t1, :]), m)
    res = acc.result()
    crps, ratio, frame = _numpy_scores(members, true, mask, np.array(valid))
    assert list(res["ensemble"]["channels"]) == ["u", "v"] and res["ensemble"]["members"] == 4
    for i, name in enumerate(("u", "v")):
        ch = res["ensemble"]["channels"][name]
        np.testing.assert_allclose(ch["crps_per_step"], crps[:, i], rtol=1e-10)
        assert ch["crps"] == pytest.approx(float(crps[:, i].mean()), rel=1e-10)
        np.testing.assert_allclose(ch["spread_skill_per_step"], ratio[:, i], rtol=1e-10)
    np.testing.assert_allclose(res["mean"]["frame_l2re_per_step"], frame, rtol=1e-9)
    assert res["mean"]["rollout_l2re"] == res["mean"]["l2re_per_step"][-1]
    assert "one_step_nrmse" not in res["mean"]  # the mean has no one-step predictions


def test_a_perfect_mean_has_no_ratio_and_one_member_is_refused() -> None:
    acc = EnsembleAccumulator(["u"], [True], 1, 2)
    acc.start_batch(1)
    true = torch.ones(1, 3, 3, 1, 1)
    acc.add_rollout(torch.stack([true - 0.5, true + 0.5]), true, None)  # mean == truth: skill 0
    ch = acc.result()["ensemble"]["channels"]["u"]
    assert ch["spread_skill_per_step"] == [None] and ch["crps"] == pytest.approx(0.5 - 1.0 / 2)
    with pytest.raises(ValueError, match="at least 2 members"):
        EnsembleAccumulator(["u"], [True], 1, 1)


class _Damped(torch.nn.Module):
    """A deterministic stand-in: the members differ only by the noise on their inputs."""

    def __init__(self, a: float = 0.9) -> None:
        super().__init__()
        self.a = a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a * x[..., -1:, :] + (1 - self.a) * x[..., :1, :]


def _evaluate(shards: Path, store: Path, batch_size: int = 8, members: int = 3) -> dict:
    sink = PredictionWriter(store)
    ens = Ensemble([_Damped(), _Damped(0.8)], ["a.pt", "b.pt"], members, 2e-3)
    out = evaluate_model(_Damped(), DataConfig(manifests=[str(shards)]), rollout_steps=3, sink=sink,
                         batch_size=batch_size, ensemble=ens)
    sink.close()
    return out


def test_ensemble_scores_equal_the_predictions_store(fno_train_shards: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import xarray as xr

    result = _evaluate(fno_train_shards, tmp_path / "p.zarr")
    assert result["ensemble"] == {"members": 3, "noise": 2e-3, "seed": 0, "estimator": "fair",
                                  "checkpoints": ["a.pt", "b.pt"], "member_checkpoint": [0, 1, 0]}
    group = xr.open_zarr(str(tmp_path / "p.zarr"), group=DS)
    ens = group["ensemble_prediction"]
    assert ens.dims == ("trajectory", "member", "step", "channel", "y", "x") and ens.sizes["member"] == 3
    assert group["member_checkpoint"].values.tolist() == ["a.pt", "b.pt", "a.pt"]
    valid = np.array(group.attrs["channel_valid"])
    x = ens.values  # (N, M, T, C, y, x)
    assert np.ptp(x[:, :, :, valid], axis=1).max() > 0  # the members differ
    members = np.moveaxis(x, 1, 0).transpose(0, 1, 4, 5, 2, 3)  # -> (M, N, y, x, T, C)
    true = group["truth"].values.transpose(0, 3, 4, 1, 2)
    crps, ratio, frame = _numpy_scores(members, true, group["mask"].values, valid)
    scores = result["datasets"][DS]
    np.testing.assert_allclose(scores["ensemble"]["channels"]["vorticity"]["crps_per_step"], crps[:, 0], rtol=1e-5)
    np.testing.assert_allclose(scores["ensemble"]["channels"]["vorticity"]["spread_skill_per_step"], ratio[:, 0],
                               rtol=1e-4)
    np.testing.assert_allclose(scores["ensemble_mean"]["frame_l2re_per_step"], frame, rtol=1e-5)
    assert scores["model"]["rollout_l2re"] == \
        evaluate_model(_Damped(), DataConfig(manifests=[str(fno_train_shards)]), rollout_steps=3)["datasets"][DS][
            "model"]["rollout_l2re"]  # the single rollout is unchanged beside the ensemble

    # seeded per trajectory and call: another batch size, and a long rollout read chunk by chunk, give the same
    one = _evaluate(fno_train_shards, tmp_path / "one.zarr", batch_size=1)
    monkeypatch.setattr(evaluate, "STREAM_STEPS", 1)
    monkeypatch.setattr(eval_stream, "CHUNK_STEPS", 2)
    monkeypatch.setattr("dpot_train.evaluation.ensemble.CHUNK_STEPS", 2)
    streamed = _evaluate(fno_train_shards, tmp_path / "s.zarr")
    for other, name in ((one, "one.zarr"), (streamed, "s.zarr")):
        np.testing.assert_array_equal(xr.open_zarr(str(tmp_path / name), group=DS)["ensemble_prediction"].values, x)
        for key in ("ensemble", "ensemble_mean"):
            got, want = _leaves(other["datasets"][DS][key]), _leaves(scores[key])
            assert len(got) == len(want) > 5
            np.testing.assert_allclose(got, want, rtol=1e-6)  # sums in another order; float32 FFTs of a batch


def _leaves(node: object) -> list[float]:
    if isinstance(node, dict):
        return [v for k in sorted(node) for v in _leaves(node[k])]
    if isinstance(node, list):
        return [v for item in node for v in _leaves(item)]
    return [float(node)] if isinstance(node, (int, float)) else []


def _checkpoint(path: Path, noise: float | None) -> Path:
    """One of our checkpoints of a tiny DPOT (4 channels, 32x32), its run config recording the training noise."""
    from dpot_train.model import build_model

    torch.manual_seed(0)
    data = {"normalize": "none", **({"noise": noise} if noise is not None else {})}
    torch.save(checkpoint_payload(build_model("tiny", img_size=32), step=1,
                                  train_config={"recipe": "dpot", "data": data}), path)
    return path


def test_cli_ensemble_writes_members_and_scores(fno_train_shards: Path, tmp_path: Path) -> None:
    import xarray as xr

    from dpot_train.cli import app

    ckpt = _checkpoint(tmp_path / "step-00000001.pt", noise=0.01)
    out, store = tmp_path / "eval.json", tmp_path / "p.zarr"
    r = CliRunner().invoke(app, ["evaluate", str(ckpt), "--manifest", str(fno_train_shards), "--out", str(out),
                                 "--rollout-steps", "2", "--device", "cpu", "--ensemble", "3",
                                 "--predictions", str(store)])
    assert r.exit_code == 0, r.output
    ev = json.loads(out.read_text())
    assert ev["schema"] == "dpot-eval/3"
    assert ev["ensemble"]["members"] == 3 and ev["ensemble"]["noise"] == 0.01  # the run's data.noise
    assert ev["ensemble"]["member_checkpoint"] == [0, 0, 0]
    group = xr.open_zarr(str(store), group=DS)
    assert group.sizes["member"] == 3 and group["ensemble_prediction"].dims[:3] == ("trajectory", "member", "step")
    valid = np.array(group.attrs["channel_valid"])
    members = np.moveaxis(group["ensemble_prediction"].values, 1, 0).transpose(0, 1, 4, 5, 2, 3)
    crps, ratio, _ = _numpy_scores(members, group["truth"].values.transpose(0, 3, 4, 1, 2), group["mask"].values,
                                   valid)
    ch = ev["datasets"][DS]["ensemble"]["channels"]["vorticity"]
    np.testing.assert_allclose(ch["crps_per_step"], crps[:, 0], rtol=1e-5)
    np.testing.assert_allclose(ch["spread_skill_per_step"], ratio[:, 0], rtol=1e-4)
    assert all(v > 0 for v in ch["crps_per_step"])
    assert len(ev["datasets"][DS]["ensemble_mean"]["l2re_per_step"]) == 2
    assert "Ensemble of 3 members (noise 0.01)" in r.output and "Stability" in r.output

    # another checkpoint of the same model: members roll the two out in turn, without noise one each
    other = _checkpoint(tmp_path / "other.pt", noise=0.0)
    r = CliRunner().invoke(app, ["evaluate", str(ckpt), "--manifest", str(fno_train_shards), "--out", str(out),
                                 "--rollout-steps", "2", "--device", "cpu", "--ensemble-checkpoints", str(other),
                                 "--ensemble-noise", "0"])
    assert r.exit_code == 0, r.output
    ev = json.loads(out.read_text())["ensemble"]
    assert (ev["members"], ev["member_checkpoint"], ev["checkpoints"]) == (2, [0, 1], [str(ckpt), str(other)])


@pytest.mark.parametrize(("args", "line"), [
    (["--ensemble", "1"], "error: --ensemble 1: expected a member count of at least 2"),
    (["--ensemble", "3", "--ensemble-noise", "0"],
     "error: --ensemble 3: without noise the members of one checkpoint are identical; give --ensemble-noise S > 0 "
     "(the weights' run trained with noise 0, or recorded none) or one checkpoint per member with "
     "--ensemble-checkpoints"),
    (["--ensemble-noise", "0.1"], "error: --ensemble-noise: give the member count with --ensemble N"),
    (["--ensemble", "2", "--recipe", "reference"],
     "error: --ensemble: the reference recipe scores no ensemble; add --recipe dpot"),
])
def test_cli_refuses_ensembles_that_cannot_be(fno_train_shards: Path, tmp_path: Path, args: list[str],
                                              line: str) -> None:
    from dpot_train.cli import app

    ckpt = _checkpoint(tmp_path / "c.pt", noise=None)
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["evaluate", str(ckpt), "--manifest", str(fno_train_shards), "--out", str(out),
                                 "--device", "cpu", *args])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [line], r.output
    assert not out.exists()
    r = CliRunner().invoke(app, ["evaluate", str(ckpt), "--manifest", str(fno_train_shards), "--out", str(out),
                                 "--device", "cpu", "--ensemble", "2"])
    assert r.exit_code == 2 and r.output.strip() == (
        f"error: --ensemble 2: {ckpt} records no training noise (data.noise); give --ensemble-noise S (5e-4 is the "
        "pre-training recipe's) or --ensemble-checkpoints")
