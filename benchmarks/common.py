"""Helpers shared by the benchmark scripts: machine description and fp32-means-fp32 CUDA settings.

torch is imported only by the helpers that need it, so that CPU-only benchmarks (ingest) do not pay for it.
"""

from __future__ import annotations

import os
import platform
import shutil
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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


def total_ram() -> int:
    """Physical memory in bytes (0 where it cannot be told)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def package_versions(names: list[str] | tuple[str, ...]) -> dict[str, str]:
    """Installed version of each distribution (None when it is not installed)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine(folder: str | Path, packages: list[str] | tuple[str, ...] = ()) -> dict:
    """What a result was measured on: CPU model, cores, RAM, free disk under `folder`, load average, Python and the
    versions of `packages`."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    return {
        "host": platform.node(),
        "cpu": cpu_name(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "ram_bytes": total_ram(),
        "disk_free_bytes": shutil.disk_usage(folder).free,
        "load_average": [round(v, 2) for v in load] if load[0] is not None else None,
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": package_versions(packages),
    }


def device_name(device: torch.device) -> str:
    """The GPU's name on CUDA, else the CPU model."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def strict_fp32(device: torch.device) -> None:
    """Turn TF32 off on CUDA, so that an fp32 figure is real fp32 when compared with bf16."""
    import torch

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def bench_device(name: str, threads: int | None) -> torch.device:
    """The device to measure on, with the thread count set and TF32 off (fp32 figures are real fp32)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    device = torch.device(name)
    strict_fp32(device)
    return device
