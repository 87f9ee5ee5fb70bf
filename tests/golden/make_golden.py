"""Regenerate the in-repository golden checkpoint `dpot_small.pth` and its inputs/outputs `dpot_small_io.npz`.

    .venv/bin/python tests/golden/make_golden.py

The checkpoint is in the released DPOT format (a dict with one key, 'model', holding the state dict) for a small
configuration (32x32 grid), with seeded weights plus a seeded offset on every tensor so that no weight sits at a
trivial value. Its outputs are computed by our model, which is first checked against the reference implementation's
golden outputs for `dpot_tiny.pth` in ../shared/reference (when present; the script refuses to write otherwise).
These files let the checkpoint-format tests run on a clone without ../shared.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from dpot_train.core.checkpoint import load_pretrained  # noqa: E402
from dpot_train.model import build_model  # noqa: E402

CONFIG = dict(img_size=32, patch_size=8, in_channels=4, out_channels=4, in_timesteps=10, out_timesteps=1, n_blocks=4,
              embed_dim=32, out_layer_dim=16, depth=2, modes=32, mlp_ratio=1.0, n_cls=12, act="gelu")


def check_against_reference(reference: Path) -> float:
    """Max abs difference of our model's outputs from the reference's for the released-format tiny checkpoint."""
    with np.load(reference / "dpot_tiny_io.npz", allow_pickle=False) as io:
        model = load_pretrained(reference / "dpot_tiny.pth").eval()
        with torch.no_grad():
            pred, cls = model(torch.from_numpy(io["x"]), return_logits=True)
        return max(float(np.abs(pred.numpy() - io["pred"]).max()), float(np.abs(cls.numpy() - io["cls"]).max()))


def main() -> int:
    reference = ROOT.parent / "shared" / "reference"
    if not (reference / "dpot_tiny.pth").exists():
        print(f"{reference}: the reference golden files are needed to anchor the regenerated outputs", file=sys.stderr)
        return 1
    diff = check_against_reference(reference)
    if diff > 1e-6:
        print(f"our model differs from the reference by {diff:.3e} (> 1e-6): not writing", file=sys.stderr)
        return 1
    torch.manual_seed(1234)
    model = build_model("tiny", **{k: v for k, v in CONFIG.items()}).eval()
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.1 if ".filter." in name else 0.01
            p.add_(scale * torch.randn(p.shape, generator=g))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    torch.save({"model": state}, HERE / "dpot_small.pth")
    x = torch.randn(2, 32, 32, 10, 4, generator=g)
    with torch.no_grad():
        pred, cls = model(x, return_logits=True)
    np.savez(HERE / "dpot_small_io.npz", x=x.numpy(), pred=pred.numpy(), cls=cls.numpy())
    print(f"wrote {HERE / 'dpot_small.pth'} ({sum(v.numel() for v in state.values())} values) and dpot_small_io.npz; "
          f"reference check {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
