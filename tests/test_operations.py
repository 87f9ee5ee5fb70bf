"""Operations around the two CLIs: an `ingest corpus` folder is one argument for inspect, verify and launch; a
mixture naming absent datasets says which and trains on the rest only when asked; relative paths work with a real
dask.distributed cluster (a scheduler and two workers in another working directory, on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpot_data.cli import app as data_app
from dpot_data.ingest import IngestOptions, ingest_files
from dpot_data.synth.fno import write_mat_v5
from tests import train_runs


def _raw(folder: Path, nu: str, n: int = 6) -> Path:
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(nu))
    path = folder / f"NavierStokes_V{nu}_N{n}_T12.mat"
    write_mat_v5(path, rng.standard_normal((n, 16, 16)).astype(np.float32),
                 rng.standard_normal((n, 16, 16, 12)).astype(np.float32), np.arange(1, 13, dtype=np.float32)[None])
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("corpus")
    for nu in ("1e-4", "1e-3"):
        ingest_files("fno", [_raw(base / "raw", nu)], base / "out" / f"fno-{nu}",
                     IngestOptions(resolution=None, split=(0.5,), stats=False))
    return base / "out"


def test_a_corpus_folder_is_one_argument(corpus: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    report = json.loads(runner.invoke(data_app, ["inspect", str(corpus), "--json"]).stdout)
    assert sorted(d["name"] for d in report["datasets"]) == ["fno-ns-v1e-3", "fno-ns-v1e-4"] and report["ok"]
    verified = runner.invoke(data_app, ["verify", str(corpus)])
    assert verified.exit_code == 0 and "OK: " in verified.output, verified.output
    r = train_runs.run(train_runs.launch_args(corpus, tmp_path / "run", "--dry-run", nproc=1))
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.slow
def test_mixture_with_absent_datasets_needs_an_explicit_flag(corpus: Path, tmp_path: Path) -> None:
    one = corpus / "fno-1e-3"
    args = train_runs.launch_args(one, tmp_path / "run", "--mixture", "fno-ns-v1e-3=1,fno-ns-v1e-4=3", "--dry-run",
                                  nproc=1)
    r = train_runs.run(args)
    assert r.returncode == 2 and "absent from the given manifests: ['fno-ns-v1e-4']" in r.stderr
    assert "--mixture-partial" in r.stderr
    r = train_runs.run([*args, "--mixture-partial"])
    assert r.returncode == 0, r.stderr[-2000:]


def _dask(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "dask"), *args]


@pytest.mark.slow
def test_relative_paths_with_a_real_dask_cluster(tmp_path: Path) -> None:
    sched_file = tmp_path / "scheduler.json"
    elsewhere = tmp_path / "workers"  # the workers' working directory differs from the client's
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(train_runs.ROOT)}
    procs = [subprocess.Popen(_dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                                    "--scheduler-file", str(sched_file)), cwd=elsewhere, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert time.monotonic() < deadline, "the dask scheduler did not start"
            time.sleep(0.2)
        for _ in range(2):
            procs.append(subprocess.Popen(_dask("worker", "--scheduler-file", str(sched_file), "--nthreads", "1",
                                                "--host", "127.0.0.1", "--dashboard-address", ":0", "--no-nanny"),
                                          cwd=elsewhere, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        address = json.loads(sched_file.read_text())["address"]
        from distributed import Client

        with Client(address, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
        client_dir = tmp_path / "client"
        _raw(client_dir / "raw", "1e-3", n=8)
        cli = [sys.executable, "-m", "dpot_data"]
        for args in (["ingest", "fno", "raw/NavierStokes_V1e-3_N8_T12.mat", "--out", "out", "--resolution", "0",
                      "--no-progress", "--scheduler", address],
                     ["verify", "out", "--scheduler", address],
                     ["stats", "out", "--scheduler", address]):
            r = subprocess.run([*cli, *args], cwd=client_dir, env=env, capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, (args[0], r.stdout[-1500:], r.stderr[-1500:])
        assert (client_dir / "out" / "manifest.json").is_file()
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_catalog_command_lists_the_known_datasets() -> None:
    runner = CliRunner()
    listed = json.loads(runner.invoke(data_app, ["catalog", "--pretrain", "--json"]).stdout)
    assert len(listed) == 12 and {e["source"] for e in listed} == {"fno", "pdebench", "pdearena", "cfdbench"}
    dr = runner.invoke(data_app, ["catalog", "pdebench-dr"])
    assert dr.exit_code == 0 and "dpot-data ingest --dataset pdebench-dr 2D_diff-react_NA_NA.h5" in dr.output
    missing = runner.invoke(data_app, ["catalog", "nope"])
    assert missing.exit_code == 2 and "no catalog dataset 'nope'" in missing.output


def test_a_split_without_test_trajectories_warns_at_ingest(tmp_path: Path) -> None:
    raw = _raw(tmp_path / "raw", "1e-3", n=4)  # the reference's FNO 1e-3 test set starts at index 4800
    result = CliRunner().invoke(data_app, ["ingest", "fno", str(raw), "--out", str(tmp_path / "out"),
                                           "--resolution", "0", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "warning: fno-ns-v1e-3: the split leaves no test trajectory" in result.output


def test_upsampling_says_how_much_it_multiplies_the_data_before_writing(tmp_path: Path) -> None:
    raw = _raw(tmp_path / "raw", "1e-3", n=4)  # 16x16 native
    result = CliRunner().invoke(data_app, ["ingest", "fno", str(raw), "--out", str(tmp_path / "out"),
                                           "--resolution", "64", "--no-progress", "--format", "wds"])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if "multiplies the data" in ln)
    # 4 trajectories x 12 frames x 4 channels x 64 x 64 x 4 bytes
    assert "16x16 -> 64x64 multiplies the data 16x: about 0.00315 GB per output format (wds)" in line


def test_3d_data_gets_its_channels_and_no_2d_only_warning(tmp_path: Path) -> None:
    from dpot_data.synth import pdebench

    raw = pdebench.write_cfd(tmp_path / "raw", dims=3, m=1.0, eta=1e-8, n=2, frames=3, res=6)
    result = CliRunner().invoke(data_app, ["ingest", "pdebench", str(raw), "--out", str(tmp_path / "out"),
                                           "--resolution", "0", "--no-progress", "--format", "zarr"])
    assert result.exit_code == 0, result.output
    assert "2D data only" not in result.output  # dpot-train launch trains on 3D shards too
    entry = json.loads((tmp_path / "out" / "manifest.json").read_text())["datasets"][0]
    assert entry["channels"] == ["Vx", "Vy", "Vz", "density", "pressure"]  # five native channels, none dropped


@pytest.mark.slow
def test_a_mixture_run_logs_each_datasets_training_loss(corpus: Path, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = train_runs.launch_args(corpus, tmp_path / "run", "--no-eval", steps=4)  # 2 gloo processes
    args[args.index("--log-every") + 1] = "2"
    r = train_runs.run(args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    acc = EventAccumulator(str(tmp_path / "run" / "tb"))
    acc.Reload()
    for name in ("fno-ns-v1e-3", "fno-ns-v1e-4"):
        events = acc.Scalars(f"train/loss/{name}")
        assert [e.step for e in events] == [2, 4] and all(0 < e.value < 10 for e in events)


def test_the_same_file_gets_the_same_split_named_or_detected(tmp_path: Path) -> None:
    raw = _raw(tmp_path / "raw", "1e-3", n=10)
    splits = []
    for how, extra in (("named", ["--dataset", "fno-ns-v1e-3"]), ("detected", [])):
        result = CliRunner().invoke(data_app, ["ingest", *extra, str(raw), "--out", str(tmp_path / how),
                                               "--resolution", "0", "--no-progress", "--convention", "canonical"])
        assert result.exit_code == 0, result.output
        splits.append(json.loads((tmp_path / how / "manifest.json").read_text())["datasets"][0]["splits"])
    assert splits[0] == splits[1] and "train 0.8, valid 0.1" in splits[0]["rule"]  # the catalog's ratios


def test_makefile_torch_choice_and_docs_stay_inside_the_repository() -> None:
    root = train_runs.ROOT
    plain = subprocess.run(["make", "-n", "-B", ".venv/.installed"], cwd=root, capture_output=True, text=True)
    cpu = subprocess.run(["make", "-n", "-B", ".venv/.installed", "TORCH_INDEX=https://example.invalid/cpu"],
                         cwd=root, capture_output=True, text=True)
    assert plain.returncode == cpu.returncode == 0
    def torch_line(out: str) -> str:
        return next(ln for ln in out.splitlines() if 'install -q "torch==2.13.0"' in ln)

    assert "--index-url" not in torch_line(plain.stdout)  # the default index, as documented
    assert "--index-url https://example.invalid/cpu" in torch_line(cpu.stdout)
    docs = [*root.glob("docs/*.md"), root / "README.md", *root.glob("dpot_data/**/*.py"), *root.glob("dpot_train/**/*.py"),
            *root.glob("dpot_format/**/*.py")]
    for path in docs:
        text = path.read_text(encoding="utf-8")
        for outside in ("../shared", "FORMATS.md", "REFERENCE_INPUTS.md", "project brief"):
            assert outside not in text, (path, outside)


def test_catalog_check_lists_found_missing_and_published_md5(tmp_path: Path) -> None:
    from dpot_data.synth import pdebench

    pdebench.write_diff_react(tmp_path / "dl", n=2, frames=3, res=8)  # our small file: not the published bytes
    result = CliRunner().invoke(data_app, ["catalog", "--check", str(tmp_path / "dl"), "--md5"])
    assert result.exit_code == 1, result.output
    assert "found   pdebench-dr: 1 file(s)" in result.output and "published MD5 DIFFERS" in result.output
    assert "missing pdebench-swe (pre-training): expected 2D_rdb_NA_NA.h5" in result.output
    listed = json.loads(CliRunner().invoke(data_app, ["catalog", "pdebench-dr", "--json"]).stdout)
    assert listed[0]["download"] == {"url": "https://darus.uni-stuttgart.de/api/access/datafile/133017",
                                     "md5": "b8d0b86064193195ddc30c33be5dc949"}
