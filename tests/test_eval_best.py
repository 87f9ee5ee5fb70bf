"""`launch --eval-every N`: validation during training keeps checkpoints/best.pt (with its sha256 record), and the
final evaluation scores it, naming the checkpoint and the step in eval.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpot_train.core.checkpoint import record_path, verify_record
from dpot_train.evaluation.evaluate import evaluate_checkpoint
from tests import train_runs


@pytest.mark.slow
def test_eval_every_keeps_and_scores_the_best_checkpoint(fno_train_shards: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = train_runs.run(train_runs.launch_args(fno_train_shards, run, "--eval-every", "2", "--rollout-steps", "2",
                                              "--lr", "0.05", steps=6, nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if "validation mean rollout_l2re" in ln]
    assert [ln.split(":")[0] for ln in lines] == ["step 2", "step 4", "step 6"]
    scores = {int(ln.split(":")[0].split()[1]): float(ln.split("over datasets ")[1].split()[0]) for ln in lines}
    best_step = min(scores, key=lambda s: (scores[s], s))

    best = run / "checkpoints" / "best.pt"
    verify_record(best)  # written with a sha256 record like every checkpoint
    assert record_path(best).is_file()
    record = json.loads((run / "checkpoints" / "best.json").read_text())
    assert record["step"] == best_step and record["score"] == pytest.approx(scores[best_step], rel=1e-5)

    ev = json.loads((run / "eval.json").read_text())
    assert ev["checkpoint"] == str(best) and ev["step"] == best_step
    assert ev["validation"]["step"] == best_step
    again = evaluate_checkpoint(str(best), [str(fno_train_shards)], rollout_steps=2)["datasets"]["fno-ns-v1e-3"]
    for who in ("model", "persistence"):  # the same weights (another process: float rounding may differ)
        for key in ("rollout_l2re", "one_step_l2re"):
            assert again[who][key] == pytest.approx(ev["datasets"]["fno-ns-v1e-3"][who][key], rel=1e-5)


@pytest.mark.slow
def test_without_validation_the_last_checkpoint_is_scored(fno_train_shards: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = train_runs.run(train_runs.launch_args(fno_train_shards, run, "--rollout-steps", "1", steps=2, nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ev = json.loads((run / "eval.json").read_text())
    assert ev["checkpoint"] == str(run / "checkpoints" / "step-00000002.pt") and ev["step"] == 2
    assert not (run / "checkpoints" / "best.pt").exists()
