"""Experiment trackers: rank 0 mirrors metrics.jsonl (same names, steps and values) and the final eval.json scalars
to Weights & Biases or MLflow (`launch --tracker wandb|mlflow`).

A tracker is an extra copy: metrics.jsonl stays the record. A tracker that cannot start, or raises while logging, is
reported in one `warning:` line and dropped for the rest of the run; training goes on. The tracker packages are
imported only when a tracker is chosen (the `track` extra). The id of each tracker's run is kept in
RUN_DIR/trackers.json, so that `launch --resume` continues the same tracker run.

A resume redoes the steps after its checkpoint, which the tracker run may hold already, and the tracker run may lack
steps that metrics.jsonl has (a tool that had not written or sent them when the run was killed). On --resume each
tracker's run is read back (`Held`: MLflow's metric history; W&B online, the step its server continues from; W&B
offline, the history in the earlier offline files of the run), the metrics.jsonl lines up to the checkpoint that it
lacks are sent first, and after that it receives a scalar only at a step it does not hold: its history, like
metrics.jsonl, has every step once. Only what the tool itself holds counts: a record of our own, written beside a
flush, could claim steps that the tool never kept (wandb writes its .wandb file every 15 s) or lag a flush.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

TRACKERS = ("wandb", "mlflow")
INSTALL = 'pip install "dpot[track]"'
STATE_NAME = "trackers.json"  # in RUN_DIR: {tracker: its run's id and where it lives}
DEFAULT_PROJECT = "dpot"
MLFLOW_BATCH = 1000  # metrics per MlflowClient.log_batch call (the REST API's limit)
MLFLOW_PARAMS = 100  # params per log_batch call (the REST API's limit)
MLFLOW_PARAM_CHARS = 500  # a param value longer than this is cut (the API's limit is 6000 on recent servers)


class RunConfig(Protocol):
    """What the trackers read of dpot_train.core.config.TrainConfig (not imported: config.py parses with
    tracker_names)."""

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
    """The steps a tracker run holds already: scalar `name` at `step` is held when step <= `upto` (every name up to
    there: W&B online, whose steps only increase) or step <= `steps[name]` (that name's last step, read back).
    Steps start at 1; 0 holds nothing."""

    def __init__(self, upto: int = 0, steps: dict[str, int] | None = None) -> None:
        self.upto = upto
        self.steps = dict(steps or {})

    def holds(self, name: str, step: int) -> bool:
        """Whether `name` at `step` is in the tracker run already (it is then not sent again)."""
        return step <= max(self.upto, self.steps.get(name, 0))

    def add(self, names: list[str], step: int) -> None:
        """`names` at `step` were sent."""
        for name in names:
            self.steps[name] = max(self.steps.get(name, 0), step)


class Tracker(Protocol):
    """What the run hands a tracker: scalars at a step (possibly buffered until flush), and the end of the run;
    `state` is what RUN_DIR/trackers.json keeps to continue its run on --resume; `held` reads back what the
    continued run holds already."""

    state: dict[str, Any]

    def held(self) -> Held: ...

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
        here = str(Path(self.run.settings.sync_dir).parent)  # the wandb folder of this attempt's files
        before = stored.get("dirs") if isinstance(stored.get("dirs"), list) else []
        dirs = [d for d in before if isinstance(d, str) and d != here] + [here]
        self.state = {"id": self.run.id, "project": self.run.project, "dirs": dirs}

    def held(self) -> Held:
        """Online: every step below the one the server continues from (it drops lower steps anyway). Offline: the
        last step of each name in the offline files of this run's earlier attempts (what wandb had written)."""
        if not self.run.offline:
            return Held(upto=max(0, int(self.run.starting_step or 0) - 1))
        steps: dict[str, int] = {}
        for folder in self.state["dirs"]:
            for path in sorted(Path(folder).glob(f"offline-run-*-{self.run.id}/run-{self.run.id}.wandb")):
                for name, step in wandb_history_steps(path).items():
                    steps[name] = max(steps.get(name, 0), step)
        return Held(steps=steps)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def flush(self) -> None:
        """Nothing to do: wandb sends in the background."""

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
    dropped; the others, and metrics.jsonl, go on. A scalar at a step that a tracker's run holds already (`held`,
    read back on a resume) is not sent to it again."""

    def __init__(self, open_trackers: dict[str, Tracker], held: dict[str, Held] | None = None) -> None:
        self.open = dict(open_trackers)
        self.held = {name: (held or {}).get(name) or Held() for name in self.open}

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
            held = self.held[name]
            new = {k: v for k, v in scalars.items() if not held.holds(k, step)}
            if new and self._call(name, f"logging step {step}", lambda t: t.log(new, step)):
                held.add(list(new), step)

    def flush(self) -> None:
        """Send what the trackers buffered (called at each log step)."""
        self._each("sending metrics", lambda t: t.flush())

    def finish(self, failed: bool = False) -> None:
        """Flush and close every tracker run (marked failed when the run did not end well)."""
        self._each("finishing", lambda t: t.finish(failed))
        self.open.clear()

    def backfill(self, metrics: Path, step: int) -> None:
        """On a resume from `step`: send the lines of metrics.jsonl (already cut back to `step`) that a tracker's
        run lacks, in step order before the redone steps, so that its history has every line (read a line at a
        time). Nothing is sent to a tracker that holds them all, the usual case."""
        if not self.open or step <= 0 or not metrics.exists() or all(h.upto >= step for h in self.held.values()):
            return
        with open(metrics, encoding="utf-8") as lines:
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:  # a line cut short: metrics.jsonl's own reader says so, not a tracker
                    continue
                at = rec.get("step") if isinstance(rec, dict) else None
                if isinstance(at, int) and 0 < at <= step:
                    self.log({k: v for k, v in rec.items() if k != "step"}, at)
        self.flush()


def read_state(run: Path) -> dict[str, Any]:
    """RUN_DIR/trackers.json ({} when absent or unreadable: the trackers then start new runs)."""
    try:
        state = json.loads((run / STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def open_trackers(cfg: RunConfig, run: Path, resume: bool) -> Trackers:
    """Start (or, on --resume, continue with the ids in RUN_DIR/trackers.json, and read back what each continued run
    holds) the runs of cfg.tracker; rank 0 only. The ids are written back atomically. One that cannot start is a
    warning line, and the run goes on without it."""
    from dpot_format.io import atomic_write

    run = Path(run).resolve()
    state = read_state(run) if resume else {}
    opened: dict[str, Tracker] = {}
    held: dict[str, Held] = {}
    for name in tracker_names(cfg.tracker):
        stored = state.get(name) if isinstance(state.get(name), dict) else {}
        tracker: Tracker | None = None
        try:
            tracker = _KINDS[name](cfg, run, stored)
            held[name] = tracker.held() if resume else Held()
        except Exception as exc:  # noqa: BLE001 - no tracker stops a training run
            _warn(f"--tracker {name}: could not start ({_one_line(exc)}); training goes on without it")
            _close_quietly(tracker)
            continue
        opened[name] = tracker
        state[name] = tracker.state
    if opened:
        try:
            atomic_write(run / STATE_NAME, (json.dumps(state, indent=1) + "\n").encode())
        except OSError as exc:  # the tracking goes on; only a later --resume cannot find these runs
            _warn(f"{run / STATE_NAME}: cannot record the tracker runs ({_one_line(exc)}); a --resume will start "
                  "new ones")
    return Trackers(opened, held)


def _close_quietly(tracker: Tracker | None) -> None:
    """Close a tracker run that was started but is not used (its failure was said already)."""
    if tracker is not None:
        try:
            tracker.finish(failed=True)
        except Exception:  # noqa: BLE001 - the warning line is out; nothing more to say
            pass


_LOG_BLOCK, _LOG_HEADER = 32768, 7  # a .wandb file: LevelDB's log format, records in 32 KiB blocks of chunks
_WANDB_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_log_records(path: Path) -> Iterator[bytes]:
    """The records of a .wandb transaction log, a block at a time: after the file header, chunks with a 7-byte
    header (CRC32 of type and data, length, type) that never straddle a 32 KiB block; a record too long for one
    chunk is FIRST, MIDDLE..., LAST. The reading ends at a chunk cut short or damaged (a writer killed there)."""
    with open(path, "rb") as f:
        if f.read(_LOG_HEADER) != _WANDB_HEADER:
            return
        parts, block, pos = b"", b"\0" * _LOG_HEADER + f.read(_LOG_BLOCK - _LOG_HEADER), _LOG_HEADER
        while True:
            while pos + _LOG_HEADER <= len(block):
                crc, length, kind = struct.unpack_from("<IHB", block, pos)
                if kind == 0 and length == 0:  # the rest of the block was never written
                    break
                body = block[pos + _LOG_HEADER:pos + _LOG_HEADER + length]
                if len(body) < length or zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
                    return
                pos += _LOG_HEADER + length
                parts = body if kind in (_FULL, _FIRST) else parts + body
                if kind in (_FULL, _LAST):
                    yield parts
                    parts = b""
            if len(block) < _LOG_BLOCK:
                return
            block, pos = f.read(_LOG_BLOCK), 0


def wandb_history_steps(path: Path) -> dict[str, int]:
    """The last `_step` of each name in the history records of a .wandb transaction log ({} when unreadable)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    steps: dict[str, int] = {}
    try:
        for data in _wandb_log_records(path):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") != "history":
                continue
            row = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
            step = int(json.loads(row.get("_step", "0")))
            for name in row:
                if not name.startswith("_"):
                    steps[name] = max(steps.get(name, 0), step)
    except (OSError, DecodeError, ValueError):  # the records read up to there stand
        pass
    return steps
