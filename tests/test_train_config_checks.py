"""Run configs that would fail in the worker (or pass silently) are refused by `dpot-train launch` in one line that
names the file, the key and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpot_train.cli import app


def _launch_config(tmp_path: Path, text: str) -> tuple[int, list[str], Path]:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["launch", "--config", str(path), "--out", str(out), "--manifest",
                                      str(tmp_path / "no-data"), "--dry-run"])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert not out.exists(), "nothing may be written for a refused config"
    return result.exit_code, lines, path


@pytest.mark.parametrize("text, expected", [
    ("steps: true\n", "steps: expected a whole number, got True"),
    ("steps: 1e400\n", "steps: expected a whole number, got '1e400'"),
    ("steps: 1.0e+400\n", "steps: expected a whole number, got inf"),
    ("optim:\n  lr: .inf\n", "optim.lr: expected a finite number, got inf"),
    ("optim:\n  lr: 0\n", "optim.lr: expected a learning rate above 0"),
    ("batch_size: 1e12\n", "batch_size: expected a whole number, got '1e12'"),
    ("batch_size: 1000000000000\n", "batch_size: expected a global batch from 1 to 1048576"),
    ("data:\n  noise: .nan\n", "data.noise: expected a finite number"),
    ("model_overrides: {embed_dim: 1048576}\n", "model_overrides {'embed_dim': 1048576}: expected a model of at most"),
    ("model_overrides: {depth: 100000000}\n", "model_overrides {'depth': 100000000}: expected a model of at most"),
])
def test_values_the_worker_cannot_run_are_refused_naming_file_and_key(tmp_path: Path, text: str,
                                                                      expected: str) -> None:
    code, lines, path = _launch_config(tmp_path, text)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: "), lines
    assert expected in lines[0], lines


@pytest.mark.parametrize("text, line, problem", [
    ("steps: 3\nbatch_size: 4\nsteps: 4\n", 3, "duplicate key 'steps'"),
    ("optim:\n  lr: 0.1\n  lr: 0.2\n", 3, "duplicate key 'lr'"),
    ("steps: 3\nmodel: [tiny\n", 3, "expected ',' or ']'"),
    ("steps: 3\n  model: tiny: x\n", 2, "mapping values are not allowed here"),
])
def test_yaml_errors_are_one_line_with_file_and_line(tmp_path: Path, text: str, line: int, problem: str) -> None:
    code, lines, path = _launch_config(tmp_path, text)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:{line}: not valid YAML: "), lines
    assert problem in lines[0]


def test_the_shipped_presets_are_within_the_model_limit() -> None:
    from dpot_train.launch import MAX_PARAMETERS, model_parameters
    from dpot_train.model import build_model

    for name in ("tiny", "Ti", "H"):
        count = model_parameters(name, {})
        assert count == sum(p.numel() for p in build_model(name, device="meta").parameters())
        assert count < MAX_PARAMETERS


def test_every_launch_option_sets_its_run_config_key_or_is_the_launchers_own() -> None:
    import inspect

    from dpot_train.cli_train import _SWITCHES, _VALUES, launch_cmd, launch_overrides
    from dpot_train.config import TrainConfig

    launcher = {"config", "nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_timeout", "resume",
                "dry_run"}
    names = set(inspect.signature(launch_cmd).parameters)
    assert names == set(_VALUES) | set(_SWITCHES) | {"manifest", "epochs"} | launcher  # none silently dropped
    defaults = TrainConfig().to_dict()

    def exists(key: str) -> bool:
        node = defaults
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    none_given = {**{n: None for n in names}, **{n: False for n in _SWITCHES}, "manifest": []}
    assert all(v is None for v in launch_overrides(none_given).values())  # nothing given: the run config stays
    for name, key in _VALUES.items():
        assert exists(key), key
        assert launch_overrides({**none_given, name: 7})[key] == 7
    for name, (key, value) in _SWITCHES.items():
        assert exists(key) and launch_overrides({**none_given, name: True})[key] is value
    both = launch_overrides({**none_given, "steps": 5, "manifest": ["a"]})
    assert both["steps"] == 5 and both["epochs"] == 0 and both["data.manifests"] == ["a"]  # --steps beats epochs
    assert launch_overrides({**none_given, "steps": 5, "epochs": 2.0})["epochs"] == 2.0
