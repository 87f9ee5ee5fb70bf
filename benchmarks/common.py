"""Helpers shared by the benchmark scripts: machine description and fp32-means-fp32 CUDA settings."""

from __future__ import annotations

import platform

import torch


def cpu_name() -> str:
    """The CPU model (lscpu's 'Model name')."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def device_name(device: torch.device) -> str:
    """The GPU's name on CUDA, else the CPU model."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def strict_fp32(device: torch.device) -> None:
    """Turn TF32 off on CUDA, so that an fp32 figure is real fp32 when compared with bf16."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def bench_device(name: str, threads: int | None) -> torch.device:
    """The device to measure on, with the thread count set and TF32 off (fp32 figures are real fp32)."""
    if threads:
        torch.set_num_threads(threads)
    device = torch.device(name)
    strict_fp32(device)
    return device
