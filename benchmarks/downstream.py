"""From scratch vs fine-tuned, the paper's downstream comparison in one command: the same model trained for the same
steps on one dataset, once from a fresh initialisation and once from a checkpoint, and both L2RE side by side.

Run:  PYTHONPATH=$PWD .venv/bin/python benchmarks/downstream.py                  # toy scale on CPU, a few minutes
      PYTHONPATH=$PWD .venv/bin/python benchmarks/downstream.py --dims 3         # 2D checkpoint -> 3D data
      PYTHONPATH=$PWD .venv/bin/python benchmarks/downstream.py --manifest SHARDS --init model_Ti.pth \\
          --steps 20000 --batch-size 32 --res 128 --device cuda                   # a real dataset and checkpoint

Without --manifest/--init it builds a toy case with dpot-data's synthetic writers: a tiny model pre-trained on FNO
Navier-Stokes (32x32, --pretrain-steps steps) is the checkpoint, and PDEBench compressible NS (2D at 32x32, or 3D at
12^3 resized to 16^3 with --dims 3) is the downstream dataset. Both runs are `dpot-train launch` runs with the same
data, steps, batch, seed, schedule and recipe (the reference's for released weights, ours otherwise); the fine-tuned
one adds `--init CKPT --load COMPONENTS` (default all in 2D, blocks,time_agg in 3D, as the reference). The scores are
each run's end-of-run evaluation (eval.json) on the test split. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402

# architecture fields the scratch run copies from the checkpoint (the data fixes grid, channels, frames, dimension)
ARCHITECTURE = ("patch_size", "embed_dim", "depth", "n_blocks", "mlp_ratio", "out_layer_dim", "modes", "modes_z",
                "n_cls", "normalize", "act", "time_agg", "norm_groups")


def run(args: list[str]) -> str:
    """Run a dpot-data / dpot-train command with this checkout on the path; its output, or exit naming it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args[:2])} failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout + r.stderr


def toy_data(work: Path, dims: int) -> tuple[Path, Path]:
    """(pre-training shards: FNO NS 32x32, downstream shards: PDEBench CFD 2D 32x32 or 3D 12^3 native)."""
    run(["dpot_data", "synth", "fno", "--out", str(work / "raw-pre"), "--n", "24", "--frames", "13",
         "--resolution", "32"])
    pre = sorted((work / "raw-pre").glob("NavierStokes_*.mat"))[0]
    run(["dpot_data", "ingest", "fno", str(pre), "--out", str(work / "pre"), "--resolution", "32",
         "--no-progress"])
    kind = "pdebench-cfd3d" if dims == 3 else "pdebench-cfd"
    run(["dpot_data", "synth", kind, "--out", str(work / "raw-down"), "--n", "16", "--frames", "13",
         "--res", "12" if dims == 3 else "32"])
    files = [str(p) for p in sorted((work / "raw-down").glob("*.hdf5"))]
    run(["dpot_data", "ingest", "pdebench", *files, "--out", str(work / "down"), "--resolution",
         "0" if dims == 3 else "32", "--split", "0.75,0", "--no-progress"])
    return work / "pre", work / "down"


def pretrain(work: Path, shards: Path, steps: int, batch: int, device: str) -> Path:
    """A tiny model trained on the pre-training shards; its final checkpoint."""
    out = work / "pretrain"
    run(["dpot_train", "launch", "--manifest", str(shards), "--model", "tiny", "--steps", str(steps),
         "--batch-size", str(batch), "--out", str(out), "--no-eval", "--no-progress", "--device", device,
         "--ckpt-every", str(steps)])
    return out / "checkpoints" / f"step-{steps:08d}.pt"


def scratch_config(ckpt: Path, path: Path, t_in: int) -> Path:
    """A run config whose model has the checkpoint's architecture (fresh weights)."""
    from dpot_train.core.model_setup import checkpoint_config

    _, config = checkpoint_config(str(ckpt))
    arch = {k: v for k, v in config.to_dict().items() if k in ARCHITECTURE}
    path.write_text(yaml.safe_dump({"model": "tiny", "model_overrides": arch, "data": {"t_in": t_in}}),
                    encoding="utf-8")
    return path


def train_and_score(name: str, args: list[str], work: Path) -> dict[str, Any]:
    """One `dpot-train launch` run to its end-of-run evaluation; eval.json's first dataset."""
    out = work / name
    log = run(["dpot_train", "launch", *args, "--out", str(out), "--no-progress"])
    init = [ln for ln in log.splitlines() if ln.startswith("--init ")]
    result = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    (dataset, scores), = list(result["datasets"].items())[:1]
    return {"dataset": dataset, "recipe": result["recipe"], "scores": scores, "init": init[0] if init else None}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--manifest", help="Downstream shards (one dataset); default: the toy case.")
    p.add_argument("--init", help="Checkpoint to fine-tune (released or ours); default: the toy pre-training.")
    p.add_argument("--load", help="Components to load (default: all in 2D, blocks,time_agg for 2D -> 3D).")
    p.add_argument("--dims", type=int, choices=(2, 3), default=2, help="Toy case: 2D or 3D downstream data.")
    p.add_argument("--steps", type=int, default=150, help="Steps of each of the two runs.")
    p.add_argument("--pretrain-steps", type=int, default=300, help="Toy case: steps of the pre-training.")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--t-in", type=int, default=10)
    p.add_argument("--res", type=int, default=0, help="Resize windows to this grid (0: the stored grid).")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--work", help="Folder for data and runs (default: a temporary one).")
    a = p.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="dpot-downstream-"))
    work.mkdir(parents=True, exist_ok=True)
    manifest, ckpt = (Path(a.manifest) if a.manifest else None), (Path(a.init) if a.init else None)
    res = a.res or (16 if a.dims == 3 and not a.manifest else 0)
    if manifest is None:
        pre, manifest = toy_data(work, a.dims)
        ckpt = ckpt or pretrain(work, pre, a.pretrain_steps, a.batch_size, a.device)
    elif ckpt is None:
        sys.exit("--manifest needs --init (the checkpoint to compare with training from scratch)")
    from dpot_train.data.datasets import read_manifests
    from dpot_train.core.checkpoint import load_state_dict_file

    dims = len(read_manifests([str(manifest)])[0].dims)
    load = a.load or ("blocks,time_agg" if dims == 3 else "all")
    recipe = "reference" if load_state_dict_file(str(ckpt))[1] is None else "dpot"  # released: no config
    common = ["--config", str(scratch_config(ckpt, work / "scratch.yaml", a.t_in)), "--manifest", str(manifest),
              "--steps", str(a.steps), "--batch-size", str(a.batch_size), "--lr", str(a.lr), "--recipe", recipe,
              "--res", str(res), "--device", a.device, "--nproc-per-node", str(a.nproc_per_node),
              "--ckpt-every", str(a.steps), "--log-every", str(max(1, a.steps // 10))]
    scratch = train_and_score("scratch", common, work)
    tuned = train_and_score("finetuned", common + ["--init", str(ckpt), "--load", load], work)
    key = "step_l2re" if scratch["recipe"] == "reference" else "one_step_l2re"  # the evaluation's recipe
    print(f"\n{scratch['dataset']}: {a.steps} steps, batch {a.batch_size}, recipe {recipe} (evaluated with "
          f"the {scratch['recipe']} recipe), device {a.device}")
    print(tuned["init"] or "")
    print(f"{'':12}{'rollout L2RE':>14}{key.replace('_', ' '):>16}")
    for name, r in (("from scratch", scratch), ("fine-tuned", tuned)):
        print(f"{name:12}{r['scores']['model']['rollout_l2re']:14.4f}{r['scores']['model'][key]:16.4f}")
    print(f"{'persistence':12}{scratch['scores']['persistence']['rollout_l2re']:14.4f}"
          f"{scratch['scores']['persistence'][key]:16.4f}")
    summary = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "dataset": scratch["dataset"],
               "checkpoint": str(ckpt), "load": load, "steps": a.steps, "batch_size": a.batch_size, "res": res,
               "recipe": recipe, "scratch": scratch["scores"], "finetuned": tuned["scores"], "work": str(work),
               "machine": machine(work, ["torch", "numpy"])}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
