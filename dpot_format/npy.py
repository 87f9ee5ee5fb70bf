"""`.npy` members without trusting them: the header (versions 1.0, 2.0, 3.0) parsed with a literal parser, pickled
and object dtypes refused, so that shape and dtype are known before any data is read or allocated.

The header is parsed here rather than by numpy (`np.load`, `np.lib.format`), which calls `ast.literal_eval`: on
CPython 3.11 the AST constructor's recursion counter is shared by all threads, so several loader threads parsing
headers at once can fail with "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905)."""

from __future__ import annotations

import io
import re
import struct
from typing import IO, NamedTuple

import numpy as np

from dpot_format.errors import FormatError
from dpot_format.limits import LIMITS

MAGIC = b"\x93NUMPY"
_ALLOWED_KINDS = "biuf"  # bool, signed and unsigned integers, floats: no objects, records, strings or voids
_MAX_DEPTH = 32  # nesting a header literal may have (a structured dtype's list of tuples is 3 deep)
_TOKEN = re.compile(r"""\s*(?:(?P<str>'[^'\\\n]*'|"[^"\\\n]*")|(?P<int>-?\d+)(?![\w.])|(?P<name>True|False|None)\b"""
                    r"""|(?P<punct>[{}()\[\],:]))""")
_NAMES = {"True": True, "False": False, "None": None}
# checked (shape, fortran, dtype) by exact header bytes and encoding: a loader reads the same few headers thousands of
# times a second, and parsing one costs ~60 us (a hit returns what the same bytes parsed to; failures are not kept)
_CHECKED: dict[tuple[bytes, str], tuple[tuple[int, ...], bool, np.dtype]] = {}
_CHECKED_MAX = 4096


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


class _Literal:
    """A recursive-descent parser of the Python literals a .npy header holds: dicts, tuples, lists, plain quoted
    strings (no escapes), decimal integers, True, False and None. Anything else is a ValueError."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def parse(self) -> object:
        value = self._value(0)
        if self.text[self.pos:].strip():
            raise ValueError(f"unexpected text at offset {self.pos}")
        return value

    def _next(self) -> tuple[str, str]:
        m = _TOKEN.match(self.text, self.pos)
        if m is None or m.lastgroup is None:
            raise ValueError(f"unexpected text at offset {self.pos}")
        self.pos = m.end()
        return m.lastgroup, m.group(m.lastgroup)

    def _peek(self, punct: str) -> bool:
        m = _TOKEN.match(self.text, self.pos)
        if m is not None and m.group("punct") == punct:
            self.pos = m.end()
            return True
        return False

    def _value(self, depth: int) -> object:
        if depth > _MAX_DEPTH:
            raise ValueError("nested too deeply")
        kind, text = self._next()
        if kind == "str":
            return text[1:-1]
        if kind == "int":
            return int(text)
        if kind == "name":
            return _NAMES[text]
        if text == "{":
            out: dict[object, object] = {}
            while not self._peek("}"):
                key = self._value(depth + 1)
                if not isinstance(key, (str, int)) or not self._peek(":"):
                    raise ValueError("a dict key must be a string or integer followed by ':'")
                out[key] = self._value(depth + 1)
                if not self._peek(","):
                    self._close("}")
                    break
            return out
        if text in "([":
            end = ")" if text == "(" else "]"
            items: list[object] = []
            trailing_comma = False
            while not self._peek(end):
                items.append(self._value(depth + 1))
                trailing_comma = self._peek(",")
                if not trailing_comma:
                    self._close(end)
                    break
            if end == "]":
                return items
            return items[0] if len(items) == 1 and not trailing_comma else tuple(items)  # (5) is 5, (5,) a tuple
        raise ValueError(f"unexpected {text!r} at offset {self.pos}")

    def _close(self, end: str) -> None:
        if not self._peek(end):
            raise ValueError(f"expected {end!r} at offset {self.pos}")


def parse_header_literal(text: str) -> object:
    """The Python literal of a .npy header (the dict numpy writes), parsed without `ast` so that threads may parse
    headers at once; ValueError for anything but dicts, tuples, lists, plain strings, integers, booleans and None."""
    return _Literal(text).parse()


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
    raw = _exact(f, hlen, where)
    known = _CHECKED.get((raw, encoding))
    if known is not None:
        return NpyHeader(*known, start + hlen)
    try:
        text = raw.decode(encoding)
        header = parse_header_literal(text)
    except (UnicodeDecodeError, ValueError):
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
    if len(_CHECKED) >= _CHECKED_MAX:
        _CHECKED.clear()
    _CHECKED[(raw, encoding)] = (tuple(shape), fortran, dtype)
    return NpyHeader(tuple(shape), fortran, dtype, start + hlen)


def load_npy(data: bytes, where: str = ".npy") -> np.ndarray:
    """The array in a whole .npy member: header checked as in `read_npy_header`, its size checked against the data,
    the values copied out of `data` (a writable array of its own, C or Fortran order as the header says; numpy's own
    loader is not used: it parses the header with `ast`, see the module docstring)."""
    header = read_npy_header(io.BytesIO(data), where)
    if header.data_offset + header.nbytes != len(data):
        raise FormatError(where, f"header announces {header.nbytes} bytes of {header.dtype} {header.shape}, the member "
                                 f"holds {len(data) - header.data_offset}")
    flat = np.frombuffer(data, dtype=header.dtype, count=header.nbytes // header.dtype.itemsize,
                         offset=header.data_offset)
    return flat.reshape(header.shape, order="F" if header.fortran else "C").copy(order="K")
