"""The README's "On a Slurm cluster" block, run verbatim from a folder laid out as the checkout (`scripts/`,
`.venv`) with a fake `sbatch` first on PATH: it allocates the nodes the job asks for and runs the script at once, as
Slurm's batch step would on the first node (the job's SLURM_* variables, its output in the file `#SBATCH --output`
names), with the fake `srun` and `scontrol` of tests/test_slurm.py. PRINT_ONLY=1 in the environment (passed on by
`--export=ALL`) makes both scripts print their commands instead of running them; the test checks those commands."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.test_readme_path import README, bash_blocks
from tests.test_slurm import ROOT, fake_slurm_bin

SECTION = "On a Slurm cluster"
RAW = ("NavierStokes_V1e-3_N5000_T50.mat", "NavierStokes_V1e-5_N1200_T20.mat")  # what INPUTS's glob finds

FAKE_SBATCH = r"""#!/bin/bash
# sbatch [--nodes=N] [--export=ALL,NAME=VALUE,...] SCRIPT: an allocation of N nodes (else the script's
# #SBATCH --nodes) named node01, node02, ...; SCRIPT runs at once, as Slurm's batch step runs it on the first node,
# its output in the file of #SBATCH --output. Unlike sbatch it returns when the job ends, with the job's status.
set -euo pipefail
echo "sbatch $*" >> "$FAKE_LOG"
nodes=""
while [ $# -gt 1 ]; do
    case "$1" in
        --nodes=*) nodes=${1#--nodes=} ;;
        --export=ALL,*)
            IFS=, read -r -a pairs <<< "${1#--export=ALL,}"
            for pair in "${pairs[@]}"; do export "${pair?}"; done ;;
        *) echo "sbatch: unrecognized option '$1'" >&2; exit 1 ;;
    esac
    shift
done
script=$1
header() { sed -n "/^#SBATCH --$1=/{s///p;q}" "$script"; }  # the first #SBATCH --NAME=VALUE: VALUE
nodes=${nodes:-$(header nodes)}
job=$(( $(cat "$FAKE_DIR/job-id" 2>/dev/null || echo 1000) + 1 ))
echo "$job" > "$FAKE_DIR/job-id"
name=$(header job-name)
output=$(header output)
output=${output//%x/$name}
output=${output//%j/$job}
if [ "$nodes" = 1 ]; then nodelist=node01; else nodelist="node[01-$(printf %02d "$nodes")]"; fi
export SLURM_JOB_ID=$job SLURM_JOB_NAME=$name SLURM_NNODES=$nodes SLURM_NODEID=0 SLURM_SUBMIT_DIR=$PWD \
    SLURM_JOB_NODELIST=$nodelist FAKE_HOSTS="$(seq -f 'node%02g' 1 "$nodes" | tr '\n' ' ')"
cpus=$(header cpus-per-task)
if [ -n "$cpus" ]; then export SLURM_CPUS_PER_TASK=$cpus; fi
gpus=$(header gpus-per-node)
if [ -n "$gpus" ]; then export SLURM_GPUS_PER_NODE=$gpus; fi
echo "Submitted batch job $job"
bash "$script" > "${output:-slurm-$job.out}" 2>&1
"""


def _block() -> str:
    blocks = bash_blocks(README.read_text(encoding="utf-8"), SECTION)
    assert len(blocks) == 1, f"README.md, {SECTION!r}: expected one bash block, found {len(blocks)}"
    return blocks[0]


def _commands(text: str) -> list[list[str]]:
    """The job output's command lines (as words), without the scripts' own `dpot: ...` lines."""
    return [shlex.split(line) for line in text.splitlines() if line.strip() and not line.startswith("dpot: ")]


def test_readme_slurm_block_submits_the_ingest_and_the_training_it_documents(tmp_path: Path) -> None:
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the checkout's layout
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    (tmp_path / "raw").mkdir()
    for name in RAW:
        (tmp_path / "raw" / name).write_bytes(b"")
    fake = fake_slurm_bin(tmp_path / "fake-bin")
    (fake / "sbatch").write_text(FAKE_SBATCH)
    (fake / "sbatch").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DPOT_"))}
    env.update({"PATH": f"{fake}{os.pathsep}{env.get('PATH', '')}", "FAKE_LOG": str(tmp_path / "calls.log"),
                "FAKE_DIR": str(tmp_path), "PRINT_ONLY": "1"})
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + _block()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    jobs = {p.name: p.read_text() for p in tmp_path.glob("*.out")}
    assert proc.returncode == 0, proc.stdout + proc.stderr + "\n".join(jobs.values())
    assert proc.stdout.splitlines() == ["Submitted batch job 1001", "Submitted batch job 1002"]
    assert sorted(jobs) == ["dpot-ingest-1001.out", "dpot-train-1002.out"]

    # every variable the block exports is one its script reads
    calls = (tmp_path / "calls.log").read_text().splitlines()
    submitted = [line.split() for line in calls if line.startswith("sbatch ")]
    assert len(submitted) == 2
    for words in submitted:
        script = (tmp_path / words[-1]).read_text()
        exports = next(w for w in words if w.startswith("--export=ALL,"))[len("--export=ALL,"):]
        for name in (pair.split("=", 1)[0] for pair in exports.split(",")):
            assert re.search(rf"^(export )?{name}=\$\{{{name}:?-", script, flags=re.M), \
                f"{words[-1]} reads no variable {name} (the README exports it)"

    # the ingest: a 4-node cluster (the script's default) at the first node, printed, nothing started
    bin_dir = tmp_path / ".venv" / "bin"
    address = "tcp://node01:8786"
    ingest_log = jobs["dpot-ingest-1001.out"]
    assert f"dpot: job 1001 on node[01-04]: dask scheduler at {address}" in ingest_log
    assert _commands(ingest_log) == [
        ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=node01", f"{bin_dir}/dask", "scheduler",
         "--port", "8786", "--no-dashboard"],
        ["srun", "--overlap", "--ntasks-per-node=1", "--cpus-per-task=32", f"{bin_dir}/dask", "worker", address,
         "--nworkers", "1", "--nthreads", "32", "--local-directory", f"/tmp/dask-worker-{env.get('USER') or 'dpot'}",
         "--death-timeout", "120"],
        [f"{bin_dir}/python", "-m", "dpot_train.run.slurm", "dask-wait", address, "--workers", "4", "--timeout", "120"],
        [f"{bin_dir}/dpot-data", "ingest", "fno", *(f"raw/{name}" for name in RAW), "--out", "corpus/fno",
         "--scheduler", address],
    ]

    # the training: one launch per node of the 4 asked for, 8 processes each (#SBATCH --gpus-per-node), meeting
    # at the first node; no checkpoint in runs/ti yet, so no --resume
    assert "dpot: job 1002 on node[01-04] (start 1)" in jobs["dpot-train-1002.out"]
    assert [line.split()[:2] for line in calls if line.startswith("srun ")] == [["srun", "--ntasks-per-node=1"]]
    for rank in range(4):
        cmd = _commands((tmp_path / f"node-{rank}.log").read_text())[-1]
        assert Path(cmd[0]).name.startswith("python") and cmd[1:4] == ["-m", "dpot_train", "launch"]
        assert cmd[4:] == ["--manifest", "corpus/", "--config", "pretrain-ti", "--mixture", "dpot-pretrain-ti",
                           "--out", "runs/ti", "--nnodes", "4", "--node-rank", str(rank), "--nproc-per-node", "8",
                           "--rdzv-endpoint", "node01:29500"]


def test_ingest_sbatch_takes_the_first_host_of_a_host_list_longer_than_a_pipe(tmp_path: Path) -> None:
    """scontrol still writing its host list when the first host is taken is no failure of the job (a reader that
    stops early would leave scontrol to SIGPIPE, which `set -o pipefail` makes the script's end)."""
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/bash\nseq -f 'node%05g' 1 20000\n")  # 200 kB: more than a pipe holds
    (fake / "scontrol").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DPOT_"))}
    env.update({"PATH": f"{fake}{os.pathsep}{env.get('PATH', '')}", "PRINT_ONLY": "1", "SLURM_JOB_ID": "7",
                "SLURM_JOB_NODELIST": "node[00001-20000]", "SLURM_NNODES": "20000", "BIN": "/opt/dpot/bin"})
    r = subprocess.run(["bash", str(ROOT / "scripts" / "slurm" / "ingest.sbatch")], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dask scheduler at tcp://node00001:8786" in r.stderr
    assert _commands(r.stdout)[-1][-2:] == ["--scheduler", "tcp://node00001:8786"]
