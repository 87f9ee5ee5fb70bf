"""dpot_train: the DPOT model and a resumable DDP trainer that streams dpot_data shards.

`load_pretrained(path)`: the network of any checkpoint dpot reads (DPOT 2D/3D, FNO, UNet; released format or ours),
in eval mode (`dpot_train.core.checkpoint.load_pretrained`; imported on first use, so `import dpot_train` stays light).
`open_dataset(manifest_or_url, split, t_in, t_out, ...)`: the windows `dpot-train launch` trains on, as a torch
IterableDataset for a training loop of one's own (`dpot_train.api.open_dataset`, docs/api.md; imported on first use).

Sub-packages, top first, each importing only from those below it (`LAYERS`; tests/test_import_direction.py checks
every import, those inside functions included): `run` > `train` > `evaluation` > `data` > `core` > `model`,
`integrations`, all above dpot_format; the packages of one level never import each other. The top level holds only
the public API and the entry points (`cli`, `api`, `preview`, `model_info`), which may import any of them. Module
paths the docs named before this layout (`dpot_train.checkpoint`, ...) still import, as the moved modules
themselves (`MOVED`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType
from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "load_pretrained", "open_dataset"]


def __getattr__(name: str) -> Any:
    if name == "load_pretrained":
        from dpot_train.core.checkpoint import load_pretrained

        return load_pretrained
    if name == "open_dataset":
        from dpot_train.api import open_dataset

        return open_dataset
    raise AttributeError(f"module 'dpot_train' has no attribute {name!r}")


# The sub-packages, top first: a module imports only from the packages of lower levels, never from its own level's
# other packages; the top level (this package's own modules) may import any. The docstring above states it and
# tests/test_import_direction.py holds every import to it.
LAYERS: tuple[tuple[str, ...], ...] = (("run",), ("train",), ("evaluation",), ("data",), ("core",),
                                       ("model", "integrations"))

# Module paths the docs named before the sub-packages: `dpot_train.OLD` imports the module `dpot_train.NEW` itself
# (the same object), and only when asked for, so that `import dpot_train` stays light.
MOVED: dict[str, str] = {
    "checkpoint": "core.checkpoint",
    "config": "core.config",
    "ensemble": "evaluation.ensemble",
    "eval_metrics": "evaluation.metrics",
    "eval_stream": "evaluation.stream",
    "metrics": "core.metrics",
    "model_setup": "core.model_setup",
    "normalize": "core.normalize",
    "report": "evaluation.report",
    "slurm": "run.slurm",
    "startup": "train.startup",
    "threads": "core.threads",
    "torchrun": "run.torchrun",
    "trainer": "train.trainer",
    "worker": "run.worker",
}


class _MovedModules:
    """Meta path finder and loader of the old paths in MOVED: `import dpot_train.OLD`, `mock.patch("dpot_train.OLD.x")`
    and `python -m dpot_train.OLD` reach the module under its new name."""

    @staticmethod
    def _target(fullname: str) -> str | None:
        prefix, _, old = fullname.partition(".")
        return f"{prefix}.{MOVED[old]}" if prefix == __name__ and old in MOVED else None

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        return ModuleSpec(fullname, _MovedModules) if _MovedModules._target(fullname) else None

    @staticmethod
    def create_module(spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(_MovedModules._target(spec.name))
        spec.loader_state = module.__spec__  # the import system sets module.__spec__ to the alias: put back below
        return module

    @staticmethod
    def exec_module(module: ModuleType) -> None:
        module.__spec__ = module.__spec__.loader_state  # already run under its new name: nothing to execute

    @staticmethod
    def get_code(fullname: str) -> CodeType | None:
        """The new module's code, for `python -m dpot_train.OLD` (runpy)."""
        target = _MovedModules._target(fullname)
        return importlib.util.find_spec(target).loader.get_code(target)


if not any(getattr(f, "__qualname__", None) == _MovedModules.__qualname__ for f in sys.meta_path):
    sys.meta_path.append(_MovedModules)  # last: consulted only for names no real module has
