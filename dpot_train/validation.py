"""`launch --eval-every N`: score the model on the validation split every N steps and keep the best weights as
`checkpoints/best.pt`, so that the final evaluation scores the best checkpoint rather than the last.

The score is the model's rollout L2RE (the dpot recipe's, or the reference's under --recipe reference) averaged over
the datasets; lower is better, and a tie keeps the earlier checkpoint. best.pt is a checkpoint in the run's format,
written atomically with its sha256 record like every other (checkpoint.save_atomic); `checkpoints/best.json` beside it
({"step", "score", "split", "metric"}, written after it) is what a resumed run compares new scores with. Only rank 0
evaluates; the others wait at a barrier.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from dpot_train import distributed as D
from dpot_train.checkpoint import checkpoint_payload, save_atomic

VALID_SPLIT = "valid"
BEST_NAME = "best.pt"
BEST_RECORD = "best.json"
METRIC = "mean rollout_l2re over datasets"


def has_split(datasets: list[Any], split: str = VALID_SPLIT) -> bool:
    """Whether every dataset holds trajectories in `split` (checked from the manifests)."""
    return bool(datasets) and all(d.split_counts.get(split, 0) > 0 for d in datasets)


def best_record(ckpt_dir: Path) -> dict[str, Any] | None:
    """checkpoints/best.json, None when there is none (or it cannot be read: the next validation writes it anew)."""
    try:
        rec = json.loads((Path(ckpt_dir) / BEST_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("score"), (int, float)) else None


def validation_score(model: torch.nn.Module, cfg: Any, device: torch.device, datasets: list[Any]) -> float:
    """The model's mean rollout L2RE over the datasets' validation trajectories (no file written)."""
    from dpot_train.evaluate import evaluate_model

    result = evaluate_model(model, cfg.data, split=VALID_SPLIT, rollout_steps=cfg.rollout_steps, device=device,
                            max_trajectories=cfg.eval_max_trajectories, verify=False, recipe=cfg.recipe or "dpot",
                            datasets=datasets)
    scores = [float(r["model"]["rollout_l2re"]) for r in result["datasets"].values()]
    return sum(scores) / len(scores)


def validate_and_keep_best(cfg: Any, info: Any, model: torch.nn.Module, step: int, ckpt_dir: Path,
                           datasets: list[Any]) -> float | None:
    """Rank 0: score `model` at `step`; when it beats checkpoints/best.json (or there is none), write best.pt and
    best.json. Every rank returns after a barrier; rank 0 returns the score. The model is left in training mode."""
    score = None
    if info.is_main:
        was_training = model.training
        score = validation_score(model, cfg, info.device, datasets)
        model.train(was_training)
        best = best_record(ckpt_dir)
        if math.isfinite(score) and (best is None or score < float(best["score"])):
            record = {"step": step, "score": score, "split": VALID_SPLIT, "metric": METRIC}
            payload = checkpoint_payload(model, train_config=cfg.to_dict(), step=step, validation=record)
            save_atomic(payload, Path(ckpt_dir) / BEST_NAME)
            from dpot_format.io import atomic_write

            atomic_write(Path(ckpt_dir) / BEST_RECORD, (json.dumps(record) + "\n").encode("utf-8"))
        print(f"step {step}: validation {METRIC} {score:.6g}"
              + (f" (best {best['score']:.6g} at step {best['step']})" if best is not None else ""), flush=True)
    D.barrier()
    return score


def load_best(model: torch.nn.Module, ckpt_dir: Path) -> dict[str, Any] | None:
    """Load best.pt's weights into `model` (its sha256 record checked); its validation record, None without one."""
    from dpot_train.checkpoint import parse_checkpoint, read_checkpoint

    path = Path(ckpt_dir) / BEST_NAME
    if not path.is_file():
        return None
    content = read_checkpoint(path)
    state, _, _ = parse_checkpoint(content, path)
    target = model.module if hasattr(model, "module") else model
    target.load_state_dict(state)
    return dict(content.get("validation") or {})
