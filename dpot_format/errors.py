"""The one error type of the format: anything that breaks docs/format.md, its message naming the file or key and
what was expected."""

from __future__ import annotations


class FormatError(ValueError):
    """A file or value breaks the shard format; `str()` is "<file or key>: <what was expected / found>".

    `FormatError(where, expected)` builds that message; `FormatError(message)` takes a finished one.
    """

    def __init__(self, where: str, expected: str | None = None) -> None:
        if expected is None:
            self.where: str | None = None
            self.expected = str(where)
            message = str(where)
        else:
            self.where = str(where)
            self.expected = str(expected)
            message = f"{self.where}: {self.expected}"
        super().__init__(message)
