"""What the Slurm templates (scripts/slurm/) run on each node, kept here so that it is testable without a cluster.

`python -m dpot_train.run.slurm launch [--print] -- LAUNCH_OPTIONS` turns the Slurm environment of one node (one task
per node, started by `srun --ntasks-per-node=1`) into that node's `dpot-train launch`: `--nnodes` from
SLURM_NNODES, `--node-rank` from SLURM_NODEID, `--nproc-per-node` from the node's GPUs, `--rdzv-endpoint` the first
host of SLURM_JOB_NODELIST at $DPOT_RDZV_PORT, and `--resume` when the run folder already holds a checkpoint (a
requeued job continues its run). `python -m dpot_train.run.slurm dask-wait ADDRESS --workers N` waits until a dask
scheduler has N workers, so that an ingest started after it sees the whole cluster.
Bad input (a missing or malformed variable, an option the allocation decides) is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

PORT_ENV = "DPOT_RDZV_PORT"  # the rendezvous port on the first node
NPROC_ENV = "DPOT_NPROC_PER_NODE"  # processes per node when not one per GPU (e.g. CPU nodes)
DEFAULT_PORT = 29500
# launch options the allocation decides: given by hand they would disagree between nodes or with Slurm
DECIDED = ("--nnodes", "--node-rank", "--nproc-per-node", "--rdzv-endpoint", "--resume")


class SlurmError(ValueError):
    """The Slurm environment or the options do not fit; `str()` is one line naming the variable or option."""


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int:
    """A whole number from the environment, at least `minimum`, or SlurmError naming the variable."""
    raw = env.get(name, "").strip()
    if not raw:
        raise SlurmError(f"{name}: not set; expected it from Slurm (run this under srun in an sbatch job)")
    if not raw.isdigit() or int(raw) < minimum:
        raise SlurmError(f"{name}: expected a whole number of at least {minimum}, got {raw!r}")
    return int(raw)


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compact host list as host names, in order: `gpu[01-02,05]` -> gpu01, gpu02, gpu05 (zero padding
    kept; several bracket groups in one name and comma-separated names too). The templates ask `scontrol show
    hostnames` first; this is the fallback where scontrol is not on PATH."""
    text = nodelist.strip()
    items = re.findall(r"(?:[^,\[\]]|\[[^\[\]]*\])+", text)  # names, commas inside brackets kept
    if not items or ",".join(items) != text:
        raise SlurmError(f"SLURM_JOB_NODELIST: cannot read {nodelist!r}; expected host names such as gpu[01-02,05]")
    hosts: list[str] = []
    for item in items:
        parts = re.split(r"\[([^\]]*)\]", item)  # literal, ranges, literal, ranges, ..., literal
        choices = [[p] if i % 2 == 0 else _ranges(p, nodelist) for i, p in enumerate(parts)]
        hosts += ["".join(c) for c in itertools.product(*choices)]
    return hosts


def _ranges(spec: str, nodelist: str) -> list[str]:
    """`01-02,05` -> 01, 02, 05 (the width of each range's first number kept)."""
    out: list[str] = []
    for piece in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", piece.strip())
        if not m or (m.group(2) is not None and int(m.group(2)) < int(m.group(1))):
            raise SlurmError(f"SLURM_JOB_NODELIST: cannot read the range {piece!r} in {nodelist!r}; expected "
                             "N or N-M with N <= M")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        out += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1)]
    return out


def hostnames(nodelist: str, scontrol: str | None = None) -> list[str]:
    """The job's hosts in Slurm's order: `scontrol show hostnames` where scontrol is on PATH, else
    expand_nodelist."""
    scontrol = scontrol or shutil.which("scontrol")
    if scontrol is None:
        return expand_nodelist(nodelist)
    try:
        proc = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SlurmError(f"SLURM_JOB_NODELIST: `scontrol show hostnames {nodelist}` failed ({exc})") from None
    hosts = proc.stdout.split()
    if proc.returncode != 0 or not hosts:
        why = " ".join(proc.stderr.split())[:200] or f"exit code {proc.returncode}, no host names"
        raise SlurmError(f"SLURM_JOB_NODELIST: `scontrol show hostnames {nodelist}` failed ({why})")
    return hosts


def _count_gpus() -> int:
    """GPUs `nvidia-smi -L` lists on this node (0 without nvidia-smi or when it fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(line.startswith("GPU ") for line in proc.stdout.splitlines()) if proc.returncode == 0 else 0


def gpus_on_node(env: Mapping[str, str], count_gpus: Callable[[], int] = _count_gpus) -> int:
    """This node's GPUs: SLURM_GPUS_ON_NODE, else SLURM_GPUS_PER_NODE (`4`, `a100:4`, `a100:2,v100:2`), else the
    count of `nvidia-smi -L`; 0 on a node without GPUs."""
    if env.get("SLURM_GPUS_ON_NODE", "").strip():
        return _int(env, "SLURM_GPUS_ON_NODE")
    per_node = env.get("SLURM_GPUS_PER_NODE", "").strip()
    if per_node:
        counts = [part.rsplit(":", 1)[-1] for part in per_node.split(",")]
        if not all(c.isdigit() for c in counts):
            raise SlurmError(f"SLURM_GPUS_PER_NODE: expected a GPU count such as 4 or a100:4, got {per_node!r}")
        return sum(int(c) for c in counts)
    return count_gpus()


def nproc_per_node(env: Mapping[str, str], gpus: int) -> int:
    """Training processes on this node: $DPOT_NPROC_PER_NODE when set, else one per GPU, else one."""
    if env.get(NPROC_ENV, "").strip():
        return _int(env, NPROC_ENV, minimum=1)
    return gpus if gpus > 0 else 1


def run_dir(options: Sequence[str]) -> str:
    """The --out of the launch options (`--out DIR` or `--out=DIR`)."""
    for i, opt in enumerate(options):
        if opt == "--out" and i + 1 < len(options):
            return options[i + 1]
        if opt.startswith("--out="):
            return opt.split("=", 1)[1]
    raise SlurmError("--out: missing from the launch options; expected --out RUN_DIR (the run folder a requeued "
                     "job resumes)")


def has_checkpoint(out: str) -> bool:
    """Whether RUN_DIR/checkpoints holds a complete checkpoint (then the node's launch passes --resume)."""
    from dpot_train.core.checkpoint import list_checkpoints

    return bool(list_checkpoints(Path(out) / "checkpoints"))


def launch_args(env: Mapping[str, str], options: Sequence[str], hosts: Sequence[str], gpus: int,
                resume: bool) -> list[str]:
    """`launch OPTIONS --nnodes N --node-rank R --nproc-per-node P [--rdzv-endpoint HOST:PORT] [--resume]` for the
    node whose Slurm environment is `env`; `hosts` the job's hosts in order (the first is the rendezvous host),
    `gpus` this node's GPUs, `resume` whether the run folder holds a checkpoint."""
    for opt in options:
        name = opt.split("=", 1)[0]
        if name in DECIDED:
            raise SlurmError(f"{name}: comes from the Slurm allocation; leave it out of the launch options")
    nnodes = _int(env, "SLURM_NNODES", minimum=1)
    rank = _int(env, "SLURM_NODEID")
    if rank >= nnodes:
        raise SlurmError(f"SLURM_NODEID: expected a node id below SLURM_NNODES={nnodes}, got {rank}")
    if len(hosts) != nnodes:
        raise SlurmError(f"SLURM_JOB_NODELIST: names {len(hosts)} host(s), expected SLURM_NNODES={nnodes}")
    port = _int(env, PORT_ENV, minimum=1) if env.get(PORT_ENV, "").strip() else DEFAULT_PORT
    args = ["launch", *options, "--nnodes", str(nnodes), "--node-rank", str(rank),
            "--nproc-per-node", str(nproc_per_node(env, gpus))]
    if nnodes > 1:
        args += ["--rdzv-endpoint", f"{hosts[0]}:{port}"]
    return args + (["--resume"] if resume else [])


def node_command(env: Mapping[str, str], options: Sequence[str]) -> list[str]:
    """The whole command this node runs: `python -m dpot_train launch ...` (this interpreter)."""
    nodelist = env.get("SLURM_JOB_NODELIST", "").strip() or env.get("SLURM_NODELIST", "").strip()
    if not nodelist:
        raise SlurmError("SLURM_JOB_NODELIST: not set; expected it from Slurm (run this under srun in an sbatch job)")
    resume = has_checkpoint(run_dir(options))
    args = launch_args(env, options, hostnames(nodelist), gpus_on_node(env), resume)
    return [sys.executable, "-m", "dpot_train", *args]


def wait_for_workers(address: str, workers: int, timeout: float) -> int:
    """Wait until the dask scheduler at `address` has `workers` workers (connecting for up to `timeout` seconds,
    then up to `timeout` seconds for the workers); returns how many joined, SlurmError after the timeout."""
    from distributed import Client

    try:
        client = Client(address, timeout=timeout)
    except OSError as exc:
        why = " ".join(str(exc).split())[:200]
        raise SlurmError(f"{address}: no dask scheduler answered within {timeout:g} s ({why})") from None
    try:
        client.wait_for_workers(workers, timeout=timeout)
        return len(client.scheduler_info()["workers"])
    except TimeoutError:
        have = len(client.scheduler_info()["workers"])
        raise SlurmError(f"{address}: {have} of {workers} dask worker(s) joined within {timeout:g} s; expected one "
                         "per node (see the worker lines in the job's log)") from None
    finally:
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """`launch [--print] -- OPTIONS` (exec the node's launch, or print it) or `dask-wait ADDRESS --workers N`."""
    ap = argparse.ArgumentParser(prog="python -m dpot_train.run.slurm", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    launch = sub.add_parser("launch", help="run this node's dpot-train launch")
    launch.add_argument("--print", action="store_true", help="print the command instead of running it")
    launch.add_argument("options", nargs=argparse.REMAINDER, help="-- then dpot-train launch options")
    wait = sub.add_parser("dask-wait", help="wait until a dask scheduler has N workers")
    wait.add_argument("address")
    wait.add_argument("--workers", type=int, required=True)
    wait.add_argument("--timeout", type=float, default=120.0, help="seconds (default 120)")
    args = ap.parse_args(argv)
    try:
        if args.command == "dask-wait":
            have = wait_for_workers(args.address, args.workers, args.timeout)
            print(f"dask scheduler {args.address}: {have} worker(s)", file=sys.stderr)
            return 0
        options = args.options[1:] if args.options[:1] == ["--"] else args.options
        cmd = node_command(os.environ, options)
    except SlurmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print:
        print(shlex.join(cmd))
        return 0
    print(f"node {os.environ.get('SLURM_NODEID')}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    os.execv(cmd[0], cmd)
    return 0  # not reached: execv replaces this process


if __name__ == "__main__":
    sys.exit(main())
