"""`dpot-train launch`: check the data and RUN_DIR, write RUN_DIR/config.yaml, then hand over to torchrun.

The launcher replaces itself with torchrun (exec), so that a scheduler's signals reach torchrun directly; every
data problem (missing shard, wrong checksum, anything dpot_format's validator refuses, unknown mixture name,
mismatched channels) is reported before that, one line per problem.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dpot_train.checkpoint import latest_checkpoint, list_checkpoints
from dpot_format.readers import hold_shared
from dpot_format.validate import validate_output
from dpot_train.config import DataConfig, TrainConfig, load_config, save_config
from dpot_train.data.manifest import DataError, expand_outputs, manifest_url, read_manifests
from dpot_train.data.mixture import parse_mixture, resolve_weights
from dpot_train.data.prepare import prepare_stream
from dpot_train.trainer import RunDirError

# Fields a resume may change: they do not alter the data stream or the optimisation.
_RESUMABLE = {"out", "progress", "log_every", "ckpt_every", "keep_checkpoints", "eval_at_end", "eval_split",
              "rollout_steps", "eval_max_trajectories", "device", "audit", "data.num_workers",
              "data.worker_kind", "data.verify_checksums", "deterministic", "trust",
              "allow_convention_mismatch"}
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
    """`python -m dpot_train.torchrun ... -m dpot_train.worker --config ...` for this topology (torchrun's
    arguments; the wrapper keeps a worker's one-line error to itself)."""
    cmd = [sys.executable, "-m", "dpot_train.torchrun", f"--nproc-per-node={topo.nproc_per_node}"]
    if topo.nnodes > 1:
        if not topo.rdzv_endpoint:
            raise ValueError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")
        cmd += [f"--nnodes={topo.nnodes}", f"--node-rank={topo.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={topo.rdzv_endpoint}", f"--rdzv-conf=join_timeout={topo.rdzv_timeout}"]
    else:
        cmd += ["--standalone", "--nnodes=1"]
    cmd += ["-m", "dpot_train.worker", "--config", str(config_path)]
    if resume:
        cmd.append("--resume")
    if checksums_verified:
        cmd.append("--checksums-verified")
    return cmd


def _diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(a) | set(b)):
        key = f"{prefix}{k}"
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict) and key not in ("model_overrides",) and key != "data.mixture":
            out += _diff(va, vb, key + ".")
        elif va != vb:
            out.append(key)
    return out


def _absolute(path: str) -> str:
    """A local path made absolute (a resume or --config from another directory finds it); URLs are kept."""
    return path if "://" in path else str(Path(path).expanduser().resolve())


def absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """cfg with its manifest, mixture-file and --init paths absolute."""
    data = cfg.data
    mixture = data.mixture
    if isinstance(mixture, str) and "=" not in mixture and Path(mixture).exists():  # a file (not a packaged name
        mixture = _absolute(mixture)                                                 # or an inline 'a=1,b=2')
    data = replace(data, manifests=[_absolute(m) for m in data.manifests], mixture=mixture)
    return replace(cfg, data=data, init=_absolute(cfg.init) if cfg.init else None)


def resolve_recipe(cfg: TrainConfig) -> TrainConfig:
    """cfg with `recipe` decided: as given, else "reference" when --init names released weights, else "dpot"."""
    if cfg.recipe is not None:
        return cfg
    from dpot_train.model_setup import is_released

    released = bool(cfg.init) and is_released(cfg.init, cfg.trust)
    return replace(cfg, recipe="reference" if released else "dpot")


MAX_PARAMETERS = 10**10  # 160 GB of fp32 weights, gradients and AdamW states per process: more fits no device


def model_parameters(model: str, overrides: dict) -> int:
    """Parameter count of the preset with its overrides, from two blocks built on the meta device (no memory, and no
    time spent building a depth a typo made huge)."""
    from dpot_train.model.factory import build_model, resolve_config

    config = resolve_config(model, **overrides)
    one, two = (sum(p.numel() for p in build_model(config.replace(depth=d), device="meta").parameters())
                for d in (1, 2))
    return one + (config.depth - 1) * (two - one)


def validate_config(cfg: TrainConfig, source: str | None = None) -> None:
    """Every check that needs no data, so that a mistake is one line before torchrun, not a traceback after it;
    `source` (the run config file the values came from) prefixes the line."""
    try:
        _validate_config(cfg)
    except ValueError as exc:
        if source is None:
            raise
        raise ValueError(f"{source}: {exc}") from None


def _validate_config(cfg: TrainConfig) -> None:
    from dpot_train.model.factory import resolve_config

    try:
        resolve_config(cfg.model, **cfg.model_overrides)
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(f"--model {cfg.model!r}: {exc}") from None
    count = model_parameters(cfg.model, cfg.model_overrides)
    if count > MAX_PARAMETERS:
        raise ValueError(f"model_overrides {cfg.model_overrides}: expected a model of at most {MAX_PARAMETERS:.0e} "
                         f"parameters; preset {cfg.model!r} with these overrides has {count:.2e}")
    if cfg.ckpt_every <= 0 or cfg.log_every <= 0 or cfg.steps <= 0:
        raise ValueError("steps, ckpt_every and log_every must be positive")
    if cfg.recipe not in (None, "dpot", "reference"):
        raise ValueError(f"--recipe must be dpot or reference, got {cfg.recipe!r}")
    if not 0 < cfg.optim.warmup_pct < 1:
        raise ValueError(f"optim.warmup_pct must lie strictly between 0 and 1, got {cfg.optim.warmup_pct}")
    try:  # the same schedule the trainer builds, on a dummy parameter
        dummy = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr)
        torch.optim.lr_scheduler.OneCycleLR(dummy, max_lr=cfg.optim.lr, total_steps=cfg.steps,
                                            pct_start=cfg.optim.warmup_pct, cycle_momentum=False)
    except (ZeroDivisionError, ValueError) as exc:
        raise ValueError(f"--steps {cfg.steps} with optim.warmup_pct {cfg.optim.warmup_pct}: the one-cycle schedule "
                         f"cannot be built ({type(exc).__name__}: {exc}); choose another --steps") from None
    if cfg.init:
        from dpot_train.model.checkpoint import load_state_dict_file

        if not Path(cfg.init).is_file():
            raise FileNotFoundError(f"--init checkpoint not found: {cfg.init}")
        load_state_dict_file(cfg.init, trusted=cfg.trust)  # refuses pickled objects unless --trust


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


MAX_PROBLEM_LINES = 50  # lines `launch` prints before counting the rest


def check_outputs(data: DataConfig) -> None:
    """Run dpot_format's validator on every output the config names (the parts the backend reads, every split);
    DataError with one line per fatal problem (prefixed by its output folder) when any is found."""
    lines: list[str] = []
    part = "zarr" if data.backend == "zarr" else "shards"
    for path in [m for given in data.manifests for m in expand_outputs(given)]:
        for problem in validate_output(path, rehash=data.verify_checksums, parts=(part,), scan=False):
            if not problem.fatal:
                continue
            if problem.kind in ("manifest", "schema"):  # names manifest.json itself: say which one
                lines.append(f"{manifest_url(path)}: {problem.actual}")
            else:
                lines.append(f"{path.rstrip('/')}/{problem}")  # the file, member or array by its full path
    if lines:
        more = len(lines) - MAX_PROBLEM_LINES
        shown = lines[:MAX_PROBLEM_LINES] + ([f"... and {more} more problem(s)"] if more > 0 else [])
        raise DataError("\n".join(shown))


def hold_outputs(data: DataConfig) -> list[int]:
    """Take the readers' lock (dpot_format.readers) of every local output the run reads, inheritable so that it lasts
    through the exec into torchrun, for the whole run: `dpot-data ingest --overwrite` then refuses to delete the files
    the run reads, in one line, instead of the run failing on a missing shard hours later."""
    fds = []
    for given in data.manifests:
        for path in expand_outputs(given):
            if "://" in path:
                continue
            fd = hold_shared(Path(path).parent if path.endswith(".json") else Path(path))
            if fd is not None:
                os.set_inheritable(fd, True)
                fds.append(fd)
    return fds


def prepare_run(cfg: TrainConfig, resume: bool, topo: Topology, source: str | None = None
                ) -> tuple[TrainConfig, Path]:
    """Check RUN_DIR and the data, write config.yaml; returns the config to run and its path. `source`: the run
    config file the settings came from (named in errors)."""
    validate_config(cfg, source)
    cfg = absolute_paths(cfg)
    run = Path(cfg.out)
    cfg_path = run / "config.yaml"
    has_ckpt = bool(list_checkpoints(run / "checkpoints"))
    if has_ckpt and not resume:
        raise RunDirError(f"{run} already holds checkpoints; pass --resume to continue it or choose another --out")
    if resume and has_ckpt:  # the newest one that loads, damaged newer ones set aside; none: one line, here
        latest_checkpoint(run / "checkpoints")
    if resume and cfg_path.exists():
        saved = absolute_paths(load_config(cfg_path))  # a run written before paths were stored absolute: from here
        changed = [k for k in _diff(saved.to_dict(), cfg.to_dict()) if k not in _RESUMABLE]
        if changed and has_ckpt:
            raise RunDirError(f"--resume: {', '.join(changed)} differ from {cfg_path}; a resumed run keeps its "
                              "data, model and optimiser settings (start a new --out to change them)")
    if cfg.batch_size % (topo.nproc_per_node * topo.nnodes):
        raise ValueError(f"--batch-size {cfg.batch_size} (global) must be divisible by the "
                         f"{topo.nproc_per_node * topo.nnodes} processes")
    cfg = resolve_recipe(cfg)
    hold_outputs(cfg.data)  # before the checks: what is checked is what the run reads
    datasets = read_manifests(list(cfg.data.manifests))  # each manifest readable, the mixture names them: first
    resolve_weights([d.name for d in datasets], parse_mixture(cfg.data.mixture), cfg.data.mixture_partial)
    check_outputs(cfg.data)  # docs/format.md on every output, sha256 included unless disabled
    spec, _ = prepare_stream(cfg.data, cfg.seed, validated=True)  # mixture, compatibility, trajectory index
    if cfg.init and not cfg.allow_convention_mismatch:
        from dpot_train.model_setup import convention_problems, is_released

        if is_released(cfg.init, cfg.trust):
            problems = convention_problems(spec.datasets, cfg.init)
            if problems:
                raise ValueError(problems[0])
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, cfg_path)
    layout = {k: v for k, v in asdict(topo).items() if k != "node_rank"}
    (run / LAYOUT_NAME).write_text(json.dumps(layout) + "\n", encoding="utf-8")
    return cfg, cfg_path
