"""Each training process chooses torch's intra-op threads from the cores it has (dpot_train.core.threads): the rule, the
user's OMP_NUM_THREADS winning over it (and over the 1 torchrun sets for several processes), and the line rank 0 logs.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from dpot_train.core.threads import (OMP_ENV, USER_OMP_ENV, ThreadsError, apply_threads, available_cores,
                                     choose_threads, user_threads)
from tests import train_runs


@pytest.mark.parametrize("cores, processes, workers, expected", [
    (2, 1, 0, 1),  # one process on 2 cores: one core left to the rest (torch's default took both)
    (2, 2, 0, 1),
    (16, 1, 0, 15),
    (16, 2, 0, 7),
    (16, 8, 0, 1),
    (16, 1, 4, 11),  # 4 loader workers keep 4 cores busy
    (16, 2, 6, 1),
    (2, 1, 4, 1),  # never below one
    (1, 4, 0, 1),  # more processes than cores
])
def test_rule(cores: int, processes: int, workers: int, expected: int) -> None:
    choice = choose_threads(cores, processes, workers, None)
    assert choice.intra_op == expected
    assert (choice.cores, choice.processes, choice.loader_workers, choice.user_value) == \
        (cores, processes, workers, None)
    assert f"torch intra-op {expected} per process" in choice.line() and "OMP_NUM_THREADS overrides" in choice.line()


def test_user_value_wins() -> None:
    choice = choose_threads(16, 8, 4, 3)
    assert choice.intra_op == 3 and choice.user_value == 3
    assert "OMP_NUM_THREADS=3 (set by the user)" in choice.line()


def test_user_threads_from_env() -> None:
    assert user_threads({}) is None
    assert user_threads({OMP_ENV: ""}) is None
    assert user_threads({OMP_ENV: "4"}) == 4
    assert user_threads({OMP_ENV: " 4,2 "}) == 4  # OpenMP's nested form: the outer count
    # under dpot_train.run.torchrun: the launcher's value is the user's, not the 1 torchrun sets for several processes
    assert user_threads({OMP_ENV: "1", USER_OMP_ENV: ""}) is None
    assert user_threads({OMP_ENV: "1", USER_OMP_ENV: "6"}) == 6


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_bad_omp_value_is_one_line(value: str) -> None:
    with pytest.raises(ThreadsError, match=rf"^OMP_NUM_THREADS='{value}': expected a positive integer thread count$"):
        user_threads({OMP_ENV: value})


def test_apply_sets_torch_threads() -> None:
    before = torch.get_num_threads()
    try:
        choice = apply_threads(0, {})
        assert choice.cores == available_cores() and choice.processes == 1
        assert choice.intra_op == max(1, available_cores() - 1) == torch.get_num_threads()
        choice = apply_threads(0, {"LOCAL_WORLD_SIZE": "2", OMP_ENV: "1", USER_OMP_ENV: "3"})
        assert (choice.processes, choice.intra_op, torch.get_num_threads()) == (2, 3, 3)
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_launched_workers_log_their_choice(fno_train_shards: Path, tmp_path: Path) -> None:
    """A 2-process launch without OMP_NUM_THREADS: torchrun's own OMP_NUM_THREADS=1 is not taken for the user's, and
    rank 0 (only) logs the rule's choice for 2 processes, in its output and as TensorBoard text."""
    env = train_runs.env()
    env.pop(OMP_ENV)
    env.pop(USER_OMP_ENV, None)
    args = train_runs.launch_args(fno_train_shards, tmp_path / "run", steps=2, nproc=2)
    r = subprocess.run(args, capture_output=True, text=True, timeout=240, env=env, cwd=train_runs.ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    expected = choose_threads(available_cores(), 2, 0, None).line()
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("threads:")] == [expected]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"tensors": 0})
    acc.Reload()
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("threads/text_summary")]
    assert texts == [expected]  # the same line as TensorBoard text


@pytest.mark.slow
def test_bad_omp_value_stops_the_launch_in_one_line(fno_train_shards: Path, tmp_path: Path) -> None:
    env = {**train_runs.env(), OMP_ENV: "abc"}
    args = train_runs.launch_args(fno_train_shards, tmp_path / "run", steps=2, nproc=2)
    r = subprocess.run(args, capture_output=True, text=True, timeout=240, env=env, cwd=train_runs.ROOT)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: OMP_NUM_THREADS='abc': expected a positive integer thread count"]
    assert "Traceback" not in r.stderr
    assert "dpot_train.run.torchrun" not in r.stderr  # refused by launch itself, before any rank starts
    assert not (tmp_path / "run").exists()  # and before RUN_DIR is written
