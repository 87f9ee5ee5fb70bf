"""The loader benchmark compares like with like: the DPOT-style baseline and our stream deliver the same windows
(same trajectory, same start frame) up to float rounding; both benchmark scripts run and end with their JSON line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import loader as bench_loader  # noqa: E402
import loop_bound as bench_loop  # noqa: E402
import paper_table as bench_paper  # noqa: E402
import train_step as bench_step  # noqa: E402
from reference_loader import ReferenceWindows, pad_data  # noqa: E402

from dpot_train.core.config import DataConfig  # noqa: E402
from dpot_train.data.prepare import prepare_stream  # noqa: E402
from dpot_train.data.stream import EpochPlans, make_sample  # noqa: E402
from dpot_train.data.windows import split_window, to_model_layout  # noqa: E402

SMALL = ["--trajectories", "3", "--frames", "12", "--native", "32"]


@pytest.fixture(scope="module")
def bench_data(tmp_path_factory: pytest.TempPathFactory) -> bench_loader.BenchData:
    return bench_loader.make_data(tmp_path_factory.mktemp("bench"), trajectories=3, frames=12, native=32)


def _reference(data: bench_loader.BenchData) -> ReferenceWindows:
    return ReferenceWindows(data.reference, data.trajectories, res=128, n_channels=4, t_in=10, t_out=1)


@pytest.mark.parametrize("backend", ["webdataset", "zarr"])
def test_reader_windows_equal_reference_windows(bench_data: bench_loader.BenchData, backend: str) -> None:
    spec, reader = prepare_stream(DataConfig(manifests=[str(bench_data.manifest)], backend=backend),
                                  seed=0, verify=False)
    ref = _reference(bench_data)
    refs = spec.refs[0]
    assert sorted(r.index for r in refs) == [0, 1, 2]
    for r in refs:
        for t0 in (0, 1):
            fields, _ = reader.read(r, t0, 11)
            x, y = split_window(to_model_layout(fields, spec.datasets[0].model_layout), 10)
            rx, ry = (a.numpy() for a in ref.window(r.index, t0))
            assert x.shape == rx.shape == (128, 128, 10, 4) and y.shape == ry.shape == (128, 128, 1, 4)
            # same bilinear upsampling, applied along (y, x) at ingest and along (x, y) by the baseline
            np.testing.assert_allclose(x, rx, rtol=0, atol=2e-6)
            np.testing.assert_allclose(y, ry, rtol=0, atol=2e-6)
            assert np.all(x[..., 2:] == 1.0) and np.all(rx[..., 2:] == 1.0)  # both pad channels 2, 3 with 1
            assert np.abs(x[..., :2] - 1.0).max() > 0.1  # the data channels are not padding


def test_stream_samples_are_reference_windows_at_their_start(bench_data: bench_loader.BenchData) -> None:
    spec, reader = prepare_stream(DataConfig(manifests=[str(bench_data.manifest)]), seed=3, verify=False)
    plans, ref = EpochPlans(spec), _reference(bench_data)
    starts = set()
    for position in range(6):
        k, tref, _ = plans.lookup(position)
        s = make_sample(spec, reader, k, tref, position)
        rx, ry = ref.window(tref.index, s["t0"])
        np.testing.assert_allclose(s["x"], rx.numpy(), rtol=0, atol=2e-6)
        np.testing.assert_allclose(s["y"], ry.numpy(), rtol=0, atol=2e-6)
        starts.add(s["t0"])
    assert starts <= {0, 1}


@pytest.mark.parametrize("workers,kind", [(0, "thread"), (1, "process"), (2, "thread")])
def test_loader_batches_hold_the_stream_samples(bench_data: bench_loader.BenchData, workers: int, kind: str) -> None:
    """What the benchmark times (batches with no workers, a worker process or threads) is the sample data."""
    spec, reader = prepare_stream(DataConfig(manifests=[str(bench_data.manifest)]), seed=1, verify=False)
    plans = EpochPlans(spec)
    it = iter(bench_loader.our_loader(bench_data, "webdataset", workers, 2, seed=1, kind=kind))
    for _ in range(3):
        batch = next(it)
        assert tuple(batch["x"].shape) == (2, 128, 128, 10, 4) and tuple(batch["y"].shape) == (2, 128, 128, 1, 4)
        for i, position in enumerate(batch["position"].tolist()):
            k, tref, _ = plans.lookup(position)
            s = make_sample(spec, reader, k, tref, position)
            assert batch["id"][i] == s["id"]
            np.testing.assert_array_equal(batch["x"][i].numpy(), s["x"])
            np.testing.assert_array_equal(batch["y"][i].numpy(), s["y"])
    del it


def test_reference_pad_data_resamples_and_pads_with_one() -> None:
    x = np.arange(4 * 4 * 3 * 2, dtype=np.float32).reshape(4, 4, 3, 2)
    import torch

    out = pad_data(torch.from_numpy(x), 8, 4).numpy()
    assert out.shape == (8, 8, 3, 4)
    assert np.all(out[..., 2:] == 1.0)
    same = pad_data(torch.from_numpy(x), 4, 3).numpy()  # same grid: bilinear is the identity
    np.testing.assert_array_equal(same[..., :2], x)


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_loader_benchmark_ends_with_its_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_loader.main([*SMALL, "--workers", "0", "--batch", "2", "--seconds", "0.2", "--warmup", "1"]) == 0
    out = _last_json(capsys.readouterr().out)
    assert out["benchmark"] == "loader"
    rows = {(r["loader"], r["workers"]): r for r in out["results"]}
    assert set(rows) == {("webdataset", 0), ("zarr", 0), ("reference", 0)}  # webdataset-process needs workers
    for r in rows.values():
        assert r["kind"] == "main"
        assert r["samples"] >= 6 and r["samples"] % 2 == 0  # at least 3 batches of 2
        assert r["samples_per_s"] > 0 and r["cpu_ms_per_sample"] > 0 and r["peak_rss_mib"] > 0
        # a window is 11 frames of 128 x 128 x 4 float32
        assert r["window_mb_per_s"] == pytest.approx(r["samples_per_s"] * 11 * 128 * 128 * 4 * 4 / 1e6, rel=0.02)
    ratio = out["ratios"]["webdataset_vs_reference"]["0"]
    assert ratio == pytest.approx(rows["webdataset", 0]["samples_per_s"] / rows["reference", 0]["samples_per_s"],
                                  abs=0.01)
    assert out["target"]["met"] == (ratio >= 3.0)


def test_loader_benchmark_measures_another_checkout_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    """--baseline DIR: each loader measured with this checkout's code and with DIR's, each in a child process that
    imports that checkout's dpot_train (here DIR is this checkout itself, so both rows name it)."""
    root = Path(__file__).resolve().parents[1]
    assert bench_loader.main([*SMALL, "--workers", "0", "--batch", "2", "--seconds", "0.2", "--warmup", "1",
                              "--loaders", "webdataset", "--baseline", str(root)]) == 0
    out = _last_json(capsys.readouterr().out)
    rows = {r["loader"]: r for r in out["results"]}
    assert set(rows) == {"webdataset", f"webdataset@{root.name}"}
    assert {r["code"] for r in rows.values()} == {str(root)}
    for r in rows.values():
        assert r["copy_windows_per_s"] > 0 and r["copy_ratio"] == pytest.approx(
            r["samples_per_s"] / r["copy_windows_per_s"], abs=1e-3)
    assert set(out["ratios"]["vs_baseline"]) == {f"webdataset_vs_{root.name}", f"webdataset_vs_{root.name}_cpu"}
    assert out["window"]["copy_ratio"] == [rows["webdataset"]["copy_ratio"]]


def test_train_step_benchmark_ends_with_its_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*SMALL, "--device", "cpu", "--workers", "0,1", "--batch", "2", "--steps", "1", "--warmup", "1"]
    assert bench_step.main(args) == 0
    out = _last_json(capsys.readouterr().out)
    assert out["benchmark"] == "train_step" and out["device"] == "cpu"
    assert [(r["preset"], r["dtype"], r["compile"], r["batch"], r["workers"]) for r in out["results"]] == \
        [("tiny", "fp32", False, 2, 0), ("tiny", "fp32", False, 2, 1)]
    for r in out["results"]:
        assert r["step_samples_per_s"] > 0 and r["model_samples_per_s"] > 0 and 0 <= r["data_wait"] < 1
    assert [x["workers"] for x in out["loader"]] == [0, 1]
    assert all(x["samples_per_s"] > 0 and x["pinned"] is False for x in out["loader"])
    assert "loader_vs_fastest_step" in out["targets"]


def test_loop_bound_smoke_reports_loop_against_bound(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/loop_bound.py --smoke: the trainer's loop over the real loader with the emulated step (2 ms holding
    the GIL, 1 ms without, batch 2), for the loop alone, no workers, a thread and a process worker."""
    assert bench_loop.main(["--smoke"]) == 0
    out = _last_json(capsys.readouterr().out)
    assert out["benchmark"] == "loop_bound" and out["settings"]["smoke"] is True
    assert out["bound_samples_per_s"] == pytest.approx(2 / 0.003, abs=0.1)
    assert [(r["kind"], r["workers"]) for r in out["results"]] == [("ready", 0), ("none", 0), ("thread", 1),
                                                                  ("process", 1)]
    for r in out["results"]:
        assert 0 < r["loop_samples_per_s"] and r["ratio"] == pytest.approx(r["loop_samples_per_s"] / 666.7, abs=2e-3)
        assert r["ratio"] <= 1.0  # a loop cannot beat its step
        assert r["slot_copies"] == 0  # the loop drops each batch before it asks for the next
        assert r["between_steps_ms"] >= 0
        assert (r["loader_samples_per_s"] is None) == (r["kind"] == "ready")
    assert out["machine"]["cores"] >= 1 and len(out["machine"]["load_average_start"]) == 3


def _seed_eval(model: dict[str, float], persistence: dict[str, float], family: str) -> dict:
    """An eval.json as paper_table reads it: {dataset: rollout L2RE} for the model and persistence (one-step: half)."""
    return {"network": {"model": family.upper(), "family": family, "size": "x", "parameters": 7}, "datasets": {
        d: {"model": {"rollout_l2re": v, "one_step_l2re": v / 2},
            "persistence": {"rollout_l2re": persistence[d], "one_step_l2re": persistence[d] / 2}}
        for d, v in model.items()}}


def test_paper_table_summarise_gives_each_row_its_mean_min_max_over_the_seeds() -> None:
    """paper_table.summarise on hand-made per-seed figures: every score's mean, min, max and per-seed values in seed
    order, the final training loss and its ratio to the tenth of the steps before per trained row, the rows in the
    report's order, a table line with mean [min-max], and persistence_spread > 0 once one evaluation's persistence
    figure differs (different test windows)."""
    pers = {"ns": 0.16, "dr": 0.22}
    unet = [0.30, 0.10, 0.20]  # diffusion-reaction rollout L2RE of seeds 0, 1, 2
    families = {"dpot-scratch": "dpot", "fno": "fno", "unet": "unet", "dpot-finetuned": "dpot"}
    evals = [{label: _seed_eval({"ns": 0.04 + seed / 100, "dr": unet[seed] if label == "unet" else 0.15}, pers, f)
              for label, f in families.items()} for seed in range(3)]
    for e in evals:
        e["persistence"] = _seed_eval(pers, pers, "persistence")
    # 20 logged losses: 2.0, then 1.0 over the last tenth (2 values) -> final 1.0, half the tenth before
    curves = {label: [(list(range(1, 21)), [2.0 * (seed + 1)] * 18 + [1.0 * (seed + 1)] * 2) for seed in range(3)]
              for label in families}
    curves["pretrain"] = [(list(range(1, 21)), [3.0] * 20)]
    lines, rows, persistence_spread = bench_paper.summarise(evals, curves)
    assert list(rows) == ["dpot-scratch", "fno", "unet", "dpot-finetuned", "persistence"]
    dr = rows["unet"]["scores"]["dr"]
    assert dr["rollout_l2re"] == dr["rollout_l2re_spread"]["mean"] == pytest.approx(0.2)
    assert dr["rollout_l2re_spread"] == {"mean": pytest.approx(0.2), "min": 0.1, "max": 0.3, "seeds": [0.3, 0.1, 0.2]}
    assert dr["one_step_l2re_spread"]["seeds"] == [0.15, 0.05, 0.1]
    ns = rows["fno"]["scores"]["ns"]["rollout_l2re_spread"]
    assert ns["seeds"] == [0.04, 0.05, 0.06] and ns["min"] == 0.04 and ns["max"] == 0.06
    assert rows["persistence"]["scores"]["dr"]["rollout_l2re_spread"]["seeds"] == [0.22] * 3
    assert "training" not in rows["persistence"] and "pretrain" not in rows
    for label in families:
        training = rows[label]["training"]
        assert training["final_loss"] == {"mean": 2.0, "min": 1.0, "max": 3.0, "seeds": [1.0, 2.0, 3.0]}
        assert training["last_over_previous_tenth"]["seeds"] == [0.5, 0.5, 0.5]
        assert rows[label]["network"]["family"] == families[label]
    assert rows == json.loads(json.dumps(rows))  # the JSON line carries them as they are
    unet_line = next(line for line in lines if line.startswith("unet "))
    assert "0.2000 [0.1000-0.3000]" in unet_line and "0.1000 [0.050-0.150]" in unet_line
    assert persistence_spread == 0.0
    evals[2]["fno"]["datasets"]["dr"]["persistence"]["rollout_l2re"] = 0.25
    assert bench_paper.summarise(evals, curves)[2] == pytest.approx(0.03)


@pytest.mark.slow
def test_paper_table_smoke_reports_the_five_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/paper_table.py --smoke end to end with one seed: synth, ingest, pre-train, the four training runs
    (each launch evaluating its own checkpoint), the learning curves and the report; each row's figures are its
    run's evaluation (the aggregation over seeds: the test above), the report holds the five runs (persistence as
    its own) beside the paper's FNO-nu 1e-3 column."""
    summary = bench_paper.main(["--smoke", "--out", str(tmp_path)])
    out = _last_json(capsys.readouterr().out)
    assert out["benchmark"] == "paper_table" and out == json.loads(json.dumps(summary))
    assert out["seeds"] == [0] and out["spread"] == "min-max over seeds"
    assert list(out["rows"]) == ["dpot-scratch", "fno", "unet", "dpot-finetuned", "persistence"]
    assert [out["rows"][r]["network"]["family"] for r in out["rows"]] == ["dpot", "fno", "unet", "dpot", "persistence"]
    assert out["rows"]["unet"]["network"]["size"] == out["settings"]["unet"]
    for label, row in out["rows"].items():
        assert set(row["scores"]) == {"fno-ns-v1e-3", "pdebench-dr"}
        scored = json.loads((tmp_path / "runs" / "seed-0" / label / "eval.json").read_text(encoding="utf-8"))
        if label != "persistence":  # the launch's own evaluation of its last checkpoint, the network named
            run = tmp_path / "runs" / "seed-0" / label / "train"
            launched = json.loads((run / "eval.json").read_text(encoding="utf-8"))
            assert scored["datasets"] == launched["datasets"] and scored["recipe"] == "dpot"
            steps = 20 if label == "unet" else 10  # the UNet's own steps and lr (the smoke scale's, as the cpu one)
            assert scored["split"] == "test"
            assert scored["checkpoint"] == str(run / "checkpoints" / f"step-{steps:08d}.pt")
            config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
            assert (config["steps"], config["optim"]["lr"]) == (steps, 3e-2 if label == "unet" else 3e-3)
            assert scored["network"] == row["network"] and row["network"]["parameters"] > 0
        for d, v in row["scores"].items():
            assert 0 < v["rollout_l2re"] < 100 and 0 < v["one_step_l2re"] < 100
            for key in ("rollout_l2re", "one_step_l2re"):
                figure = scored["datasets"][d]["model"][key]
                assert v[f"{key}_spread"] == {"mean": figure, "min": figure, "max": figure, "seeds": [figure]}
                assert v[key] == figure
    for label in ("dpot-scratch", "fno", "unet", "dpot-finetuned"):
        assert out["rows"][label]["training"]["final_loss"]["min"] > 0
        assert len(out["rows"][label]["training"]["final_loss"]["seeds"]) == 1
    assert out["persistence_spread"] == 0.0  # persistence is the same for every run: the same test windows
    scratch = json.loads((tmp_path / "runs" / "seed-0" / "dpot-scratch" / "eval.json").read_text(encoding="utf-8"))
    for d, scores in out["rows"]["persistence"]["scores"].items():
        assert scores["rollout_l2re"] == scratch["datasets"][d]["persistence"]["rollout_l2re"]
    png = tmp_path / "learning_curves.png"
    assert out["learning_curves"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["report"] == str(tmp_path / "report.md")
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    header = next(ln for ln in report.splitlines() if ln.startswith("| dataset | dpot-scratch"))
    assert [c.split(" (")[0] for c in header.strip("| ").split(" | ")] == \
        ["dataset", "dpot-scratch", "fno", "unet", "dpot-finetuned", "persistence"]
    assert "## Paper Table 1, FNO-nu 1e-3 (fno-ns-v1e-3)" in report and "| persistence / paper |" in report
