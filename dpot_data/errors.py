"""The one error type for bad raw input: the CLI turns it into exit code 2 and one line naming the file."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """A raw input file (or option) is not what the reader expects; `str()` is "<file>: <what was expected>"."""

    def __init__(self, path: str | Path, message: str) -> None:
        self.path = str(path)
        self.message = message
        super().__init__(f"{self.path}: {message}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        """Pickled as (path, message): a dask.distributed worker sends a task's error back to the client so."""
        return type(self), (self.path, self.message)


class CatalogError(ValueError):
    """The catalog file itself is malformed (names the file, the entry and the key)."""


class TrajectoryError(InputError):
    """An InputError about one trajectory's values (NaN/Inf, data that cannot be read): what a reader's
    `check_finite=True` scan leaves out, met instead by a block read that checks what it reads."""
