"""`dpot-train launch`: check the data and RUN_DIR, write RUN_DIR/config.yaml, then hand over to torchrun.

The launcher replaces itself with torchrun (exec), so that a scheduler's signals reach torchrun directly; every
data problem (missing shard, wrong checksum, unknown mixture name, mismatched channels) is reported before that.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from dpot_train.checkpoint import list_checkpoints
from dpot_train.config import TrainConfig, load_config, save_config
from dpot_train.data.prepare import prepare_stream
from dpot_train.trainer import RunDirError

# Fields a resume may change: they do not alter the data stream or the optimisation.
_RESUMABLE = {"out", "progress", "log_every", "ckpt_every", "keep_checkpoints", "eval_at_end", "eval_split",
              "rollout_steps", "eval_max_trajectories", "device", "audit", "data.num_workers",
              "data.worker_kind", "data.verify_checksums"}


@dataclass(frozen=True)
class Topology:
    """torchrun process layout."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None


def torchrun_command(config_path: Path, topo: Topology, resume: bool, checksums_verified: bool) -> list[str]:
    """`python -m torch.distributed.run ... -m dpot_train.worker --config ...` for this topology."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={topo.nproc_per_node}"]
    if topo.nnodes > 1:
        if not topo.rdzv_endpoint:
            raise ValueError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        cmd += [f"--nnodes={topo.nnodes}", f"--node-rank={topo.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={topo.rdzv_endpoint}"]
    else:
        cmd += ["--standalone", "--nnodes=1"]
    cmd += ["-m", "dpot_train.worker", "--config", str(config_path)]
    if resume:
        cmd.append("--resume")
    if checksums_verified:
        cmd.append("--checksums-verified")
    return cmd


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        key = f"{prefix}{k}"
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict) and key not in ("model_overrides",) and key != "data.mixture":
            out += _diff(va, vb, key + ".")
        elif va != vb:
            out.append(key)
    return out


def prepare_run(cfg: TrainConfig, resume: bool, topo: Topology) -> tuple[TrainConfig, Path]:
    """Check RUN_DIR and the data, write config.yaml; returns the config to run and its path."""
    run = Path(cfg.out)
    cfg_path = run / "config.yaml"
    has_ckpt = bool(list_checkpoints(run / "checkpoints"))
    if has_ckpt and not resume:
        raise RunDirError(f"{run} already holds checkpoints; pass --resume to continue it or choose another --out")
    if resume and cfg_path.exists():
        saved = load_config(cfg_path)
        changed = [k for k in _diff(saved.to_dict(), cfg.to_dict()) if k not in _RESUMABLE]
        if changed and has_ckpt:
            raise RunDirError(f"--resume: {', '.join(changed)} differ from {cfg_path}; a resumed run keeps its "
                              "data, model and optimiser settings (start a new --out to change them)")
    if cfg.batch_size % (topo.nproc_per_node * topo.nnodes):
        raise ValueError(f"--batch-size {cfg.batch_size} (global) must be divisible by the "
                         f"{topo.nproc_per_node * topo.nnodes} processes")
    if cfg.ckpt_every <= 0 or cfg.log_every <= 0 or cfg.steps <= 0:
        raise ValueError("steps, ckpt_every and log_every must be positive")
    if cfg.init and not Path(cfg.init).is_file():
        raise FileNotFoundError(f"--init checkpoint not found: {cfg.init}")
    prepare_stream(cfg.data, cfg.seed)  # every data check, sha256 included unless disabled
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, cfg_path)
    return cfg, cfg_path
