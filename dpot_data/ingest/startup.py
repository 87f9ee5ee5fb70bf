"""Start-up of the `dpot-data ingest` command: the modules an ingest needs imported with less work before the first
block task, and the objects they leave kept out of the garbage collector's passes while the ingest runs.

- `dask.array` imports `scipy.fftpack` (for a warning in its FFT wrappers) and `scipy.sparse` (to register sparse
  matrices as chunk types), and with them scipy.special and numpy.f2py: about 0.2 s of CPU, serial before the first
  block, for code the ingest never runs. `import_dask_array` imports it with scipy hidden for that import only;
  scipy stays importable (the Fourier resample imports `scipy.fft` when it needs it). The one effect left: in this
  process dask does not take scipy sparse matrices for chunks, which no reader produces.
- The imports leave ~10⁵ objects that live as long as the process. Every full collection walks them all again;
  `ingest_process` imports with the collector off, then moves them into the permanent generation (`gc.freeze`), so
  that the collections during the ingest walk only what the ingest itself allocates (0.1 s of collections per
  0.1 GB ingested to 0.02 s on the VM of benchmarks/RESULTS.md), and unfreezes them when the ingest is done.

The CLI uses this for `dpot-data ingest`; library callers are left with their process's imports and collector.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import sys
from typing import Iterator

HIDDEN_FROM_DASK_ARRAY = ("scipy", "scipy.sparse", "scipy.fftpack")


def import_dask_array() -> bool:
    """Import `dask.array` without its optional scipy imports (module docstring); True when it was imported so,
    False when it or scipy was already imported (then nothing changes)."""
    if "dask.array" in sys.modules or any(name in sys.modules for name in HIDDEN_FROM_DASK_ARRAY):
        return False
    for name in HIDDEN_FROM_DASK_ARRAY:
        sys.modules[name] = None  # type: ignore[assignment]  # "import scipy" raises ImportError, which dask expects
    try:
        importlib.import_module("dask.array")
    finally:
        for name in HIDDEN_FROM_DASK_ARRAY:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return True


@contextlib.contextmanager
def ingest_process(source: str | None = None) -> Iterator[None]:
    """For the body: the ingest's modules (and the reader of `source`, when named) imported with the collector off,
    then frozen out of its passes; unfrozen on the way out. Nothing is frozen when something else froze objects
    already (its freeze is left alone)."""
    if gc.get_freeze_count():
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        import_dask_array()
        importlib.import_module("dpot_data.ingest.pipeline")
        if source is not None:
            from dpot_data.sources.base import load_source

            with contextlib.suppress(ValueError):  # an unknown source: the ingest says so in its own words
                load_source(source)
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
