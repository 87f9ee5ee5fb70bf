"""The source-agnostic ingest: lock the output → resolve the job → read → plan → run → publish → upload.

- `resolve` (dpot_data.ingest.job) decides everything about a job before data is read: options, the output and what
  it holds, the inputs (URLs copied in), the source and catalog entry (`IngestJob`, frozen);
- `plan` (dpot_data.ingest.plan) decides everything about the output without I/O, the format's limits included;
- `run` (dpot_data.ingest.run) processes blocks of trajectories as tasks (a bounded window in flight, never whole
  files) and writes them into OUT/.staging-<dataset>, whose journal (dpot_data.ingest.journal) records every
  finished block so that re-running an interrupted ingest resumes it with a byte-identical result;
- `publish` (dpot_data.ingest.publish) makes the staged output the output of OUT with one atomic manifest rename,
  the old output valid until then; one ingest at a time writes into an OUT (`OutputLock`);
- `remote` (dpot_data.ingest.remote) uploads a finished output to a URL, manifest last.

`run_ingest` (dpot_data.ingest.pipeline) is the one entry point from raw files (local or URLs, optionally named by a
catalog dataset); the CLI, the corpus and library users call it. This package's own import is light (its names load
on first use), so that `dpot_data.ingest.input_hashes` can start hashing before the machinery is imported.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "CONVENTIONS": "options", "FORMATS": "options", "IngestOptions": "options", "IngestOutcome": "options",
    "parse_split": "options", "InputHashes": "input_hashes", "assign_splits": "plan", "resampled_coord": "plan",
    "IngestJob": "job", "resolve": "job", "ingest": "pipeline", "ingest_files": "pipeline", "read_source": "pipeline",
    "run_ingest": "pipeline", "execute": "pipeline",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    """Load a public name from the module that defines it, on first use."""
    if name not in _NAMES:
        raise AttributeError(f"module 'dpot_data.ingest' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dpot_data.ingest.{_NAMES[name]}"), name)
    globals()[name] = value
    return value
