"""The DDP training loop: data stream, AdamW + one-cycle, bf16 autocast on CUDA, clipping, exact checkpoint/resume.

Run it under torchrun (`dpot-train launch` builds the command); a plain `python -m dpot_train.worker` is one process.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.nn.parallel import DistributedDataParallel as DDP

from dpot_train import distributed as D
from dpot_train.checkpoint import (RunDirError, checkpoint_path, latest_checkpoint, list_checkpoints, prune,
                                   restore_training, rng_state, rng_states, save_atomic, set_rng_state, stored_config,
                                   trained_config, training_payload)
from dpot_train.config import TrainConfig, resolve_epochs, save_config
from dpot_train.data.prepare import data_reader, prepare_stream
from dpot_train.data.loader import make_loader
from dpot_train.data.stream import WindowStream
from dpot_train.data.windows import inject_noise, resize_frames, resize_mask
from dpot_train.metrics import per_sample_loss
from dpot_train.finetune import finetune_model
from dpot_train.model import DPOTConfig, build_model
from dpot_train.model_setup import data_overrides, fresh_model
from dpot_train.run_plan import RunPlan


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW (paper betas and weight decay) or Adam (the reference's fine-tuning), and a one-cycle schedule that
    leaves beta1 alone (no momentum cycling) or the reference's step decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optim
    kind = torch.optim.Adam if o.optimizer == "adam" else torch.optim.AdamW
    opt = kind(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    if o.schedule == "step":
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=max(o.decay_every, 1), gamma=o.decay_gamma)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=o.lr, total_steps=max(cfg.steps, 1), pct_start=o.warmup_pct, anneal_strategy="cos",
        cycle_momentum=False, div_factor=o.div_factor, final_div_factor=o.final_div_factor)
    return opt, sched


def build_run_model(cfg: TrainConfig, channels: int, shape: tuple[int, ...], saved: dict[str, Any] | None = None
                    ) -> tuple[torch.nn.Module, str | None]:
    """Seeded preset fitted to the data, or the --init weights (the --load components; the rest fresh) and the line
    saying which; on a resume, the model config `saved` in the run's checkpoint (its weights are loaded after, so
    the --init file is not read again). The unused dataset-classification head is frozen."""
    fixed = data_overrides(channels, shape, cfg.data.t_in, cfg.data.t_out, cfg.data.res)
    torch.manual_seed(cfg.seed)
    line = None
    if saved is not None:
        model = build_model(DPOTConfig.from_dict(saved))
    elif cfg.init:
        model, line = finetune_model(cfg.init, fixed, cfg.load, cfg.model_overrides, cfg.trust)
    else:
        model = fresh_model(cfg.model, cfg.model_overrides, fixed)
    cls_head = getattr(model, "cls_head", None)
    if cls_head is not None:  # never trained (loss weight 0 in the reference); frozen so DDP sees no unused grads
        for p in cls_head.parameters():
            p.requires_grad_(False)
    return model, line


def set_determinism(enabled: bool) -> None:
    """Deterministic kernels on CUDA (cuBLAS workspace, cuDNN, torch's deterministic algorithms), so a GPU run and
    its resume repeat bitwise; CPU runs are deterministic without it. Call before the first CUDA matmul."""
    if not enabled:
        return
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)  # an op without a deterministic kernel warns, by name


def _autocast(device: torch.device, enabled: bool) -> Any:
    if enabled and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def _truncate_jsonl(path: Path, step: int) -> None:
    """Drop log lines written after `step` (they are redone after a resume)."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln and json.loads(ln).get("step", 0) <= step]
    path.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")


def train(cfg: TrainConfig, resume: bool = False, verify_checksums: bool | None = None,
          plan: RunPlan | None = None) -> dict[str, Any]:
    """Run (or resume) training to cfg.steps; returns a summary (final step, last loss, run dir). `plan`: what
    `dpot-train launch` decided (datasets, stream spec and shard index): nothing is read or checked again."""
    set_determinism(cfg.deterministic)
    info = D.init_distributed(cfg.device)
    run = Path(cfg.out)
    ckpt_dir = run / "checkpoints"
    if info.is_main:
        run.mkdir(parents=True, exist_ok=True)
    D.barrier()

    random.seed(cfg.seed * 1000003 + info.rank)  # nothing in training draws from these; seeded so runs are identical
    np.random.seed((cfg.seed * 1000003 + info.rank) % 2**32)
    found = latest_checkpoint(ckpt_dir, keep_damaged=info.is_main) if resume else None
    if not resume and list_checkpoints(ckpt_dir):
        raise RunDirError(f"{run} already holds checkpoints; pass --resume to continue it or choose another --out")

    if plan is not None:
        spec = plan.stream_spec(cfg.data.t_in, cfg.data.t_out, cfg.seed)
        reader = data_reader(cfg.data, spec.datasets)
    else:
        verify = (cfg.data.verify_checksums if verify_checksums is None else verify_checksums) and info.is_main
        spec, reader = prepare_stream(cfg.data, cfg.seed, verify=verify)
    cfg = resolve_epochs(cfg, spec.epoch_length)
    ds0 = spec.datasets[0]
    model, init_line = build_run_model(cfg, len(ds0.channels), ds0.shape,
                                       stored_config(found[1]) if found is not None else None)
    model = model.to(info.device)
    if init_line and info.is_main:
        print(init_line, flush=True)
    opt, sched = build_optimizer(model, cfg)
    step, position = _restore(found, cfg, model, opt, sched) if found is not None else (0, 0)
    if info.is_main and found is not None:
        print(f"resumed from {found[0]} at step {step} (stream position {position})", flush=True)
    elif resume and info.is_main:
        print(f"no checkpoint in {ckpt_dir}: starting from step 0", flush=True)

    ddp_model = DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None) \
        if info.world > 1 else model
    stream = WindowStream(spec, reader, start=position, global_batch=cfg.batch_size, world=info.world, rank=info.rank)
    # creating the iterator draws a base seed from the torch RNG, so the saved RNG states are restored after it
    batches = iter(make_loader(stream, cfg.data.num_workers, pin_memory=info.device.type == "cuda",
                               kind=cfg.data.worker_kind))
    if found is not None:
        states = rng_states(found[1])
        if len(states) == info.world:
            set_rng_state(states[info.rank])
        else:  # another process count: the data stream is unaffected; reseed the process RNGs deterministically
            torch.manual_seed(cfg.seed * 1000003 + step * 7919 + info.rank)
    summary = _loop(cfg, info, ddp_model, model, opt, sched, batches, spec, step, position, run)
    del batches  # stops the loader workers (threads or processes) before the evaluation
    del ddp_model
    # every rank done with its collectives, the process group ends on all ranks together (a rank leaving while a
    # peer's transport still talks to it can abort that peer); rank 0 then evaluates alone, with no group to time out
    D.barrier()
    D.shutdown()
    if info.is_main and cfg.eval_at_end:
        from dpot_train.evaluate import evaluate_model, print_table, write_eval

        model.eval()
        result = evaluate_model(model, cfg.data, split=cfg.eval_split, rollout_steps=cfg.rollout_steps,
                                device=info.device, max_trajectories=cfg.eval_max_trajectories, verify=False,
                                recipe=cfg.recipe or "dpot", datasets=plan.datasets() if plan is not None else None,
                                trajectories=plan.eval_trajectories() if plan is not None else None)
        result["checkpoint"] = str(checkpoint_path(ckpt_dir, summary["step"]))
        write_eval(result, run / "eval.json")
        print_table(result)
        _eval_to_tensorboard(run / "tb", result, summary["step"])
        summary["eval"] = result
    return summary


def _restore(found: tuple[Path, dict[str, Any]], cfg: TrainConfig, model: torch.nn.Module,
             opt: torch.optim.Optimizer, sched: Any) -> tuple[int, int]:
    """Load a checkpoint's weights, optimiser and schedule; (step, stream position) to continue from."""
    path, ckpt = found
    saved = trained_config(ckpt)
    if saved.get("batch_size") != cfg.batch_size or saved.get("seed") != cfg.seed:
        raise RunDirError(f"{path}: batch_size/seed differ from the checkpoint ({saved.get('batch_size')}, "
                          f"{saved.get('seed')}); a resume must keep them to continue the same data stream")
    return restore_training(ckpt, model, opt, sched)


def _loop(cfg: TrainConfig, info: D.DistInfo, ddp_model: torch.nn.Module, model: torch.nn.Module,
          opt: torch.optim.Optimizer, sched: Any, it: Any, spec: Any, step: int, position: int,
          run: Path) -> dict[str, Any]:
    """The step loop; rank 0 logs and saves."""
    ckpt_dir = run / "checkpoints"
    metrics_path = run / "metrics.jsonl"
    writer, bar = _open_logs(cfg, run, step) if info.is_main else (None, None)
    audit = _open_audit(run, info.rank, step) if cfg.audit else None
    trainable = [p for p in model.parameters() if p.requires_grad]
    clip = cfg.optim.clip_grad if cfg.optim.clip_grad > 0 else math.inf
    log = _StepLog(cfg, spec.epoch_length, metrics_path, writer, bar) if info.is_main else None
    reference = cfg.recipe == "reference"
    pending: list[tuple[int, int, float, torch.Tensor, torch.Tensor]] = []  # read back at the next flush
    by_dataset = _DatasetLoss([d.name for d in spec.datasets], info.device) if len(spec.datasets) > 1 else None
    last_loss = None  # stays None when a resume starts at the final step (only the evaluation is left to do)
    ddp_model.train()
    last_loss = None  # stays None when a resume finds the run already at its last step
    try:
        while step < cfg.steps:
            batch = next(it)
            x = batch["x"].to(info.device, non_blocking=True)
            y = batch["y"].to(info.device, non_blocking=True)
            mask = batch["mask"].to(info.device, non_blocking=True)
            cv = batch["channel_valid"].to(info.device, non_blocking=True)
            if cfg.data.res > 0:  # the run's grid (the reference resizes in its loader, before the noise)
                x, y = resize_frames(x, cfg.data.res), resize_frames(y, cfg.data.res)
                mask = resize_mask(mask, cfg.data.res)
            if reference:  # the reference's noise touches every channel and cell
                x = inject_noise(x, cfg.data.noise, batch["position"], cfg.seed)
            else:
                x = inject_noise(x, cfg.data.noise, batch["position"], cfg.seed, mask, batch["channel_valid"])
            with _autocast(info.device, cfg.amp):
                pred = ddp_model(x)
            per_sample = per_sample_loss(pred.float(), y, mask, cv, "all" if reference else cfg.loss)
            loss = per_sample.mean()
            if by_dataset is not None:
                by_dataset.add(batch["dataset"].to(info.device, non_blocking=True), per_sample.detach())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, clip)
            opt.step()
            sched.step()
            lr = sched.get_last_lr()[0]
            step += 1
            position += cfg.batch_size
            if audit is not None:
                audit.write(json.dumps({"step": step, "rank": info.rank, "ids": batch["id"],
                                        "positions": batch["position"].tolist()}) + "\n")
                audit.flush()
            # no host sync here: loss and grad norm stay on the device until the next log or checkpoint step
            pending.append((step, position, lr, D.mean_across_ranks(loss.detach()), grad_norm.detach()))
            if step % cfg.log_every == 0 or step % cfg.ckpt_every == 0 or step == cfg.steps:
                last_loss = _flush(pending, log)
                if by_dataset is not None:
                    by_dataset.flush(log.writer if log is not None else None, step)
            if step % cfg.ckpt_every == 0 or step == cfg.steps:
                _save(cfg, info, model, opt, sched, step, position, spec, ckpt_dir)
    finally:
        if audit is not None:
            audit.close()
        if bar is not None:
            bar.close()
        if writer is not None:
            writer.close()
    if info.is_main:
        _print_loss_curve(metrics_path)
    return {"step": step, "position": position, "loss": last_loss, "run": str(run)}


def _open_logs(cfg: TrainConfig, run: Path, step: int) -> tuple[Any, Any]:
    """Rank 0's config.yaml, metrics.jsonl cut back to `step`, TensorBoard writer and progress bar (or None)."""
    save_config(cfg, run / "config.yaml")
    _truncate_jsonl(run / "metrics.jsonl", step)
    from torch.utils.tensorboard import SummaryWriter

    # events after the resume step are redone; the resume step's own event stays
    writer = SummaryWriter(log_dir=str(run / "tb"), purge_step=step + 1)
    writer.add_text("config", "```yaml\n" + yaml.safe_dump(cfg.to_dict(), sort_keys=False) + "```", step)
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
            log.record(step, position, lr, loss, grad)
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
    """Rank 0's per-step records: metrics.jsonl, TensorBoard, the progress bar and the periodic step line."""

    def __init__(self, cfg: TrainConfig, epoch_length: int, path: Path, writer: Any, bar: Any) -> None:
        self.cfg, self.epoch_length, self.path, self.writer, self.bar = cfg, epoch_length, path, writer, bar
        self.t_last, self.n_last = time.perf_counter(), 0
        self.t_start = self.t_last

    def record(self, step: int, position: int, lr: float, loss: float, grad_norm: float) -> None:
        cfg = self.cfg
        self.n_last += cfg.batch_size
        rec: dict[str, Any] = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                               "epoch": position / self.epoch_length}
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


def _eval_to_tensorboard(log_dir: Path, result: dict[str, Any], step: int) -> None:
    """Every number of the evaluation, per dataset, as eval/<dataset>/<name> scalars at the final step."""
    from torch.utils.tensorboard import SummaryWriter

    def leaves(prefix: str, node: Any) -> list[tuple[str, float]]:
        if isinstance(node, dict):
            return [kv for k, v in node.items() for kv in leaves(f"{prefix}/{k}", v)]
        if isinstance(node, (int, float)) and not isinstance(node, bool):
            return [(prefix, float(node))]
        return []

    with SummaryWriter(log_dir=str(log_dir)) as writer:
        for name, value in leaves("eval", result.get("datasets", {})):
            writer.add_scalar(name, value, step)


def _save(cfg: TrainConfig, info: D.DistInfo, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any,
          step: int, position: int, spec: Any, ckpt_dir: Path) -> None:
    """Every rank contributes its RNG state; rank 0 writes the checkpoint atomically and prunes old ones."""
    states = D.all_gather_object(rng_state())
    if info.is_main:
        loader = {"position": position, "epoch": position // spec.epoch_length, "epoch_length": spec.epoch_length,
                  "global_batch": cfg.batch_size}
        payload = training_payload(model, cfg.to_dict(), opt, sched, step, loader, states)
        save_atomic(payload, checkpoint_path(ckpt_dir, step))
        prune(ckpt_dir, cfg.keep_checkpoints)
    D.barrier()
