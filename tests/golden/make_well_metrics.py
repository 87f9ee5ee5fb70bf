"""Writes tests/golden/well_metrics.npz: the inputs of tests/well_cases.py and The Well's own metric values on them.

Run it in a scratch environment, never the project's (the_well pins fsspec):
    python3 -m venv /tmp/wellref && /tmp/wellref/bin/pip install torch==2.13.0 the_well==1.2.0
    /tmp/wellref/bin/python tests/golden/make_well_metrics.py
For each case and sample: NRMSE and VRMSE per frame and channel (B, T, C), computed by the_well's NRMSE / VRMSE on the
fluid cells (flattened to one spatial axis where there is a mask, the grid itself where there is none), and
binned_spectral_mse's three mse bins (B, T, 3, C) of the residual zeroed on solid cells, on the grid.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from the_well.benchmark.metrics import NRMSE, VRMSE, binned_spectral_mse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from well_cases import cases  # noqa: E402


def _well(x: np.ndarray) -> torch.Tensor:
    """(*S, T, C) -> The Well's (T, *S, C)."""
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -2, 0)))


def main() -> None:
    store: dict[str, np.ndarray] = {}
    for name, case in cases().items():
        pred, true = case["pred"], case["true"]
        nd = pred.ndim - 3
        mask = case.get("mask")
        nrmse, vrmse, spec = [], [], []
        for b in range(pred.shape[0]):
            if mask is None:
                p, t, meta = _well(pred[b]), _well(true[b]), SimpleNamespace(n_spatial_dims=nd)
            else:  # the fluid cells as one spatial axis
                p, t, meta = _well(pred[b][mask[b]]), _well(true[b][mask[b]]), SimpleNamespace(n_spatial_dims=1)
            nrmse.append(NRMSE.eval(p, t, meta).numpy())
            vrmse.append(VRMSE.eval(p, t, meta).numpy())
            m = np.ones(pred.shape[1:1 + nd], dtype=bool) if mask is None else mask[b]
            w = m.astype(np.float32)[..., None, None]
            bins = binned_spectral_mse.eval(_well(pred[b] * w), _well(true[b] * w), SimpleNamespace(n_spatial_dims=nd))
            spec.append(np.stack([bins[f"spectral_error_mse_per_bin_{i}"].numpy() for i in range(3)], axis=1))
        for key, value in case.items():
            store[f"{name}/{key}"] = value
        store[f"{name}/well_nrmse"] = np.stack(nrmse)
        store[f"{name}/well_vrmse"] = np.stack(vrmse)
        store[f"{name}/well_spectral_mse"] = np.stack(spec)
    out = Path(__file__).with_name("well_metrics.npz")
    np.savez_compressed(out, **store)
    print(f"wrote {out}: {sorted(store)}")


if __name__ == "__main__":
    main()
