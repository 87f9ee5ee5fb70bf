"""Typed run configuration (data, optimiser, training), saved as YAML in RUN_DIR and as a plain dict in checkpoints."""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dpot_format.grid import parse_grid


@dataclass
class DataConfig:
    """Where the shards are and how windows are cut from them."""

    manifests: list[str] = field(default_factory=list)
    # Mixture: None (weight 1 per dataset, the balanced default), a YAML file path, or an inline mapping name -> weight.
    mixture: str | dict[str, float] | None = None
    mixture_partial: bool = False  # datasets of the mixture absent from the manifests are dropped (shares renormalised)
    split: str = "train"
    backend: str = "webdataset"  # "webdataset" or "zarr"
    t_in: int = 10
    t_out: int = 1
    # grid every window is resized to, per run (the shards keep their grid): trilinear for 3D, bilinear for 2D, as
    # the reference's loaders do; 0 keeps the stored grid, N is N on every axis, a list one side per stored axis
    # (the manifest's grid.dims order: [H, W] = y, x; [D, H, W] = z, y, x)
    res: int | list[int] = 0
    noise: float = 5e-4  # epsilon of the noise injection x + eps * ||x|| * N(0, 1)
    num_workers: int = 0
    worker_kind: str = "thread"  # loader workers: "thread" (the default) or "process" (DataLoader worker processes)
    verify_checksums: bool = True
    # with verify_checksums: skip what the record of verified shards vouches for (--verify-checksums auto); False:
    # hash every local shard and Zarr array (always); dpot_train/data/verified.py
    checksum_record: bool = True
    cache_dir: str | None = None  # shard cache for shards in object storage (docs/training.md); None: the default
    cache_limit: str | None = None  # its size bound ("200GiB"); None: 100 GiB
    # per-channel normalisation from the manifests' train statistics (dpot_train/core/normalize.py): "auto" (every
    # dataset but the paper's sources under dpot-reference), "manifest" (every dataset) or "none"
    normalize: str = "auto"
    # the statistics the run normalises with, dataset name -> {mean: [C], std: [C]}: filled in by the run from the
    # manifests (None) and saved with every checkpoint, so that evaluation applies the same ones
    norm_stats: dict[str, dict[str, list[float]]] | None = None

    def __post_init__(self) -> None:
        if self.normalize not in ("auto", "none", "manifest"):
            raise ValueError(f"data.normalize must be auto, none or manifest, got {self.normalize!r}")
        if self.normalize == "none" and self.norm_stats:
            raise ValueError("data.norm_stats: expected none with data.normalize none")
        if self.worker_kind not in ("thread", "process"):
            raise ValueError(f"data.worker_kind must be 'thread' or 'process', got {self.worker_kind!r}")
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"data.num_workers must be an integer >= 0, got {self.num_workers!r}")
        if isinstance(self.res, tuple):
            self.res = list(self.res)
        if not isinstance(self.res, list) and (not isinstance(self.res, int) or isinstance(self.res, bool)
                                               or self.res < 0):
            raise ValueError(f"data.res must be an integer >= 0 (0: the stored grid), got {self.res!r}")
        if isinstance(self.res, list):
            sides = parse_grid(self.res, "data.res", MAX_RES)
            self.res = list(sides) if isinstance(sides, tuple) else sides


OPTIMIZERS = ("adamw", "adam")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
SCHEDULES = ("one_cycle", "step")


@dataclass
class OptimConfig:
    """Optimiser and learning-rate schedule: AdamW and one-cycle by default (paper values); the reference's
    fine-tuning scripts use Adam (L2 weight decay) with one-cycle (2D) or step decay (3D)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.9)
    weight_decay: float = 1e-6
    optimizer: str = "adamw"  # "adamw" (decoupled weight decay) or "adam" (decay added to the gradient)
    schedule: str = "one_cycle"  # "one_cycle" (warm-up then cosine) or "step" (lr * decay_gamma every decay_every)
    warmup_pct: float = 0.2
    div_factor: float = 1e4  # initial lr = lr / div_factor
    final_div_factor: float = 1e4  # final lr = initial lr / final_div_factor
    decay_every: int = 0  # step schedule: optimiser steps between decays (set from decay_every_epochs when given)
    decay_every_epochs: float = 0.0  # step schedule: epochs between decays, converted with the dataset size
    decay_gamma: float = 0.5  # step schedule: factor of each decay
    clip_grad: float = 1.0  # max global gradient norm; 0 disables clipping

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optim.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule must be one of {SCHEDULES}, got {self.schedule!r}")


@dataclass
class TrainConfig:
    """Everything one run needs; the YAML form of this is RUN_DIR/config.yaml."""

    out: str = "run"
    model: str = "tiny"  # a preset name: DPOT's (tiny, Ti, S, M, L, H) or a baseline's (fno, fno-m, unet, ...)
    model_overrides: dict[str, Any] = field(default_factory=dict)  # model config fields to change (e.g. img_size)
    init: str | None = None  # checkpoint to fine-tune from (released format or one of ours)
    # components of --init to load, the reference's names: "all" or a list of patch_embed, pos, blocks, time_agg,
    # cls_head, scale_feats, out; what is not loaded (or cannot be: channels, patch size, dimension) starts fresh
    load: str | list[str] = "all"  # YAML may give a list; it is kept as the comma-separated string
    epochs: float = 0  # > 0: steps = epochs x ceil(trajectory visits per epoch / batch_size), as the reference counts
    trust: bool = False  # allow arbitrary pickled objects in the --init checkpoint (unsafe; weights-only otherwise)
    # sha256 of the --init file: given (--sha256) or recorded by launch; every load of the file is checked against it
    init_sha256: str | None = None
    steps: int = 1000
    batch_size: int = 8  # global batch: split evenly over the processes
    seed: int = 0
    loss: str = "valid"  # "valid": valid channels and fluid cells; "all": every channel and cell, like the reference
    # "dpot": our recipe (loss and noise over valid channels and fluid cells); "reference": the reference DPOT's (loss
    # and noise over every channel and cell, its evaluation); None: reference when --init names released weights
    recipe: str | None = None
    allow_convention_mismatch: bool = False  # released weights on shards of another convention
    device: str = "auto"  # "auto", "cpu" or "cuda"
    amp: bool = True  # bf16 autocast on CUDA (ignored on CPU)
    deterministic: bool = False  # deterministic CUDA kernels (bitwise-repeatable GPU runs and resumes)
    # torch.compile the training step's forward, loss, backward and optimiser step
    # (dpot_train.train.trainer.compiled_step)
    compile: bool = False
    compile_mode: str | None = None  # torch.compile mode; None: reduce-overhead (CUDA graphs) on CUDA, default on CPU
    log_every: int = 10
    ckpt_every: int = 100
    keep_checkpoints: int = 3
    eval_at_end: bool = True
    eval_every: int = 0  # > 0: validation-split rollout L2RE every N steps; the best weights kept as checkpoints/best.pt
    eval_split: str = "test"
    rollout_steps: int = 0  # 0: roll out to the end of each test trajectory
    eval_max_trajectories: int = 0  # 0: all test trajectories of each dataset
    audit: bool = False  # write the trajectory ids each rank consumed (audit.jsonl)
    progress: bool = True
    # experiment trackers rank 0 mirrors metrics.jsonl and eval.json to (dpot_train/integrations/trackers.py): a list of
    # wandb, mlflow (YAML or --tracker may give "wandb,mlflow"; "none" or empty: off); kept as a list
    tracker: str | list[str] = field(default_factory=list)
    tracker_project: str | None = None  # W&B project / MLflow experiment; None: $WANDB_PROJECT, ..., else "dpot"
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        if isinstance(self.load, (list, tuple)):
            self.load = ",".join(str(c) for c in self.load)
        from dpot_train.integrations.trackers import tracker_names

        self.tracker = tracker_names(self.tracker)
        if self.compile_mode is not None and self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode: expected one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (lists, not tuples) that YAML and torch.load(weights_only=True) both accept."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """Build from a (possibly partial) dict; unknown keys are an error that names them."""
        d = dict(d)
        data = _build(DataConfig, _section(d.pop("data", {}), "data"), "data")
        optim = _build(OptimConfig, _section(d.pop("optim", {}), "optim"), "optim")
        cfg = _build(cls, d, "")
        cfg.data, cfg.optim = data, optim
        cfg.optim.betas = tuple(float(b) for b in cfg.optim.betas)  # type: ignore[assignment]
        return cfg


def steps_per_epoch(epoch_length: int, batch_size: int) -> int:
    """Optimiser steps of one epoch: the reference's len(train_loader), ceil(visits / batch)."""
    return max(1, math.ceil(epoch_length / batch_size))


def resolve_epochs(cfg: TrainConfig, epoch_length: int) -> TrainConfig:
    """cfg with `steps` (and a step schedule's `decay_every`) computed from `epochs` and the data's epoch length;
    unchanged when epochs is 0. Deterministic, so a resume resolves to the same numbers."""
    per = steps_per_epoch(epoch_length, cfg.batch_size)
    optim = cfg.optim
    if optim.decay_every_epochs > 0:
        optim = dataclasses.replace(optim, decay_every=max(1, round(optim.decay_every_epochs * per)))
    if cfg.epochs <= 0:
        return dataclasses.replace(cfg, optim=optim)
    return dataclasses.replace(cfg, steps=max(1, math.ceil(cfg.epochs * per)), optim=optim)


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def _section(value: Any, key: str) -> dict[str, Any]:
    """A nested section of the run config (`data:`, `optim:`): a mapping of its keys; empty when absent."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{key}: expected a mapping of {key} keys (indented below `{key}:`), got {value!r}")
    return value


def _build(cls: type, d: dict[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    prefix = f"{where}." if where else ""
    if unknown:
        keys = ", ".join(prefix + k for k in unknown)
        raise ValueError(f"unknown config key(s) {keys}; expected one of {sorted(names)}")
    hints = typing.get_type_hints(cls)
    for key, value in d.items():
        problem = _field_problem(hints[key], value) or _range_problem(prefix + key, value)
        if problem:
            raise ValueError(f"{prefix}{key}: expected {problem}, got {value!r}")
    return cls(**d)


MAX_RES = 4096  # --res: 8x the largest grid DPOT was trained on; beyond it one window alone fills a device


def res_value(value: Any, option: str = "--res") -> int | list[int]:
    """A grid as `--res`, `open_dataset(res=...)` and `preview` take it ("64", "48,64", 64, (48, 64), [16, 24, 32])
    as data.res holds it: 0, one side, or a list of sides in the manifest's axis order; ValueError in one line."""
    sides = parse_grid(value, option, MAX_RES)
    return list(sides) if isinstance(sides, tuple) else sides

# Upper bounds that keep a mistyped number from reaching the worker (where it would exhaust memory or time).
_LIMITS: dict[str, tuple[float, float, str]] = {
    "steps": (1, 10**10, "a whole number of steps from 1 to 1e10"),
    "batch_size": (1, 2**20, "a global batch from 1 to 1048576"),
    "log_every": (1, 10**10, "a positive whole number"),
    "ckpt_every": (1, 10**10, "a positive whole number"),
    "eval_every": (0, 10**10, "a whole number of steps >= 0 (0: no validation)"),
    "optim.lr": (0, 10.0, "a learning rate above 0 and at most 10"),
    "data.noise": (0, 1e3, "a finite noise epsilon >= 0"),
    "data.t_in": (1, 4096, "a frame count from 1 to 4096"),
    "data.t_out": (1, 4096, "a frame count from 1 to 4096"),
    "data.num_workers": (0, 1024, "a worker count from 0 to 1024"),
    "data.res": (0, MAX_RES, f"a grid side from 1 to {MAX_RES} (0: the stored grid)"),
    "optim.weight_decay": (0, 1e3, "a finite weight decay >= 0"),
    "optim.clip_grad": (0, 1e12, "a finite gradient norm >= 0 (0: no clipping)"),
    "optim.div_factor": (1e-12, 1e12, "a finite positive factor"),
    "optim.final_div_factor": (1e-12, 1e12, "a finite positive factor"),
}


_WORDS = {int: "a whole number", float: "a finite number", bool: "true or false", str: "a string",
          dict: "a mapping", list: "a list"}


def _fits(option: Any, value: Any) -> bool:
    """One type of a field's annotation accepts `value` (bools are not numbers; floats must be finite)."""
    if option is type(None):
        return value is None
    if option is bool or option is str:
        return isinstance(value, option)
    if option is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if option is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    origin = typing.get_origin(option) or option
    if origin in (list, tuple):  # and each item of the type the annotation names (list[str], tuple[float, float])
        items = typing.get_args(option)
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and items and Ellipsis not in items:
            return len(value) == len(items) and all(_fits(t, v) for t, v in zip(items, value))
        return not items or all(_fits(items[0], v) for v in value)
    return isinstance(value, origin)


def _field_problem(hint: Any, value: Any) -> str | None:
    """What a field of this type accepts, when `value` does not fit it; None when it does."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if any(_fits(option, value) for option in options):
        return None
    return " or ".join(_describe(o) for o in options if o is not type(None))


def _describe(option: Any) -> str:
    """What one type of a field's annotation accepts, in words ("a list of strings", "a list of 2 finite numbers")."""
    origin, items = typing.get_origin(option), typing.get_args(option)
    if origin in (list, tuple) and items and Ellipsis not in items:
        if origin is tuple and len(set(items)) == 1:
            return f"a list of {len(items)} {_describe(items[0]).split(' ', 1)[1]}s"
        if origin is list:
            return f"a list of {_describe(items[0]).split(' ', 1)[1]}s"
    return _WORDS.get(origin or option, getattr(origin or option, "__name__", str(option)))


def _range_problem(key: str, value: Any) -> str | None:
    """The allowed range of a numeric field when `value` lies outside it."""
    low, high, what = _LIMITS.get(key, (-math.inf, math.inf, ""))
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not low <= value <= high:
        return what
    if key == "optim.lr" and value == 0:
        return what
    return None


Limit = tuple[float, float, str]  # (lowest, highest, what is expected in words)


def check_arguments(checks: list[tuple[str, Any, Any, str | Limit | None]]) -> None:
    """Arguments of a library call (`dpot_train.open_dataset`) checked as a run config's keys are, so that a
    mistyped number fails at once in one line instead of deep in the data path: each (name, value, type, the
    config key whose range it takes (`_LIMITS`, e.g. "data.res" up to MAX_RES) or its own range, or None).
    ValueError "<name>: expected ..., got ..." for the first that does not fit."""
    for name, value, hint, limit in checks:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            value = int(value)  # a numpy integer counts as the whole number it is
        problem = _field_problem(hint, value)
        if problem is None and isinstance(limit, str):
            problem = _range_problem(limit, value)
        elif problem is None and limit is not None and isinstance(value, (int, float)) and \
                not limit[0] <= value <= limit[1]:
            problem = limit[2]
        if problem:
            raise ValueError(f"{name}: expected {problem}, got {value!r}")


def apply_overrides(cfg: TrainConfig, overrides: dict[str, Any]) -> TrainConfig:
    """Return a copy with dotted keys (``optim.lr``, ``data.noise``, ``steps``) replaced; None values are skipped."""
    d = cfg.to_dict()
    for key, value in overrides.items():
        if value is None:
            continue
        node = d
        parts = key.split(".")
        for p in parts[:-1]:
            node = node[p]
        if parts[-1] not in node:
            raise ValueError(f"unknown config key {key!r}")
        node[parts[-1]] = value
    return TrainConfig.from_dict(d)


MAX_YAML_BYTES = 1 << 20  # run configs and mixtures are a few KB; refuse anything near a megabyte


class _NoAliasLoader(yaml.SafeLoader):
    """The safe loader without anchors/aliases: a config never needs them, and nested aliases ("billion laughs")
    expand exponentially in everything that walks the result."""

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.YAMLError(f"YAML aliases are not accepted (line {event.start_mark.line + 1})")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # type: ignore[override]
        """A key given twice is an error (YAML would keep the last one silently)."""
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _NoAliasDumper(yaml.SafeDumper):
    """Writes repeated values out in full, so that what we write is what read_yaml accepts."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def read_yaml(path: str | Path) -> Any:
    """A small YAML file read safely: size-bounded, UTF-8, no aliases; ValueError naming the file otherwise."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise ValueError(f"{path}: expected a YAML file, found something else")
        if size > MAX_YAML_BYTES:
            raise ValueError(f"{path}: {size} bytes; a YAML config is expected to be under {MAX_YAML_BYTES} bytes")
        text = path.read_bytes().decode("utf-8")
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise ValueError(_yaml_problem(path, exc)) from None


def _yaml_problem(path: Path, exc: yaml.YAMLError) -> str:
    """One line `file:line: problem` for a YAML error (PyYAML's own message spans several lines of context)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
    return f"{where}: not valid YAML: {' '.join(str(problem).split())}"


def shipped_configs() -> dict[str, Path]:
    """The run configs installed with the package (dpot_train/configs/<name>.yaml), by name."""
    from importlib import resources

    folder = resources.files("dpot_train").joinpath("configs")
    if not folder.is_dir():
        return {}
    return {entry.name[:-len(".yaml")]: Path(str(entry)) for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".yaml") and entry.is_file()}


def find_config(given: str | Path) -> Path:
    """`--config`: a YAML file path, else a shipped config by name (`pretrain-ti`, `pretrain-ti.yaml`), so that an
    installed copy finds them too; ValueError listing the shipped names otherwise."""
    path = Path(given)
    if path.exists():
        return path  # load_config names the file if it is not a readable YAML mapping
    if len(path.parts) > 1:
        raise ValueError(f"--config {given}: no such file")
    shipped = shipped_configs()
    name = path.name[:-len(".yaml")] if path.name.endswith(".yaml") else path.name
    if name in shipped:
        return shipped[name]
    raise ValueError(f"--config {given}: no such file, and no shipped config of that name; shipped: "
                     f"{', '.join(shipped) or 'none'}")


def load_config(path: str | Path) -> TrainConfig:
    """Read a YAML run config (safe loader, no aliases, size-bounded)."""
    d = read_yaml(path) or {}
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a run config must be a YAML mapping, got {type(d).__name__}")
    try:
        return TrainConfig.from_dict(d)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from e


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write the config as YAML atomically (fsynced temporary file, rename)."""
    from dpot_format.io import atomic_write

    atomic_write(Path(path), yaml.dump(cfg.to_dict(), Dumper=_NoAliasDumper, sort_keys=False).encode("utf-8"))
