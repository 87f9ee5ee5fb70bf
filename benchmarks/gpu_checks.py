"""Numerical checks of the DPOT model on a CUDA device: the released-format golden in strict fp32, bf16 autocast
against fp32, and torch.compile against eager.

Run:  python benchmarks/gpu_checks.py --reference ../shared/reference        # needs CUDA
      python benchmarks/gpu_checks.py --device cpu                          # the same checks on CPU (compile too)

Golden: `dpot_tiny.pth` and `dpot_tiny_io.npz` of the reference implementation (float32 on CPU). On CUDA, TF32 is
turned off so fp32 means fp32; the tolerance is 1e-5 (max abs). bf16 and compile are compared with the fp32 eager
output by relative L2 over the whole prediction, also for each preset (Ti, S, M, L) with seeded random weights.
Prints a table and, as the last line, one JSON object; exits 1 if a check fails its stated tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_device, device_name  # noqa: E402

from dpot_train.core.checkpoint import load_pretrained  # noqa: E402
from dpot_train.model import build_model  # noqa: E402

GOLDEN_TOL = 1e-5  # max abs difference from the reference outputs (fp32)
BF16_TOL = 2e-2  # relative L2 of bf16 autocast against fp32 (bf16 has an 8-bit mantissa: ~4e-3 per rounding)
COMPILE_TOL = 1e-4  # relative L2 of torch.compile against eager in fp32 (fused kernels reorder sums); bf16: BF16_TOL


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))


def run(model: torch.nn.Module, x: torch.Tensor, bf16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(pred, logits) in float32 on the host."""
    with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
        pred, logits = model(x, return_logits=True)
    return pred.float().cpu(), logits.float().cpu()


def check_golden(reference: Path, device: torch.device, compile_model: bool) -> dict[str, Any]:
    """The released-format tiny checkpoint against the reference's outputs; bf16 and compile against fp32 eager."""
    with np.load(reference / "dpot_tiny_io.npz", allow_pickle=False) as data:
        x_np, pred_ref, cls_ref = data["x"], data["pred"], data["cls"]
    model = load_pretrained(reference / "dpot_tiny.pth").to(device).eval()
    x = torch.from_numpy(x_np).to(device)
    pred, logits = run(model, x, bf16=False)
    out: dict[str, Any] = {
        "golden_pred_max_abs": float(np.abs(pred.numpy() - pred_ref).max()),
        "golden_cls_max_abs": float(np.abs(logits.numpy() - cls_ref).max()),
    }
    pred_bf16, _ = run(model, x, bf16=True)
    out["bf16_vs_fp32_rel_l2"] = rel_l2(pred_bf16, pred)
    out["bf16_vs_reference_max_abs"] = float(np.abs(pred_bf16.numpy() - pred_ref).max())
    if compile_model:
        compiled = torch.compile(model)
        out["compile_fp32_vs_eager_rel_l2"] = rel_l2(run(compiled, x, bf16=False)[0], pred)
        out["compile_fp32_vs_reference_max_abs"] = float(np.abs(run(compiled, x, bf16=False)[0].numpy() - pred_ref).max())
        out["compile_bf16_vs_eager_bf16_rel_l2"] = rel_l2(run(compiled, x, bf16=True)[0], pred_bf16)
    return out


def check_preset(name: str, device: torch.device, compile_model: bool) -> dict[str, Any]:
    """bf16 and compile against fp32 eager for one preset with seeded weights and a seeded smooth-ish input."""
    torch.manual_seed(0)
    model = build_model(name).to(device).eval()
    cfg = model.config
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, cfg.img_size, cfg.img_size, cfg.in_timesteps, cfg.in_channels, generator=g).to(device)
    pred, _ = run(model, x, bf16=False)
    row: dict[str, Any] = {"preset": name, "bf16_vs_fp32_rel_l2": rel_l2(run(model, x, bf16=True)[0], pred)}
    if compile_model:
        compiled = torch.compile(model)
        row["compile_fp32_vs_eager_rel_l2"] = rel_l2(run(compiled, x, bf16=False)[0], pred)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def failures(golden: dict[str, Any], presets: list[dict[str, Any]]) -> list[str]:
    """Each check outside its stated tolerance, by name."""
    bad = [k for k in ("golden_pred_max_abs", "golden_cls_max_abs") if golden.get(k, 0.0) > GOLDEN_TOL]
    rows = [golden, *presets]
    for row in rows:
        where = row.get("preset", "tiny golden")
        if row.get("bf16_vs_fp32_rel_l2", 0.0) > BF16_TOL:
            bad.append(f"{where}: bf16_vs_fp32_rel_l2")
        if row.get("compile_fp32_vs_eager_rel_l2", 0.0) > COMPILE_TOL:
            bad.append(f"{where}: compile_fp32_vs_eager_rel_l2")
        if row.get("compile_bf16_vs_eager_bf16_rel_l2", 0.0) > BF16_TOL:  # two bf16 roundings of fused vs unfused ops
            bad.append(f"{where}: compile_bf16_vs_eager_bf16_rel_l2")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared/reference",
                    help="folder with dpot_tiny.pth and dpot_tiny_io.npz")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--presets", default="Ti,S,M,L", help="comma list for the bf16/compile checks ('' for none)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile checks")
    args = ap.parse_args(argv)
    device = bench_device(args.device, None)
    compile_model = not args.no_compile
    golden = check_golden(args.reference, device, compile_model)
    presets = [check_preset(p.strip(), device, compile_model) for p in args.presets.split(",") if p.strip()]
    bad = failures(golden, presets)
    print(f"# DPOT numerical checks on {device} ({device_name(device)}), torch {torch.__version__}, TF32 off")
    for key, value in golden.items():
        print(f"tiny golden  {key:<36} {value:.3e}")
    for row in presets:
        for key, value in row.items():
            if key != "preset":
                print(f"{row['preset']:<12} {key:<36} {value:.3e}")
    print(f"# tolerances: golden max abs {GOLDEN_TOL}, bf16 rel L2 {BF16_TOL}, compile rel L2 {COMPILE_TOL}; "
          f"{'all met' if not bad else 'FAILED: ' + ', '.join(bad)}")
    print(json.dumps({"benchmark": "gpu_checks", "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      "device": str(device), "device_name": device_name(device), "torch": torch.__version__,
                      "tolerances": {"golden_max_abs": GOLDEN_TOL, "bf16_rel_l2": BF16_TOL,
                                     "compile_rel_l2": COMPILE_TOL},
                      "golden": golden, "presets": presets, "failures": bad}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
