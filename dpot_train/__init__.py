"""dpot_train: the DPOT model and a resumable DDP trainer that streams dpot_data shards.

`load_pretrained(path)`: the network of any checkpoint dpot reads (DPOT 2D/3D, FNO, UNet; released format or ours),
in eval mode (`dpot_train.checkpoint.load_pretrained`; imported on first use, so `import dpot_train` stays light).
`open_dataset(manifest_or_url, split, t_in, t_out, ...)`: the windows `dpot-train launch` trains on, as a torch
IterableDataset for a training loop of one's own (`dpot_train.api.open_dataset`, docs/api.md; imported on first use).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_pretrained", "open_dataset"]


def __getattr__(name: str) -> Any:
    if name == "load_pretrained":
        from dpot_train.checkpoint import load_pretrained

        return load_pretrained
    if name == "open_dataset":
        from dpot_train.api import open_dataset

        return open_dataset
    raise AttributeError(f"module 'dpot_train' has no attribute {name!r}")
