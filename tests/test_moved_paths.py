"""The module paths the docs named before dpot_train's sub-packages (dpot_train.MOVED) still import, as the moved
modules themselves: the same objects, patched in one place, run by `python -m`; `import dpot_train` stays light."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import dpot_train
from tests.test_import_graph import ROOT


@pytest.mark.parametrize("old", sorted(dpot_train.MOVED))
def test_an_old_path_imports_the_moved_module_itself(old: str) -> None:
    new = importlib.import_module(f"dpot_train.{dpot_train.MOVED[old]}")
    alias = importlib.import_module(f"dpot_train.{old}")
    assert alias is new and alias.__spec__.name == new.__name__ == f"dpot_train.{dpot_train.MOVED[old]}"


def test_the_imports_the_docs_showed_give_the_same_objects() -> None:
    from dpot_train.checkpoint import checkpoint_payload, load_pretrained
    from dpot_train.core import checkpoint, metrics, model_setup
    from dpot_train.metrics import relative_l2_loss
    from dpot_train.model_setup import data_overrides, fresh_model

    assert (load_pretrained, checkpoint_payload) == (checkpoint.load_pretrained, checkpoint.checkpoint_payload)
    assert relative_l2_loss is metrics.relative_l2_loss
    assert (data_overrides, fresh_model) == (model_setup.data_overrides, model_setup.fresh_model)


def test_a_patch_by_the_old_path_patches_the_module_the_code_uses(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpot_train.core import checkpoint

    sentinel = object()
    monkeypatch.setattr("dpot_train.checkpoint.load_pretrained", sentinel)
    assert checkpoint.load_pretrained is sentinel


def test_python_m_by_the_old_path_runs_the_moved_module() -> None:
    def run(module: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120)

    old, new = run("dpot_train.slurm"), run("dpot_train.run.slurm")
    assert new.returncode == 0 and "launch" in new.stdout
    assert (old.returncode, old.stdout) == (new.returncode, new.stdout)


def test_importing_dpot_train_imports_none_of_its_modules_nor_torch() -> None:
    code = "import sys, dpot_train; print(sorted(m for m in sys.modules if m.startswith(('dpot_train', 'torch'))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "['dpot_train']"
