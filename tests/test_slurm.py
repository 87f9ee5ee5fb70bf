"""The Slurm templates (scripts/slurm/*.sbatch) run with a fake Slurm: the job's environment set by hand and fake
`srun`, `scontrol` and `nvidia-smi` on PATH. train.sbatch must give each node the `dpot-train launch` of its place in
the allocation (and --resume once the run holds a checkpoint) and requeue itself on the time-limit signal;
ingest.sbatch must start the dask scheduler on the first node and a worker on every node, wait for them, and run
the ingest against that scheduler."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpot_train.run import slurm

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "scripts" / "slurm" / "train.sbatch"
INGEST = ROOT / "scripts" / "slurm" / "ingest.sbatch"
VENV_BIN = Path(sys.executable).parent

FAKES = {
    # srun: record the call, then run the command once (this "node") without srun's own options
    "srun": """#!/bin/bash
echo "srun $*" >> "$FAKE_LOG"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
if [ -n "${FAKE_SRUN_WAIT:-}" ]; then   # stand for a long step: run until the job is requeued
    touch "$FAKE_DIR/started"
    for _ in $(seq 600); do [ -e "$FAKE_DIR/requeued" ] && exit 0; sleep 0.1; done
    exit 1
fi
exec "$@"
""",
    "scontrol": """#!/bin/bash
echo "scontrol $*" >> "$FAKE_LOG"
if [ "$1" = show ] && [ "$2" = hostnames ]; then printf '%s\\n' $FAKE_HOSTS; fi
if [ "$1" = requeue ]; then touch "$FAKE_DIR/requeued"; fi
""",
    "nvidia-smi": """#!/bin/bash
printf 'GPU 0: NVIDIA H100 (UUID: GPU-0)\\nGPU 1: NVIDIA H100 (UUID: GPU-1)\\n'
""",
}


def _fake_bin(folder: Path, fakes: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in fakes.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A fake job's environment: 2 nodes gpu[01-02], this one node id 1 with 4 GPUs; no real Slurm or dpot
    variables of the machine running the test."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DPOT_"))}
    fake = _fake_bin(tmp_path / "fake-bin", FAKES)
    return {**base, "PATH": f"{fake}{os.pathsep}{base.get('PATH', '')}", "FAKE_LOG": str(tmp_path / "calls.log"),
            "FAKE_DIR": str(tmp_path), "FAKE_HOSTS": "gpu01 gpu02", "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_GPUS_ON_NODE": "4",
            "BIN": str(VENV_BIN), "PYTHONPATH": str(ROOT), **extra}


def _train(tmp_path: Path, **extra: str) -> tuple[list[str], str]:
    """train.sbatch with PRINT_ONLY=1: this node's launch command (as words) and the fake Slurm calls."""
    env = _env(tmp_path, PRINT_ONLY="1", MANIFEST="corpus/", CONFIG="pretrain-ti", OUT=str(tmp_path / "run"),
               **extra)
    r = subprocess.run(["bash", str(TRAIN)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = (tmp_path / "calls.log").read_text()
    (tmp_path / "calls.log").unlink()
    return shlex.split(r.stdout.strip().splitlines()[-1]), calls


def test_each_node_launches_with_its_place_in_the_allocation_and_resumes_once_a_checkpoint_exists(
        tmp_path: Path) -> None:
    cmd, calls = _train(tmp_path)
    assert Path(cmd[0]).name.startswith("python") and cmd[1:4] == ["-m", "dpot_train", "launch"]
    assert cmd[4:] == ["--manifest", "corpus/", "--config", "pretrain-ti", "--mixture", "dpot-pretrain-ti",
                       "--out", str(tmp_path / "run"), "--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "4",
                       "--rdzv-endpoint", "gpu01:29500"]
    assert "scontrol show hostnames gpu[01-02]" in calls  # the host list comes from scontrol
    assert "srun --ntasks-per-node=1 " in calls  # one launch per node

    ckpts = tmp_path / "run" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "step-00000100.pt.tmp-1").write_bytes(b"")  # an unfinished write is no checkpoint
    cmd, _ = _train(tmp_path)
    assert "--resume" not in cmd
    (ckpts / "step-00000100.pt").write_bytes(b"")
    cmd, _ = _train(tmp_path, DPOT_RDZV_PORT="31000", MIXTURE="", LAUNCH_OPTIONS="--steps 50 --ckpt-every 5")
    assert cmd[4:] == ["--manifest", "corpus/", "--config", "pretrain-ti", "--out", str(tmp_path / "run"),
                       "--steps", "50", "--ckpt-every", "5", "--nnodes", "2", "--node-rank", "1",
                       "--nproc-per-node", "4", "--rdzv-endpoint", "gpu01:31000", "--resume"]


def test_the_time_limit_signal_requeues_the_job(tmp_path: Path) -> None:
    env = _env(tmp_path, FAKE_SRUN_WAIT="1", OUT=str(tmp_path / "run"))
    proc = subprocess.Popen(["bash", str(TRAIN)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():  # the trap is set before the step starts
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)  # what `#SBATCH --signal=B:USR1@600` sends to the batch script
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert "scontrol requeue 4242" in (tmp_path / "calls.log").read_text()
    assert f"job 4242 nears its time limit: requeueing it; the requeued job resumes {tmp_path / 'run'}" in err


def test_launch_args_of_one_node_and_of_node_zero_of_two() -> None:
    env = {"SLURM_NNODES": "1", "SLURM_NODEID": "0"}
    assert slurm.launch_args(env, ["--out", "r"], ["gpu01"], gpus=8, resume=False) == \
        ["launch", "--out", "r", "--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "8"]
    env = {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "DPOT_NPROC_PER_NODE": "3"}  # CPU nodes: set by hand
    assert slurm.launch_args(env, ["--out=r"], ["cpu7", "cpu9"], gpus=0, resume=True) == \
        ["launch", "--out=r", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "3",
         "--rdzv-endpoint", "cpu7:29500", "--resume"]


def test_gpus_per_node_come_from_slurm_then_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert slurm.gpus_on_node({"SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "8"}, lambda: 2) == 4
    assert slurm.gpus_on_node({"SLURM_GPUS_PER_NODE": "a100:4"}, lambda: 2) == 4
    assert slurm.gpus_on_node({"SLURM_GPUS_PER_NODE": "a100:2,v100:2"}, lambda: 0) == 4
    assert slurm.nproc_per_node({}, slurm.gpus_on_node({}, lambda: 0)) == 1  # no GPU: one CPU process
    monkeypatch.setenv("PATH", str(_fake_bin(tmp_path / "bin", {"nvidia-smi": FAKES["nvidia-smi"]})))
    assert slurm.gpus_on_node({}) == 2  # `nvidia-smi -L` lists two
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert slurm.gpus_on_node({}) == 0


def test_host_lists_expand_with_scontrol_or_without_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert slurm.expand_nodelist("gpu[01-02,05]") == ["gpu01", "gpu02", "gpu05"]
    assert slurm.expand_nodelist("a1,b[8-10]") == ["a1", "b8", "b9", "b10"]
    assert slurm.expand_nodelist("r[1-2]-n[09-10]") == ["r1-n09", "r1-n10", "r2-n09", "r2-n10"]
    for bad in ("gpu[01-02", "gpu[2-1]", "a,,b", "x[a]", ""):
        with pytest.raises(slurm.SlurmError, match=r"^SLURM_JOB_NODELIST: cannot read"):
            slurm.expand_nodelist(bad)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert slurm.hostnames("gpu[01-02,05]") == ["gpu01", "gpu02", "gpu05"]
    monkeypatch.setenv("PATH", str(_fake_bin(tmp_path / "bin", {"scontrol": FAKES["scontrol"]})))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("FAKE_HOSTS", "gpu01.site gpu02.site")
    assert slurm.hostnames("gpu[01-02]") == ["gpu01.site", "gpu02.site"]  # scontrol's answer wins


@pytest.mark.parametrize("environ, options, message", [
    ({"SLURM_NODEID": None}, ["--out", "r"], "SLURM_NODEID: not set; expected it from Slurm"),
    ({"SLURM_NODEID": "2"}, ["--out", "r"], "SLURM_NODEID: expected a node id below SLURM_NNODES=2, got 2"),
    ({"SLURM_NNODES": "two"}, ["--out", "r"], "SLURM_NNODES: expected a whole number of at least 1, got 'two'"),
    ({}, ["--out", "r", "--nnodes", "4"], "--nnodes: comes from the Slurm allocation; leave it out"),
    ({}, ["--out", "r", "--resume"], "--resume: comes from the Slurm allocation; leave it out"),
    ({}, ["--manifest", "m"], "--out: missing from the launch options; expected --out RUN_DIR"),
    ({"SLURM_JOB_NODELIST": "gpu[01-03]"}, ["--out", "r"], "SLURM_JOB_NODELIST: names 3 host(s), expected "
                                                           "SLURM_NNODES=2"),
    ({"DPOT_RDZV_PORT": "x"}, ["--out", "r"], "DPOT_RDZV_PORT: expected a whole number of at least 1, got 'x'"),
])
def test_bad_environment_or_options_are_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], environ: dict,
                                                            options: list[str], message: str) -> None:
    for key in [k for k in os.environ if k.startswith(("SLURM_", "DPOT_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no scontrol: the host list is expanded here
    job = {"SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_NNODES": "2", "SLURM_NODEID": "1", **environ}
    for key, value in job.items():
        if value is not None:
            monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    assert slurm.main(["launch", "--print", "--", *options]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {message}"), err


MULTI_SRUN = """#!/bin/bash
# srun --ntasks-per-node=1 over SLURM_NNODES "nodes" on this machine: one task each, SLURM_NODEID set per task
echo "srun $*" >> "$FAKE_LOG"
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
pids=()
for node in $(seq 0 $((SLURM_NNODES - 1))); do
    SLURM_NODEID=$node SLURM_PROCID=$node "$@" > "$FAKE_DIR/node-$node.log" 2>&1 &
    pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
exit $rc
"""


def fake_slurm_bin(folder: Path) -> Path:
    """`folder` holding a fake `srun` (one task per node of SLURM_NNODES on this machine, node N's output in
    $FAKE_DIR/node-N.log) and `scontrol` (the hosts of $FAKE_HOSTS), to put first on PATH."""
    return _fake_bin(folder, {"srun": MULTI_SRUN, "scontrol": FAKES["scontrol"]})


@pytest.mark.slow
def test_a_two_node_job_trains_and_its_requeue_resumes(fno_train_shards: Path, tmp_path: Path) -> None:
    fake = fake_slurm_bin(tmp_path / "multi-bin")
    env = _env(tmp_path, FAKE_HOSTS="127.0.0.1 127.0.0.1", SLURM_JOB_NODELIST="node[1-2]",
               DPOT_RDZV_PORT=str(_free_port()), DPOT_NPROC_PER_NODE="1", MANIFEST=str(fno_train_shards), CONFIG="",
               MIXTURE="", OUT=str(tmp_path / "run"), OMP_NUM_THREADS="1",
               LAUNCH_OPTIONS="--steps 4 --batch-size 4 --ckpt-every 2 --log-every 1 --no-progress --device cpu")
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    del env["SLURM_GPUS_ON_NODE"]
    logs = {}
    for start in ("first", "requeued"):
        r = subprocess.run(["bash", str(TRAIN)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        logs[start] = [(tmp_path / f"node-{n}.log").read_text() for n in (0, 1)]
        assert r.returncode == 0, r.stderr + "\n".join(logs[start])
    first, requeued = logs["first"], logs["requeued"]
    assert "--nnodes=2 --node-rank=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:" in first[1]
    assert (tmp_path / "run" / "checkpoints" / "step-00000004.pt").is_file()
    assert all(" --resume" not in log.splitlines()[0] for log in first)  # "node N: ... launch ..." lines
    assert all(log.splitlines()[0].endswith(" --resume") for log in requeued)
    assert "the run already reached its last step (4); only the final evaluation is repeated" in requeued[0]


INGEST_FAKES = {  # the job's programs, each recording its arguments
    "dask": """#!/bin/bash
echo "dask $*" >> "$FAKE_LOG"
echo "$$" >> "$FAKE_DIR/cluster.pids"
exec sleep 120   # a scheduler or worker runs until the script stops it
""",
    "python": """#!/bin/bash
echo "python $*" >> "$FAKE_LOG"
for _ in $(seq 600); do   # as dask-wait: return once the scheduler and the worker are up
    grep -q '^dask scheduler' "$FAKE_LOG" && grep -q '^dask worker' "$FAKE_LOG" && exit 0
    sleep 0.1
done
exit 1
""",
    "dpot-data": """#!/bin/bash
echo "dpot-data $*" >> "$FAKE_LOG"
""",
}


def _gone(pid: int) -> bool:
    """Whether a process has ended (no such process, or a zombie waiting for its reaper)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_ingest_starts_the_cluster_waits_for_it_and_ingests_against_it(tmp_path: Path) -> None:
    fakes = _fake_bin(tmp_path / "job-bin", INGEST_FAKES)
    env = _env(tmp_path, BIN=str(fakes), SOURCE="fno", INPUTS="raw/a.mat raw/b.mat", OUT="corpus/fno",
               INGEST_OPTIONS="--resolution 64", SLURM_CPUS_PER_TASK="8", WORKER_DIR="/scratch/w")
    proc = subprocess.Popen(["bash", str(INGEST)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
        pids = [int(p) for p in (tmp_path / "cluster.pids").read_text().split()]
        deadline = time.monotonic() + 30
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:  # the script's EXIT trap ends them
            time.sleep(0.05)
        assert all(_gone(p) for p in pids), "the scheduler or a worker outlived the job script"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    lines = (tmp_path / "calls.log").read_text().splitlines()
    address = "tcp://gpu01:8786"
    assert "dask scheduler at tcp://gpu01:8786" in err
    assert f"srun --overlap --nodes=1 --ntasks=1 --nodelist=gpu01 {fakes}/dask scheduler --port 8786 " \
           "--no-dashboard" in lines
    assert f"srun --overlap --ntasks-per-node=1 --cpus-per-task=8 {fakes}/dask worker {address} --nworkers 1 " \
           "--nthreads 8 --local-directory /scratch/w --death-timeout 120" in lines
    wait = f"python -m dpot_train.run.slurm dask-wait {address} --workers 2 --timeout 120"
    ingest = f"dpot-data ingest fno raw/a.mat raw/b.mat --out corpus/fno --scheduler {address} --resolution 64"
    assert wait in lines and ingest in lines and lines.index(wait) < lines.index(ingest)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ingest_sbatch_runs_a_real_ingest_on_a_one_node_dask_cluster(tmp_path: Path) -> None:
    from dpot_data.synth.fno import synth_fno

    synth_fno(tmp_path / "raw", n=6, frames=12, viscosity=1e-3, seed=0, resolution=32)
    env = _env(tmp_path, FAKE_HOSTS="127.0.0.1", SLURM_JOB_NODELIST="localhost", SLURM_NNODES="1",
               SLURM_NODEID="0", SLURM_CPUS_PER_TASK="2", SCHEDULER_PORT=str(_free_port()), SOURCE="fno",
               INPUTS="raw/NavierStokes_*.mat", OUT=str(tmp_path / "shards"), WORKER_DIR=str(tmp_path / "dask"),
               INGEST_OPTIONS="--resolution 32 --split 0.5", DPOT_SCHEDULER_TIMEOUT="60")
    proc = subprocess.Popen(["bash", str(INGEST)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        else:
            try:  # what the trap did not stop (it should have stopped everything)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert "dask scheduler tcp://127.0.0.1:" in err and ": 1 worker(s)" in err
    # the ingest was a client of that scheduler and probed its worker (the shared-folder check): it ran there
    assert err.count("Receive client connection") >= 2 and "Run out-of-band function 'exists'" in err
    r = subprocess.run([str(VENV_BIN / "dpot-data"), "verify", str(tmp_path / "shards")], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dask_wait_without_a_scheduler_ends_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there
    assert slurm.main(["dask-wait", address, "--workers", "2", "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {address}: no dask scheduler answered within 1 s") and err.count("\n") == 1, err


def test_dask_wait_for_workers_that_do_not_come_ends_in_one_line() -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
        with pytest.raises(slurm.SlurmError) as err:
            slurm.wait_for_workers(cluster.scheduler_address, 1, timeout=1)
    assert str(err.value) == (f"{cluster.scheduler_address}: 0 of 1 dask worker(s) joined within 1 s; expected one "
                              "per node (see the worker lines in the job's log)")
