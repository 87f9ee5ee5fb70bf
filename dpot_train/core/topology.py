"""The torchrun process layout of a run: given on the command line, or on --resume the one the run recorded in
RUN_DIR/launch.json; and the torchrun command for it."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from dpot_format.io import atomic_write

LAYOUT_NAME = "launch.json"  # RUN_DIR/launch.json: the process layout a resume reuses


@dataclass(frozen=True)
class Topology:
    """torchrun process layout."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    rdzv_timeout: int = 600  # seconds a node waits for the others to join (torchrun's join_timeout)

    def waiting_message(self) -> str | None:
        """What a node of a multi-node job prints before torchrun blocks in the rendezvous (None for one node)."""
        if self.nnodes <= 1:
            return None
        return (f"node {self.node_rank} of {self.nnodes}: waiting at {self.rdzv_endpoint} for the other "
                f"{self.nnodes - 1} node(s) to join (up to {self.rdzv_timeout} s; --rdzv-timeout changes it)")


def torchrun_command(config_path: Path, topo: Topology, resume: bool, checksums_verified: bool) -> list[str]:
    """`python -m dpot_train.run.torchrun ... -m dpot_train.run.worker --config ...` for this topology (torchrun's
    arguments; the wrapper keeps a worker's one-line error to itself)."""
    cmd = [sys.executable, "-m", "dpot_train.run.torchrun", f"--nproc-per-node={topo.nproc_per_node}"]
    if topo.nnodes > 1:
        if not topo.rdzv_endpoint:
            raise ValueError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        cmd += [f"--nnodes={topo.nnodes}", f"--node-rank={topo.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={topo.rdzv_endpoint}", f"--rdzv-conf=join_timeout={topo.rdzv_timeout}"]
    else:
        cmd += ["--standalone", "--nnodes=1"]
    cmd += ["-m", "dpot_train.run.worker", "--config", str(config_path)]
    if resume:
        cmd.append("--resume")
    if checksums_verified:
        cmd.append("--checksums-verified")
    return cmd


def resume_layout(run: Path, topo: Topology | None) -> Topology:
    """The layout to run: the one given, else (on a resume) the run's recorded one, else one process."""
    if topo is not None:
        return topo
    path = run / LAYOUT_NAME
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        layout = Topology(int(saved["nproc_per_node"]), int(saved["nnodes"]), 0, saved.get("rdzv_endpoint"),
                          int(saved.get("rdzv_timeout", 600)))
        print(f"resuming with the run's layout: {layout.nproc_per_node} process(es) per node x {layout.nnodes} "
              f"node(s) (from {path}; --nproc-per-node/--nnodes override it)", file=sys.stderr)
        return layout
    return Topology()


def choose_topology(run: Path, resume: bool, nproc_per_node: int | None, nnodes: int | None, node_rank: int,
                    rdzv_endpoint: str | None, rdzv_timeout: int) -> Topology:
    """The layout from the launch options: as given; on --resume with neither count given, the run's recorded one
    (this node keeps its own --node-rank and may name another rendezvous endpoint)."""
    given = None if nproc_per_node is None and nnodes is None else \
        Topology(nproc_per_node or 1, nnodes or 1, node_rank, rdzv_endpoint, rdzv_timeout)
    topo = resume_layout(run, given) if resume else (given or Topology())
    if topo.nnodes > 1 and topo.node_rank != node_rank:
        topo = Topology(topo.nproc_per_node, topo.nnodes, node_rank, rdzv_endpoint or topo.rdzv_endpoint,
                        topo.rdzv_timeout)
    return topo


def layout_record(topo: Topology) -> dict:
    """What RUN_DIR/launch.json records: the layout without this node's rank."""
    return {k: v for k, v in asdict(topo).items() if k != "node_rank"}


def save_layout(run: Path, topo: Topology) -> None:
    """Write RUN_DIR/launch.json (the layout a --resume reuses)."""
    atomic_write(run / LAYOUT_NAME, (json.dumps(layout_record(topo)) + "\n").encode())
