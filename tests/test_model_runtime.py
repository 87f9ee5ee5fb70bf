"""DPOT runs under bf16 autocast and torch.compile, and its Fourier mixer keeps float32 and the mode truncation."""

from __future__ import annotations

import torch

from dpot_train.model import build_model
from dpot_train.model.layers import AFNOMixer
from tests.test_model_3d import spectral_support


def _small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("tiny", img_size=32, in_timesteps=4).eval()


def test_bf16_autocast_is_close_to_fp32() -> None:
    model = _small_model()
    x = torch.randn(2, 32, 32, 4, 4)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(x)
    assert torch.isfinite(low).all()
    rel = (low.float() - ref).norm() / ref.norm()
    assert rel < 5e-2, float(rel)


def test_mixer_spectrum_runs_in_float32_under_autocast() -> None:
    mixer = AFNOMixer(2, 64, 4, (32, 32), "gelu")
    x = torch.randn(1, 64, 8, 8)
    with torch.no_grad():
        ref = mixer(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = mixer(x)
    assert out.dtype == torch.float32
    assert torch.allclose(out, ref, atol=1e-6)


def test_2d_mixer_truncates_modes_like_reference() -> None:
    # Reference keeps spectrum[:modes, :modes] of rfft2 (low positive frequencies on the first axis) and zeros the rest.
    mixer = AFNOMixer(2, 64, 4, (3, 3), "gelu")
    x = torch.randn(2, 64, 8, 8)
    with torch.no_grad():
        spec = torch.fft.rfft2(mixer(x) - x, norm="ortho").abs()
    assert spec[:, :, :3, :3].min() > 0
    support = spectral_support((3, 3), (8, 5))
    assert spec[:, :, ~support].max() < 1e-5
    assert spec[:, :, 3:, 1:].max() < 1e-5


def test_torch_compile_matches_eager() -> None:
    model = _small_model()
    x = torch.randn(1, 32, 32, 4, 4)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert torch.allclose(compiled(x), model(x), atol=1e-5)


def test_backward_reaches_every_parameter() -> None:
    model = build_model("tiny", img_size=32, in_timesteps=4)
    pred, logits = model(torch.randn(2, 32, 32, 4, 4), return_logits=True)
    (pred.square().mean() + logits.square().mean()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert missing == []
