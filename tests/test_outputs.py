"""The one output rule (dpot_format.output) on every writer: nothing lost, nothing read or written outside.

A predictions store over a dataset's own store is refused and the dataset still verifies; devices and FIFOs stay
what they are under `report --out` and `model export --out`; links in a plot folder are not followed and a user's
file named like a plot is not overwritten; `--predictions LINK` is refused before evaluating; what a killed write
left beside its target (`.NAME.tmp-<pid>`, its process gone) is removed by the next write; an ingest that fails with
an error leaves no staging folder."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpot_format.output import OutputError, check_store, pid_alive
from dpot_train.core.checkpoint import checkpoint_payload
from dpot_train.cli import app
from dpot_train.model import build_model
from tests.toy_output import write_fno_raw


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped): what a killed writer's temporary name carries."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not pid_alive(proc.pid)
    return proc.pid


def _one_line(result) -> str:  # noqa: ANN001 - click Result
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _checkpoint(path: Path, img_size: int = 32) -> Path:
    """One of our checkpoints of a tiny DPOT (4 channels) in the layout `model export` and `evaluate` read."""
    torch.manual_seed(0)
    torch.save(checkpoint_payload(build_model("tiny", img_size=img_size), step=1), path)
    return path


def _evaluate(ckpt: Path, shards: Path, out: Path, *extra: str):  # noqa: ANN202 - click Result
    return CliRunner().invoke(app, ["evaluate", str(ckpt), "--manifest", str(shards), "--out", str(out),
                                    "--recipe", "dpot", "--rollout-steps", "2", "--device", "cpu", *extra])


def _eval_json(path: Path) -> Path:
    path.write_text(json.dumps({"schema": "dpot-eval/2", "split": "test", "t_in": 10, "recipe": "dpot", "datasets": {
        "fno-ns-v1e-3": {"trajectories": 2, "rollout_steps": 2,
                         "model": {"rollout_l2re": 0.1, "one_step_l2re": 0.05, "l2re_per_step": [0.05, 0.1]},
                         "persistence": {"rollout_l2re": 0.2, "one_step_l2re": 0.1}}}}))
    return path


# --- 1: a predictions store is never written over a dataset ---------------------------------------------------------

def test_predictions_over_a_dataset_store_is_refused_and_the_dataset_still_verifies(fno_train_shards: Path,
                                                                                   tmp_path: Path) -> None:
    from dpot_data.cli import app as data_app

    shards = tmp_path / "shards"
    shutil.copytree(fno_train_shards, shards)
    ckpt = _checkpoint(tmp_path / "ck.pt")
    line = _one_line(_evaluate(ckpt, shards, tmp_path / "e.json", "--predictions", str(shards / "data.zarr")))
    assert line == (f"error: --predictions {shards / 'data.zarr'}: lies inside the ingest output {shards.resolve()} "
                    "(it holds manifest.json); expected a path outside it")
    assert not (tmp_path / "e.json").exists()
    verified = CliRunner().invoke(data_app, ["verify", str(shards)])
    assert verified.exit_code == 0, verified.output


def _store(path: Path, written_by: str | None) -> Path:
    import zarr

    root = zarr.open_group(str(path), mode="w")
    if written_by is not None:
        root.attrs["dpot"] = {"written_by": written_by}
    root.create_array("a", shape=(2,), dtype="f4")[:] = np.ones(2, dtype=np.float32)
    return path


def test_a_store_is_replaced_only_when_dpot_wrote_it_and_it_holds_nothing_else(tmp_path: Path) -> None:
    from dpot_train.evaluation.predictions import WRITTEN_BY, PredictionWriter

    ours = _store(tmp_path / "ours.zarr", WRITTEN_BY)
    assert check_store(ours, "--predictions", WRITTEN_BY) == ours  # a store of ours, holding only Zarr's files
    (ours / "notes.txt").write_text("the user's")
    with pytest.raises(OutputError) as caught:
        PredictionWriter(ours)
    assert str(caught.value) == (f"--predictions {ours}: holds notes.txt, which `{WRITTEN_BY}` does not write; move "
                                 "it out or name a new path (the store is replaced whole)")
    other = _store(tmp_path / "other.zarr", None)  # a Zarr store of someone else's
    with pytest.raises(OutputError, match="exists and is not a store `dpot-train evaluate --predictions` wrote"):
        PredictionWriter(other)
    assert (ours / "notes.txt").read_text() == "the user's" and (other / "zarr.json").is_file()


# --- 2: devices and FIFOs stay what they are ------------------------------------------------------------------------

def _specials(folder: Path) -> list[tuple[Path, str, int]]:
    fifo = folder / "fifo.md"  # a name `report --out` takes (.md), so that the rule is what refuses it
    os.mkfifo(fifo)
    found = [(fifo, "a FIFO (named pipe)", stat.S_IFIFO)]
    if os.geteuid() == 0:  # a device node of our own (the one /dev/null is): only root may make it
        null = folder / "null.md"
        os.mknod(null, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        found.append((null, "a character device", stat.S_IFCHR))
    return found


def test_report_and_model_export_leave_a_device_and_a_fifo_as_they_are(tmp_path: Path) -> None:
    ev = _eval_json(tmp_path / "eval.json")
    ckpt = _checkpoint(tmp_path / "ck.pt", img_size=16)
    specials = _specials(tmp_path)
    for target, what, kind in specials:
        for args in (["report", str(ev), "--out", str(target)], ["model", "export", str(ckpt), "--out", str(target)]):
            line = _one_line(CliRunner().invoke(app, args))
            assert line == (f"error: --out {target}: is {what}; expected a regular file or a new name (dpot writes "
                            "neither through a link nor onto a special file)")
            assert stat.S_IFMT(os.lstat(target).st_mode) == kind, args
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ck.pt", "eval.json", *(t.name for t, _, _ in
                                                                                          specials)])


# --- 6: links and the user's files in the plot folder, --predictions LINK --------------------------------------------

@pytest.mark.parametrize("kind", ["link", "file"])
def test_a_link_or_a_users_file_named_like_a_plot_is_refused_before_evaluating(fno_train_shards: Path,
                                                                               tmp_path: Path, kind: str) -> None:
    plots, outside = tmp_path / "plots", tmp_path / "outside.txt"
    plots.mkdir()
    outside.write_text("kept")
    named = plots / "fno-ns-v1e-3_error.png"
    if kind == "link":
        named.symlink_to(outside)
        what = f"is a symbolic link (to {str(outside)!r}), not a file dpot wrote"
    else:
        named.write_text("my own picture")
        what = "exists and was not written by dpot (it bears no dpot mark)"
    line = _one_line(_evaluate(_checkpoint(tmp_path / "ck.pt"), fno_train_shards, tmp_path / "e.json",
                               "--plot", str(plots)))
    assert line == f"error: --plot {named}: {what}; move it away or choose another folder" + (
        "" if kind == "link" else ": dpot does not overwrite it")
    assert outside.read_text() == "kept" and not (tmp_path / "e.json").exists()
    assert os.path.islink(named) if kind == "link" else named.read_text() == "my own picture"
    assert sorted(p.name for p in plots.iterdir()) == [named.name]  # nothing drawn, no scratch store left


def test_predictions_link_and_plot_file_are_refused_before_evaluating(fno_train_shards: Path, tmp_path: Path) -> None:
    ckpt, outside = _checkpoint(tmp_path / "ck.pt"), tmp_path / "elsewhere"
    outside.mkdir()
    link = tmp_path / "preds.zarr"
    link.symlink_to(outside)
    line = _one_line(_evaluate(ckpt, fno_train_shards, tmp_path / "e.json", "--predictions", str(link)))
    assert line == (f"error: --predictions {link}: is a symbolic link (to {str(outside)!r}); expected a new path or a "
                    "store `dpot-train evaluate --predictions` wrote")
    assert list(outside.iterdir()) == [] and os.path.islink(link)
    line = _one_line(_evaluate(ckpt, fno_train_shards, tmp_path / "e.json", "--plot", str(ckpt)))
    assert line == f"error: --plot {ckpt}: is a regular file; expected a folder or a new name"
    assert not (tmp_path / "e.json").exists()


def test_a_second_evaluation_replaces_its_own_pictures_and_store_and_follows_no_link(fno_train_shards: Path,
                                                                                    tmp_path: Path) -> None:
    import xarray as xr

    ckpt, plots, store, outside = _checkpoint(tmp_path / "ck.pt"), tmp_path / "plots", tmp_path / "p.zarr", \
        tmp_path / "outside.png"
    plots.mkdir()
    outside.write_bytes(b"kept")
    (plots / "notes.png").symlink_to(outside)  # a link of the user's, named like no picture: left alone
    for _ in range(2):
        r = _evaluate(ckpt, fno_train_shards, tmp_path / "e.json", "--plot", str(plots), "--predictions", str(store))
        assert r.exit_code == 0, r.output
    assert outside.read_bytes() == b"kept" and os.path.islink(plots / "notes.png")
    names = sorted(p.name for p in plots.iterdir())
    assert names == ["fno-ns-v1e-3_error.png", "fno-ns-v1e-3_fields.png", "fno-ns-v1e-3_spectrum.png", "notes.png"]
    assert all(b"dpot-train evaluate --plot" in (plots / n).read_bytes()[:4096] for n in names[:3])
    assert xr.open_zarr(str(store), group="fno-ns-v1e-3")["prediction"].shape[:2] == (2, 2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_plot_folder_that_is_an_existing_file_is_one_line(tmp_path: Path) -> None:
    existing = tmp_path / "plots"
    existing.write_text("a file")
    r = CliRunner().invoke(app, ["evaluate", str(tmp_path / "none.pt"), "--manifest", str(tmp_path), "--out",
                                 str(tmp_path / "e.json"), "--plot", str(existing)])
    assert _one_line(r) == f"error: --plot {existing}: is a regular file; expected a folder or a new name"
    assert existing.read_text() == "a file"


# --- 8: what a killed write left is removed by the next write -------------------------------------------------------

def test_leftovers_of_a_killed_predictions_write_are_removed_by_the_next_one(tmp_path: Path) -> None:
    from dpot_train.evaluation.predictions import PredictionWriter

    dead, alive = _dead_pid(), os.getppid()
    store = tmp_path / "preds.zarr"
    for name in (f".preds.zarr.tmp-{dead}", f".preds.zarr.tmp-{dead}-old", f".preds.zarr.tmp-{alive}"):
        (tmp_path / name / "g").mkdir(parents=True)
        (tmp_path / name / "zarr.json").write_text("{}")
    (tmp_path / f".other.zarr.tmp-{dead}").mkdir()  # another target's: not this write's to remove
    PredictionWriter(store)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".other.zarr.tmp-{dead}", f".preds.zarr.tmp-{alive}"]


def test_leftovers_of_a_killed_checkpoint_write_go_with_the_next_checkpoint(tmp_path: Path) -> None:
    from dpot_train.core import checkpoint as C

    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    dead, alive = _dead_pid(), os.getppid()
    left = [f".step-00000004.pt.tmp-{dead}", f".step-00000004.pt.sha256.tmp-{dead}", f".best.pt.tmp-{dead}"]
    for name in [*left, f".step-00000008.pt.tmp-{alive}"]:
        (ckpts / name).write_bytes(b"partial")
    model = build_model("tiny", img_size=16, embed_dim=16, depth=1)
    path = C.checkpoint_path(ckpts, 6)  # what rank 0 does at a checkpoint of the resumed run: write, then prune
    C.save_atomic({**checkpoint_payload(model), "format": C.FORMAT, "step": 6}, path)
    C.prune(ckpts, 3)
    assert sorted(p.name for p in ckpts.iterdir()) == [f".step-00000008.pt.tmp-{alive}", "step-00000006.pt",
                                                        "step-00000006.pt.sha256"]


def test_leftovers_of_a_killed_report_and_plot_write_are_removed(tmp_path: Path) -> None:
    from dpot_train.evaluation.plots import check_plot_folder

    dead = _dead_pid()
    (tmp_path / f".report.md.tmp-{dead}").write_text("partial")
    r = CliRunner().invoke(app, ["report", str(_eval_json(tmp_path / "eval.json")), "--out",
                                 str(tmp_path / "report.md")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json", "report.md"]
    plots = tmp_path / "plots"
    (plots / f".dpot-predictions.tmp-{dead}-x1y2" / "predictions.zarr").mkdir(parents=True)
    (plots / f".d_fields.png.tmp-{dead}").write_bytes(b"partial")
    (plots / f".mine.tmp-{dead}").write_bytes(b"not a picture's temporary")
    check_plot_folder(plots)  # what `evaluate --plot` runs before evaluating
    assert sorted(p.name for p in plots.iterdir()) == [f".mine.tmp-{dead}"]


def test_an_ingest_that_fails_with_an_error_leaves_no_staging(tmp_path: Path, monkeypatch) -> None:
    import dpot_data.ingest.journal as jn
    from dpot_data.ingest import IngestOptions, run_ingest

    raw = write_fno_raw(tmp_path / "raw", n=4, res=16, frames=4)
    out = tmp_path / "out"
    original = jn.Journal.record

    def record(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        original(self, *args, **kwargs)
        raise ValueError("an error after the first block was staged")

    monkeypatch.setattr(jn.Journal, "record", record)
    with pytest.raises(ValueError, match="after the first block"):
        run_ingest("fno", [raw], out, IngestOptions(resolution=0, workers=1, command="test", split=(0.5, 0.25)))
    assert not out.exists() or [p.name for p in out.iterdir() if p.name.startswith(".staging-")] == []


def test_a_staging_name_that_is_a_link_or_a_users_folder_is_refused_and_left_alone(tmp_path: Path) -> None:
    from dpot_data.errors import InputError
    from dpot_data.ingest import IngestOptions, run_ingest

    raw = write_fno_raw(tmp_path / "raw", n=4, res=16, frames=4)
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    out.mkdir()
    (out / ".staging-toy").symlink_to(elsewhere)
    opts = IngestOptions(resolution=0, workers=1, command="test", name="toy", split=(0.5, 0.25))
    with pytest.raises(InputError) as caught:
        run_ingest("fno", [raw], out, opts)
    assert str(caught.value) == (f"{out / '.staging-toy'}: is a symbolic link (to {str(elsewhere)!r}); expected a "
                                 "folder or a new name")
    assert list(elsewhere.iterdir()) == [] and not (out / "manifest.json").exists()
    (out / ".staging-toy").unlink()
    (out / ".staging-toy").mkdir()
    (out / ".staging-toy" / "notes.txt").write_text("the user's")
    with pytest.raises(InputError, match="exists and is not a staging folder of dpot-data ingest"):
        run_ingest("fno", [raw], out, opts)
    assert (out / ".staging-toy" / "notes.txt").read_text() == "the user's"


def test_inspect_plot_through_a_link_is_refused_and_writes_nothing_outside(fno_train_shards: Path,
                                                                           tmp_path: Path) -> None:
    from dpot_data.cli import app as data_app

    outside, link = tmp_path / "outside.png", tmp_path / "frames.png"
    outside.write_bytes(b"kept")
    link.symlink_to(outside)
    r = CliRunner().invoke(data_app, ["inspect", str(fno_train_shards), "--plot", str(link)])
    assert _one_line(r) == (f"error: --plot {link}: is a symbolic link (to {str(outside)!r}); expected a regular "
                            "file or a new name (dpot writes neither through a link nor onto a special file)")
    assert outside.read_bytes() == b"kept" and os.path.islink(link)


def test_no_output_goes_into_an_ingest_output_or_a_runs_own_files(fno_train_shards: Path, tmp_path: Path) -> None:
    from dpot_format.output import check_file

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("steps: 2\n")
    ckpt = _checkpoint(tmp_path / "ck.pt", img_size=16)
    for target, why in ((fno_train_shards / "manifest.json", f"lies inside the ingest output {fno_train_shards}"),
                        (run / "config.yaml", f"is part of the run {run} (its config.yaml"),
                        (run / "checkpoints" / "w.pth", f"is part of the run {run} (its checkpoints")):
        r = CliRunner().invoke(app, ["model", "export", str(ckpt), "--out", str(target)])
        assert _one_line(r).startswith(f"error: --out {target}: {why}")
    assert (run / "config.yaml").read_text() == "steps: 2\n" and not (run / "checkpoints" / "w.pth").exists()
    assert check_file(run / "report.md") == run / "report.md"  # a new file of the user's beside the run's own
