"""The DDP training loop: data stream, AdamW + one-cycle, bf16 autocast on CUDA, clipping, exact checkpoint/resume.

Run it under torchrun (`dpot-train launch` builds the command); a plain `python -m dpot_train.run.worker` is one
process.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import random
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from dpot_train.core import distributed as D
from dpot_train.train import startup
from dpot_train.core.checkpoint import (RunDirError, checkpoint_path, data_record, latest_checkpoint, list_checkpoints,
                                        prune, restore_training, rng_state, rng_states, save_atomic, set_rng_state,
                                        stored_config, trained_config, training_payload)
from dpot_train.core.config import TrainConfig, resolve_epochs
from dpot_train.data.prepare import data_reader, norm_table, prepare_stream
from dpot_train.data.loader import make_loader
from dpot_train.data.stream import StreamSpec, WindowStream
from dpot_train.data.windows import fluid_rule_samples, inject_noise, resize_window, run_grid
from dpot_train.core.metrics import per_sample_loss
from dpot_train.train.schedule import one_cycle
from dpot_train.train.finetune import finetune_model, recipe_line
from dpot_train.model import families, unwrap_model
from dpot_train.core.model_setup import data_overrides, fresh_model
from dpot_train.core.normalize import applied, recorded
from dpot_train.train.run_plan import RunPlan
from dpot_train.integrations.trackers import Trackers
from dpot_train.train.log import TrainLog, eval_to_tensorboard


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW (paper betas and weight decay) or Adam (the reference's fine-tuning), and a one-cycle schedule that
    leaves beta1 alone (no momentum cycling) or the reference's step decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    o = cfg.optim
    kind = torch.optim.Adam if o.optimizer == "adam" else torch.optim.AdamW
    opt = kind(params, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    if o.schedule == "step":
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=max(o.decay_every, 1), gamma=o.decay_gamma)
    sched = one_cycle(opt, cfg.steps, o)
    return opt, sched


def build_run_model(cfg: TrainConfig, channels: int, grid: tuple[int, ...], saved: dict[str, Any] | None = None
                    ) -> tuple[torch.nn.Module, str | None]:
    """Seeded preset fitted to the data (`grid`: the run's grid in the model's axis order, `run_grid`), or the --init
    weights (the --load components; the rest fresh) and the line saying which; on a resume, the model config `saved`
    in the run's checkpoint (its weights are loaded after, so the --init file is not read again). The unused
    dataset-classification head is frozen."""
    fixed = data_overrides(channels, grid, cfg.data.t_in, cfg.data.t_out)
    torch.manual_seed(cfg.seed)
    line = None
    if saved is not None:
        model = families.build(families.config_from_dict(saved))
    elif cfg.init:
        model, line = finetune_model(cfg.init, fixed, cfg.load, cfg.model_overrides, cfg.trust, cfg.init_sha256)
    else:
        model = fresh_model(cfg.model, cfg.model_overrides, fixed)
    cls_head = getattr(model, "cls_head", None)
    if cls_head is not None:  # never trained (loss weight 0 in the reference); frozen so DDP sees no unused grads
        for p in cls_head.parameters():
            p.requires_grad_(False)
    return model, line


def with_normalization(cfg: TrainConfig, spec: StreamSpec, resumed: dict[str, Any] | None
                       ) -> tuple[TrainConfig, StreamSpec]:
    """The statistics the run normalises with (dpot_train.core.normalize): on a resume those its checkpoint recorded
    (none for a run from before normalisation), else cfg's from the manifests. They go into cfg's data.norm_stats,
    saved with every checkpoint and used by the final evaluation, and into the stream."""
    data = cfg.data
    if resumed is not None:
        mode, stats = recorded(resumed) or ("none", {})
        data = dataclasses.replace(data, normalize=mode, norm_stats=stats)
    table = norm_table(data, spec.datasets)
    data = dataclasses.replace(data, norm_stats=applied(table))
    return dataclasses.replace(cfg, data=data), dataclasses.replace(spec, norm=table)


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


def train(cfg: TrainConfig, resume: bool = False, verify_checksums: bool | None = None,
          plan: RunPlan | None = None, tracker: Trackers | None = None) -> dict[str, Any]:
    """Run (or resume) training to cfg.steps; returns a summary (final step, last loss, run dir). `plan`: what
    `dpot-train launch` decided (datasets, stream spec and shard index): nothing is read or checked again.
    `tracker` (rank 0, dpot_train.integrations.trackers.Trackers): receives a copy of every metrics.jsonl line."""
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
    cfg, spec = with_normalization(cfg, spec, found[1] if found is not None else None)
    ds0 = spec.datasets[0]
    model, init_line = build_run_model(cfg, len(ds0.channels), run_grid(ds0.shape, ds0.model_layout, cfg.data.res),
                                       stored_config(found[1]) if found is not None else None)
    model = model.to(info.device)
    if init_line and info.is_main:
        print(init_line, flush=True)
    if info.is_main and recipe_line(cfg.init, cfg.recipe):
        print(recipe_line(cfg.init, cfg.recipe), flush=True)
    opt, sched = build_optimizer(model, cfg)
    step, position = _restore(found, cfg, model, opt, sched) if found is not None else (0, 0)
    tensor_lr(opt, info.device, False)  # a --compile run's checkpoint holds tensors; compiled_step sets them again
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
    summary = _loop(cfg, info, ddp_model, model, opt, sched, batches, spec, step, position, run,
                    _validator(cfg, info, model, plan.datasets() if plan is not None else spec.datasets, ckpt_dir,
                               data_record(spec.datasets)),
                    tracker)
    del batches  # stops the loader workers (threads or processes) before the evaluation
    del ddp_model
    # every rank done with its collectives, the process group ends on all ranks together (a rank leaving while a
    # peer's transport still talks to it can abort that peer); rank 0 then evaluates alone, with no group to time out
    D.barrier()
    D.shutdown()
    if info.is_main and cfg.eval_at_end:
        from dpot_train.evaluation.evaluate import evaluate_model, print_table, write_eval

        scored = _final_weights(cfg, model, ckpt_dir, summary["step"])
        model.eval()
        result = evaluate_model(model, cfg.data, split=cfg.eval_split, rollout_steps=cfg.rollout_steps,
                                device=info.device, max_trajectories=cfg.eval_max_trajectories, verify=False,
                                recipe=cfg.recipe or "dpot", datasets=plan.datasets() if plan is not None else None,
                                trajectories=plan.eval_trajectories() if plan is not None else None)
        result.update(scored)
        write_eval(result, run / "eval.json")
        print_table(result)
        eval_to_tensorboard(run / "tb", result, summary["step"])
        summary["eval"] = result
    return summary


def _validator(cfg: TrainConfig, info: D.DistInfo, model: torch.nn.Module, datasets: list[Any], ckpt_dir: Path,
               trained: dict[str, Any] | None = None) -> Any:
    """`--eval-every N`: the function the loop calls after each step (validation.validate_and_keep_best every N
    steps); None when off, or when a dataset has no validation split (said once)."""
    from dpot_train.train.validation import VALID_SPLIT, has_split, validate_and_keep_best

    if cfg.eval_every <= 0:
        return None
    if not has_split(datasets):
        if info.is_main:
            print(f"--eval-every: no {VALID_SPLIT!r} split in every dataset; no validation, the final evaluation "
                  "scores the last checkpoint", flush=True)
        return None

    def validate(step: int) -> None:
        if step % cfg.eval_every == 0 or step == cfg.steps:
            validate_and_keep_best(cfg, info, model, step, ckpt_dir, datasets, trained)

    return validate


def _final_weights(cfg: TrainConfig, model: torch.nn.Module, ckpt_dir: Path, step: int) -> dict[str, Any]:
    """Which checkpoint the final evaluation scores: best.pt (its weights loaded into `model`) when validation ran,
    else the last one; eval.json's `checkpoint`, `step` and, for best.pt, `validation`."""
    from dpot_train.train.validation import BEST_NAME, load_best

    best = load_best(model, ckpt_dir) if cfg.eval_every > 0 else None
    if best is None:
        return {"checkpoint": str(checkpoint_path(ckpt_dir, step)), "step": step}
    return {"checkpoint": str(ckpt_dir / BEST_NAME), "step": int(best["step"]), "validation": best}


def _restore(found: tuple[Path, dict[str, Any]], cfg: TrainConfig, model: torch.nn.Module,
             opt: torch.optim.Optimizer, sched: Any) -> tuple[int, int]:
    """Load a checkpoint's weights, optimiser and schedule; (step, stream position) to continue from."""
    path, ckpt = found
    saved = trained_config(ckpt)
    if saved.get("batch_size") != cfg.batch_size or saved.get("seed") != cfg.seed:
        raise RunDirError(f"{path}: batch_size/seed differ from the checkpoint ({saved.get('batch_size')}, "
                          f"{saved.get('seed')}); a resume must keep them to continue the same data stream")
    return restore_training(ckpt, model, opt, sched)


def train_step(cfg: TrainConfig, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any,
               batch: dict[str, Any], device: torch.device, trainable: list[torch.nn.Parameter],
               update: Update | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimiser step on a batch: resize to the run's grid (with --res: the grid the model was built for), add
    the noise, then `update` (predict, loss, clip, step; `make_update`'s, or its compiled form, `compiled_step`),
    then the schedule. Returns the loss, the per-sample losses and the gradient norm, left on the device. The
    batch's "fluid_rule" (the loop's `fluid_rule_samples`) names the samples the mask-aware resize applies to;
    absent: every sample with a solid cell."""
    fluid_rule = batch.get("fluid_rule", True)
    x, y, mask, cv = (batch[k].to(device, non_blocking=True) for k in ("x", "y", "mask", "channel_valid"))
    if cfg.data.res:  # the run's grid (the reference resizes in its loader, before the noise)
        grid = unwrap_model(model).config.grid  # run_grid of the data: the model was fitted to it
        x, _ = resize_window(x, mask, grid, fluid_rule)
        y, mask = resize_window(y, mask, grid, fluid_rule)
    if cfg.recipe == "reference":  # the reference's noise touches every channel and cell
        x = inject_noise(x, cfg.data.noise, batch["position"], cfg.seed)
    else:
        x = inject_noise(x, cfg.data.noise, batch["position"], cfg.seed, mask, batch["channel_valid"])
    update = update or make_update(cfg, model, opt, trainable, device)
    loss, per_sample, grad_norm = update(x, y, mask, cv)
    sched.step()
    return loss, per_sample, grad_norm


Update = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                  tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def make_update(cfg: TrainConfig, model: torch.nn.Module, opt: torch.optim.Optimizer,
                trainable: list[torch.nn.Parameter], device: torch.device) -> Update:
    """The step's update on prepared tensors: forward (bf16 autocast on CUDA with amp), loss, backward, clipping,
    the optimiser's step; (loss, per-sample losses, gradient norm), detached, on the device."""
    mode = "all" if cfg.recipe == "reference" else cfg.loss
    clip = cfg.optim.clip_grad if cfg.optim.clip_grad > 0 else math.inf

    def update(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, cv: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with _autocast(device, cfg.amp):
            pred = model(x)
        per_sample = per_sample_loss(pred.float(), y, mask, cv, mode)
        loss = per_sample.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, clip)
        opt.step()
        return loss.detach(), per_sample.detach(), grad_norm.detach()

    return update


def compile_mode(cfg: TrainConfig, device: torch.device) -> str:
    """torch.compile's mode for --compile: the config's, else reduce-overhead (CUDA graphs) on CUDA, else default."""
    return cfg.compile_mode or ("reduce-overhead" if device.type == "cuda" else "default")


def compiled_step(cfg: TrainConfig, model: torch.nn.Module, opt: torch.optim.Optimizer,
                  trainable: list[torch.nn.Parameter], device: torch.device) -> Callable[..., Any]:
    """--compile: `train_step` with `compiled_update`. The data side (device copy, resize, seeded noise) and the
    schedule stay eager."""
    return functools.partial(train_step, update=compiled_update(cfg, model, opt, trainable, device))


def compiled_update(cfg: TrainConfig, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    trainable: list[torch.nn.Parameter], device: torch.device) -> Update:
    """`make_update`'s update (forward, loss, backward, clipping, optimiser step) through torch.compile. Ops inductor
    does not lower (the spectral mixer's complex FFTs) run as aten fallbacks, so the model's numerics are unchanged
    (inductor's warning about them is expected and silenced). The learning rate becomes a tensor (`tensor_lr`), so
    the schedule changing it needs no recompilation."""
    tensor_lr(opt, device, True)
    warnings.filterwarnings("ignore", message="Torchinductor does not support code generation for complex operators")
    compiled = torch.compile(make_update(cfg, model, opt, trainable, device), mode=compile_mode(cfg, device))

    def update(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, cv: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One call of the compiled update, a new step for CUDA graphs; its outputs copied out of the graph's memory,
        which the next step's replay overwrites (the loop keeps them until its next log or checkpoint step)."""
        torch.compiler.cudagraph_mark_step_begin()
        loss, per_sample, grad_norm = compiled(x, y, mask, cv)
        return loss.clone(), per_sample.clone(), grad_norm.clone()

    return update


def tensor_lr(opt: torch.optim.Optimizer, device: torch.device, on: bool) -> None:
    """Each parameter group's learning rate as a float64 tensor on `device` (on: the compiled step reads it as an
    input, not as a constant to guard on) or as a float (off: eager, as before). Called after a checkpoint's
    restore, so either kind of checkpoint resumes either way."""
    for group in opt.param_groups:
        lr = group["lr"]
        if on:
            group["lr"] = torch.as_tensor(float(lr), dtype=torch.float64).to(device)
        elif isinstance(lr, torch.Tensor):
            group["lr"] = lr.item()


class NonFiniteLoss(D.CollectiveError):
    """A step's loss or gradient norm is not finite: every rank stops together, before the model is saved."""


class FiniteGuard:
    """Stops the run on the first step whose loss or gradient norm is not finite, naming the step and the samples.

    Each step's flags stay on the device (no host sync per step); at every log or checkpoint step, before anything
    is written, all ranks read them back together (one reduction over the ranks, so every rank takes the same
    decision and none waits for another) and raise NonFiniteLoss: no NaN model is ever checkpointed."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor, list[str], torch.Tensor, torch.Tensor]] = []

    def add(self, step: int, per_sample: torch.Tensor, grad_norm: torch.Tensor, batch: dict[str, Any]) -> None:
        """One finished step (device tensors; the batch's samples without a scored cell are noted for the message)."""
        empty = ~(batch["mask"].flatten(1).bool().any(1) & batch["channel_valid"].bool().any(1))
        self.pending.append((step, torch.isfinite(per_sample).all() & torch.isfinite(grad_norm), per_sample,
                             list(batch["id"]), batch["dataset"], empty))

    def check(self) -> None:
        """NonFiniteLoss on every rank when any rank's pending steps hold a non-finite loss or gradient norm."""
        if not self.pending:
            return
        bad = D.mean_across_ranks((~torch.stack([ok for _, ok, *_ in self.pending])).float()).cpu()
        pending, self.pending = self.pending, []
        if not bool(bad.any()):
            return
        step, _, per_sample, ids, datasets, empty = pending[int(bad.nonzero()[0])]
        losses = per_sample.float().cpu().tolist()
        mine = [f"dataset {self.names[int(d)]!r} trajectory {i} (" + (f"loss {v}" if not math.isfinite(v) else
                                                                      "no fluid cell in a valid channel") + ")"
                for i, d, v, e in zip(ids, datasets.tolist(), losses, empty.tolist()) if e or not math.isfinite(v)]
        found = [s for rank in D.all_gather_object(mine) for s in rank]
        where = f"in {', '.join(found[:3])}" + (f" and {len(found) - 3} more" if len(found) > 3 else "") \
            if found else "with every sample's loss finite (the gradient overflowed: lower --lr or --clip-grad)"
        raise NonFiniteLoss(f"step {step}: the training loss or its gradient is not finite {where}; stopped before "
                            "saving that model (the checkpoints already written are intact): fix or remove that data "
                            "(NaN or infinite values, or no fluid cell), then launch again")


def _loop(cfg: TrainConfig, info: D.DistInfo, ddp_model: torch.nn.Module, model: torch.nn.Module,
          opt: torch.optim.Optimizer, sched: Any, it: Any, spec: Any, step: int, position: int,
          run: Path, validate: Any = None, tracker: Trackers | None = None) -> dict[str, Any]:
    """The step loop from (step, position) to cfg.steps; every rank records, rank 0 saves; `validate(step)` (see
    _validator) after each step's checkpoint."""
    log = TrainLog(cfg, info, run, step, spec, tracker)
    guard = FiniteGuard([d.name for d in spec.datasets])
    trainable = [p for p in model.parameters() if p.requires_grad]
    step_fn = compiled_step(cfg, ddp_model, opt, trainable, info.device) if cfg.compile else train_step
    ddp_model.train()
    first = startup.FirstStep.begin(info.is_main)  # a launch's time to its first step (rank 0)
    try:
        while step < cfg.steps:
            batch = next(it)
            if cfg.data.res:  # which samples' solid cells take the mask-aware resize, decided on the CPU
                batch["fluid_rule"] = fluid_rule_samples(spec.datasets, batch["dataset"], batch["mask"])
            lr = sched.get_last_lr()[0]  # the rate this step runs at (the step ends by moving the schedule on)
            loss, per_sample, grad_norm = step_fn(cfg, ddp_model, opt, sched, batch, info.device, trainable)
            step, position = step + 1, position + cfg.batch_size
            if first is not None:
                log.first_step(step, first.end(info.device))
                first = None
            guard.add(step, per_sample, grad_norm, batch)
            if step % cfg.log_every == 0 or step % cfg.ckpt_every == 0 or step == cfg.steps:
                guard.check()  # before the log and the checkpoint of these steps are written
            log.record(step, position, lr, batch, loss, per_sample, grad_norm)
            if step % cfg.ckpt_every == 0 or step == cfg.steps:
                _save(cfg, info, model, opt, sched, step, position, spec, run / "checkpoints")
            if validate is not None:
                validate(step)
            batch = None  # dropped before the next is asked for: process workers then reuse its slot as it is
    finally:
        log.close()
    log.print_loss_curve()
    return {"step": step, "position": position, "loss": log.last_loss, "run": str(run)}


def _save(cfg: TrainConfig, info: D.DistInfo, model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any,
          step: int, position: int, spec: Any, ckpt_dir: Path) -> None:
    """Every rank contributes its RNG state; rank 0 writes the checkpoint atomically and prunes old ones."""
    states = D.all_gather_object(rng_state())
    if info.is_main:
        loader = {"position": position, "epoch": position // spec.epoch_length, "epoch_length": spec.epoch_length,
                  "global_batch": cfg.batch_size}
        payload = training_payload(model, cfg.to_dict(), opt, sched, step, loader, states,
                                   data_record(spec.datasets))  # what evaluate compares its data with
        save_atomic(payload, checkpoint_path(ckpt_dir, step))
        prune(ckpt_dir, cfg.keep_checkpoints)
    D.barrier()
