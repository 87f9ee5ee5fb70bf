"""The first hour of a new user (issue 20): errors that say what to do, before torchrun and before the checksum pass;
shipped configs by name; closing lines; --help, --version and `ingest --dry-run`. In-process (typer's runner)."""

from __future__ import annotations

import json
import re
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from dpot_data.cli import app as data_app
from dpot_train.cli import app as train_app
from dpot_train.core.config import find_config, shipped_configs

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden" / "dpot_small.pth"  # released format
RUNNER = CliRunner()


def _run(app, *args: str):  # noqa: ANN001, ANN202 - typer app, click Result
    return RUNNER.invoke(app, list(args), env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})


def _one_line_error(result) -> str:  # noqa: ANN001
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip() and "torch.distributed.run" not in ln]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "torch.distributed.run" not in result.output  # stopped before torchrun
    return lines[0]


def _shards(base: Path, **options: object) -> Path:
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.fno import synth_fno

    raw = synth_fno(base / "raw", n=6, frames=12, viscosity=1e-3, seed=0, resolution=16)
    ingest_files("fno", [raw[0]], base / "shards", IngestOptions(resolution=16, progress=False, **options))
    return base / "shards"


@pytest.fixture(scope="module")
def all_train(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default (reference) split of a small FNO file: every trajectory in train, none in test."""
    return _shards(tmp_path_factory.mktemp("all_train"))


@pytest.fixture(scope="module")
def canonical(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Canonical-convention shards with a test split."""
    return _shards(tmp_path_factory.mktemp("canonical"), convention="canonical", split=(0.5,))


def _no_checksum_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the checksum pass fail loudly: an error reported instead comes before it."""
    import dpot_train.run.launch as launch

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("the checksum pass ran before the name checks")

    monkeypatch.setattr(launch, "check_outputs", refuse)


# item 1: the evaluation split is checked before torchrun

def test_launch_without_a_test_split_says_what_to_do(all_train: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _no_checksum_pass(monkeypatch)
    line = _one_line_error(_run(train_app, "launch", "--manifest", str(all_train), "--out", str(tmp_path / "r"),
                                "--steps", "20", "--dry-run"))
    assert "no 'test' trajectories" in line and "fno-ns-v1e-3" in line and "train 6" in line
    assert "--split 0.8" in line and "--no-eval" in line
    assert not (tmp_path / "r").exists()


def test_launch_with_no_eval_trains_on_an_all_train_split(all_train: Path, tmp_path: Path) -> None:
    result = _run(train_app, "launch", "--manifest", str(all_train), "--out", str(tmp_path / "r"), "--steps", "20",
                  "--no-eval", "--dry-run")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["eval_at_end"] is False  # the run config --dry-run prints
    assert not (tmp_path / "r").exists()  # and writes nothing


def test_evaluate_without_the_split_says_what_to_do(all_train: Path, tmp_path: Path) -> None:
    line = _one_line_error(_run(train_app, "evaluate", str(GOLDEN), "--manifest", str(all_train),
                                "--out", str(tmp_path / "e.json")))
    assert "no 'test' trajectories" in line and "--split 0.8" in line and "another --split" in line
    assert not (tmp_path / "e.json").exists()


def test_ingest_warning_for_an_empty_test_split_says_what_to_do(tmp_path: Path) -> None:
    from dpot_data.synth.fno import synth_fno

    raw = synth_fno(tmp_path / "raw", n=4, frames=4, viscosity=1e-3, seed=0, resolution=16)
    result = _run(data_app, "ingest", "fno", str(raw[0]), "--out", str(tmp_path / "o"), "--no-progress")
    assert result.exit_code == 0, result.output
    warning = next(ln for ln in result.output.splitlines() if "no test trajectory" in ln)
    assert "--split 0.8" in warning and "--no-eval" in warning


# item 4: shipped configs by name

def test_shipped_configs_resolve_by_name_and_list_every_yaml() -> None:
    folder = ROOT / "dpot_train" / "configs"
    assert set(shipped_configs()) == {p.stem for p in folder.glob("*.yaml")} >= {"pretrain-ti", "demo"}
    assert find_config("pretrain-ti").resolve() == (folder / "pretrain-ti.yaml").resolve()
    assert find_config("pretrain-ti.yaml").resolve() == (folder / "pretrain-ti.yaml").resolve()
    with pytest.raises(ValueError, match=r"--config pretrain-tii: .*shipped: .*pretrain-ti"):
        find_config("pretrain-tii")
    with pytest.raises(ValueError, match=r"--config nothere/x.yaml: no such file"):
        find_config("nothere/x.yaml")


def test_launch_takes_a_shipped_config_by_name_and_a_path(canonical: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # not the checkout: the name must not depend on the working directory
    result = _run(train_app, "launch", "--config", "pretrain-ti", "--manifest", str(canonical), "--out", "r",
                  "--steps", "20", "--dry-run")
    assert result.exit_code == 0, result.output
    saved = yaml.safe_load(result.stdout)  # the run config --dry-run prints
    assert saved["batch_size"] == 160 and saved["model"] == "Ti" and saved["steps"] == 20
    own = tmp_path / "mine.yaml"
    own.write_text("batch_size: 4\n")
    result = _run(train_app, "launch", "--config", str(own), "--manifest", str(canonical), "--out", "r2",
                  "--steps", "20", "--dry-run")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["batch_size"] == 4
    line = _one_line_error(_run(train_app, "launch", "--config", "pretrain-tii", "--out", "r3"))
    assert "pretrain-ti" in line and "demo" in line


# item 5: messages that point the right way

def test_a_misspelled_source_names_the_sources(tmp_path: Path) -> None:
    line = _one_line_error(_run(data_app, "ingest", "fnoo", "f.mat", "--out", str(tmp_path / "o")))
    assert "fnoo" in line and "did you mean `dpot-data ingest fno`" in line
    assert all(s in line for s in ("pdebench", "pdearena", "cfdbench", "corpus"))
    assert not (tmp_path / "o").exists()
    line = _one_line_error(_run(data_app, "ingest", str(tmp_path / "missing.mat"), "--out", str(tmp_path / "o")))
    assert "missing.mat" in line and "not found" in line  # a path is still read as a file


def test_resume_without_a_run_says_there_is_none(tmp_path: Path) -> None:
    line = _one_line_error(_run(train_app, "launch", "--out", str(tmp_path / "R"), "--resume"))
    assert f"no run to resume at {tmp_path / 'R'}" in line


def test_a_mixture_typo_names_the_datasets_present_before_the_checksum_pass(
        canonical: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_checksum_pass(monkeypatch)
    line = _one_line_error(_run(train_app, "launch", "--manifest", str(canonical), "--out", str(tmp_path / "r"),
                                "--mixture", "fno-ns-v1e-4=1", "--dry-run"))
    assert "['fno-ns-v1e-4']" in line and "the manifests hold: ['fno-ns-v1e-3']" in line
    assert "did you mean 'fno-ns-v1e-3'" in line


def test_released_weights_on_another_convention_are_refused_before_the_checksum_pass(
        canonical: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_checksum_pass(monkeypatch)
    line = _one_line_error(_run(train_app, "launch", "--manifest", str(canonical), "--out", str(tmp_path / "r"),
                                "--init", str(GOLDEN), "--steps", "20", "--dry-run"))
    assert "'canonical' convention" in line and "--allow-convention-mismatch" in line


# item 6: closing lines

def test_a_finished_run_names_where_its_results_are() -> None:
    from dpot_train.run.worker import closing_lines

    text = closing_lines("runs/a/", 1200, evaluated=True)
    assert "results in runs/a/" in text and "step-00001200.pt" in text and "eval.json" in text
    assert "tensorboard --logdir runs/a/tb" in text
    assert "eval.json" not in closing_lines("runs/a", 5, evaluated=False)
    demo = (ROOT / "scripts" / "demo.sh").read_text()
    assert "tensorboard --logdir $OUT/run/tb" in demo and "eval.json" in demo.split("evaluate")[-1]


def test_skip_reasons_say_what_the_shared_folder_is(tmp_path: Path) -> None:
    from tests.conftest import require_shared

    with pytest.raises(pytest.skip.Exception) as skipped:
        require_shared(tmp_path / "shared")
    reason = str(skipped.value)
    assert "reference fixtures (the shared/ folder beside the checkout" in reason
    assert str(tmp_path / "shared") in reason and "golden-reference tests need it" in reason


# item 9: --help, --version, --dry-run

def test_help_shows_no_bool_noise_and_launch_shows_its_defaults() -> None:
    launch = _run(train_app, "launch", "--help").output
    assert "<bool>" not in launch and "[default: 1000]" in launch and "[default: tiny]" in launch
    assert re.search(r"--resume\s+Continue RUN_DIR", launch)
    ingest = _run(data_app, "ingest", "fno", "--help").output
    assert "<bool>" not in ingest and "--dry-run" in ingest
    assert "<bool>" not in _run(data_app, "--help").output


def test_version_comes_from_the_package_metadata() -> None:
    for app, prog in ((data_app, "dpot-data"), (train_app, "dpot-train")):
        result = _run(app, "--version")
        assert result.exit_code == 0 and result.output.strip() == f"{prog} {version('dpot')}"


def test_ingest_dry_run_writes_nothing_and_reports_the_plan(tmp_path: Path) -> None:
    from dpot_data.synth.fno import synth_fno

    raw = synth_fno(tmp_path / "raw", n=5, frames=6, viscosity=1e-3, seed=0, resolution=16)
    out = tmp_path / "out"
    result = _run(data_app, "ingest", "fno", str(raw[0]), "--out", str(out), "--dry-run", "--resolution", "32",
                  "--split", "0.8")
    assert result.exit_code == 0, result.output
    assert not out.exists()
    text = result.output
    assert str(raw[0]) in text and "source fno" in text and "dataset fno-ns-v1e-3" in text
    assert "5 trajectories of 6 frames" in text and "native grid 16x16" in text
    assert "5 trajectories x 6 frames x 4 channels (vorticity, pad1, pad2, pad3) x 32x32" in text
    assert "split train 4, test 1" in text
    expected = 5 * 6 * 4 * 32 * 32 * 4 + 5 * 32 * 32  # float32 fields and the uint8 mask
    assert f"({expected} bytes) per format" in text and "formats zarr, wds" in text
    # the estimate is close to what the ingest then writes
    assert _run(data_app, "ingest", "fno", str(raw[0]), "--out", str(out), "--resolution", "32", "--split", "0.8",
                "--no-progress").exit_code == 0
    written = sum(s["bytes"] for s in json.loads((out / "manifest.json").read_text())["datasets"][0]["shards"])
    assert abs(written - expected) < 0.1 * expected
    line = _one_line_error(_run(data_app, "ingest", "corpus", str(tmp_path / "raw"), "--out", str(tmp_path / "c"),
                                "--dry-run"))
    assert "--dry-run" in line and not (tmp_path / "c").exists()


def test_model_export_writes_the_released_format(tmp_path: Path) -> None:
    from dpot_train.core.checkpoint import checkpoint_payload, load_pretrained, load_state_dict_file
    from dpot_train.model import build_model

    model = build_model("tiny", img_size=32)
    ours = tmp_path / "step-00000001.pt"
    torch.save(checkpoint_payload(model, step=1), ours)
    result = _run(train_app, "model", "export", str(ours), "--out", str(tmp_path / "w.pth"))
    assert result.exit_code == 0, result.output
    saved = torch.load(tmp_path / "w.pth", weights_only=True)
    assert list(saved) == ["model", "recipe"] and load_state_dict_file(tmp_path / "w.pth")[1] is None
    again = load_pretrained(tmp_path / "w.pth")
    assert again.config == model.config
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
    line = _one_line_error(_run(train_app, "model", "export", str(tmp_path / "w.pth"), "--out", str(tmp_path / "x")))
    assert "already in the released format" in line
