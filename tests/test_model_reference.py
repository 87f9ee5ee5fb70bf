"""The DPOT model reproduces the reference implementation's outputs from the released checkpoint format."""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.core.checkpoint import CheckpointError, checkpoint_payload, load_pretrained
from dpot_train.model import DPOT2D, build_model

TOL = 1e-6  # tighter than the 1e-5 acceptance bound: catches tanh-approximated GELU (about 6e-6 here)
GOLDEN = Path(__file__).resolve().parent / "golden"  # in-repo released-format checkpoint (tests/golden/make_golden.py)


@pytest.fixture(scope="module")
def golden_io() -> dict[str, np.ndarray]:
    """Inputs and outputs of tests/golden/dpot_small.pth, anchored to the reference when they were made."""
    with np.load(GOLDEN / "dpot_small_io.npz", allow_pickle=False) as data:
        return {k: data[k] for k in ("x", "pred", "cls")}


@pytest.fixture(scope="module")
def reference_io(reference_dir: Path) -> dict[str, np.ndarray]:
    with np.load(reference_dir / "dpot_tiny_io.npz", allow_pickle=False) as data:
        return {k: data[k] for k in ("x", "pred", "cls")}


def _outputs(model: torch.nn.Module, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    model.eval()
    with torch.no_grad():
        pred, logits = model(torch.from_numpy(x), return_logits=True)
    return pred.numpy(), logits.numpy()


def _max_diffs(model: torch.nn.Module, io: dict[str, np.ndarray]) -> tuple[float, float]:
    pred, logits = _outputs(model, io["x"])
    side = io["x"].shape[1]
    assert pred.shape == io["pred"].shape == (2, side, side, 1, 4)
    assert logits.shape == io["cls"].shape == (2, 12)
    return float(np.abs(pred - io["pred"]).max()), float(np.abs(logits - io["cls"]).max())


def test_released_checkpoint_reproduces_reference(reference_dir: Path, reference_io: dict[str, np.ndarray]) -> None:
    model = load_pretrained(reference_dir / "dpot_tiny.pth")
    assert isinstance(model, DPOT2D)
    assert model.config == build_model("tiny").config  # inferred from the weights, no size argument
    assert model.num_parameters() == 242675
    d_pred, d_cls = _max_diffs(model, reference_io)
    assert d_pred <= TOL, d_pred
    assert d_cls <= TOL, d_cls


def test_in_repo_golden_checkpoint_reproduces_its_outputs(golden_io: dict[str, np.ndarray]) -> None:
    model = load_pretrained(GOLDEN / "dpot_small.pth")
    assert isinstance(model, DPOT2D)
    assert (model.config.img_size, model.config.embed_dim, model.config.depth, model.config.out_layer_dim) == \
        (32, 32, 2, 16)  # inferred from the weights alone (released format: no config stored)
    d_pred, d_cls = _max_diffs(model, golden_io)
    assert d_pred <= TOL and d_cls <= TOL, (d_pred, d_cls)


def test_module_prefixed_checkpoint_reproduces_outputs(golden_io: dict[str, np.ndarray], tmp_path: Path) -> None:
    state = torch.load(GOLDEN / "dpot_small.pth", map_location="cpu", weights_only=True)["model"]
    prefixed = collections.OrderedDict((f"module.{k}", v) for k, v in state.items())
    args = argparse.Namespace(modes=32, act="gelu", lr=1e-3, model="DPOT")
    path = tmp_path / "ddp.pth"
    torch.save({"args": args, "model": prefixed}, path)
    d_pred, d_cls = _max_diffs(load_pretrained(path), golden_io)
    assert d_pred <= TOL and d_cls <= TOL, (d_pred, d_cls)


def test_classify_and_plain_call_match_tuple_call(golden_io: dict[str, np.ndarray]) -> None:
    model = load_pretrained(GOLDEN / "dpot_small.pth").eval()
    x = torch.from_numpy(golden_io["x"][:1])
    with torch.no_grad():
        pred, logits = model(x, return_logits=True)
        assert torch.equal(model(x), pred)
        assert torch.equal(model.classify(x), logits)


def test_own_checkpoint_roundtrip(tmp_path: Path) -> None:
    model = load_pretrained(GOLDEN / "dpot_small.pth")
    path = tmp_path / "own.pt"
    torch.save(checkpoint_payload(model, step=3), path)
    again = load_pretrained(path)
    assert again.config == model.config
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)


class ArbitraryObject:
    """A class that weights-only unpickling must not instantiate."""

    def __init__(self) -> None:
        self.payload = "x"


def test_unsafe_pickle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pth"
    torch.save({"model": build_model("tiny").state_dict(), "extra": ArbitraryObject()}, path)
    with pytest.raises(CheckpointError, match=r"refused to load.*ArbitraryObject.*trusted=True"):
        load_pretrained(path)
    # An explicit trust flag loads it.
    assert isinstance(load_pretrained(path, trusted=True), DPOT2D)


def test_missing_and_unexpected_keys_are_listed(tmp_path: Path) -> None:
    state = torch.load(GOLDEN / "dpot_small.pth", map_location="cpu", weights_only=True)["model"]
    state = dict(state)
    del state["blocks.1.filter.b2"]
    state["blocks.1.filter.extra"] = torch.zeros(3)
    path = tmp_path / "broken.pth"
    torch.save({"model": state}, path)
    with pytest.raises(CheckpointError) as info:
        load_pretrained(path)
    message = str(info.value)
    assert "missing keys ['blocks.1.filter.b2']" in message
    assert "unexpected keys ['blocks.1.filter.extra']" in message
    assert str(path) in message


def test_wrong_layout_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.pth"
    torch.save({"weights": [torch.zeros(2)]}, path)
    with pytest.raises(CheckpointError, match=r"expected a dict with a 'model' entry.*\['weights'\]"):
        load_pretrained(path)
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match=r"garbage.pth: not a checkpoint: text, expected a file written by "
                                              r"torch.save"):
        load_pretrained(garbage)
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        load_pretrained(tmp_path / "absent.pth")


def test_bf16_weights_load_as_float32_trainable_parameters(golden_io: dict[str, np.ndarray], tmp_path: Path) -> None:
    state = torch.load(GOLDEN / "dpot_small.pth", map_location="cpu", weights_only=True)["model"]
    path = tmp_path / "bf16.pth"
    torch.save({"model": {k: v.to(torch.bfloat16) for k, v in state.items()}}, path)
    model = load_pretrained(path)
    params = list(model.named_parameters())
    assert len(params) == len(state)
    assert all(p.dtype == torch.float32 and p.requires_grad and p.device.type == "cpu" for _, p in params)
    d_pred, _ = _max_diffs(model, golden_io)
    assert 1e-6 < d_pred < 5e-2  # rounded weights: close to, but not equal to, the reference


def test_payload_of_wrapped_model_has_plain_keys() -> None:
    model = build_model("tiny")
    payload = checkpoint_payload(torch.compile(model), epoch=1)
    assert list(payload["model"]) == list(model.state_dict())
    assert payload["config"] == model.config.to_dict() and payload["epoch"] == 1
    with pytest.raises(ValueError, match="reserved"):
        checkpoint_payload(model, config={})
