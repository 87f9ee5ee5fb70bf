"""Benchmark DPOT presets: forward latency (batch 1) and training throughput (samples/s) in fp32 and bf16.

Usage:
    python benchmarks/model_step.py                       # CUDA if available (Ti,S,M,L, train batch 20), else CPU
    python benchmarks/model_step.py --device cpu --presets Ti,S
    python benchmarks/model_step.py --device cuda --presets L --train-batch 20 --iters 20 --compile
    python benchmarks/model_step.py --device cuda --no-train --cuda-graph        # batch-1 forward as a CUDA graph
    python benchmarks/model_step.py --device cpu --presets tiny --compile-step   # eager vs the compiled whole step

Prints a table and, as the last line, one JSON object with every measurement and the settings used.
CPU defaults are smaller (presets Ti,S, fp32 only, train batch 2, fewer iterations) so a run finishes in a couple of minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Callable

import torch

from dpot_train.model import build_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import bench_device, device_name  # noqa: E402

DTYPES = {"fp32": None, "bf16": torch.bfloat16}


@dataclass
class Result:
    """One preset x dtype measurement."""

    preset: str
    dtype: str
    compiled: str  # "off", "model" (--compile: the model wrapped) or "step" (--compile-step: the whole train step)
    params_m: float
    forward_ms: float
    forward_ms_min: float
    forward_cpu_ms: float
    train_samples_per_s: float | None
    train_step_ms: float | None
    train_step_cpu_ms: float | None
    peak_mem_mib: float | None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> tuple[list[float], list[float]]:
    """(wall, process CPU) seconds of `iters` calls after `warmup` untimed ones (device-synchronised).

    Process CPU time shows the compute cost when other jobs share the cores (wall time then overstates it).
    """
    for _ in range(warmup):
        fn()
    _sync(device)
    wall, cpu = [], []
    for _ in range(iters):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        _sync(device)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu


def _graphed(fn: Callable[[], None], device: torch.device) -> Callable[[], None]:
    """fn captured once as a CUDA graph (static input): each call replays it, one launch instead of one per kernel."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up on a side stream (cuFFT plans, cuBLAS handles) before capture
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _relative_l2(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Relative L2 per sample and channel, averaged (the DPOT training loss)."""
    dims = tuple(range(1, pred.ndim - 1))
    diff = torch.linalg.vector_norm(pred.float() - target.float(), dim=dims)
    return (diff / torch.linalg.vector_norm(target.float(), dim=dims).clamp_min(1e-8)).mean()


def bench_preset(name: str, dtype_name: str, device: torch.device, args: argparse.Namespace,
                 compiled: str = "off") -> Result:
    """Measure one preset in one precision; `compiled`: "model" wraps the model in torch.compile, "step" compiles
    the whole train step (forward, loss, backward, AdamW step) as one function."""
    torch.manual_seed(0)
    model = build_model(name).to(device)
    cfg = model.config
    if compiled == "model":
        model = torch.compile(model, mode=args.compile_mode)
    amp_dtype = DTYPES[dtype_name]

    def autocast() -> torch.autocast:
        return torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None)

    shape = (cfg.img_size, cfg.img_size, cfg.in_timesteps, cfg.in_channels)
    x1 = torch.randn(1, *shape, device=device)

    model.eval()

    def forward() -> None:
        with torch.no_grad(), autocast():
            model(x1)

    if args.cuda_graph and device.type == "cuda":
        forward = _graphed(forward, device)
    fwd, fwd_cpu = _time(forward, device, args.warmup, args.iters)

    params = sum(p.numel() for p in model.parameters())
    if args.no_train:
        return Result(name, dtype_name, compiled, round(params / 1e6, 3), round(statistics.median(fwd) * 1e3, 3),
                      round(min(fwd) * 1e3, 3), round(statistics.median(fwd_cpu) * 1e3, 3), None, None, None, None)
    model.train()
    xb = torch.randn(args.train_batch, *shape, device=device)
    yb = torch.randn(args.train_batch, cfg.img_size, cfg.img_size, cfg.out_timesteps, cfg.out_channels, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.9), weight_decay=1e-6)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = _relative_l2(model(xb), yb)
        loss.backward()
        opt.step()

    if compiled == "step":
        train_step = torch.compile(train_step, mode=args.compile_mode)
    warmup = max(args.warmup, 3) if compiled == "step" else args.warmup  # compilation stays out of the timed calls
    steps, steps_cpu = _time(train_step, device, warmup, args.train_iters)
    step_s = statistics.median(steps)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Result(
        preset=name,
        dtype=dtype_name,
        compiled=compiled,
        params_m=round(params / 1e6, 3),
        forward_ms=round(statistics.median(fwd) * 1e3, 3),
        forward_ms_min=round(min(fwd) * 1e3, 3),
        forward_cpu_ms=round(statistics.median(fwd_cpu) * 1e3, 3),
        train_samples_per_s=round(args.train_batch / step_s, 3),
        train_step_ms=round(step_s * 1e3, 1),
        train_step_cpu_ms=round(statistics.median(steps_cpu) * 1e3, 1),
        peak_mem_mib=round(peak, 1) if peak is not None else None,
    )


def _fmt(value: float | None, width: int, spec: str) -> str:
    return f"{value:>{width}{spec}}" if value is not None else f"{'-':>{width}}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda or cuda:N")
    parser.add_argument("--presets", default=None, help="comma list; default Ti,S,M,L on CUDA, Ti,S on CPU")
    parser.add_argument("--dtypes", default=None,
                        help="comma list of fp32, bf16; default both on CUDA, fp32 on CPU (CPU bf16 is emulated, very slow)")
    parser.add_argument("--train-batch", type=int, default=None, help="default 20 on CUDA, 2 on CPU")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls; default 5 on CUDA, 1 on CPU")
    parser.add_argument("--iters", type=int, default=None, help="timed forward calls; default 50 on CUDA, 3 on CPU")
    parser.add_argument("--train-iters", type=int, default=None, help="timed train steps; default 20 on CUDA, 2 on CPU")
    parser.add_argument("--no-train", action="store_true", help="forward latency only (for large presets on CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--compile", action="store_true", help="wrap the model in torch.compile")
    parser.add_argument("--compile-step", action="store_true",
                        help="also time the whole train step (forward, loss, backward, AdamW step) compiled as one "
                             "function, side by side with eager (the forward is then timed eagerly)")
    parser.add_argument("--compile-mode", default=None,
                        help="torch.compile mode (default, reduce-overhead, max-autotune, ...)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="time the batch-1 forward as a captured CUDA graph replay (CUDA only)")
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda requested but CUDA is not available")
    defaults = {"presets": "Ti,S,M,L" if cuda else "Ti,S", "dtypes": "fp32,bf16" if cuda else "fp32", "train_batch": 20 if cuda else 2,
                "warmup": 5 if cuda else 1, "iters": 50 if cuda else 3, "train_iters": 20 if cuda else 2}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    unknown = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if unknown:
        parser.error(f"unknown dtypes {unknown}; choose from {list(DTYPES)}")
    return args


def variants(args: argparse.Namespace) -> list[str]:
    """What is compiled in each measurement: eager then the whole step (--compile-step), the model (--compile), or
    nothing."""
    if args.compile_step:
        return ["off", "step"]
    return ["model"] if args.compile else ["off"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = bench_device(args.device, args.threads)
    results: list[Result] = []
    header = f"{'preset':<6} {'dtype':<5} {'compile':<7} {'params':>9} {'fwd ms (b=1)':>13} {'fwd min':>9} {'fwd cpu':>9} " \
             f"{'train samp/s (b=' + str(args.train_batch) + ')':>22} {'step ms':>9} {'step cpu':>9} {'peak MiB':>9}"
    print(f"# DPOT model step benchmark on {device} ({device_name(device)}), torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}", flush=True)
    print(header, flush=True)
    for name in args.presets.split(","):
        for dtype_name, compiled in [(d, c) for d in args.dtypes.split(",") for c in variants(args)]:
            r = bench_preset(name.strip(), dtype_name, device, args, compiled)
            results.append(r)
            peak = f"{r.peak_mem_mib:.0f}" if r.peak_mem_mib is not None else "-"
            print(f"{r.preset:<6} {r.dtype:<5} {r.compiled:<7} {r.params_m:>8.2f}M {r.forward_ms:>13.2f} {r.forward_ms_min:>9.2f} "
                  f"{r.forward_cpu_ms:>9.1f} {_fmt(r.train_samples_per_s, 22, '.2f')} {_fmt(r.train_step_ms, 9, '.0f')} "
                  f"{_fmt(r.train_step_cpu_ms, 9, '.0f')} {peak:>9}", flush=True)
    summary = {
        "benchmark": "model_step",
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "settings": {k: getattr(args, k) for k in ("presets", "dtypes", "train_batch", "warmup", "iters",
                                                   "train_iters", "compile", "compile_step", "compile_mode", "cuda_graph",
                                                   "no_train")},
        "results": [asdict(r) for r in results],
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
