"""Long rollouts scored chunk by chunk (eval_stream) give the numbers and predictions of the whole-block path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.evaluation import stream as eval_stream, evaluate
from dpot_train.core.config import DataConfig
from dpot_train.evaluation.predictions import PredictionWriter
from dpot_train.evaluation.stream import RolloutStream
from dpot_train.evaluation.evaluate import evaluate_model
from dpot_train.core.metrics import rollout

DS = "fno-ns-v1e-3"


class _Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.9 * x[..., -1:, :] + 0.1 * x[..., :1, :]


class _TwoFrames(torch.nn.Module):
    """Predicts two frames per call: the streamed rollout must carry the surplus frame into the next chunk."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([0.8 * x[..., -1:, :], 0.7 * x[..., -2:-1, :] + 0.1], dim=-2)


@pytest.mark.parametrize("model", [_Scaled(), _TwoFrames()])
def test_rollout_stream_equals_rollout(model: torch.nn.Module) -> None:
    frames = torch.randn(2, 6, 5, 4, 3)
    keep = torch.rand(2, 6, 5, 1, 3) > 0.3
    whole = rollout(model, frames, 4, 7, keep)
    stream = RolloutStream(model, frames[..., :4, :], 4, keep)
    parts = torch.cat([stream.take(n) for n in (2, 3, 1, 1)], dim=-2)
    assert torch.equal(parts, whole)


def _close(a: object, b: object) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for k in a:
            _close(a[k], b[k])
    elif isinstance(a, list) and a and isinstance(a[0], float):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-6)
    else:
        assert a == b


def test_streamed_evaluation_equals_whole(fno_train_shards: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    data = DataConfig(manifests=[str(fno_train_shards)])
    whole_sink = PredictionWriter(tmp_path / "whole.zarr")
    whole = evaluate_model(_Scaled(), data, rollout_steps=3, batch_size=1, sink=whole_sink)
    monkeypatch.setattr(evaluate, "STREAM_STEPS", 1)
    monkeypatch.setattr(eval_stream, "CHUNK_STEPS", 2)
    calls: list[int] = []
    real = eval_stream.RolloutStream.take
    monkeypatch.setattr(eval_stream.RolloutStream, "take", lambda self, n: calls.append(n) or real(self, n))
    stream_sink = PredictionWriter(tmp_path / "stream.zarr")
    streamed = evaluate_model(_Scaled(), data, rollout_steps=3, batch_size=1, sink=stream_sink)
    assert calls and set(calls) == {2, 1}  # the streamed path ran, in chunks of 2 and 1 steps
    _close(whole["datasets"], streamed["datasets"])

    import xarray as xr

    a = xr.open_zarr(str(whole_sink.close()), group=DS)
    b = xr.open_zarr(str(stream_sink.close()), group=DS)
    for var in ("prediction", "truth", "mask"):
        np.testing.assert_array_equal(a[var].values, b[var].values)
