"""RunPlan: what `dpot-train launch` decided about a run, built once and saved as RUN_DIR/plan.json beside
config.yaml. The workers, the trainer and the final evaluation load it instead of reading the manifests again,
indexing the shards' tar headers again or loading `--init` again."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dpot_format.io import atomic_write
from dpot_train.data.datasets import DataError, DatasetInfo, datasets_of_docs
from dpot_train.data.readers import TrajRef
from dpot_train.data.stream import StreamSpec

PLAN_NAME = "plan.json"
FORMAT = "dpot-run-plan/2"  # 2: with the evaluation split's trajectories


@dataclass(frozen=True)
class InitFacts:
    """What launch learned from the `--init` checkpoint in its one load."""

    path: str
    released: bool  # the released {'model': state_dict} format (no `config` entry): reference recipe, conventions
    config: dict[str, Any] | None  # the DPOTConfig dict of one of our checkpoints
    # a Hub reference's resolution (dpot_train.integrations.hub.Resolved.record: as given, repo, file, commit, sha256);
    # None: a file
    hub: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunPlan:
    """The run's data and model decisions; everything is plain JSON."""

    config_sha256: str  # of the run config it was built for (config.yaml): a stale plan is refused
    manifests: dict[str, dict[str, Any]]  # manifest url -> its document, read and validated once
    weights: dict[str, float]  # mixture weight per dataset (0: left out)
    train: list[str]  # the weighted datasets, in stream order
    visits: list[int]  # per train dataset, visits per epoch
    refs: list[list[list[Any]]]  # per train dataset, its trajectories of the training split (TrajRef fields)
    evaluation: dict[str, list[list[Any]]]  # per dataset, its trajectories of the evaluation split (when indexed)
    init: InitFacts | None
    topology: dict[str, Any]  # the torchrun process layout

    def datasets(self) -> list[DatasetInfo]:
        """Every dataset of the manifests (the evaluation reads its split of each)."""
        return datasets_of_docs(self.manifests)

    def stream_spec(self, t_in: int, t_out: int, seed: int) -> StreamSpec:
        """The training stream's spec, shard index included: nothing is read."""
        by_name = {d.name: d for d in self.datasets()}
        return StreamSpec(datasets=[by_name[n] for n in self.train],
                          refs=[[TrajRef(*r) for r in refs] for refs in self.refs],
                          visits=list(self.visits), t_in=t_in, t_out=t_out, seed=seed)

    def eval_trajectories(self) -> dict[str, list[TrajRef]]:
        """Per dataset, the trajectories of the final evaluation's split that launch indexed: nothing is read."""
        return {name: [TrajRef(*r) for r in refs] for name, refs in self.evaluation.items()}

    def to_json(self) -> bytes:
        return (json.dumps({"format": FORMAT, **asdict(self)}, separators=(",", ":")) + "\n").encode()


def config_digest(config: dict[str, Any]) -> str:
    """sha256 of a run config dict (canonical JSON), binding a plan to its config.yaml."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def make_plan(config: dict[str, Any], docs: dict[str, dict[str, Any]], weights: dict[str, float], spec: StreamSpec,
              evaluation: dict[str, list[TrajRef]], init: InitFacts | None, topology: dict[str, Any]) -> RunPlan:
    """The plan of a checked run: the config it belongs to, the manifests read, the stream spec, the evaluation's
    trajectories and the --init facts."""
    return RunPlan(config_digest(config), docs, dict(weights), [d.name for d in spec.datasets], list(spec.visits),
                   [_fields(refs) for refs in spec.refs], {name: _fields(refs) for name, refs in evaluation.items()},
                   init, topology)


def _fields(refs: list[TrajRef]) -> list[list[Any]]:
    """Trajectory references as plain JSON lists of their fields."""
    return [list(asdict(r).values()) for r in refs]


def save_plan(plan: RunPlan, run: Path) -> Path:
    """Write RUN_DIR/plan.json atomically."""
    path = Path(run) / PLAN_NAME
    atomic_write(path, plan.to_json())
    return path


def load_plan(run: Path, config: dict[str, Any]) -> RunPlan | None:
    """RUN_DIR/plan.json (None when absent); DataError when it is not a plan of this config."""
    path = Path(run) / PLAN_NAME
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_bytes())
        if doc.pop("format") != FORMAT:
            raise ValueError("format tag")
        init = InitFacts(**doc.pop("init")) if doc.get("init") else doc.pop("init", None)
        plan = RunPlan(**doc, init=init)
    except (ValueError, TypeError, KeyError) as exc:
        raise DataError(f"{path}: expected a run plan written by `dpot-train launch` ({exc})") from None
    if plan.config_sha256 != config_digest(config):
        raise DataError(f"{path}: written for another run config than {Path(run) / 'config.yaml'}; run "
                        "`dpot-train launch` again to rebuild it")
    return plan
