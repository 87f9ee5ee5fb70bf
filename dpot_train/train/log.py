"""What a training run records as it goes, kept out of the train step: metrics.jsonl (mirrored to the experiment
trackers), TensorBoard, the progress bar and the periodic step line (rank 0), the per-dataset loss of a mixture, and
each rank's audit of the trajectories it consumed. The step hands over its device tensors; they are read back in one
sync at log and checkpoint steps."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from dpot_train.core import distributed as D
from dpot_train.core.config import TrainConfig, save_config
from dpot_train.integrations.trackers import Trackers


class TrainLog:
    """Every record of one process of a run, opened at `step` (later records of an earlier attempt are cut)."""

    def __init__(self, cfg: TrainConfig, info: D.DistInfo, run: Path, step: int, spec: Any,
                 tracker: Trackers | None = None) -> None:
        self.cfg, self.info = cfg, info
        self.metrics_path = run / "metrics.jsonl"
        self.writer, self.bar = _open_logs(cfg, run, step) if info.is_main else (None, None)
        if tracker is not None and info.is_main:  # a resume: first the lines up to `step` a tracker's run lacks
            tracker.backfill(self.metrics_path, step)
        self.audit = _open_audit(run, info.rank, step) if cfg.audit else None
        self.steps = (_StepLog(cfg, spec.epoch_length, self.metrics_path, self.writer, self.bar, tracker)
                      if info.is_main else None)
        names = [d.name for d in spec.datasets]
        self.by_dataset = _DatasetLoss(names, info.device) if len(names) > 1 else None
        self.pending: list[tuple[int, int, float, torch.Tensor, torch.Tensor]] = []  # read back at the next flush
        self.last_loss: float | None = None  # stays None when a resume starts at the final step

    def record(self, step: int, position: int, lr: float, batch: dict[str, Any], loss: torch.Tensor,
               per_sample: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """One finished step (every rank calls it: the loss is averaged over the ranks)."""
        cfg = self.cfg
        if self.by_dataset is not None:
            self.by_dataset.add(batch["dataset"].to(self.info.device, non_blocking=True), per_sample)
        if self.audit is not None:
            self.audit.write(json.dumps({"step": step, "rank": self.info.rank, "ids": batch["id"],
                                         "positions": batch["position"].tolist()}) + "\n")
            self.audit.flush()
        # no host sync here: loss and grad norm stay on the device until the next log or checkpoint step
        self.pending.append((step, position, lr, D.mean_across_ranks(loss), grad_norm))
        if step % cfg.log_every == 0 or step % cfg.ckpt_every == 0 or step == cfg.steps:
            self.last_loss = _flush(self.pending, self.steps)
            if self.by_dataset is not None:
                self.by_dataset.flush(self.writer, step)

    def first_step(self, step: int, fields: dict[str, float]) -> None:
        """Rank 0, at the launch's first optimizer step: print the time to it (dpot_train.train.startup) in one line and
        add its parts to that step's metrics.jsonl line (the trackers get them with it)."""
        if self.steps is None:
            return
        from dpot_train.train.startup import line

        if self.bar is not None:
            self.bar.write(line(fields))
        else:
            print(line(fields), flush=True)
        self.steps.extra[step] = dict(fields)

    def close(self) -> None:
        """Close the files, the bar and the TensorBoard writer."""
        for thing in (self.audit, self.bar, self.writer):
            if thing is not None:
                thing.close()

    def print_loss_curve(self) -> None:
        """Rank 0: one line comparing the first and the last steps' mean loss."""
        if self.info.is_main:
            _print_loss_curve(self.metrics_path)


def _truncate_jsonl(path: Path, step: int) -> None:
    """Drop log lines written after `step` (they are redone after a resume), a line at a time into a new file that
    replaces the old one whole (a stop during the cut leaves the old log). A line that is not JSON (cut short by a
    crash or a full disk while it was written) is left out, and one warning line says so."""
    if not path.exists():
        return
    from dpot_format.io import atomic_path

    broken = 0
    with atomic_path(path) as tmp, open(path, encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as dst:
        for line in src:
            try:
                rec = json.loads(line) if line.strip() else None
            except ValueError:
                broken += 1
                continue
            if isinstance(rec, dict) and rec.get("step", 0) <= step:
                dst.write(line if line.endswith("\n") else line + "\n")
    if broken:
        print(f"warning: {path}: left out {broken} line(s) that are not JSON (written when the run stopped)",
              file=sys.stderr, flush=True)


def _open_logs(cfg: TrainConfig, run: Path, step: int) -> tuple[Any, Any]:
    """Rank 0's config.yaml, metrics.jsonl cut back to `step`, TensorBoard writer and progress bar (or None)."""
    save_config(cfg, run / "config.yaml")
    _truncate_jsonl(run / "metrics.jsonl", step)
    from torch.utils.tensorboard import SummaryWriter

    # events after the resume step are redone; the resume step's own event stays
    writer = SummaryWriter(log_dir=str(run / "tb"), purge_step=step + 1)
    writer.add_text("config", "```yaml\n" + yaml.safe_dump(cfg.to_dict(), sort_keys=False) + "```", step)
    from dpot_train.core import threads

    if threads.applied is not None:
        writer.add_text("threads", threads.applied.line(), step)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        # disable=None: no bar when stderr is not a terminal (logs stay readable); the step lines remain
        bar = tqdm(total=cfg.steps, initial=step, desc="train", unit="step", dynamic_ncols=True, disable=None,
                   mininterval=1.0)
    return writer, bar


def _open_audit(run: Path, rank: int, step: int) -> Any:
    """This rank's audit log (the trajectories it consumed), cut back to `step`, open for appending."""
    (run / "audit").mkdir(parents=True, exist_ok=True)
    audit_path = run / "audit" / f"rank-{rank}.jsonl"
    _truncate_jsonl(audit_path, step)
    return open(audit_path, "a", encoding="utf-8")


def _print_loss_curve(metrics_path: Path) -> None:
    """One line comparing the mean loss of the first and the last steps of metrics.jsonl."""
    if not metrics_path.exists():
        return
    losses = [json.loads(ln)["loss"] for ln in metrics_path.read_text(encoding="utf-8").splitlines() if ln]
    k = max(1, min(50, len(losses) // 10))
    if losses:
        print(f"loss curve: mean of the first {k} steps {sum(losses[:k]) / k:.4f} -> "
              f"mean of the last {k} steps {sum(losses[-k:]) / k:.4f} ({len(losses)} steps, {metrics_path})",
              flush=True)


def _flush(pending: list[tuple[int, int, float, torch.Tensor, torch.Tensor]], log: "_StepLog | None") -> float:
    """Read the pending steps' loss and grad norm back in one device sync, log them (rank 0); the last loss."""
    values = torch.stack([torch.stack([l.float(), g.float()]) for *_, l, g in pending]).cpu().tolist()
    if log is not None:
        for (step, position, lr, _, _), (loss, grad) in zip(pending, values):
            log.record(step, position, float(lr), loss, grad)  # a --compile run's lr is a tensor
        if log.tracker is not None:  # these steps' lines are in metrics.jsonl: send the trackers' copy
            log.tracker.flush()
    pending.clear()
    return values[-1][0]


class _DatasetLoss:
    """Per-dataset mean training loss of a mixture since the last flush, summed on the device and reduced over the
    ranks at flush time only; rank 0 writes it to TensorBoard as train/loss/<dataset>."""

    def __init__(self, names: list[str], device: torch.device) -> None:
        self.names = names
        self.sums = torch.zeros(len(names), device=device)
        self.counts = torch.zeros(len(names), device=device)

    def add(self, dataset: torch.Tensor, per_sample: torch.Tensor) -> None:
        self.sums.index_add_(0, dataset, per_sample.float())
        self.counts.index_add_(0, dataset, torch.ones_like(per_sample, dtype=torch.float32))

    def flush(self, writer: Any, step: int) -> None:
        sums, counts = (D.mean_across_ranks(t).cpu().tolist() for t in (self.sums, self.counts))  # ratio unaffected
        if writer is not None:
            for name, s, c in zip(self.names, sums, counts):
                if c > 0:
                    writer.add_scalar(f"train/loss/{name}", s / c, step)
        self.sums.zero_()
        self.counts.zero_()


class _StepLog:
    """Rank 0's per-step records: metrics.jsonl (and the trackers' copy of each line), TensorBoard, the progress bar
    and the periodic step line."""

    def __init__(self, cfg: TrainConfig, epoch_length: int, path: Path, writer: Any, bar: Any,
                 tracker: Trackers | None = None) -> None:
        self.cfg, self.epoch_length, self.path, self.writer, self.bar = cfg, epoch_length, path, writer, bar
        self.tracker = tracker
        self.extra: dict[int, dict[str, float]] = {}  # step -> more fields of its line (the time to first step)
        self.t_last, self.n_last = time.perf_counter(), 0
        self.t_start = self.t_last

    def record(self, step: int, position: int, lr: float, loss: float, grad_norm: float) -> None:
        cfg = self.cfg
        self.n_last += cfg.batch_size
        rec: dict[str, Any] = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                               "epoch": position / self.epoch_length, **self.extra.pop(step, {})}
        if step % cfg.log_every == 0 or step == cfg.steps:
            now = time.perf_counter()
            rec["samples_per_s"] = self.n_last / max(now - self.t_last, 1e-9)
            self.t_last, self.n_last = now, 0
            eta = (cfg.steps - step) * cfg.batch_size / max(rec["samples_per_s"], 1e-9)
            msg = (f"step {step}/{cfg.steps} | epoch {rec['epoch']:.2f} | loss {loss:.4f} | lr {lr:.2e} "
                   f"| grad {grad_norm:.3f} | {rec['samples_per_s']:.1f} samples/s "
                   f"| elapsed {_clock(now - self.t_start)} | eta {_clock(eta)}")
            (self.bar.write if self.bar is not None else print)(msg)
            self.writer.add_scalar("train/samples_per_s", rec["samples_per_s"], step)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        if self.tracker is not None:  # after the line is written: a tracker never costs metrics.jsonl a line
            self.tracker.log({k: v for k, v in rec.items() if k != "step"}, step)
        self.writer.add_scalar("train/loss", loss, step)
        self.writer.add_scalar("train/lr", lr, step)
        self.writer.add_scalar("train/grad_norm", grad_norm, step)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}")


def _clock(seconds: float) -> str:
    """H:MM:SS."""
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def eval_scalars(result: dict[str, Any]) -> dict[str, float]:
    """Every number of an evaluation (eval.json), per dataset, as eval/<dataset>/<name> (nested names joined by /;
    lists, such as the per-step curves, left out): what TensorBoard and the trackers receive."""

    def leaves(prefix: str, node: Any) -> list[tuple[str, float]]:
        if isinstance(node, dict):
            return [kv for k, v in node.items() for kv in leaves(f"{prefix}/{k}", v)]
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            return [(prefix, float(node))]
        return []

    return dict(leaves("eval", result.get("datasets", {})))


def eval_to_tensorboard(log_dir: Path, result: dict[str, Any], step: int) -> None:
    """Every number of the evaluation, per dataset, as eval/<dataset>/<name> scalars at the final step."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(log_dir)) as writer:
        for name, value in eval_scalars(result).items():
            writer.add_scalar(name, value, step)
