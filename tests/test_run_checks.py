"""What a run trains and what an evaluation scores are what the user thinks: `--model` against the `--init` weights'
family, `--eval-every` without a validation split, best.pt missing or damaged, evaluation on channels, grids or
datasets the model was not trained on, a clamped `--rollout-steps`, and the one-line messages around them (a full
disk, a pruned checkpoint, a plain pickle, a refused launch that leaves no folder)."""

from __future__ import annotations

import errno
import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from dpot_train.core import checkpoint as C
from dpot_train.cli import app
from dpot_train.core.config import TrainConfig, save_config
from dpot_train.data.datasets import read_manifests
from dpot_train.model import build_model, families
from tests import train_runs

ROOT = Path(__file__).resolve().parents[1]
DATASET = "fno-ns-v1e-3"


# --- fixtures and helpers -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def no_valid_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The FNO shards of conftest's fno_train_shards, split into train and test only (no `valid` split)."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.fno import synth_fno

    base = tmp_path_factory.mktemp("novalid")
    files = synth_fno(base / "raw", n=8, frames=13, viscosity=1e-3, seed=0, resolution=32)
    ingest_files("fno", [files[0]], base / "shards", IngestOptions(resolution=32, split=(0.75,), seed=0))
    return base / "shards"


@pytest.fixture(scope="module")
def uv_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A u, v dataset (xarray NetCDF, 32x32, 4 channels with 2 padded): the same channel count as the FNO shards'
    vorticity (1 valid, 3 padded), other channels."""
    from dpot_data.cli import app as data_app
    from dpot_data.synth.gridded import write_netcdf

    base = tmp_path_factory.mktemp("uv")
    nc = write_netcdf(base / "raw", members=4, frames=13, ny=32, nx=32, land=False)
    r = CliRunner().invoke(data_app, ["ingest", "xarray", str(nc), "--out", str(base / "ocean"), "--split", "0.5",
                                      "--resolution", "32", "--no-progress"])
    assert r.exit_code == 0, r.output
    return base / "ocean"


def _weights(path: Path, family: str, ours: bool = True) -> Path:
    """A freshly initialised model of `family`'s test preset on the FNO shards' fields (32x32, 4 channels, 10 frames
    in): ours (with `config`) or the released format (a bare {'model': state_dict})."""
    fixed = dict(img_size=32, in_channels=4, out_channels=4, in_timesteps=10, out_timesteps=1, spatial_dims=2)
    torch.manual_seed(0)
    model = families.build(families.configure({"dpot": "tiny", "fno": "fno-tiny", "unet": "unet-tiny"}[family],
                                              fixed, {}))
    torch.save(C.checkpoint_payload(model) if ours else {"model": model.state_dict()}, path)
    return path


def _checkpoint(path: Path, trained: dict | None, grid: int = 32, step: int = 2) -> Path:
    """A training checkpoint of a tiny DPOT on a `grid` side, recording `trained` as its training data."""
    torch.manual_seed(0)
    model = build_model("tiny", img_size=grid)
    cfg = TrainConfig(out=str(path.parent.parent), steps=step).to_dict()
    payload = {**C.checkpoint_payload(model), "format": C.FORMAT, "train_config": cfg, "step": step}
    if trained is not None:
        payload[C.TRAINED_ON] = trained
    C.save_atomic(payload, path)
    return path


def _record(shards: Path, name: str | None = None, shape: list[int] | None = None) -> dict:
    """data_record of the shards' dataset, renamed and with another stored grid when asked."""
    (rec,) = C.data_record(read_manifests([str(shards)])).values()
    return {name or DATASET: {**rec, **({"shape": shape} if shape else {})}}


def _evaluate(ckpt: Path, shards: Path, out: Path, *extra: str) -> tuple[int, list[str]]:
    r = CliRunner().invoke(app, ["evaluate", str(ckpt), "--manifest", str(shards), "--out", str(out), "--device",
                                 "cpu", *extra])
    return r.exit_code, [ln for ln in r.output.splitlines() if ln.strip()]


def _launch(shards: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """A real `launch` (a check that fails to refuse would train: --steps 1, no evaluation)."""
    return train_runs.run(train_runs.launch_args(shards, out, "--no-eval", *extra, steps=1, nproc=1), timeout=300)


def _one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "dpot_train.run.torchrun" not in r.stdout + r.stderr  # refused before torchrun
    return lines[0]


# --- A: --model against the family of the --init weights ----------------------------------------------------------

@pytest.mark.parametrize("model, family, label, named", [("unet", "dpot", "DPOT", "UNet"),
                                                          ("fno", "unet", "UNet", "FNO")])
def test_a_model_of_another_family_than_the_init_weights_is_refused(fno_train_shards: Path, tmp_path: Path,
                                                                    model: str, family: str, label: str,
                                                                    named: str) -> None:
    init = _weights(tmp_path / f"{family}.pth", family, ours=False)
    out = tmp_path / "runs" / "a"
    line = _one_error_line(_launch(fno_train_shards, out, "--model", model, "--init", str(init)))
    presets = ", ".join(families.FAMILIES[family].presets)
    assert line == (f"error: --model {model}: names a {named} preset, but --init {init} holds {label} weights, "
                    f"which decide what trains; expected a preset of that family ({presets}), or drop --model")
    assert not (tmp_path / "runs").exists()  # nothing in --out, nor the folder above it that launch would create


def test_a_config_file_model_of_another_family_is_refused_naming_the_file(fno_train_shards: Path,
                                                                          tmp_path: Path) -> None:
    config = tmp_path / "ft.yaml"
    config.write_text("model: Ti\n", encoding="utf-8")
    init = _weights(tmp_path / "fno.pth", "fno")
    r = CliRunner().invoke(app, ["launch", "--manifest", str(fno_train_shards), "--config", str(config), "--init",
                                 str(init), "--out", str(tmp_path / "run"), "--dry-run"])
    assert r.exit_code == 2
    assert r.output.strip().startswith(f"error: {config}: model Ti: names a DPOT preset, but --init {init} holds FNO "
                                       "weights"), r.output


@pytest.mark.parametrize("family, preset", [("fno", "fno-tiny"), ("unet", "unet-tiny"), ("dpot", "tiny")])
def test_without_model_the_run_records_the_family_of_the_init_weights(fno_train_shards: Path, tmp_path: Path,
                                                                      family: str, preset: str) -> None:
    init = _weights(tmp_path / f"{family}.pt", family)
    r = CliRunner().invoke(app, ["launch", "--manifest", str(fno_train_shards), "--init", str(init), "--steps", "4",
                                 "--device", "cpu", "--out", str(tmp_path / "run"), "--dry-run"])
    assert r.exit_code == 0, r.output
    config = yaml.safe_load(r.stdout)  # what config.yaml would hold
    assert config["model"] == preset and config["init"] == str(init)


# --- B: evaluation on other channels, another grid, another dataset; a clamped rollout ----------------------------

def test_channels_the_model_was_not_trained_on_are_refused(fno_train_shards: Path, uv_shards: Path,
                                                           tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "run" / "checkpoints" / "step-00000002.pt", _record(fno_train_shards))
    code, lines = _evaluate(ckpt, uv_shards, tmp_path / "eval.json")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {ckpt}: dataset 'ocean' ({uv_shards / 'manifest.json'}) has channels u, v; "
                               f"the model was trained on {DATASET} with channel 0 = vorticity, never 'u': expected "
                               "data of the model's channels"), lines
    assert not (tmp_path / "eval.json").exists()
    export = tmp_path / "exported.pth"  # the export keeps the record: refused the same way
    assert CliRunner().invoke(app, ["model", "export", str(ckpt), "--out", str(export)]).exit_code == 0
    code, lines = _evaluate(export, uv_shards, tmp_path / "eval.json")
    assert code == 2 and lines[0].startswith(f"error: {export}: dataset 'ocean' "), lines


def test_a_dataset_ingested_since_with_other_channels_is_refused(fno_train_shards: Path, tmp_path: Path) -> None:
    record = _record(fno_train_shards)
    record[DATASET]["channels"] = ["u", "pad1", "pad2", "pad3"]
    ckpt = _checkpoint(tmp_path / "c" / "checkpoints" / "step-00000002.pt", record)
    code, lines = _evaluate(ckpt, fno_train_shards, tmp_path / "eval.json")
    assert code == 2 and len(lines) == 1, lines
    assert f"dataset '{DATASET}'" in lines[0] and "has channels vorticity" in lines[0]
    assert "the model was trained on it with u" in lines[0], lines


def _notes(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith("note: ")]


def test_another_grid_another_dataset_and_a_clamped_rollout_are_each_named(fno_train_shards: Path,
                                                                           tmp_path: Path) -> None:
    # a model trained on 64x64 grids of another dataset with the same channels, scored on 32x32 shards, 50 steps asked
    ckpt = _checkpoint(tmp_path / "r" / "checkpoints" / "step-00000002.pt",
                       _record(fno_train_shards, name="fno-ns-v1e-4", shape=[64, 64]), grid=64)
    code, lines = _evaluate(ckpt, fno_train_shards, tmp_path / "eval.json", "--rollout-steps", "50")
    assert code == 0, lines
    expected = [f"dataset '{DATASET}' was not in the model's training data (fno-ns-v1e-4); scored as new data",
                f"the model was trained on a 64x64 grid; dataset '{DATASET}' is scored on its 32x32 grid, the "
                "positional embedding resampled; --res 64 resizes it to the trained grid",
                f"--rollout-steps 50: dataset '{DATASET}' has 13 frames, 10 of them inputs; rolled out 3 steps"]
    assert _notes(lines) == [f"note: {n}" for n in expected]
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["notes"] == expected and result["datasets"][DATASET]["rollout_steps"] == 3

    code, lines = _evaluate(ckpt, fno_train_shards, tmp_path / "eval2.json", "--rollout-steps", "2", "--res", "64")
    assert code == 0 and _notes(lines)[1:] == [], lines  # the trained grid, a rollout that fits: only the dataset


def test_the_data_a_model_was_trained_on_gets_no_note(fno_train_shards: Path, tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path / "r" / "checkpoints" / "step-00000002.pt", _record(fno_train_shards))
    code, lines = _evaluate(ckpt, fno_train_shards, tmp_path / "eval.json", "--rollout-steps", "3")
    assert code == 0 and _notes(lines) == [], lines
    assert "notes" not in json.loads((tmp_path / "eval.json").read_text())


# --- C: --eval-every without a validation split; best.pt missing ----------------------------------------------------

def test_eval_every_without_a_valid_split_is_refused_before_torchrun(no_valid_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "v"
    line = _one_error_line(_launch(no_valid_shards, out, "--eval-every", "1"))
    assert line == (f"error: --eval-every 1: no 'valid' trajectories to validate on in dataset(s) '{DATASET}' "
                    f"({no_valid_shards / 'manifest.json'}: train 6, test 2); re-ingest with a validation split "
                    "(`dpot-data ingest ... --split TRAIN,VALID --overwrite`, e.g. --split 0.8,0.1: 80% train, 10% "
                    "valid, the rest test), or drop --eval-every")
    assert not (tmp_path / "runs").exists()


def test_the_readme_flow_makes_a_validation_split_where_it_uses_eval_every() -> None:
    from tests.test_readme_path import SECTIONS, bash_blocks

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    script = "\n".join(b for h in SECTIONS for b in bash_blocks(text, h))
    ingest = re.search(r"dpot-data ingest fno .* --out shards .*--split (\S+)", script)
    launch = re.search(r"dpot-train launch --manifest shards [^\n]*\\\n\s+--eval-every \d+", script)
    assert ingest and len(ingest.group(1).split(",")) == 2, "the README's shards have no validation split"
    assert launch and ingest.start() < launch.start()


def _run_dir(tmp_path: Path, eval_every: int, steps: list[int], keep: int = 3) -> Path:
    run = tmp_path / "run"
    for step in steps:
        _checkpoint(C.checkpoint_path(run / "checkpoints", step), None, step=step)
    save_config(TrainConfig(out=str(run), eval_every=eval_every, keep_checkpoints=keep), run / "config.yaml")
    return run


@pytest.mark.parametrize("every, steps, why", [
    (0, [2], "the run had no --eval-every, so it keeps no best.pt"),
    (4, [2], "no validation finished yet (--eval-every 4: the first at step 4)"),
])
def test_a_missing_best_pt_says_why(fno_train_shards: Path, tmp_path: Path, every: int, steps: list[int],
                                    why: str) -> None:
    run = _run_dir(tmp_path, every, steps)
    best = run / "checkpoints" / "best.pt"
    code, lines = _evaluate(best, fno_train_shards, tmp_path / "eval.json")
    assert code == 2 and lines == [f"error: {best}: no such file: {why}; beside it: step-00000002.pt"], lines


# --- D: a damaged best.pt set aside, a broken best.json named -------------------------------------------------------

def _best(ckpt_dir: Path, step: int, score: float) -> Path:
    """best.pt (a validation record inside) and best.json, as validate_and_keep_best writes them."""
    from dpot_train.train.validation import BEST_NAME, BEST_RECORD, METRIC, VALID_SPLIT

    record = {"step": step, "score": score, "split": VALID_SPLIT, "metric": METRIC}
    torch.manual_seed(step)
    C.save_atomic(C.checkpoint_payload(build_model("tiny", img_size=32), step=step, validation=record),
                  ckpt_dir / BEST_NAME)
    (ckpt_dir / BEST_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")
    return ckpt_dir / BEST_NAME


def _damage(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    return bytes(data)


def test_a_damaged_best_pt_is_set_aside_on_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpot_train.run.launch import check_run_dir

    run = _run_dir(tmp_path, 2, [2])
    ckpt_dir = run / "checkpoints"
    damaged = _damage(_best(ckpt_dir, 2, 0.5))
    check_run_dir(TrainConfig(out=str(run), eval_every=2), resume=True)
    assert not (ckpt_dir / "best.pt").exists() and not (ckpt_dir / "best.json").exists()
    assert (ckpt_dir / "best.pt.damaged").read_bytes() == damaged
    assert C.record_path(ckpt_dir / "best.pt.damaged").is_file()
    assert json.loads((ckpt_dir / "best.pt.damaged.json").read_text())["score"] == 0.5
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"warning: {ckpt_dir / 'best.pt'} does not load (damaged: "), err
    assert "kept as best.pt.damaged; the next validation writes a new best.pt" in err[0]


def test_a_damaged_best_pt_at_the_final_evaluation_is_set_aside_and_the_last_weights_scored(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpot_train.train.validation import load_best

    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    _damage(_best(ckpt_dir, 4, 0.25))
    model = build_model("tiny", img_size=32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert load_best(model, ckpt_dir) is None  # the caller scores the last checkpoint
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert (ckpt_dir / "best.pt.damaged").is_file() and not (ckpt_dir / "best.pt").exists()
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].endswith("kept as best.pt.damaged; the final evaluation scores the last "
                                             "checkpoint"), err


def test_a_broken_best_json_is_named_and_rebuilt_from_best_pt(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from dpot_train.train.validation import best_record

    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    _best(ckpt_dir, 6, 0.125)
    (ckpt_dir / "best.json").write_text('{"step": 6, "sco', encoding="utf-8")  # cut by a crash, or edited
    record = best_record(ckpt_dir)
    assert record is not None and record["step"] == 6 and record["score"] == 0.125
    assert json.loads((ckpt_dir / "best.json").read_text()) == record
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith(f"warning: {ckpt_dir / 'best.json'}: cannot be read ("), err
    assert err[0].endswith("rebuilt from best.pt's own record (step 6, score 0.125)")
    assert best_record(ckpt_dir) == record and capsys.readouterr().err == ""  # once
    (ckpt_dir / "best.pt").unlink()
    (ckpt_dir / "best.json").write_text("[]", encoding="utf-8")
    assert best_record(ckpt_dir) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("the next validation writes best.pt and best.json anew"), err


# --- E: messages --------------------------------------------------------------------------------------------------

def test_a_full_disk_while_writing_eval_json_names_the_file(fno_train_shards: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import dpot_format.io

    ckpt = _checkpoint(tmp_path / "r" / "checkpoints" / "step-00000002.pt", None)
    out = tmp_path / "results" / "eval.json"

    def full(path: object, data: bytes) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dpot_format.io, "atomic_write", full)
    code, lines = _evaluate(ckpt, fno_train_shards, out, "--rollout-steps", "1")
    assert code == 2
    errors = [ln for ln in lines if ln.startswith("error")]
    assert errors == [f"error: {out}: the results could not be written (no space left on the device holding "
                      f"{out.parent}); no partial file was left: free space there (or write elsewhere) and run "
                      "again"], lines
    assert not out.exists()


def test_a_refused_launch_leaves_no_folder_behind(fno_train_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs" / "b"
    args = train_runs.launch_args(fno_train_shards, out, "--batch-size", "3", steps=1, nproc=2)
    line = _one_error_line(train_runs.run(args, timeout=300))  # refused once RUN_DIR is locked
    assert line == "error: --batch-size 3 (global) must be divisible by the 2 processes"
    assert not (tmp_path / "runs").exists()


def test_model_info_of_a_pruned_checkpoint_says_so_and_names_those_beside_it(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, 0, [3, 4, 5])
    gone = C.checkpoint_path(run / "checkpoints", 1)
    r = CliRunner().invoke(app, ["model", "info", str(gone)])
    assert r.exit_code == 2
    assert r.output.strip() == (f"error: {gone}: no such file: pruned? a run keeps its newest 3 checkpoints "
                                "(keep_checkpoints); beside it: step-00000003.pt, step-00000004.pt, "
                                "step-00000005.pt")


def test_a_plain_pickle_is_one_line_without_torch_warnings(tmp_path: Path) -> None:
    path = tmp_path / "weights.pkl"
    path.write_bytes(pickle.dumps({"model": {"w": [1.0, 2.0]}}, protocol=4))
    r = subprocess.run([sys.executable, "-m", "dpot_train", "model", "info", str(path)], capture_output=True,
                       text=True, timeout=120, env=train_runs.env(), cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"error: {path}: not a checkpoint: a plain Python pickle (written by "
                                     "pickle.dump), expected a file written by torch.save (a zip archive holding "
                                     "data.pkl, or its legacy pickle format)"]


def test_torch_legacy_files_are_not_taken_for_plain_pickles(tmp_path: Path) -> None:
    state = {"w": torch.arange(3.0)}
    path = tmp_path / "legacy.pt"
    torch.save({"model": state}, path, _use_new_zipfile_serialization=False)
    assert torch.equal(C.read_checkpoint(path)["model"]["w"], state["w"])
    torch.save({"model": state}, path, _use_new_zipfile_serialization=False, pickle_protocol=4)
    with open(path, "rb") as fh:
        assert C.not_a_torch_file(fh) is None  # torch's own legacy format, whatever its pickle protocol


# --- a trained run records its data -------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_trained_run_records_its_data_and_evaluate_names_what_differs(fno_train_shards: Path,
                                                                        tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = train_runs.run(train_runs.launch_args(fno_train_shards, run, "--eval-every", "2", "--rollout-steps", "1",
                                              "--ckpt-every", "1", steps=4, nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    expected = _record(fno_train_shards)
    for name in ("step-00000004.pt", "best.pt"):
        assert C.trained_on(C.read_checkpoint(run / "checkpoints" / name)) == expected, name
    pruned = run / "checkpoints" / "step-00000001.pt"  # keep_checkpoints 3 of steps 1..4
    line = CliRunner().invoke(app, ["model", "info", str(pruned)]).output.strip()
    assert line == (f"error: {pruned}: no such file: pruned? a run keeps its newest 3 checkpoints (keep_checkpoints); "
                    "beside it: step-00000002.pt, step-00000003.pt, step-00000004.pt, best.pt")
    code, lines = _evaluate(run / "checkpoints" / "best.pt", fno_train_shards, tmp_path / "eval.json",
                            "--rollout-steps", "9")
    assert code == 0 and _notes(lines) == [f"note: --rollout-steps 9: dataset '{DATASET}' has 13 frames, 10 of them "
                                           "inputs; rolled out 3 steps"], lines
