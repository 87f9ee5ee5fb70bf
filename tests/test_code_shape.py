"""The ingest path stays in small functions: none of dpot_format, dpot_data's ingest (journal, scheduler and remote
included), writers or sources modules is longer than MAX_LINES (read from the source with ast, nothing imported)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60  # from `def` to the function's last line, docstring included
INGEST_PATH = ("dpot_format", "dpot_data/ingest", "dpot_data/writers", "dpot_data/sources")


def _long_functions(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_the_counter_sees_a_long_function() -> None:
    probe = ROOT / "dpot_format" / "names.py"
    assert _long_functions(probe, 3)  # the counter finds functions longer than a small limit in a real module


def test_no_function_of_the_ingest_path_is_longer_than_the_limit() -> None:
    files = [f for part in INGEST_PATH for f in ((ROOT / part).rglob("*.py") if (ROOT / part).is_dir()
                                                  else [ROOT / part])]
    assert len(files) > 20
    assert [line for f in sorted(files) for line in _long_functions(f, MAX_LINES)] == []
