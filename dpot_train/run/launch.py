"""`dpot-train launch`: check the data and RUN_DIR, write RUN_DIR/config.yaml, then hand over to torchrun.

The launcher's process becomes torchrun's (`hand_over`: torchrun runs in it, as an exec would have it: the same pid,
so that a scheduler's signals reach torchrun directly, and the same held locks), without starting a second
interpreter and importing torch again; every data problem (missing shard, wrong checksum, anything dpot_format's validator refuses, unknown mixture name,
mismatched channels) is reported before that, one line per problem.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import torch

from dpot_train.core.checkpoint import RunDirError, latest_checkpoint, list_checkpoints
from dpot_format.errors import FormatError
from dpot_format.grid import grid_text
from dpot_format.lock import FileLock, LockBusy
from dpot_format.names import MANIFEST_NAME
from dpot_format.readers import hold_shared
from dpot_format.tar import SampleIndex
from dpot_format.validate import validate_output
from dpot_train.core.config import DataConfig, TrainConfig, load_config, resolve_epochs, save_config
from dpot_train.train import startup
from dpot_train.data.cached_reader import cache_dir, uses_cache, with_cache
from dpot_train.data.datasets import (DataError, DatasetInfo, datasets_of_docs, expand_outputs, manifest_url,
                                      note_scanned, read_manifest_docs)
from dpot_train.data.hash_pool import HashProgress, hash_runner
from dpot_train.data.verified import RecordPolicy, Records
from dpot_train.data.mixture import parse_mixture, resolve_weights
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.readers import indexed_trajectories
from dpot_train.data.windows import run_grid, stored_shape
from dpot_train.integrations.hub import is_reference
from dpot_train.model.family_config import GridError
from dpot_train.core.model_setup import data_overrides, fresh_config
from dpot_train.core.normalize import applied, describe
from dpot_train.train.run_plan import InitFacts, make_plan, save_plan
from dpot_train.train.schedule import one_cycle
from dpot_train.core.topology import LAYOUT_NAME, Topology, layout_record, resume_layout, save_layout, torchrun_command

__all__ = ["LAYOUT_NAME", "Topology", "prepare_run", "resume_layout", "torchrun_command", "validate_config"]

# Fields a resume may change: they do not alter the data stream or the optimisation.
_RESUMABLE = {"out", "progress", "log_every", "ckpt_every", "keep_checkpoints", "eval_at_end", "eval_split",
              "eval_every", "rollout_steps", "eval_max_trajectories", "device", "audit", "data.num_workers",
              "data.worker_kind", "data.verify_checksums", "data.checksum_record", "deterministic", "trust",
              "allow_convention_mismatch", "data.cache_dir", "data.cache_limit", "init_sha256", "tracker",
              "tracker_project", "compile", "compile_mode"}


# Fields computed from `epochs` and the data at launch: a resume recomputes them, so they are not compared.
_FROM_EPOCHS = {"steps", "optim.decay_every"}


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
    """A local path made absolute (a resume or --config from another directory finds it); URLs and Hub references
    (dpot:Ti) are kept."""
    return path if "://" in path or is_reference(path) else str(Path(path).expanduser().resolve())


def absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """cfg with its manifest, mixture-file and --init paths absolute."""
    data = cfg.data
    mixture = data.mixture
    if isinstance(mixture, str) and "=" not in mixture and Path(mixture).exists():  # a file (not a packaged name
        mixture = _absolute(mixture)                                                 # or an inline 'a=1,b=2')
    data = replace(data, manifests=[_absolute(m) for m in data.manifests], mixture=mixture)
    return replace(cfg, data=data, init=_absolute(cfg.init) if cfg.init else None)


def resolve_recipe(cfg: TrainConfig, init: InitFacts | None) -> TrainConfig:
    """cfg with `recipe` decided: as given, else "reference" when --init names released weights, else "dpot"."""
    if cfg.recipe is not None:
        return cfg
    return replace(cfg, recipe="reference" if init is not None and init.released else "dpot")


MAX_PARAMETERS = 10**10  # 160 GB of fp32 weights, gradients and AdamW states per process: more fits no device


def model_parameters(model: str, overrides: dict) -> int:
    """Parameter count of the preset (any family) with its overrides, without allocating weights (DPOT: from two
    blocks built on the meta device, so no time is spent building a depth a typo made huge)."""
    from dpot_train.model import families

    return families.parameter_count(families.resolve(model, **overrides))


def validate_config(cfg: TrainConfig, source: str | None = None) -> InitFacts | None:
    """Every check that needs no data, so that a mistake is one line before torchrun, not a traceback after it;
    `source` (the run config file the values came from) prefixes the line. Returns what the one load of `--init`
    found (None without --init)."""
    loaded = _validated(cfg, source)
    return loaded[0] if loaded is not None else None


InitLoad = tuple[InitFacts, dict[str, Any], Any]  # (facts, state dict, DPOTConfig) of the one load of --init


def _validated(cfg: TrainConfig, source: str | None, digest: list[str] | None = None) -> InitLoad | None:
    """validate_config, keeping the --init state dict and model config for the checks that need the data; `digest`
    receives the --init file's sha256, taken in its one read."""
    try:
        _validate_config(cfg)
    except ValueError as exc:
        if source is None:
            raise
        raise ValueError(f"{source}: {exc}") from None
    return load_init(cfg.init, cfg.trust, cfg.init_sha256, digest) if cfg.init else None


def init_facts(path: str, trust: bool) -> InitFacts:
    """Load the --init checkpoint once (weights-only unless --trust, its sha256 record checked) and keep what the
    launch decides from it."""
    return load_init(path, trust)[0]


def load_init(path: str, trust: bool, sha256: str | None = None, digest: list[str] | None = None) -> InitLoad:
    """The one load of the --init checkpoint (checked against `sha256` when given): (facts, state dict, model
    config). A file that holds no DPOT model (a torch file of another network) is refused here, naming it, not in
    every worker after torchrun starts. A Hub reference (dpot:Ti, hf://...) is resolved through huggingface_hub's
    cache; the facts then name it pinned to its commit (hf://OWNER/REPO/FILE@COMMIT), the file the workers load."""
    from dpot_train.core.checkpoint import load_state_dict_file
    from dpot_train.integrations.hub import resolve
    from dpot_train.model import CheckpointError
    from dpot_train.core.model_setup import checkpoint_config

    hub = resolve(path) if is_reference(path) else None
    if hub is not None:
        path = str(hub.path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"--init checkpoint not found: {path}")
    digest = digest if digest is not None else []
    loaded = load_state_dict_file(path, trusted=trust, sha256=sha256.lower() if sha256 else None, digest_out=digest)
    try:
        state, model_config = checkpoint_config(path, trust, loaded)
    except (CheckpointError, TypeError, ValueError) as exc:
        text = str(exc)
        raise CheckpointError(text if text.startswith(str(path)) else f"{path}: {text}") from None
    if hub is not None:
        return InitFacts(hub.pinned, loaded[1] is None, loaded[1], hub.record(digest[-1])), state, model_config
    return InitFacts(_absolute(path), loaded[1] is None, loaded[1]), state, model_config


def _validate_config(cfg: TrainConfig) -> None:
    from dpot_train.model import families

    try:
        families.resolve(cfg.model, **cfg.model_overrides)
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
    check_schedule(cfg)
    if cfg.init_sha256 is not None and not cfg.init:
        raise ValueError("--sha256 checks the --init checkpoint; pass --init CHECKPOINT")
    from dpot_train.core.checkpoint import check_sha256_option

    check_sha256_option(cfg.init_sha256)
    if not cfg.init and cfg.load != "all":
        raise ValueError(f"--load {cfg.load}: names components of an --init checkpoint; pass --init CHECKPOINT")
    if cfg.init:  # the file itself is loaded once, by init_facts
        from dpot_train.train.finetune import parse_components

        parse_components(cfg.load)
    from dpot_train.integrations.trackers import check_installed, tracker_names

    check_installed(tracker_names(cfg.tracker))  # a missing package: one line naming the extra, before torchrun


def grid_refusal(cfg: TrainConfig, ds: Any, exc: GridError) -> str:
    """One line for a grid the run's model cannot take (a side not a multiple of its patch size): the grid and the
    nearest valid one in the manifest's axis order, with the options that give it."""
    grid = stored_shape(exc.grid, ds.model_layout)
    near = ",".join(map(str, stored_shape(exc.nearest, ds.model_layout)))
    what = f"--init {cfg.init}" if cfg.init else f"--model {cfg.model}"
    return (f"{what}: dataset {ds.name!r} gives the model a {grid_text(grid)} grid ({', '.join(ds.dims)}"
            f"{'; from --res' if cfg.data.res else ''}), not a multiple of the patch size {exc.multiple} on every "
            f"axis; the nearest valid grid is {near.replace(',', 'x')}: train with --res {near}, or ingest with "
            f"--resolution {near}")


def check_model_size(cfg: TrainConfig, fixed: dict) -> None:
    """The fresh model on the data's grid (or --res) stays within MAX_PARAMETERS: its positional embedding grows with
    the grid (cubically for 3D), so a large --res would otherwise fail in every worker."""
    if cfg.init:
        return
    from dpot_train.model import families

    count = families.parameter_count(families.configure(cfg.model, fixed, cfg.model_overrides))  # any family's fit
    if count > MAX_PARAMETERS:
        raise ValueError(f"--res {grid_text(cfg.data.res)}: expected a grid the model fits at most "
                         f"{MAX_PARAMETERS:.0e} parameters on; preset {cfg.model!r} on a "
                         f"{grid_text(fixed['img_size'])} grid has {count:.2e}")


class _Groups(torch.optim.Optimizer):
    """An optimiser of one parameter group holding no parameter, which a schedule is built on (check_schedule);
    torch's Optimizer.__init__ is left out: its first call imports torch._dynamo (~1 s of the launcher's checks)."""

    def __init__(self, lr: float) -> None:  # noqa: D107 - no super().__init__(), on purpose (above)
        self.defaults: dict[str, Any] = {"lr": lr}
        self.param_groups: list[dict[str, Any]] = [{"params": [], "lr": lr}]
        self.state: dict[Any, Any] = {}


def check_schedule(cfg: TrainConfig) -> None:
    """The learning-rate schedule can be built for cfg.steps (one-cycle) or has a decay interval (step)."""
    if cfg.optim.schedule == "step":
        if cfg.optim.decay_every <= 0 and cfg.optim.decay_every_epochs <= 0:
            raise ValueError("optim.schedule step needs optim.decay_every (steps) or optim.decay_every_epochs > 0")
        return
    if not 0 < cfg.optim.warmup_pct < 1:
        raise ValueError(f"optim.warmup_pct must lie strictly between 0 and 1, got {cfg.optim.warmup_pct}")
    try:  # the same schedule the trainer builds, on one group of no parameters
        one_cycle(_Groups(cfg.optim.lr), cfg.steps, cfg.optim)
    except (ZeroDivisionError, ValueError) as exc:
        raise ValueError(f"--steps {cfg.steps} with optim.warmup_pct {cfg.optim.warmup_pct}: the one-cycle schedule "
                         f"cannot be built ({type(exc).__name__}: {exc}); choose another --steps") from None


MAX_PROBLEM_LINES = 50  # lines `launch` prints before counting the rest


def check_outputs(data: DataConfig, docs: dict[str, dict] | None = None, progress: bool = True,
                  workers: int | None = None, record: RecordPolicy | None = None,
                  said: list[str] | None = None) -> dict[str, list[SampleIndex]]:
    """Run dpot_format's validator on every output the config names (the parts the backend reads, every split);
    DataError with one line per fatal problem (prefixed by its output folder) when any is found. `docs`: the
    manifests already read (manifest url -> document), not read again. Returns the member index of every shard
    (url -> samples): the datasets' recorded index (no tar header is read), else as the validator scanned it from
    the tar headers (one line says so); the run does not read them again.

    The sha256 pass runs on a local thread pool (`dpot_train.data.hash_pool`; `workers` threads, None: one per
    usable core), results in manifest order, so the lines are those of a one-thread pass; its bar (over the bytes
    `docs` list) is shown unless `progress` is False (--no-progress). `record` (launch's): each local output's
    record of what was verified before (`dpot_train.data.verified`) serves the sha256 of every shard or array
    unchanged since, and receives what this pass verifies; None: every listed item is hashed."""
    lines: list[str] = []
    index: dict[str, list[SampleIndex]] = {}
    scanned: list[tuple[str, dict]] = []
    part = "zarr" if data.backend == "zarr" else "shards"
    paths = [m for given in data.manifests for m in expand_outputs(given)]
    # the cache checks each download's size and sha256: only the outputs read without it are rehashed here
    cached = {p: uses_cache([p], data.backend) for p in paths}
    rehashed = {p: data.verify_checksums and not cached[p] for p in paths}
    started = time.perf_counter()
    records = Records(record if any(rehashed.values()) else None)
    size, count = records.to_hash([(p, ((docs or {}).get(manifest_url(p)) or {}).get("datasets", []))
                                   for p in paths if rehashed[p]], part)
    pool = any(rehashed.values()) and (count > 0 or not docs)  # none when the records vouch for everything
    with records, hash_runner(pool, part, workers) as runner, \
            HashProgress(size, count, part, progress) as bar:
        for path in paths:
            doc = (docs or {}).get(manifest_url(path))
            if part == "shards" and doc is not None:
                scanned += [(manifest_url(path), entry) for entry in doc["datasets"]]
            for problem in validate_output(path, rehash=rehashed[path], parts=(part,), scan=False, manifest=doc,
                                           indexes=index, trust_index=True, stat_remote=not cached[path],
                                           runner=runner if rehashed[path] else None,
                                           progress=records.progress(path, bar) if rehashed[path] else None,
                                           memo=records.record(path, doc, part) if rehashed[path] else None):
                if not problem.fatal:
                    continue
                if problem.kind in ("manifest", "schema"):  # names manifest.json itself: say which one
                    lines.append(f"{manifest_url(path)}: {problem.actual}")
                else:
                    lines.append(f"{path.rstrip('/')}/{problem}")  # the file, member or array by its full path
    if any(rehashed.values()):
        startup.note("hashing", time.perf_counter() - started)
    if lines:
        more = len(lines) - MAX_PROBLEM_LINES
        shown = lines[:MAX_PROBLEM_LINES] + ([f"... and {more} more problem(s)"] if more > 0 else [])
        raise DataError("\n".join(shown))
    note_scanned(scanned)
    summary = records.summary(part)
    if summary is not None and said is not None:  # said by the caller once every check has passed (stdout)
        said.append(summary)
    return index


def check_names(cfg: TrainConfig, datasets: list[DatasetInfo], weights: dict[str, float],
                init: InitFacts | None) -> None:
    """What the manifests alone can refute, checked before any shard is hashed (every mixture name present was
    checked by resolve_weights): the evaluation split present (unless --no-eval), and released --init weights on
    data of their convention."""
    from dpot_train.evaluation.evaluate import require_split

    if cfg.eval_at_end:
        require_split(datasets, cfg.eval_split, "pass --no-eval to train without the final evaluation")
    if cfg.eval_every > 0:
        check_validation_split(datasets, cfg.eval_every)
    if init is not None and init.released and not cfg.allow_convention_mismatch:
        from dpot_train.core.model_setup import convention_problems

        problems = convention_problems([d for d in datasets if weights[d.name] > 0], cfg.init)
        if problems:
            raise ValueError(problems[0])


def check_validation_split(datasets: list[DatasetInfo], every: int) -> None:
    """`--eval-every` scores the `valid` split of every dataset: ValueError naming those without one (from the
    manifests, before torchrun), instead of a run that validates nothing and keeps no best.pt."""
    from dpot_train.data.datasets import without_split
    from dpot_train.train.validation import VALID_SPLIT

    names = without_split(datasets, VALID_SPLIT)
    if names:
        raise ValueError(f"--eval-every {every}: no {VALID_SPLIT!r} trajectories to validate on in dataset(s) {names}; "
                         "re-ingest with a validation split (`dpot-data ingest ... --split TRAIN,VALID --overwrite`, "
                         "e.g. --split 0.8,0.1: 80% train, 10% valid, the rest test), or drop --eval-every")


def hold_outputs(data: DataConfig) -> list[int]:
    """Take the readers' lock (dpot_format.readers) of every local output the run reads, inheritable so that it lasts
    through the exec into torchrun, for the whole run: `dpot-data ingest --overwrite` then refuses to delete the files
    the run reads, in one line, instead of the run failing on a missing shard hours later."""
    fds = []
    for given in data.manifests:
        for path in expand_outputs(given):
            manifest = Path(path) if path.endswith(".json") else Path(path) / MANIFEST_NAME
            if "://" in path or not manifest.is_file():  # no dpot output there: nothing to lock, and no lock file
                continue                                 # left in the user's folder
            fd = hold_shared(manifest.parent)
            if fd is not None:
                os.set_inheritable(fd, True)
                fds.append(fd)
    return fds


RUN_LOCK = ".dpot-run.lock"  # in RUN_DIR: held by the launch, then by torchrun (the exec keeps it), for the run


class RunLock:
    """The exclusive lock of a RUN_DIR (dpot_format.lock.FileLock on RUN_DIR/.dpot-run.lock): one launch or resume
    at a time writes into a run folder. Its descriptor is inheritable, so the exec into torchrun keeps it held until
    the run ends (the kernel releases it when torchrun exits, however it exits); the file records the holder's pid
    and host, which a refused launch names."""

    def __init__(self, run: Path) -> None:
        self.run = Path(run)
        self.created = False
        self.made: list[Path] = []  # the folders acquire created, RUN_DIR first, then its missing parents
        self.lock = FileLock(self.run / RUN_LOCK)

    def acquire(self, record: bool = True) -> "RunLock":
        """Take the lock (creating RUN_DIR when missing) or raise RunDirError naming the folder and the holder.
        `record` False (a dry run's probe): the holder record is left as it is."""
        if self.run.exists() and not self.run.is_dir():
            raise RunDirError(f"{self.run}: is a file, expected a run folder (--out RUN_DIR)")
        self.created = not self.run.exists()
        self.made = [p for p in (self.run, *self.run.absolute().parents) if not p.exists()]
        self.run.mkdir(parents=True, exist_ok=True)
        try:
            fd = self.lock.acquire().fd
        except LockBusy:  # RUN_DIR is the holder's: nothing here is removed
            raise RunDirError(f"{self.run}: another launch is running in this run folder ({self._holder()}); wait for "
                              "it to end, or choose another --out") from None
        except FormatError as exc:
            self.abandon()
            raise RunDirError(str(exc)) from None
        except OSError as exc:  # a file system without flock: nothing to coordinate with, as for the readers' lock
            print(f"warning: {self.run}: cannot be locked ({exc.strerror or exc}); make sure no other launch writes "
                  "into it", file=sys.stderr)
            return self
        os.set_inheritable(fd, True)
        if record:
            holder = {"pid": os.getpid(), "host": socket.gethostname(),
                      "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        return self

    def _holder(self) -> str:
        """"pid N on host H since T" from the lock file, as far as it can be read."""
        try:
            with open(self.run / RUN_LOCK, "rb") as fh:
                record = json.loads(fh.read(4096) or b"{}")
            return f"pid {int(record['pid'])} on host {record['host']}, since {record['started']}"
        except (OSError, ValueError, KeyError, TypeError):
            return f"it holds {RUN_LOCK}"

    def release(self) -> None:
        """Give the lock back now (a dry run, or a launch that stopped before torchrun)."""
        self.lock.release()

    def abandon(self) -> None:
        """Release, and remove RUN_DIR (and the parents of it that acquire created, e.g. `runs/` of `--out
        runs/a`) again when this lock created it and nothing else was written into it (the lock file is unlinked
        while still held, so that no other launch is holding the file removed): a refused launch leaves nothing."""
        self.lock.remove = self.created and self.lock.fd >= 0
        self.release()
        for folder in self.made if self.created else []:
            try:
                folder.rmdir()
            except OSError:  # not empty (another launch's, or the user's since): kept, and so are its parents
                break


@contextmanager
def reading(manifests: list[str]) -> Iterator[None]:
    """The readers' lock of every local output in `manifests` for the block (evaluate, preview): an `ingest
    --overwrite` of one of them refuses meanwhile instead of deleting the shards being read (hold_outputs)."""
    fds = hold_outputs(DataConfig(manifests=[str(m) for m in manifests]))
    try:
        yield
    finally:
        for fd in fds:
            os.close(fd)


def init_model_name(cfg: TrainConfig, init_config: Any, named: str | None) -> TrainConfig:
    """cfg with `model` naming the family of the --init weights, whose architecture is what trains: kept when it
    names a preset of that family; when the user named it (`named`: "--model", or "FILE: model" for a run config
    file) and it names another family, ValueError in one line; otherwise (the default) the weights' preset (their
    family's first when they match none), so that config.yaml records what the run trains."""
    from dpot_train.model import families

    family = families.family_of(init_config)
    try:
        mine = families.family_of(families.preset_config(cfg.model))
    except KeyError:
        mine = None
    if mine is family:
        return cfg
    if named is not None:
        given = f"names a {mine.label} preset" if mine is not None else "names no preset"
        raise ValueError(f"{named} {cfg.model}: {given}, but --init {cfg.init} holds {family.label} weights, which "
                         f"decide what trains; expected a preset of that family ({', '.join(family.presets)}), or "
                         f"drop {named if named == '--model' else 'model from that file'}")
    size = families.size_name(init_config)
    return replace(cfg, model=size if size in family.presets else next(iter(family.presets)))


def prepare_run(cfg: TrainConfig, resume: bool, topo: Topology, source: str | None = None, write: bool = True,
                model_named: str | None = None) -> tuple[TrainConfig, Path]:
    """Check the config, RUN_DIR and the data, then write config.yaml, plan.json (the RunPlan the workers load) and
    launch.json; returns the config to run and its path. `source`: the run config file the settings came from;
    `model_named`: where `model` was named ("--model", "FILE: model"), None when it is the default (with --init, the
    weights' family is then recorded: init_model_name).

    RUN_DIR's lock (RunLock) is taken before RUN_DIR is looked at and stays held (through the exec into torchrun)
    unless a check fails; a node other than the first of a multi-node run is part of the same run and takes none.
    `write` False (`launch --dry-run`): every check, nothing written (no RUN_DIR files, no readers' lock); a run
    already holding RUN_DIR is still refused."""
    digest: list[str] = []
    loaded = _validated(cfg, source, digest)  # the one read of --init, its sha256 taken on the way
    if loaded is not None and loaded[0].hub is not None:  # a Hub reference: recorded pinned to the commit read
        cfg = replace(cfg, init=loaded[0].path)
    cfg = absolute_paths(cfg)
    if cfg.init and cfg.init_sha256 is None:  # recorded in the run: every worker loads the file launch checked
        cfg = replace(cfg, init_sha256=digest[0])
    elif cfg.init_sha256 is not None:
        cfg = replace(cfg, init_sha256=cfg.init_sha256.lower())
    run = Path(cfg.out)
    lock = None
    if topo.node_rank == 0 and (write or (run / RUN_LOCK).is_file()):  # a dry run only probes an existing lock
        lock = RunLock(run).acquire(record=write)
    try:
        result = _prepare_run(cfg, resume, topo, loaded, write, source, model_named)
    except BaseException:
        if lock is not None:
            lock.abandon()
        raise
    if not write and lock is not None:
        lock.release()
    elif lock is not None:
        _HELD[run.absolute()] = lock
    return result


_HELD: dict[Path, RunLock] = {}  # RUN_DIR locks this process holds until its exec into torchrun (or release_run)


def release_run(out: str | Path) -> None:
    """Give back the RUN_DIR lock prepare_run took in this process (a caller that prepares a run without executing
    torchrun, e.g. a test or a notebook); nothing when none is held."""
    lock = _HELD.pop(Path(out).absolute(), None)
    if lock is not None:
        lock.release()


def _prepare_run(cfg: TrainConfig, resume: bool, topo: Topology, loaded: InitLoad | None, write: bool = True,
                 source: str | None = None, model_named: str | None = None) -> tuple[TrainConfig, Path]:
    init = loaded[0] if loaded is not None else None
    run = Path(cfg.out)
    found = list_checkpoints(run / "checkpoints")
    if loaded is not None and not (resume and found):  # --init decides the model (a resume: its checkpoint does)
        cfg = init_model_name(cfg, loaded[2], model_named)
    check_run_dir(cfg, resume)
    if cfg.batch_size % (topo.nproc_per_node * topo.nnodes):
        raise ValueError(f"--batch-size {cfg.batch_size} (global) must be divisible by the "
                         f"{topo.nproc_per_node * topo.nnodes} processes")
    cfg = with_cache(resolve_recipe(cfg, init))
    if write:
        hold_outputs(cfg.data)  # before the checks: what is checked is what the run reads
    docs = read_manifest_docs(list(cfg.data.manifests))  # each manifest read once, here
    datasets = datasets_of_docs(docs)
    try:
        mixture = parse_mixture(cfg.data.mixture)
    except DataError as exc:  # a mapping under data.mixture came from the run config file: name it too
        raise DataError(f"{source}: {exc}" if source and isinstance(cfg.data.mixture, dict) else str(exc)) from None
    weights = resolve_weights([d.name for d in datasets], mixture, cfg.data.mixture_partial)
    check_names(cfg, datasets, weights, init)  # splits and conventions: before the checksum pass
    said: list[str] = []  # what the record of verified shards saved: said once every check has passed
    index = check_outputs(cfg.data, docs, cfg.progress,  # docs/format.md on every output, sha256 unless disabled
                          record=RecordPolicy(cfg.data.checksum_record, write, cache_dir(cfg.data.cache_dir, cfg.out)),
                          said=said)
    spec, _ = prepare_stream(cfg.data, cfg.seed, validated=True, datasets=datasets, index=index)  # compatibility
    normalise = describe(cfg.data.normalize, spec.datasets, spec.norm, cfg.data.norm_stats)  # said once all is checked
    cfg = replace(cfg, data=replace(cfg.data, norm_stats=applied(spec.norm)))  # the statistics, in config.yaml
    evaluation = indexed_trajectories(datasets, cfg.eval_split, index) if cfg.eval_at_end else {}
    cfg = resolve_epochs(cfg, spec.epoch_length)
    check_schedule(cfg)
    ds0 = spec.datasets[0]
    fixed = data_overrides(len(ds0.channels), run_grid(ds0.shape, ds0.model_layout, cfg.data.res), cfg.data.t_in,
                           cfg.data.t_out)
    try:
        if not cfg.init:  # the preset fits this data (e.g. its Fourier modes fit the grid): one line, before torchrun
            fresh_config(cfg.model, cfg.model_overrides, fixed)
        check_model_size(cfg, fixed)
        if loaded is not None and not (resume and found):  # a resume loads its own checkpoint, not --init
            from dpot_train.train.finetune import check_components

            check_components(cfg.init or "", loaded[1], loaded[2], fixed, cfg.load, cfg.model_overrides)
    except GridError as exc:  # a side off the patch size: the nearest grid, as --res and --resolution take it
        raise ValueError(grid_refusal(cfg, ds0, exc)) from None
    if resume and found and max(step for step, _ in found) >= cfg.steps:
        rest = "only the final evaluation is repeated" if cfg.eval_at_end else "nothing is left to do"
        print(f"{run}: the run already reached its last step ({cfg.steps}); {rest}", file=sys.stderr)
    print(normalise, file=sys.stderr)
    for line in said:  # on stderr with the line above: stdout of --dry-run is the run config (YAML)
        print(line, file=sys.stderr, flush=True)
    cfg_path = run / "config.yaml"
    if not write:
        return cfg, cfg_path
    run.mkdir(parents=True, exist_ok=True)
    save_config(cfg, cfg_path)
    save_plan(make_plan(cfg.to_dict(), docs, weights, spec, evaluation, init, layout_record(topo)), run)
    save_layout(run, topo)
    return cfg, cfg_path


def hand_over(cmd: list[str]) -> NoReturn:
    """Run torchrun (`cmd`: torchrun_command's `python -m dpot_train.run.torchrun ARGS`) in this process and exit with
    its code. This process then is torchrun's, as after an exec (the pid a scheduler signals, the RUN_DIR and readers'
    locks held through the run), and torch, imported for the checks, is not imported again by a second interpreter
    (1-3 s of a launch's fixed cost). What an exec'd torchrun did at its end is kept: an exception is its traceback
    and exit code 1, Ctrl-C ends the process by SIGINT."""
    from dpot_train.run import torchrun

    module = cmd.index("dpot_train.run.torchrun")
    try:
        code = torchrun.main(cmd[module + 1:])
    except KeyboardInterrupt:
        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except Exception:  # noqa: BLE001 - torchrun's failure (a crashed rank, SIGTERM): its traceback, as before
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


def check_run_dir(cfg: TrainConfig, resume: bool) -> None:
    """RUN_DIR fits the request: no checkpoints without --resume; on --resume a checkpoint that loads (damaged newer
    ones set aside) and the run's data, model and optimiser settings unchanged."""
    run = Path(cfg.out)
    cfg_path = run / "config.yaml"
    has_ckpt = bool(list_checkpoints(run / "checkpoints"))
    if has_ckpt and not resume:
        raise RunDirError(f"{run} already holds checkpoints; pass --resume to continue it or choose another --out")
    if resume and has_ckpt:  # the newest one that loads, damaged newer ones set aside; none: one line, here
        latest_checkpoint(run / "checkpoints")
        from dpot_train.train.validation import check_best

        check_best(run / "checkpoints")  # a damaged best.pt set aside too: the resumed validation writes a new one
    if resume and has_ckpt and cfg_path.exists():
        saved = absolute_paths(load_config(cfg_path))  # a run written before paths were stored absolute: from here
        derived = _FROM_EPOCHS if cfg.epochs > 0 else set()  # recomputed from the data on every launch
        changed = [k for k in _diff(saved.to_dict(), cfg.to_dict()) if k not in _RESUMABLE | derived]
        if changed:
            raise RunDirError(f"--resume: {', '.join(changed)} differ from {cfg_path}; a resumed run keeps its "
                              "data, model and optimiser settings (start a new --out to change them)")
