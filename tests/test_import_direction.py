"""dpot_train's sub-packages import one way, top first as `dpot_train.LAYERS` orders them: every import of every
module (those inside functions included, read from the source with ast) goes to a lower level or stays in its own
package; each sub-package's docstring says what it may import; the top level stays small."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import dpot_train
from tests.test_import_graph import ROOT, _imports, _module_name

PACKAGE = ROOT / "dpot_train"
ENTRY_PACKAGES = {"cli"}  # a command-line package belongs to the top level, like cli.py
MAX_TOP_MODULES = 8  # besides __init__.py and __main__.py


def _sub(module: str) -> str:
    """The sub-package a dpot_train module belongs to ("" for the top level: the package's own modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and any(parts[1] in level for level in dpot_train.LAYERS) else ""


def _level(module: str) -> int:
    """The index in LAYERS of a module's sub-package, -1 for the top level."""
    sub = _sub(module)
    return next((i for i, level in enumerate(dpot_train.LAYERS) if sub in level), -1)


def _against_the_order(module: str, names: set[str]) -> list[str]:
    """The dpot_train names `module` imports against the order: the top level, a higher level, or another package
    of its own level. The top level may import anything."""
    if _sub(module) == "":
        return []
    return sorted(n for n in names if (n == "dpot_train" or n.startswith("dpot_train."))
                  and _sub(n) != _sub(module) and _level(n) <= _level(module))


def _lower(package: str) -> set[str]:
    level = _level(f"dpot_train.{package}")
    return {p for lower in dpot_train.LAYERS[level + 1:] for p in lower}


def test_the_check_sees_an_upward_import_inside_a_function_and_a_sibling_import(tmp_path: Path) -> None:
    fake = tmp_path / "x.py"
    fake.write_text("def f():\n    from dpot_train.run import launch\n    import dpot_train.integrations.hub\n")
    names = _imports(fake)
    assert _against_the_order("dpot_train.core.config", names) == ["dpot_train.run", "dpot_train.run.launch"]
    assert _against_the_order("dpot_train.train.trainer", names) == ["dpot_train.run", "dpot_train.run.launch"]
    assert _against_the_order("dpot_train.model.base", {"dpot_train.integrations.hub"}) == [
        "dpot_train.integrations.hub"]
    assert _against_the_order("dpot_train.core.config", {"dpot_train"}) == ["dpot_train"]
    assert _against_the_order("dpot_train.cli", names) == []


def test_every_import_in_dpot_train_goes_down_the_layers() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    found = {_module_name(f): _against_the_order(_module_name(f), _imports(f)) for f in files}
    assert {m: bad for m, bad in found.items() if bad} == {}


def test_the_layers_name_every_sub_package() -> None:
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages - ENTRY_PACKAGES == {p for level in dpot_train.LAYERS for p in level}


@pytest.mark.parametrize("package", sorted(p for level in dpot_train.LAYERS for p in level))
def test_each_sub_package_docstring_says_what_it_owns_and_what_it_may_import(package: str) -> None:
    doc = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text(encoding="utf-8"))) or ""
    said = re.search(r"May import: ([^.]*)\.", doc)
    assert said, f"dpot_train/{package}/__init__.py: its docstring has no 'May import: ...' line"
    named = {name.strip() for name in said.group(1).split(",")} - {"none"}
    assert named == _lower(package)
    assert len(doc[:said.start()].split()) >= 8  # what the package owns comes first


def test_the_top_level_docstring_states_the_order() -> None:
    order = " > ".join(", ".join(f"`{p}`" for p in level) for level in dpot_train.LAYERS)
    assert order in " ".join((dpot_train.__doc__ or "").split())


def test_the_top_level_keeps_at_most_eight_modules_besides_init_and_main() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(modules) <= MAX_TOP_MODULES, modules
