"""Who may import whom, read from the source (ast, no import side effects): dpot_train and dpot_data share the shard
contract through dpot_format only; dpot_format depends on neither; the loader modules form no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    rel = (path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path(path.name)).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module an import statement of the file names (function-level imports included, relative ones resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def _package_imports(package: str) -> dict[str, set[str]]:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no modules found under {package}/"
    return {_module_name(f): _imports(f) for f in files}


def _offenders(package: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    out = {}
    for module, names in _package_imports(package).items():
        bad = sorted(n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden))
        if bad:
            out[module] = bad
    return out


def test_the_import_walker_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    probe = ROOT / "dpot_train" / "data" / "datasets.py"
    names = _imports(probe)
    assert "dpot_format.validate" in names and "dpot_format.manifest.read_manifest" in names
    fake = tmp_path / "x.py"
    fake.write_text("def f():\n    from dpot_data.manifest_io import fsync_dir\n    import dpot_data.fs as fs\n")
    assert {"dpot_data.manifest_io", "dpot_data.fs"} <= _imports(fake)


def test_dpot_train_imports_nothing_from_dpot_data() -> None:
    assert _offenders("dpot_train", ("dpot_data",)) == {}


@pytest.mark.parametrize("forbidden", ["dpot_data", "dpot_train"])
def test_dpot_format_imports_neither_side(forbidden: str) -> None:
    assert _offenders("dpot_format", (forbidden,)) == {}


def test_stream_and_prefetch_do_not_import_each_other_both_ways() -> None:
    graph = _package_imports("dpot_train")

    def uses(a: str, b: str) -> bool:
        return any(n == b or n.startswith(b + ".") for n in graph[a])

    assert uses("dpot_train.data.prefetch", "dpot_train.data.stream")
    assert not uses("dpot_train.data.stream", "dpot_train.data.prefetch")
    assert not uses("dpot_train.data.stream", "dpot_train.data.loader")
    assert uses("dpot_train.data.loader", "dpot_train.data.prefetch")


def _module_graph(packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules importing it runs (imports at the top or inside functions, each with the
    packages above the imported module)."""
    imports = {m: n for p in packages for m, n in _package_imports(p).items()}
    modules = set(imports)

    def targets(name: str) -> set[str]:
        """The module an imported name lives in, and the packages above it (importing runs their __init__)."""
        parts = name.split(".")
        return {".".join(parts[:k]) for k in range(1, len(parts) + 1)} & modules

    # a module's own packages are not arrows: they are initialised before it, whatever it imports from them
    return {m: {t for n in names for t in targets(n) if t != m and not m.startswith(t + ".")}
            for m, names in imports.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` (the modules in order, the first repeated at the end), or [] when there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_any_package_even_through_imports_inside_functions() -> None:
    assert _cycle(_module_graph(("dpot_data", "dpot_format", "dpot_train"))) == []


def test_source_readers_never_import_the_catalog() -> None:
    assert _offenders("dpot_data/sources", ("dpot_data.catalog",)) == {}


def test_the_model_package_touches_no_file_module_above_it() -> None:
    """dpot_train.model (networks, config, weight helpers) imports nothing else of dpot_train: checkpoint files live
    in dpot_train.core.checkpoint, which imports the model, never the other way round."""
    graph = _module_graph(("dpot_train",))
    model = {m for m in graph if m == "dpot_train.model" or m.startswith("dpot_train.model.")}
    assert "dpot_train.model.weights" in model and "dpot_train.model" in graph["dpot_train.core.checkpoint"]
    assert {m: sorted(graph[m] - model) for m in sorted(model) if graph[m] - model} == {}
