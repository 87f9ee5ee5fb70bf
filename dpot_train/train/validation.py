"""`launch --eval-every N`: score the model on the validation split every N steps and keep the best weights as
`checkpoints/best.pt`, so that the final evaluation scores the best checkpoint rather than the last.

The score is the model's rollout L2RE (the dpot recipe's, or the reference's under --recipe reference) averaged over
the datasets; lower is better, and a tie keeps the earlier checkpoint. best.pt is a checkpoint in the run's format,
written atomically with its sha256 record like every other (checkpoint.save_atomic); `checkpoints/best.json` beside it
({"step", "score", "split", "metric"}, written after it) is what a resumed run compares new scores with. Only rank 0
evaluates; the others wait at a barrier. A best.pt that does not load is set aside (best.pt.damaged, with its best.json)
like a damaged step checkpoint; a best.json that cannot be read is named and rebuilt from best.pt's own record.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

from dpot_train.core import distributed as D
from dpot_train.core.checkpoint import TRAINED_ON, checkpoint_payload, save_atomic

VALID_SPLIT = "valid"
BEST_NAME = "best.pt"
BEST_RECORD = "best.json"
METRIC = "mean rollout_l2re over datasets"


def has_split(datasets: list[Any], split: str = VALID_SPLIT) -> bool:
    """Whether every dataset holds trajectories in `split` (checked from the manifests)."""
    return bool(datasets) and all(d.split_counts.get(split, 0) > 0 for d in datasets)


def _valid_record(rec: Any) -> bool:
    return isinstance(rec, dict) and isinstance(rec.get("score"), (int, float)) and not isinstance(rec["score"], bool)


def best_record(ckpt_dir: Path) -> dict[str, Any] | None:
    """checkpoints/best.json, None when there is none. One that cannot be read is named in one warning line and
    rebuilt from best.pt's own record (its `validation` entry) when best.pt loads; else the next validation writes
    both anew."""
    path = Path(ckpt_dir) / BEST_RECORD
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
        why = "" if _valid_record(rec) else "expected a JSON object with a numeric score"
    except (OSError, ValueError) as exc:
        why = " ".join(str(exc).split())[:200]
    if not why:
        return rec
    kept = _record_in_best(Path(ckpt_dir))
    if kept is not None:
        from dpot_format.io import atomic_write

        atomic_write(path, (json.dumps(kept) + "\n").encode("utf-8"))
        then = f"rebuilt from {BEST_NAME}'s own record (step {kept.get('step')}, score {kept['score']:.6g})"
    else:
        then = f"the next validation writes {BEST_NAME} and {BEST_RECORD} anew"
    print(f"warning: {path}: cannot be read ({why}); {then}", file=sys.stderr, flush=True)
    return kept


def _record_in_best(ckpt_dir: Path) -> dict[str, Any] | None:
    """The validation record best.pt carries, None when it has none or does not load (then set aside)."""
    content = _read_best(ckpt_dir)
    rec = content.get("validation") if isinstance(content, dict) else None
    return dict(rec) if _valid_record(rec) else None


def _read_best(ckpt_dir: Path, then: str = "") -> Any:
    """best.pt's content (its sha256 record checked); None when there is none, or when it does not load: it is then
    set aside as best.pt.damaged (with best.json, renamed beside it), like a damaged step checkpoint, and one
    warning line says so and `then` (what happens instead)."""
    from dpot_train.core.checkpoint import read_checkpoint, set_aside

    path = Path(ckpt_dir) / BEST_NAME
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return read_checkpoint(path)
    except Exception as exc:  # noqa: BLE001 - whatever does not load is set aside, never scored or overwritten
        why = " ".join(str(exc).split()).removeprefix(f"{path}: ")[:300]
    aside = set_aside(path)
    record = Path(ckpt_dir) / BEST_RECORD
    if record.exists():
        os.replace(record, aside.with_name(aside.name + ".json"))  # its score no longer stands for a best.pt
    print(f"warning: {path} does not load ({why}); kept as {aside.name}{then}", file=sys.stderr, flush=True)
    return None


def check_best(ckpt_dir: Path) -> None:
    """On --resume: a best.pt that does not load is set aside now (with its best.json), so that the resumed run's
    validation writes a new one and the final evaluation does not fail on it again."""
    _read_best(ckpt_dir, "; the next validation writes a new best.pt (until then the last checkpoint is scored)")


def validation_score(model: torch.nn.Module, cfg: Any, device: torch.device, datasets: list[Any]) -> float:
    """The model's mean rollout L2RE over the datasets' validation trajectories (no file written)."""
    from dpot_train.evaluation.evaluate import evaluate_model

    result = evaluate_model(model, cfg.data, split=VALID_SPLIT, rollout_steps=cfg.rollout_steps, device=device,
                            max_trajectories=cfg.eval_max_trajectories, verify=False, recipe=cfg.recipe or "dpot",
                            datasets=datasets)
    scores = [float(r["model"]["rollout_l2re"]) for r in result["datasets"].values()]
    return sum(scores) / len(scores)


def validate_and_keep_best(cfg: Any, info: Any, model: torch.nn.Module, step: int, ckpt_dir: Path,
                           datasets: list[Any], trained: dict[str, Any] | None = None) -> float | None:
    """Rank 0: score `model` at `step`; when it beats checkpoints/best.json (or there is none), write best.pt and
    best.json. Every rank returns after a barrier; rank 0 returns the score. The model is left in training mode.
    `trained`: the record of the training data (checkpoint.data_record) best.pt carries, as every checkpoint."""
    score = None
    if info.is_main:
        was_training = model.training
        score = validation_score(model, cfg, info.device, datasets)
        model.train(was_training)
        best = best_record(ckpt_dir)
        if math.isfinite(score) and (best is None or score < float(best["score"])):
            record = {"step": step, "score": score, "split": VALID_SPLIT, "metric": METRIC}
            payload = checkpoint_payload(model, train_config=cfg.to_dict(), step=step, validation=record,
                                         **({TRAINED_ON: trained} if trained else {}))
            save_atomic(payload, Path(ckpt_dir) / BEST_NAME)
            from dpot_format.io import atomic_write

            atomic_write(Path(ckpt_dir) / BEST_RECORD, (json.dumps(record) + "\n").encode("utf-8"))
        print(f"step {step}: validation {METRIC} {score:.6g}"
              + (f" (best {best['score']:.6g} at step {best['step']})" if best is not None else ""), flush=True)
    D.barrier()
    return score


def load_best(model: torch.nn.Module, ckpt_dir: Path) -> dict[str, Any] | None:
    """Load best.pt's weights into `model` (its sha256 record checked); its validation record, None without one.
    A best.pt that does not load is set aside (`_read_best`) and None returned: the last weights are scored."""
    from dpot_train.core.checkpoint import parse_checkpoint

    path = Path(ckpt_dir) / BEST_NAME
    content = _read_best(ckpt_dir, "; the final evaluation scores the last checkpoint")
    if content is None:
        return None
    state, _, _ = parse_checkpoint(content, path)
    target = model.module if hasattr(model, "module") else model
    target.load_state_dict(state)
    return dict(content.get("validation") or {})
