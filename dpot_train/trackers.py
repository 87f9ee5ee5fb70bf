"""Experiment trackers: rank 0 mirrors metrics.jsonl (same names, steps and values) and the final eval.json scalars
to Weights & Biases or MLflow (`launch --tracker wandb|mlflow`).

A tracker is an extra copy: metrics.jsonl stays the record. A tracker that cannot start, or raises while logging, is
reported in one `warning:` line and dropped for the rest of the run; training goes on. The tracker packages are
imported only when a tracker is chosen (the `track` extra). The id of each tracker's run is kept in
RUN_DIR/trackers.json, so that `launch --resume` continues the same tracker run.

A resume redoes the steps after its checkpoint, which the tracker run may already hold: each tracker then receives a
scalar only at a step it does not hold yet (`Held`), so its history, like metrics.jsonl, has every step once. What
it holds is read back from the tool where it can say (MLflow's metric history; W&B online: its next step), else taken
from the record kept in trackers.json, which is written after each flush: a stop between a flush and the record
can only send those steps again (to a tracker that cannot read back), never lose them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol

TRACKERS = ("wandb", "mlflow")
INSTALL = 'pip install "dpot[track]"'
STATE_NAME = "trackers.json"  # in RUN_DIR: {tracker: its run's id and where it lives, and RECORD_KEY}
RECORD_KEY = "held"  # in each tracker's entry: the steps it holds, as of its last flush (Held.record)
DEFAULT_PROJECT = "dpot"
MLFLOW_BATCH = 1000  # metrics per MlflowClient.log_batch call (the REST API's limit)
MLFLOW_PARAMS = 100  # params per log_batch call (the REST API's limit)
MLFLOW_PARAM_CHARS = 500  # a param value longer than this is cut (the API's limit is 6000 on recent servers)


class RunConfig(Protocol):
    """What the trackers read of dpot_train.config.TrainConfig (not imported: config.py parses with tracker_names)."""

    tracker: str | list[str]  # as TrainConfig declares it; a list once the config is built
    tracker_project: str | None

    def to_dict(self) -> dict[str, Any]: ...


class TrackerError(ValueError):
    """A tracker option the launch refuses (unknown name, package not installed); the message is one line."""


def tracker_names(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """The trackers a config or option value names, in order, each once: a list or a comma list of wandb and mlflow;
    "none" and empty entries name nothing."""
    items = [value] if isinstance(value, str) else list(value or [])
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise TrackerError(f"tracker: expected wandb, mlflow or none, got {item!r}")
        for name in (part.strip().lower() for part in item.split(",")):
            if name in ("", "none"):
                continue
            if name not in TRACKERS:
                raise TrackerError(f"tracker: expected wandb, mlflow or none, got {name!r}")
            if name not in names:
                names.append(name)
    return names


def check_installed(names: list[str]) -> None:
    """TrackerError naming `pip install "dpot[track]"` when a chosen tracker's package cannot be found (checked by
    launch before torchrun; nothing is imported)."""
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module left in sys.modules without a spec: there, but not importable
            found = False
        if not found:
            raise TrackerError(f"--tracker {name}: the {name} package is not installed; {INSTALL}")


class Held:
    """The steps a tracker run already holds: scalar `name` at `step` is held when step <= `upto` (every name up to
    there: W&B, whose steps only increase) or step <= `steps[name]` (that name's last step: MLflow's history, or
    what the record says was flushed). Steps start at 1; 0 holds nothing."""

    def __init__(self, upto: int = 0, steps: dict[str, int] | None = None) -> None:
        self.upto = upto
        self.steps = dict(steps or {})

    def holds(self, name: str, step: int) -> bool:
        """Whether `name` at `step` is in the tracker run already (a resume then leaves it out)."""
        return step <= max(self.upto, self.steps.get(name, 0))

    def add(self, names: list[str], step: int) -> None:
        """`names` at `step` are now held (after a flush)."""
        for name in names:
            self.steps[name] = max(self.steps.get(name, 0), step)

    def record(self) -> dict[str, Any]:
        """The JSON form kept in trackers.json (`from_record` reads it back)."""
        return {"upto": self.upto, "steps": dict(self.steps)}

    @classmethod
    def from_record(cls, record: Any) -> "Held":
        """A Held from trackers.json; an entry that is not a whole step is left out (nothing is held for it)."""
        if not isinstance(record, dict):
            return cls()

        def whole(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= 0

        steps = record.get("steps")
        steps = {k: v for k, v in steps.items() if isinstance(k, str) and whole(v)} if isinstance(steps, dict) else {}
        return cls(record["upto"] if whole(record.get("upto")) else 0, steps)


class Tracker(Protocol):
    """What the run hands a tracker: scalars at a step (possibly buffered until flush; sent once flush returns), and
    the end of the run; `state` is what RUN_DIR/trackers.json keeps to continue its run on --resume; `held` reads
    back what a continued run already holds (None: it cannot say, the record in trackers.json is used)."""

    state: dict[str, Any]

    def held(self) -> Held | None: ...

    def log(self, scalars: dict[str, float], step: int) -> None: ...

    def flush(self) -> None: ...

    def finish(self, failed: bool = False) -> None: ...


def _project(cfg: RunConfig, env: str) -> str:
    """--tracker-project, else the tool's own environment variable, else "dpot"."""
    return cfg.tracker_project or os.environ.get(env) or DEFAULT_PROJECT


class WandbTracker:
    """A Weights & Biases run named after RUN_DIR, in RUN_DIR/wandb unless $WANDB_DIR says otherwise; $WANDB_MODE
    (offline, disabled), $WANDB_ENTITY and the rest of wandb's environment apply as wandb defines them."""

    name = "wandb"

    def __init__(self, cfg: RunConfig, run: Path, stored: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=_project(cfg, "WANDB_PROJECT"), name=run.name, id=stored.get("id"),
                              resume="allow", dir=os.environ.get("WANDB_DIR") or str(run), job_type="train")
        self.run.config.update(cfg.to_dict(), allow_val_change=True)  # a resume may change log_every and the like
        self.state = {"id": self.run.id, "project": self.run.project}

    def held(self) -> Held | None:
        """Online: every step below the one the server continues from (it drops lower steps anyway). Offline the
        run cannot know what earlier offline files hold: None."""
        if self.run.offline:
            return None
        return Held(upto=max(0, int(self.run.starting_step) - 1))

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def flush(self) -> None:
        """wandb sends in the background; asking its service for the run's step is a round trip behind the records
        logged so far, so they have reached it when the record in trackers.json says so."""
        if not self.run.disabled:
            self.run.step  # noqa: B018 - the round trip is the point

    def finish(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    """An MLflow run named after RUN_DIR in experiment --tracker-project, at $MLFLOW_TRACKING_URI (default: a file
    store in RUN_DIR/mlruns). Metrics are buffered and sent in batches at each log step."""

    name = "mlflow"

    def __init__(self, cfg: RunConfig, run: Path, stored: dict[str, Any]) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run / "mlruns").as_uri()
        if uri.startswith("file:") or "://" not in uri:  # a file store: chosen explicitly here, so MLflow 3's opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # for it is given (set it false to refuse)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.run_id = stored.get("run_id") if stored.get("tracking_uri") == uri else None
        self.continued = self.run_id is not None
        if self.run_id is not None:
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = _project(cfg, "MLFLOW_EXPERIMENT_NAME")
            self.run_id = self.client.create_run(_experiment_id(self.client, experiment), run_name=run.name,
                                                 tags={"dpot.run_dir": str(run)}).info.run_id
            self._log_params(cfg)
        self.pending: list[Any] = []
        self.state = {"run_id": self.run_id, "tracking_uri": uri}

    def _log_params(self, cfg: RunConfig) -> None:
        """The run config as params (nested keys dotted; the normalisation statistics left out: they are data)."""
        from mlflow.entities import Param

        flat = _flatten(cfg.to_dict())
        params = [Param(k, str(v)[:MLFLOW_PARAM_CHARS]) for k, v in flat.items() if not k.startswith("data.norm_stats")]
        for i in range(0, len(params), MLFLOW_PARAMS):
            self.client.log_batch(self.run_id, params=params[i:i + MLFLOW_PARAMS])

    def held(self) -> Held:
        """The last step of each metric of a continued run, read back from the store: exact, even after a stop in
        the middle of a batch (a metric's history is appended in step order)."""
        if not self.continued:
            return Held()
        names = self.client.get_run(self.run_id).data.metrics
        return Held(steps={name: max((m.step for m in self.client.get_metric_history(self.run_id, name)), default=0)
                           for name in names})

    def log(self, scalars: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [Metric(key, float(value), now, step) for key, value in scalars.items()]
        if len(self.pending) >= MLFLOW_BATCH:
            self.flush()

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for i in range(0, len(pending), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=pending[i:i + MLFLOW_BATCH])

    def finish(self, failed: bool = False) -> None:
        self.flush()
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def _experiment_id(client: Any, name: str) -> str:
    """The id of MLflow experiment `name`, created when missing (another run creating it meanwhile is fine)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_KINDS: dict[str, Callable[..., Tracker]] = {"wandb": WandbTracker, "mlflow": MlflowTracker}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


class Trackers:
    """Rank 0's open trackers behind one log/flush/finish: a tracker that raises is named in one warning line and
    dropped; the others, and metrics.jsonl, go on. A scalar at a step a tracker run holds already (`held`, on a
    resume) is not sent to it again; after each flush `record(held)` keeps what each tracker now holds."""

    def __init__(self, open_trackers: dict[str, Tracker], held: dict[str, Held] | None = None,
                 record: Callable[[dict[str, Held]], None] | None = None) -> None:
        self.open = dict(open_trackers)
        self.held = {name: (held or {}).get(name) or Held() for name in self.open}
        self.record = record
        self.sent: dict[str, list[tuple[list[str], int]]] = {name: [] for name in self.open}  # since the last flush

    def _call(self, name: str, what: str, call: Callable[[Tracker], None]) -> bool:
        """call(tracker `name`); False, with the tracker dropped and one warning line, when it raises."""
        try:
            call(self.open[name])
        except Exception as exc:  # noqa: BLE001 - a tracker is a copy; the run and metrics.jsonl go on
            del self.open[name]
            _warn(f"--tracker {name}: {what} failed ({_one_line(exc)}); it receives nothing more from this run, "
                  "metrics.jsonl is unaffected")
            return False
        return True

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for name in list(self.open):
            self._call(name, what, call)

    def log(self, scalars: dict[str, float], step: int) -> None:
        """Scalars at a step, to every open tracker, less those its run holds already."""
        for name in list(self.open):
            new = {k: v for k, v in scalars.items() if not self.held[name].holds(k, step)}
            if new and self._call(name, f"logging step {step}", lambda t: t.log(new, step)):
                self.sent[name].append((list(new), step))

    def flush(self) -> None:
        """Send what the trackers buffered (called at each log step), then record what they now hold: after the
        flush, so that the record never claims a step a tracker may not have."""
        self._each("sending metrics", lambda t: t.flush())
        self._record()

    def finish(self, failed: bool = False) -> None:
        """Flush and close every tracker run (marked failed when the run did not end well), then record."""
        self._each("finishing", lambda t: t.finish(failed))
        self._record()
        self.open.clear()

    def _record(self) -> None:
        """What the open trackers were sent since the last flush is now held by them: `record` it."""
        changed = False
        for name in self.open:
            for names, step in self.sent[name]:
                self.held[name].add(names, step)
                changed = True
            self.sent[name] = []
        if changed and self.record is not None:
            self.record(self.held)


def read_state(run: Path) -> dict[str, Any]:
    """RUN_DIR/trackers.json ({} when absent or unreadable: the trackers then start new runs)."""
    try:
        state = json.loads((run / STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def open_trackers(cfg: RunConfig, run: Path, resume: bool) -> Trackers:
    """Start (or, on --resume, continue with the ids in RUN_DIR/trackers.json) the runs of cfg.tracker; rank 0 only.
    On --resume each tracker's held steps are read back (or taken from the record) so that the steps the resume
    redoes are not sent twice. The ids, and after each flush what each tracker holds, are written back atomically.
    One that cannot start is a warning line, and the run goes on without it."""
    run = Path(run).resolve()
    state = read_state(run) if resume else {}
    opened: dict[str, Tracker] = {}
    held: dict[str, Held] = {}
    for name in tracker_names(cfg.tracker):
        stored = state.get(name) if isinstance(state.get(name), dict) else {}
        try:
            tracker = _KINDS[name](cfg, run, stored)
        except Exception as exc:  # noqa: BLE001 - no tracker stops a training run
            _warn(f"--tracker {name}: could not start ({_one_line(exc)}); training goes on without it")
            continue
        try:
            found = tracker.held() if resume else Held()
        except Exception as exc:  # noqa: BLE001 - the record is the fallback
            _warn(f"--tracker {name}: cannot read back the steps its run holds ({_one_line(exc)}); the record in "
                  f"{STATE_NAME} is used")
            found = None
        opened[name] = tracker
        held[name] = found if found is not None else Held.from_record(stored.get(RECORD_KEY))
        state[name] = {**tracker.state, RECORD_KEY: held[name].record()}
    if not opened:
        return Trackers(opened)
    warned: list[bool] = []

    def record(now: dict[str, Held]) -> None:
        """trackers.json with what each open tracker holds now; a failure is one warning line, once."""
        from dpot_format.io import atomic_write

        for name, h in now.items():
            if isinstance(state.get(name), dict):
                state[name] = {**state[name], RECORD_KEY: h.record()}
        try:
            atomic_write(run / STATE_NAME, (json.dumps(state, indent=1) + "\n").encode())
        except OSError as exc:  # the tracking goes on; only a later --resume cannot find these runs
            if not warned:
                warned.append(True)
                _warn(f"{run / STATE_NAME}: cannot record the tracker runs ({_one_line(exc)}); a --resume will start "
                      "new ones")

    record(held)
    return Trackers(opened, held, record)
