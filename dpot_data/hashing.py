"""Re-exports of dpot_format.io's hashing for modules that import it from here (the digests are defined there)."""

from __future__ import annotations

import os

from dpot_format.io import ARRAY_BLOCK_BYTES, CHUNK, ArrayHasher, sha256_array  # noqa: F401 - re-export
from dpot_format.io import sha256_file as _sha256_file


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, streamed (dpot_format.io.sha256_file without the size)."""
    return _sha256_file(path)[0]
