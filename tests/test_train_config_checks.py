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
    ("data: [1]\n", "data: expected a mapping of data keys (indented below `data:`), got [1]"),
    ("optim: 5\n", "optim: expected a mapping of optim keys"),
    ("data:\n  manifests: [1, [2]]\n", "data.manifests: expected a list of strings, got [1, [2]]"),
    ("optim:\n  betas: [0.9]\n", "optim.betas: expected a list of 2 finite numbers, got [0.9]"),
    ("model_overrides: 5\n", "model_overrides: expected a mapping, got 5"),
    ("data:\n  res: 100000\n", "data.res: expected a grid side from 1 to 4096 (0: the stored grid), got 100000"),
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
    from dpot_train.run.launch import MAX_PARAMETERS, model_parameters
    from dpot_train.model import build_model

    for name in ("tiny", "Ti", "H"):
        count = model_parameters(name, {})
        assert count == sum(p.numel() for p in build_model(name, device="meta").parameters())
        assert count < MAX_PARAMETERS


def test_every_launch_option_sets_its_run_config_key_or_is_the_launchers_own() -> None:
    import inspect

    from dpot_train.cli_train import _DERIVED, _SWITCHES, _VALUES, launch_cmd, launch_overrides
    from dpot_train.core.config import TrainConfig

    launcher = {"config", "nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_timeout", "resume",
                "dry_run"}
    names = set(inspect.signature(launch_cmd).parameters)
    assert names == set(_VALUES) | set(_SWITCHES) | set(_DERIVED) | {"manifest", "epochs"} | launcher  # none dropped
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
    for name, keys in _DERIVED.items():  # --verify-checksums always: both keys set
        assert all(exists(k) for k in keys) and all(launch_overrides({**none_given, name: "always"})[k] is not None
                                                    for k in keys)
    both = launch_overrides({**none_given, "steps": 5, "manifest": ["a"]})
    assert both["steps"] == 5 and both["epochs"] == 0 and both["data.manifests"] == ["a"]  # --steps beats epochs
    assert launch_overrides({**none_given, "steps": 5, "epochs": 2.0})["epochs"] == 2.0


@pytest.mark.parametrize("weight", ["1e308", "-1", "inf", "nan"])
@pytest.mark.parametrize("form", ["file", "inline", "config"])
def test_a_mixture_weight_out_of_range_names_the_mixture_and_the_dataset(tmp_path: Path, weight: str,
                                                                         form: str) -> None:
    import yaml

    from dpot_train.data.datasets import DataError
    from dpot_train.data.mixture import parse_mixture

    path = tmp_path / "mix.yaml"
    path.write_text(f"fno: 1\nns: {weight}\n")
    spec: object = {"file": str(path), "inline": f"fno=1,ns={weight}", "config": yaml.safe_load(path.read_text())}[form]
    where = {"file": str(path), "inline": "--mixture", "config": "data.mixture"}[form]
    with pytest.raises(DataError, match=rf"^{where}: weight of 'ns' must be a number from 0 to 1e\+09"):
        parse_mixture(spec)  # type: ignore[arg-type]


def test_the_largest_weights_allowed_give_finite_visit_counts() -> None:
    from dpot_train.data.mixture import MAX_WEIGHT, visit_counts

    assert visit_counts({"a": 3, "b": 4}, {"a": MAX_WEIGHT, "b": MAX_WEIGHT}) == {"a": 4, "b": 4}


def test_a_mixture_weight_in_a_run_config_names_the_file_and_the_key(fno_train_shards: Path, tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  mixture:\n    fno-ns-v1e-3: 1.0e+308\n")
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["launch", "--config", str(path), "--out", str(out), "--manifest",
                                      str(fno_train_shards), "--dry-run"])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {path}: data.mixture: weight of 'fno-ns-v1e-3' must be a number from 0 to "
                               "1e+09"), lines
    assert not out.exists()
