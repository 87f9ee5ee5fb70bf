"""dpot_train: the DPOT model and a resumable DDP trainer that streams dpot_data shards.

`load_pretrained(path)`: the network of any checkpoint dpot reads (DPOT 2D/3D, FNO, UNet; released format or ours),
in eval mode (`dpot_train.checkpoint.load_pretrained`; imported on first use, so `import dpot_train` stays light).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_pretrained"]


def __getattr__(name: str) -> Any:
    if name == "load_pretrained":
        from dpot_train.checkpoint import load_pretrained

        return load_pretrained
    raise AttributeError(f"module 'dpot_train' has no attribute {name!r}")
