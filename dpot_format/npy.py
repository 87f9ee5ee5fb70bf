"""`.npy` members without trusting them: the header (versions 1.0, 2.0, 3.0) parsed with a literal parser, pickled
and object dtypes refused, so that shape and dtype are known before any data is read or allocated."""

from __future__ import annotations

import ast
import io
import struct
from typing import IO, NamedTuple

import numpy as np

from dpot_format.errors import FormatError
from dpot_format.limits import LIMITS

MAGIC = b"\x93NUMPY"
_ALLOWED_KINDS = "biuf"  # bool, signed and unsigned integers, floats: no objects, records, strings or voids


class NpyHeader(NamedTuple):
    """What a .npy header declares; `data_offset` counts from the first byte of the magic string."""

    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype
    data_offset: int

    @property
    def nbytes(self) -> int:
        """Bytes of data the header announces (shape product times item size)."""
        n = self.dtype.itemsize
        for s in self.shape:
            n *= s
        return n


def _exact(f: IO[bytes], n: int, where: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise FormatError(where, f"ends inside its .npy header (wanted {n} more bytes, got {len(data)})")
    return data


def read_npy_header(f: IO[bytes], where: str = ".npy", max_header_bytes: int = LIMITS.max_npy_header_bytes
                    ) -> NpyHeader:
    """Read a .npy header from the file's current position without reading data: (shape, fortran, dtype,
    data_offset). FormatError naming `where` for a bad magic, an unknown version, a header that is not a plain
    literal dict, or a dtype that is not a plain number type (pickled objects, records and strings are refused)."""
    magic = _exact(f, 8, where)
    if magic[:6] != MAGIC:
        raise FormatError(where, "is not a .npy array (bad magic string)")
    version = (magic[6], magic[7])
    if version == (1, 0):
        (hlen,) = struct.unpack("<H", _exact(f, 2, where))
        start, encoding = 10, "latin1"
    elif version in ((2, 0), (3, 0)):
        (hlen,) = struct.unpack("<I", _exact(f, 4, where))
        start, encoding = 12, "latin1" if version == (2, 0) else "utf8"
    else:
        raise FormatError(where, f".npy version {version[0]}.{version[1]}, expected 1.0, 2.0 or 3.0")
    if hlen > max_header_bytes:
        raise FormatError(where, f".npy header of {hlen} bytes, more than the limit of {max_header_bytes}")
    try:
        text = _exact(f, hlen, where).decode(encoding)
        header = ast.literal_eval(text)
    except (UnicodeDecodeError, ValueError, SyntaxError, MemoryError, RecursionError):
        raise FormatError(where, "has a .npy header that is not a literal dict") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise FormatError(where, "has a .npy header without exactly the keys descr, fortran_order, shape")
    descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
    if not isinstance(descr, str):
        raise FormatError(where, f"has a structured dtype {descr!r}, expected a plain number type")
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError):
        raise FormatError(where, f"has an unknown dtype {descr!r}") from None
    if dtype.hasobject or dtype.kind not in _ALLOWED_KINDS:
        raise FormatError(where, f"has dtype {descr!r} ({dtype}), expected a plain number type (no pickled objects)")
    if not isinstance(fortran, bool):
        raise FormatError(where, f"has fortran_order {fortran!r}, expected True or False")
    if not isinstance(shape, tuple) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                               for s in shape):
        raise FormatError(where, f"has shape {shape!r}, expected a tuple of non-negative integers")
    return NpyHeader(tuple(shape), fortran, dtype, start + hlen)


def load_npy(data: bytes, where: str = ".npy") -> np.ndarray:
    """The array in a whole .npy member: header checked as in `read_npy_header`, its size checked against the data,
    loaded with allow_pickle=False."""
    header = read_npy_header(io.BytesIO(data), where)
    if header.data_offset + header.nbytes != len(data):
        raise FormatError(where, f"header announces {header.nbytes} bytes of {header.dtype} {header.shape}, the member "
                                 f"holds {len(data) - header.data_offset}")
    return np.load(io.BytesIO(data), allow_pickle=False)
