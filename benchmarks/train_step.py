"""Training-step benchmark with the data path included: does the accelerator wait for data?

Run:  .venv/bin/python benchmarks/train_step.py                         # CPU: `tiny`, fp32, about a minute
      .venv/bin/python benchmarks/train_step.py --device cuda             # GPU: Ti and S, fp32/bf16, eager/compile
      .venv/bin/python benchmarks/train_step.py --device cuda --presets Ti --workers 6 --batch 20 --steps 50
      .venv/bin/python benchmarks/train_step.py --device cpu --compile-step          # eager vs the compiled step

Data: the trajectories of benchmarks/loader.py (PDEBench diffusion-reaction synthesized by `dpot_data.synth`,
ingested to 128x128 x 4 channels into WebDataset shards), streamed by our training loader (prepare_stream,
WindowStream, make_loader). On CUDA the batches come from page-locked (pinned) memory and are copied with
non_blocking=True, the model runs under bf16 autocast when asked, and optionally under torch.compile: `--compile on`
wraps the model, `--compile step` (or `--compile-step`: off and step side by side) runs the trainer's compiled step
(`dpot_train.train.trainer.compiled_update`: forward, loss, backward, clipping and AdamW as one compiled function).

For each preset x precision x compile it measures, after `--warmup` untimed steps:
  * step samples/s: full training steps exactly as dpot_train.train.trainer runs them (batch to device, noise injection
    on the device (`--noise`, training default 5e-4), forward under autocast, relative-L2 loss over valid channels and
    fluid cells, backward, gradient clipping, AdamW, one-cycle), the loader included;
  * model samples/s: the same step on one batch already on the device (no loader): the ceiling the data path is
    measured against; data_wait = 1 - step / model is the share of time the step waits for data;
And once per run, loader samples/s: the same loader alone, each batch copied to the device (no model).
The loader must deliver at least 1.5x the step samples/s of Ti for the accelerator never to wait.
The last line of output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_device  # noqa: E402
from loader import BenchData, make_data, machine, our_loader  # noqa: E402

from dpot_train.core.config import OptimConfig, TrainConfig  # noqa: E402
from dpot_train.data.windows import inject_noise  # noqa: E402
from dpot_train.core.metrics import relative_l2_loss  # noqa: E402
from dpot_train.core.model_setup import data_overrides, fresh_model  # noqa: E402
from dpot_train.train.trainer import build_optimizer, compiled_update  # noqa: E402

DTYPES = {"fp32": None, "bf16": torch.bfloat16}


@dataclass
class StepResult:
    """One preset x precision x compile measurement."""

    preset: str
    dtype: str
    compile: bool
    compiled: str  # "off", "on" (the model wrapped in torch.compile) or "step" (the trainer's compiled update)
    workers: int
    params_m: float
    batch: int
    steps: int
    step_samples_per_s: float
    model_samples_per_s: float
    data_wait: float
    step_ms: float
    peak_mem_mib: float | None


def sync(device: torch.device) -> None:
    """Wait for queued device work (CUDA), so wall times cover it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_device(batch: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, ...]:
    """x, y, mask, channel_valid on the device (asynchronous when the batch is pinned), and the stream positions."""
    return (*(batch[k].to(device, non_blocking=True) for k in ("x", "y", "mask", "channel_valid")), batch["position"],
            batch["channel_valid"])


def autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    """bf16 autocast on the device when asked (the trainer's amp=True on CUDA), else nothing."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


class Stepper:
    """Model, optimiser and schedule built by the trainer's own functions; `step` is one trainer step."""

    def __init__(self, preset: str, device: torch.device, dtype: torch.dtype | None, compiled: str, steps: int,
                 noise: float, seed: int = 0) -> None:
        torch.manual_seed(0)
        fixed = data_overrides(4, (128, 128), 10, 1)
        self.model = fresh_model(preset, {}, fixed).to(device)
        for p in getattr(self.model, "cls_head", torch.nn.Module()).parameters():
            p.requires_grad_(False)  # as the trainer does: the classification head is never trained
        cfg = TrainConfig(steps=max(steps, 1), optim=OptimConfig(), amp=dtype is not None, compile=compiled == "step")
        self.opt, self.sched = build_optimizer(self.model, cfg)
        self.forward = torch.compile(self.model) if compiled == "on" else self.model
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.update = None
        if compiled == "step":  # the trainer's --compile update
            self.update = compiled_update(cfg, self.model, self.opt, self.trainable, device)
        self.device, self.dtype, self.clip = device, dtype, cfg.optim.clip_grad
        self.noise, self.seed = noise, seed
        self.model.train()

    def step(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, cv: torch.Tensor,
             positions: torch.Tensor, cv_host: torch.Tensor) -> torch.Tensor:
        x = inject_noise(x, self.noise, positions, self.seed, mask, cv_host)  # host copy: no device-to-host sync
        if self.update is not None:
            loss = self.update(x, y, mask, cv)[0]
            self.sched.step()
            return loss
        with autocast(self.device, self.dtype):
            pred = self.forward(x)
        loss = relative_l2_loss(pred.float(), y, mask, cv, "valid")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.trainable, self.clip)
        self.opt.step()
        self.sched.step()
        return loss.detach()  # like the trainer: no host sync per step (it reads losses back at log steps)


def timed(n: int, device: torch.device, fn: Any) -> float:
    """Seconds for n calls of fn (device-synchronised at both ends)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    sync(device)
    return time.perf_counter() - start


def bench_step(preset: str, dtype_name: str, compiled: str, data: BenchData, device: torch.device,
               args: argparse.Namespace) -> StepResult:
    """Full steps from the loader, then the same step on a resident batch."""
    total = args.warmup + args.steps
    stepper = Stepper(preset, device, DTYPES[dtype_name], compiled, 2 * total, args.noise)
    params = sum(p.numel() for p in stepper.model.parameters())
    loader = our_loader(data, "webdataset", args.workers, args.batch, pin_memory=device.type == "cuda",
                        kind=args.worker_kind)
    it: Iterator[dict[str, Any]] = iter(loader)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):
        stepper.step(*to_device(next(it), device))
    step_s = timed(args.steps, device, lambda: stepper.step(*to_device(next(it), device)))
    resident = to_device(next(it), device)
    del it
    model_s = timed(args.steps, device, lambda: stepper.step(*resident))
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    n = args.steps * args.batch
    step_rate, model_rate = n / step_s, n / model_s
    return StepResult(preset, dtype_name, compiled != "off", compiled, args.workers, round(params / 1e6, 3),
                      args.batch, args.steps,
                      round(step_rate, 2), round(model_rate, 2), round(max(0.0, 1.0 - step_rate / model_rate), 3),
                      round(step_s / args.steps * 1e3, 1), round(peak, 1) if peak is not None else None)


def bench_loader(data: BenchData, device: torch.device, args: argparse.Namespace) -> dict[str, float]:
    """The training loader alone (each batch copied to the device): samples/s over `loader_steps` batches."""
    loader = our_loader(data, "webdataset", args.workers, args.batch, pin_memory=device.type == "cuda",
                        kind=args.worker_kind)
    it: Iterator[dict[str, Any]] = iter(loader)
    for _ in range(max(1, args.workers) * 2):
        to_device(next(it), device)
    seconds = timed(args.loader_steps, device, lambda: to_device(next(it), device))
    del it
    return {"samples_per_s": round(args.loader_steps * args.batch / seconds, 2), "batches": args.loader_steps,
            "workers": args.workers, "worker_kind": args.worker_kind, "pinned": device.type == "cuda"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda or cuda:N")
    parser.add_argument("--presets", default=None, help="comma list; default Ti,S on CUDA, tiny on CPU")
    parser.add_argument("--dtypes", default=None, help="comma list of fp32,bf16; default both on CUDA, fp32 on CPU")
    parser.add_argument("--compile", default=None, help="comma list of off, on (the model wrapped in torch.compile), "
                        "step (the trainer's compiled step: forward, loss, backward, AdamW); default off,on on CUDA, "
                        "off on CPU")
    parser.add_argument("--compile-step", action="store_true", help="the same as --compile off,step: eager and the "
                        "compiled whole step side by side")
    parser.add_argument("--batch", type=int, default=None, help="windows per step; default 20 on CUDA, 4 on CPU")
    parser.add_argument("--workers", default=None,
                        help="comma list of loader worker counts, each measured in turn; default min(8, cores - 1) "
                             "on CUDA, 1 on CPU")
    parser.add_argument("--worker-kind", default="thread", choices=["thread", "process"],
                        help="loader workers: thread (the training default) or process (DataLoader processes)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps; default 30 on CUDA, 12 on CPU")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps; default 10 on CUDA, 3 on CPU")
    parser.add_argument("--loader-steps", type=int, default=None, help="batches for loader-only; default = --steps x 2")
    parser.add_argument("--noise", type=float, default=5e-4, help="noise epsilon, injected on the device in the step "
                        "(training default 5e-4)")
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--frames", type=int, default=21)
    parser.add_argument("--native", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the main process")
    parser.add_argument("--tmp", type=Path, default=None, help="parent of the temp folder")
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda requested but CUDA is not available")
    defaults = {"presets": "Ti,S" if cuda else "tiny", "dtypes": "fp32,bf16" if cuda else "fp32",
                "compile": "off,on" if cuda else "off", "batch": 20 if cuda else 4,
                "workers": str(min(8, max(1, (os.cpu_count() or 2) - 1))) if cuda else "1",
                "steps": 30 if cuda else 12, "warmup": 10 if cuda else 3}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.loader_steps is None:
        args.loader_steps = 2 * args.steps
    try:
        args.worker_counts = [int(w) for w in str(args.workers).split(",")]
    except ValueError:
        parser.error(f"--workers takes a comma list of integers, got {args.workers!r}")
    bad = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if bad:
        parser.error(f"unknown dtypes {bad}; choose from {list(DTYPES)}")
    if args.compile_step:
        args.compile = "off,step"
    bad = [c for c in args.compile.split(",") if c not in ("off", "on", "step")]
    if bad:
        parser.error(f"--compile takes off, on and/or step, got {bad}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = bench_device(args.device, args.threads)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    root = Path(tempfile.mkdtemp(prefix="dpot-step-bench-", dir=args.tmp))
    load_start = os.getloadavg()
    results: list[StepResult] = []
    loader_rates: list[dict[str, Any]] = []
    try:
        data = make_data(root, args.trajectories, args.frames, args.native)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else machine()["cpu"]
        print(f"# device {device} ({name}); torch {torch.__version__}, {torch.get_num_threads()} threads; "
              f"batch {args.batch}, workers {args.workers}, {args.steps} timed steps after {args.warmup}", flush=True)
        for workers in args.worker_counts:
            args.workers = workers
            rate = bench_loader(data, device, args)
            loader_rates.append(rate)
            print(f"loader alone, {workers} {args.worker_kind} workers (to {device.type}): "
                  f"{rate['samples_per_s']:.1f} samples/s", flush=True)
        print(f"{'preset':<6} {'dtype':<5} {'compile':<7} {'workers':>7} {'params':>8} {'step samp/s':>12} "
              f"{'model samp/s':>13} {'data wait':>10} {'step ms':>8} {'peak MiB':>9}", flush=True)
        for workers in args.worker_counts:
            args.workers = workers
            for preset in filter(None, args.presets.split(",")):
                for dtype_name in args.dtypes.split(","):
                    for comp in args.compile.split(","):
                        r = bench_step(preset.strip(), dtype_name, comp, data, device, args)
                        results.append(r)
                        peak = f"{r.peak_mem_mib:.0f}" if r.peak_mem_mib is not None else "-"
                        print(f"{r.preset:<6} {r.dtype:<5} {comp:<7} {workers:>7} {r.params_m:>7.2f}M "
                              f"{r.step_samples_per_s:>12.2f} {r.model_samples_per_s:>13.2f} {r.data_wait:>10.1%} "
                              f"{r.step_ms:>8.0f} {peak:>9}", flush=True)
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    args.workers = ",".join(str(w) for w in args.worker_counts)
    checks = targets(results, max(r["samples_per_s"] for r in loader_rates))
    for key, value in checks.items():
        print(f"# {key}: {value}", flush=True)
    summary = {
        "benchmark": "train_step",
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": str(device),
        "device_name": name,
        "machine": {**machine(), "load_avg_start": [round(v, 2) for v in load_start]},
        "settings": {k: getattr(args, k) for k in ("presets", "dtypes", "compile", "batch", "workers", "worker_kind",
                                                   "steps",
                                                   "warmup", "loader_steps", "noise", "trajectories", "frames",
                                                   "native")},
        "loader": loader_rates,
        "results": [asdict(r) for r in results],
        "targets": checks,
    }
    print(json.dumps(summary), flush=True)
    return 0


def targets(results: list[StepResult], loader_rate: float) -> dict[str, Any]:
    """Loader vs the fastest Ti step (>= 1.5x) and Ti bf16 vs fp32 (faster), where those were measured."""
    out: dict[str, Any] = {}
    ti = [r for r in results if r.preset == "Ti"]
    if ti:
        fastest = max(r.step_samples_per_s for r in ti)
        out["loader_vs_ti_step"] = round(loader_rate / fastest, 2)
        out["loader_vs_ti_step_met"] = loader_rate >= 1.5 * fastest
    for comp, suffix in (("off", ""), ("on", "_compiled"), ("step", "_compiled_step")):
        fp32 = [r for r in ti if r.dtype == "fp32" and r.compiled == comp]
        bf16 = [r for r in ti if r.dtype == "bf16" and r.compiled == comp]
        if fp32 and bf16:
            key = "ti_bf16_vs_fp32" + suffix
            out[key] = round(bf16[0].step_samples_per_s / fp32[0].step_samples_per_s, 2)
            out[key + "_model"] = round(bf16[0].model_samples_per_s / fp32[0].model_samples_per_s, 2)
    for preset in {r.preset for r in results}:  # the compiled whole step against eager, same preset and precision
        for r in (r for r in results if r.preset == preset and r.compiled == "step"):
            eager = [e for e in results if e.preset == preset and e.dtype == r.dtype and e.compiled == "off"
                     and e.workers == r.workers]
            if eager:
                key = f"{preset}_{r.dtype}_step_compiled_vs_eager"
                out[key] = round(r.step_samples_per_s / eager[0].step_samples_per_s, 2)
                out[key + "_model"] = round(r.model_samples_per_s / eager[0].model_samples_per_s, 2)
    if not ti:
        fastest_any = max((r.step_samples_per_s for r in results), default=0.0)
        if fastest_any:
            out["loader_vs_fastest_step"] = round(loader_rate / fastest_any, 2)
    return out


if __name__ == "__main__":
    sys.exit(main())
