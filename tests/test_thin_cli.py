"""The command lines stay thin: dpot_data/cli/ and dpot_train/cli/ hold Typer declarations and short command bodies,
and the work each command does is a library function a test can call without the command line."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI_PACKAGES = (ROOT / "dpot_data" / "cli", ROOT / "dpot_train" / "cli")
MAX_BODY = 20  # lines of a function's statements in the command-line packages (signature, docstring not counted)


def _long_bodies(path: Path, limit: int) -> list[str]:
    """Functions of `path` whose body (docstring and nested functions left out) has more than `limit` lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            lines = sum(s.end_lineno - s.lineno + 1 for s in body
                        if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)))
            if lines > limit:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_the_body_counter_sees_a_long_body() -> None:
    assert _long_bodies(ROOT / "dpot_data" / "ingest" / "command.py", 3)  # real functions longer than a small limit


def test_every_command_line_function_is_short() -> None:
    files = sorted(f for package in CLI_PACKAGES for f in package.glob("*.py"))
    assert len(files) >= 12
    assert [line for f in files for line in _long_bodies(f, MAX_BODY)] == []


@pytest.mark.parametrize("module,prog", [("dpot_data.cli", "dpot-data"), ("dpot_train.cli", "dpot-train")])
def test_python_m_runs_each_command_line_package(module: str, prog: str) -> None:
    from dpot_format.cli_help import package_version

    r = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert (r.returncode, r.stdout) == (0, f"{prog} {package_version()}\n"), r.stderr


def test_dpot_train_cli_train_stays_importable_with_the_launch_command() -> None:
    from dpot_train import cli_train
    from dpot_train.cli.launch import launch_cmd

    assert cli_train.launch_cmd is launch_cmd and "tracker_project" in inspect.signature(launch_cmd).parameters


def test_ingest_options_from_the_command_line_values() -> None:
    from dpot_data.errors import InputError
    from dpot_data.ingest.command import SizeError, command_options, parse_bytes

    assert [parse_bytes(t) for t in ("256MiB", "64M", "1GB", "1048576", " 2k ")] == [256 << 20, 64 << 20, 10**9,
                                                                                     1 << 20, 2048]
    with pytest.raises(SizeError, match=r"^expected a byte size such as 256MiB, got '12XB'$"):
        parse_bytes("12XB")
    options = command_options({"formats": "zarr, ,wds", "fill": 1.0}, "48,64", None)
    assert options == {"formats": ("zarr", "wds"), "fill": 1.0, "resolution": (48, 64)}
    assert command_options({"formats": "zarr"}, None, 10.0) == {"formats": ("zarr",), "max_abs": 10.0}
    with pytest.raises(InputError, match=r"^--resolution: expected a grid size >= 0"):
        command_options({"formats": "zarr"}, "abc", None)


def test_ingest_outcome_lines_say_each_dataset_its_warnings_and_failures() -> None:
    from dpot_data.ingest.command import outcome_report

    dataset = {"name": "toy", "trajectories": 3, "frames": 4, "splits": {"counts": {"train": 2, "valid": 0, "test": 1}},
               "grid": {"shape": [16, 16]}, "shards": [{"bytes": 10}, {"bytes": 5}]}
    outcome = SimpleNamespace(warnings=["w1"], notes=["n1"], manifest={"datasets": [dataset]}, written=False,
                              path="out/manifest.json")
    report = outcome_report([outcome], [("bad", "out/bad: expected a file")])
    assert report.failed and report.lines == [
        ("warning: w1", True), ("n1", True),
        ("kept out/manifest.json: toy, 3 trajectories (train 2, test 1), 4 frames, grid 16x16, 2 shards (15 bytes)",
         False),
        ("error: bad: out/bad: expected a file", True)]
    assert not outcome_report([], []).failed


def test_output_roots_and_absolute_paths(tmp_path: Path) -> None:
    from dpot_data.paths import absolute_path, output_roots

    for name in ("b", "a"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
    assert output_roots(str(tmp_path)) == [str(tmp_path / "a"), str(tmp_path / "b")]  # a corpus folder
    assert output_roots(str(tmp_path / "a")) == [str(tmp_path / "a")]
    assert output_roots(str(tmp_path / "none")) == [str(tmp_path / "none")]
    assert absolute_path("memory://x/y") == "memory://x/y" and absolute_path("rel") == str(Path.cwd() / "rel")


def test_catalog_selection_and_lines() -> None:
    from dpot_data.catalog import CatalogError, entry_lines, select_entries

    catalog, entries = select_entries(None, pretrain=True)
    assert len(entries) == 12 and all(e.pretrain for e in entries) and len(catalog.entries) > 12
    _, (entry,) = select_entries("fno-ns-v1e-3", pretrain=False)
    assert entry_lines(entry)[-1] == ("ingest:      dpot-data ingest --dataset fno-ns-v1e-3 ns_V1e-3_N5000_T50.mat "
                                      "--out out/fno-ns-v1e-3")
    with pytest.raises(CatalogError, match=r"^no catalog dataset 'nope'; `dpot-data catalog` lists them$"):
        select_entries("nope", pretrain=False)


def test_check_downloads_finds_a_published_file_name(tmp_path: Path) -> None:
    from dpot_data.corpus import check_downloads

    (tmp_path / "2D_rdb_NA_NA.h5").write_bytes(b"x" * 7)
    (tmp_path / "notes.h5").write_bytes(b"")
    found = check_downloads(tmp_path, md5=False)
    assert found.code == 0 and list(found.report["datasets"]) == ["pdebench-swe"]
    assert found.lines[0] == "found   pdebench-swe: 1 file(s), 7 bytes"
    assert f"unknown {tmp_path / 'notes.h5'}: no catalog dataset has this file name" in found.lines
    assert "pdebench-swe" not in found.report["missing_pretrain"] and len(found.report["missing_pretrain"]) == 11


def test_stats_lines_one_row_per_channel_and_kind() -> None:
    from dpot_data.stats import stats_lines

    moments = {"count": 4, "mean": 1.5, "std": 0.5, "rms": 1.58, "min": 1.0, "max": None}
    doc = {"trajectories": 2, "channels": ["u"], "fields": {"u": moments}, "diff": {"u": moments}}
    lines = stats_lines({"toy": doc}, {"toy": ["u: mean differs"]})
    assert lines[0] == "toy: 2 train trajectories, float64, fluid cells, ddof 0"
    assert lines[2].split() == ["u", "value", "4", "1.5", "0.5", "1.58", "1", "-"]
    assert lines[3].split()[:2] == ["u", "dt"] and lines[-1] == "  manifest: DIFFERS: u: mean differs"


def test_launch_request_refuses_a_launch_without_run_dir() -> None:
    from dpot_train.cli.launch import launch_cmd
    from dpot_train.run.launch_request import plan_launch

    given = {name: getattr(p.default, "default", p.default)
             for name, p in inspect.signature(launch_cmd).parameters.items()}
    with pytest.raises(ValueError, match=r"^--out RUN_DIR is required$"):
        plan_launch(given)


def test_evaluation_summary_and_its_checks(tmp_path: Path) -> None:
    from dpot_train.run.eval_run import EvalFiles, comma_list, evaluate_to_files, summary_lines

    result = {"recipe": "dpot", "normalization": {"stats": {"b": {"mean": 0}, "a": None}}, "plots": ["/x/p1.png"]}
    files = EvalFiles("e.json", plot=Path("pics"))
    assert summary_lines(result, files, "test") == [
        "wrote e.json: L2RE per dataset, model vs the persistence baseline (dpot recipe, test split; normalised: b)",
        "wrote 1 pictures to pics: p1.png"]
    with pytest.raises(ValueError, match=r"^--ensemble-checkpoints a,,b: expected a comma list"):
        comma_list("a,,b", "--ensemble-checkpoints")
    with pytest.raises(ValueError, match=r"^--video: name the folder for it with --plot DIR$"):
        evaluate_to_files("ckpt.pt", [str(tmp_path)], EvalFiles(str(tmp_path / "e.json"), video=True))
    assert not (tmp_path / "e.json").exists()


def test_model_info_text_as_json() -> None:
    from dpot_train.model_info import model_info_text

    info = json.loads(model_info_text("tiny", as_json=True))
    assert info["parameters"] == 242675 and model_info_text("tiny").splitlines()[0] == "DPOT2D from preset tiny"
