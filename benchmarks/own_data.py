"""A researcher's own data, end to end with no flags beyond the paths: a CF NetCDF file (`temperature` in K, about
293 +- 3 K, on a 48x64 grid in metres with a 6x6 NaN obstacle, dpot_data.synth.gridded.write_user_netcdf) ingested,
trained on and evaluated with pictures, as a new user would run it; and the same run with `--normalize none` beside it.

Run:  PYTHONPATH=$PWD .venv/bin/python benchmarks/own_data.py --out /tmp/own-data            # ~300 steps, minutes
      PYTHONPATH=$PWD .venv/bin/python benchmarks/own_data.py --out /tmp/own-data --smoke    # 4 steps, small file

What it checks and prints (the last line of output is one JSON object):
- the ingest keeps the native 48x64 grid and stores no fluid value outside the source's fluid range;
- the units reach the Zarr attributes (K, m, s), the dataset card (`temperature [K]`) and the evaluation's picture
  (its colour bars);
- `launch` says in its `normalise:` line that the data is normalised, and with which statistics;
- the model against persistence (rollout L2RE, VRMSE at step 1 and over the rollout) with and without normalisation;
- no scored truth value on a fluid cell outside the source's fluid range (the predictions store).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

BIN = Path(sys.executable).parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """A dpot command as a user types it; its output echoed; stops the benchmark when it fails."""
    print("$", " ".join(args), flush=True)
    r = subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True)
    sys.stdout.write(r.stdout[-3000:])
    sys.stderr.write(r.stderr[-3000:])
    if r.returncode != 0:
        raise SystemExit(f"{args[0]} {args[1]} failed with exit code {r.returncode}")
    return r


def source_fluid_range(path: Path) -> tuple[float, float]:
    """min and max of the file's temperature over its non-NaN cells, as xarray reads it."""
    import xarray as xr

    with xr.open_dataset(path, engine="h5netcdf") as ds:
        a = ds["temperature"].values
    return float(np.nanmin(a)), float(np.nanmax(a))


def stored_check(shards: Path, lo: float, hi: float) -> dict[str, Any]:
    """The stored grid, units and the stored fluid values against the source's fluid range [lo, hi]."""
    import zarr

    manifest = json.loads((shards / "manifest.json").read_text())
    entry = manifest["datasets"][0]
    group = zarr.open_group(str(shards / entry["zarr"]["path"] / entry["zarr"]["group"]), mode="r")
    fields, mask = group["fields"][:, :, 0], group["mask"][:].astype(bool)  # (N, T, *grid), (N, *grid)
    fluid = fields[np.broadcast_to(mask[:, None], fields.shape)]
    return {"grid": entry["grid"]["shape"], "convention": entry["convention"]["name"],
            "fluid_min": float(fluid.min()), "fluid_max": float(fluid.max()),
            "outside": int(((fluid < lo) | (fluid > hi)).sum()),
            "zarr_units": {"fields": dict(group["fields"].attrs).get("channel_units"),
                           **{k: dict(group[k].attrs).get("units") for k in ("time", "y", "x") if k in group}}}


def scores(eval_json: Path) -> dict[str, Any]:
    """Model and persistence: rollout L2RE, VRMSE of the data channel at step 1 and over the rollout."""
    result = json.loads(eval_json.read_text())
    (name, d), = result["datasets"].items()
    out = {}
    for who in ("model", "persistence"):
        ch = d[who]["channels"]["temperature"]
        vrmse = ch["vrmse_per_step"]
        out[who] = {"rollout_l2re": d[who]["rollout_l2re"], "vrmse_step1": vrmse[0],
                    "vrmse_mean": float(np.mean(vrmse)), "rmse_K": ch.get("rmse")}
    out["units"] = d.get("units")
    return out


def scored_truth_check(store: Path, lo: float, hi: float) -> dict[str, Any]:
    """The truth the evaluation scored, on fluid cells, against the source's fluid range; the fields picture's
    colour-bar labels (drawn from the same store)."""
    import xarray as xr

    from dpot_train.evaluation.plots import fields_figure

    group = xr.open_zarr(str(store), group="heat")
    truth = group["truth"].sel(channel="temperature").values  # (trajectory, step, *grid)
    mask = group["mask"].values.astype(bool)
    fluid = truth[np.broadcast_to(mask[:, None], truth.shape)]
    fig = fields_figure(group)
    labels = sorted({ax.get_ylabel() for ax in fig.axes if ax.get_ylabel() and not ax.images})
    return {"scored_fluid_min": float(fluid.min()), "scored_fluid_max": float(fluid.max()),
            "scored_outside": int(((fluid < lo) | (fluid > hi)).sum()), "colour_bars": labels}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="A new folder for every file of the benchmark.")
    ap.add_argument("--steps", type=int, default=300, help="Optimiser steps of each run.")
    ap.add_argument("--smoke", action="store_true", help="A small file and 4 steps: the path, not the figures.")
    args = ap.parse_args()
    from dpot_data.synth.gridded import write_user_netcdf

    steps = 4 if args.smoke else args.steps
    out = args.out
    raw = write_user_netcdf(out / "raw", **({"samples": 6, "frames": 14} if args.smoke else {}))
    lo, hi = source_fluid_range(raw)
    shards = out / "shards"
    ingest = run("dpot-data", "ingest", "xarray", str(raw), "--out", str(shards))
    stored = stored_check(shards, lo, hi)
    run("dpot-data", "card", str(shards))
    card = (shards / "README.md").read_text()
    runs: dict[str, Any] = {}
    for label, extra in (("default", ()), ("normalize none", ("--normalize", "none"))):
        folder = out / ("run" if not extra else "run-raw")
        launched = run("dpot-train", "launch", "--manifest", str(shards), "--out", str(folder), "--steps", str(steps),
                       *extra)
        said = [line for line in (launched.stdout + launched.stderr).splitlines() if line.startswith("normalise")]
        ckpt = folder / "checkpoints" / f"step-{steps:08d}.pt"
        evaluation = out / ("eval" if not extra else "eval-raw")
        run("dpot-train", "evaluate", str(ckpt), "--manifest", str(shards), "--plot", str(evaluation / "plots"),
            "--predictions", str(evaluation / "predictions.zarr"), "--out", str(evaluation / "eval.json"))
        runs[label] = {"normalise_line": said, **scores(evaluation / "eval.json")}
        if not extra:
            runs[label].update(scored_truth_check(evaluation / "predictions.zarr", lo, hi))
    result = {"benchmark": "own_data", "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(out), "steps": steps, "source_fluid_range_K": [lo, hi], "stored": stored,
              "card_says_temperature_K": "temperature \\[K\\]" in card,  # as Markdown writes [K]
              "ingest_warnings": [line for line in ingest.stderr.splitlines() if line.startswith("warning")],
              "runs": runs}
    print("\n" + "=" * 100)
    print(f"source fluid range {lo:.3f} .. {hi:.3f} K; stored grid {stored['grid']}, stored fluid "
          f"{stored['fluid_min']:.3f} .. {stored['fluid_max']:.3f} K ({stored['outside']} outside); zarr units "
          f"{stored['zarr_units']}; card names 'temperature [K]': {result['card_says_temperature_K']}")
    for label, r in runs.items():
        m, p = r["model"], r["persistence"]
        print(f"{label:15s} model rollout L2RE {m['rollout_l2re']:.5f} VRMSE step 1 {m['vrmse_step1']:.4f} "
              f"mean {m['vrmse_mean']:.4f} | persistence {p['rollout_l2re']:.5f} {p['vrmse_step1']:.4f} "
              f"{p['vrmse_mean']:.4f} | {' '.join(r['normalise_line'])}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
