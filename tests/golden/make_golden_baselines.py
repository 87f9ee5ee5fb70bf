"""Regenerate the in-repository golden checkpoints of the FNO and UNet baselines and their inputs/outputs:
`fno_small.pth`/`fno_small_io.npz`, `unet_small.pth`/`unet_small_io.npz` and `fno3d_small.pth`/`fno3d_small_io.npz`.

    .venv/bin/python tests/golden/make_golden_baselines.py

Each checkpoint is in the reference's saved layout ({'args': Namespace(res=..., ...), 'model': state_dict}) for a
small configuration, with seeded weights plus a seeded offset on every tensor (and on UNet's BatchNorm running
statistics) so that nothing sits at a trivial value. The FNO uses the GroupNorm (`use_ln`) and instance
normalisation (`normalize`) options; the UNet a 20x20 grid, so its padding to a multiple of 16 and the crop back are
exercised. Their outputs are computed by our networks, which are first checked against the reference
implementation's golden outputs in ../shared/reference/baselines (when present; the script refuses to write
otherwise; the reference saved no FNO3d, so the 3D file only guards against regressions). These files let the
baseline tests run on a clone without ../shared.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from dpot_train.core.checkpoint import load_pretrained  # noqa: E402
from dpot_train.model import FNO2D, FNO3D, FNOConfig, UNet, UNetConfig  # noqa: E402

FNO = FNOConfig(modes1=4, modes2=3, width=8, img_size=16, n_channels=4, in_timesteps=10, out_timesteps=1, n_layers=2,
                use_ln=True, normalize=True, n_cls=12)
FNO3 = FNOConfig(modes1=3, modes2=3, modes3=2, width=8, img_size=8, n_channels=4, in_timesteps=10, out_timesteps=1,
                 n_layers=2, use_ln=True, n_cls=12, n_dim=3)
UNET = UNetConfig(n_dim=2, in_channels=4, out_channels=4, in_timesteps=10, out_timesteps=1, in_shape=(20, 20),
                  out_shape=(20, 20), width=2, act="gelu", n_cls=12)


def check_against_reference(reference: Path) -> float:
    """Max abs difference of our networks' outputs from the reference's for its saved FNO2d and UNet."""
    worst = 0.0
    for name in ("fno2d", "unet2d"):
        with np.load(reference / f"{name}_io.npz", allow_pickle=False) as io:
            model = load_pretrained(reference / f"{name}.pth")
            with torch.no_grad():
                pred, cls = model(torch.from_numpy(io["x"]), return_logits=True)
            worst = max(worst, float(np.abs(pred.numpy() - io["pred"]).max()),
                        float(np.abs(cls.numpy() - io["cls"]).max()))
    return worst


def write(name: str, model: torch.nn.Module, args: argparse.Namespace, grid: tuple[int, ...],
          g: torch.Generator) -> None:
    """Offset every tensor, save the checkpoint and the outputs of the network in eval mode."""
    with torch.no_grad():
        for key, t in model.state_dict().items():
            if t.is_floating_point():
                scale = 0.05 if "spectral" in key else 0.1 if "running_var" in key else 0.01
                t.add_(scale * (torch.rand(t.shape, generator=g) if "running_var" in key else
                                torch.randn(t.shape, generator=g, dtype=t.dtype)))
    model.eval()
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    torch.save({"args": args, "model": state}, HERE / f"{name}_small.pth")
    x = torch.randn(*grid, 10, 4, generator=g)
    with torch.no_grad():
        pred, cls = model(x, return_logits=True)
    np.savez(HERE / f"{name}_small_io.npz", x=x.numpy(), pred=pred.numpy(), cls=cls.numpy())
    print(f"wrote {HERE / f'{name}_small.pth'} ({sum(v.numel() for v in state.values())} values) and "
          f"{name}_small_io.npz")


def main() -> int:
    reference = ROOT.parent / "shared" / "reference" / "baselines"
    if not (reference / "fno2d.pth").exists():
        print(f"{reference}: the reference golden files are needed to anchor the regenerated outputs", file=sys.stderr)
        return 1
    diff = check_against_reference(reference)
    if diff > 1e-6:
        print(f"our baselines differ from the reference by {diff:.3e} (> 1e-6): not writing", file=sys.stderr)
        return 1
    g = torch.Generator().manual_seed(77)
    torch.manual_seed(4321)
    write("fno", FNO2D(FNO), argparse.Namespace(model="FNO", res=16, T_in=10), (2, 16, 16), g)
    torch.manual_seed(4322)
    write("unet", UNet(UNET), argparse.Namespace(model="UNet", res=20, act="gelu", T_in=10), (2, 20, 20), g)
    torch.manual_seed(4323)
    write("fno3d", FNO3D(FNO3), argparse.Namespace(model="FNO3d", res=8, T_in=10), (1, 8, 8, 8), g)
    print(f"reference check {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
