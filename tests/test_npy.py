""".npy members read without numpy's header parser: the same arrays as numpy writes them (versions 1.0 to 3.0,
C and Fortran order), the refusals of docs/format.md on one line, and many threads parsing headers at once (numpy's
parser goes through `ast`, whose constructor state CPython 3.11 shares between threads: gh-106905)."""

from __future__ import annotations

import gc
import io
import sys
import threading

import numpy as np
import pytest

from dpot_format.errors import FormatError
from dpot_format.npy import load_npy, parse_header_literal, read_npy_header


def _npy(a: np.ndarray, version: tuple[int, int] = (1, 0)) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=version, allow_pickle=False)
    return buf.getvalue()


ARRAYS = [np.arange(24, dtype="<f4").reshape(2, 3, 4), np.zeros((), dtype="u1"), np.arange(5, dtype=">i8"),
          np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.zeros((0, 3), dtype="?"),
          np.arange(7, dtype=np.float16)]


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_load_npy_gives_numpys_arrays(version: tuple[int, int]) -> None:
    for a in ARRAYS:
        got = load_npy(_npy(a, version))
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
        assert got.flags.writeable and got.flags.f_contiguous == a.flags.f_contiguous
        header = read_npy_header(io.BytesIO(_npy(a, version)))
        assert (header.shape, header.fortran, header.dtype) == (a.shape, a.flags.f_contiguous and not a.flags.c_contiguous,
                                                                a.dtype)


def test_the_literal_parser_reads_what_python_reads() -> None:
    import ast

    for text in ["{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }   \n", "(5)", "(5,)", "()", "[]",
                 "{}", '{"descr": "|u1", "fortran_order": True, "shape": (1, 0, 7)}', "[1, [-2, (3,)]]", "None",
                 "{'descr': [('a', '<f4'), ('b', '<i4', (2,))], 'fortran_order': False, 'shape': ()}"]:
        assert parse_header_literal(text) == ast.literal_eval(text), text
    for text in ["{1: 2", "(1 2)", "{'shape': (3L,)}", "1.5", "'a\\\\b'", "{,}", "(,)", "[" * 40 + "]" * 40,
                 "{'a': f()}", "__import__('os')", "{'a': 1} x", "{[]: 1}"]:
        with pytest.raises(ValueError):
            parse_header_literal(text)


@pytest.mark.parametrize(("header", "message"), [
    ("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", "has a structured dtype"),
    ("{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", "expected a plain number type (no pickled"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2.0,), }", "is not a literal dict"),
    ("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", "has fortran_order 0, expected True or False"),
    ("{'descr': '<f4', 'shape': (2,), }", "without exactly the keys descr, fortran_order, shape"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", "expected a tuple of non-negative integers"),
    ("__import__('os').system('true')", "is not a literal dict"),
])
def test_bad_headers_are_refused_on_one_line(header: str, message: str) -> None:
    text = header.encode("latin1")
    data = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + b"\0" * 8
    with pytest.raises(FormatError) as err:
        load_npy(data, "shard.tar: member s0000001.mask.npy")
    assert str(err.value).startswith("shard.tar: member s0000001.mask.npy") and message in str(err.value)
    assert "\n" not in str(err.value)


class _Finalized:
    """Garbage with a finalizer: collecting it runs Python code, where the interpreter may switch threads."""

    def __del__(self) -> None:
        sum(i for i in range(3))


def test_many_threads_parse_headers_at_once() -> None:
    """Threads at different stack depths load .npy members while garbage collection switches between them in the
    middle of a parse. Through `ast` (np.load) this fails on CPython 3.11 with "AST constructor recursion depth
    mismatch"; the header parser keeps no state outside its own call."""
    members = [(_npy(a, v), a) for a in ARRAYS for v in ((1, 0), (3, 0))]
    errors: list[str] = []

    def at_depth(n: int) -> None:
        if n:
            return at_depth(n - 1)
        for _ in range(150):
            for data, want in members:
                got = load_npy(data, "member")
                if got.shape != want.shape or not np.array_equal(got, want):
                    errors.append(f"wrong array for {want.dtype} {want.shape}")
                a, b = _Finalized(), _Finalized()
                a.other, b.other = b, a  # type: ignore[attr-defined]
        return None

    def work(depth: int) -> None:
        try:
            at_depth(depth)
        except Exception as exc:  # noqa: BLE001 - every failure is reported by the assertion below
            errors.append(f"{type(exc).__name__}: {exc}")

    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50, 1, 1)
    try:
        for _ in range(3):
            threads = [threading.Thread(target=work, args=(3 * i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)
    assert errors == []
