"""A window's first frame, drawn as `np.random.default_rng([seed, position, tag]).integers(0, n)` draws it, in plain
Python integers: the same number, without numpy's per-call cost (a SeedSequence, a PCG64 and a Generator, with an
errstate context and a lock, about 15-25 us per window: as much Python as the rest of a window's reading).

The arithmetic is numpy's own: SeedSequence (O'Neill's seed_seq hash, pool of 4 words) -> `generate_state(4,
uint64)` -> PCG64's `set_seed` (state and increment, 128 bits each) -> Lemire's bounded draw on 32-bit outputs (the
low half of a 64-bit XSL-RR output first). numpy promises that SeedSequence and PCG64 do not change; `integers` may,
so the first call checks a set of draws against numpy and uses numpy itself from then on if any differs.
"""

from __future__ import annotations

import functools

import numpy as np

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_M128 = (1 << 128) - 1
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341


def _words(n: int) -> list[int]:
    """A non-negative int as SeedSequence splits it: 32-bit words, least significant first ([0] for 0)."""
    if n < 0:
        raise ValueError(f"seed entropy must be non-negative, got {n}")
    out = [n & _M32]
    n >>= 32
    while n:
        out.append(n & _M32)
        n >>= 32
    return out


def _constants(init: int, mult: int, n: int) -> tuple[tuple[int, int], ...]:
    """The (xor, multiply) constant pairs of the first n steps of a SeedSequence hash started at `init`: each step
    xors with the running constant, advances it by `mult`, then multiplies by the new one."""
    out, h = [], init
    for _ in range(n):
        nxt = (h * mult) & _M32
        out.append((h, nxt))
        h = nxt
    return tuple(out)


_MIX_STEPS = _constants(_INIT_A, _MULT_A, 64)  # entropy of up to 16 words (4 + 12 + 4 per word past the pool)
_STATE_STEPS = _constants(_INIT_B, _MULT_B, 8)  # generate_state(4, uint64): 8 words


def seed_pool(entropy: list[int]) -> list[int]:
    """SeedSequence(entropy).pool: the 4 uint32 words its hash leaves."""
    words = [w for v in entropy for w in _words(int(v))]
    if len(words) > 12:
        return [int(w) for w in np.random.SeedSequence(entropy).pool]
    steps = iter(_MIX_STEPS)
    pool = []
    for i in range(_POOL):
        x, y = next(steps)
        v = (((words[i] if i < len(words) else 0) ^ x) * y) & _M32
        pool.append(v ^ (v >> 16))
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                x, y = next(steps)
                v = ((pool[src] ^ x) * y) & _M32
                r = (_MIX_L * pool[dst] - _MIX_R * (v ^ (v >> 16))) & _M32
                pool[dst] = r ^ (r >> 16)
    for src in range(_POOL, len(words)):
        for dst in range(_POOL):
            x, y = next(steps)
            v = ((words[src] ^ x) * y) & _M32
            r = (_MIX_L * pool[dst] - _MIX_R * (v ^ (v >> 16))) & _M32
            pool[dst] = r ^ (r >> 16)
    return pool


def _pcg_state(pool: list[int]) -> tuple[int, int]:
    """(seed, increment) of the PCG64 seeded from a SeedSequence with this pool: generate_state(4, np.uint64) as
    two 128-bit numbers (words 0-1 and 2-3, the first word the high half), written out."""
    m = _M32
    (xa, ya), (xb, yb), (xc, yc), (xd, yd), (xe, ye), (xf, yf), (xg, yg), (xh, yh) = _STATE_STEPS
    p0, p1, p2, p3 = pool
    a = ((p0 ^ xa) * ya) & m
    b = ((p1 ^ xb) * yb) & m
    c = ((p2 ^ xc) * yc) & m
    d = ((p3 ^ xd) * yd) & m
    e = ((p0 ^ xe) * ye) & m
    f = ((p1 ^ xf) * yf) & m
    g = ((p2 ^ xg) * yg) & m
    h = ((p3 ^ xh) * yh) & m
    w0 = (a ^ (a >> 16)) | ((b ^ (b >> 16)) << 32)
    w1 = (c ^ (c >> 16)) | ((d ^ (d >> 16)) << 32)
    w2 = (e ^ (e >> 16)) | ((f ^ (f >> 16)) << 32)
    w3 = (g ^ (g >> 16)) | ((h ^ (h >> 16)) << 32)
    return (w0 << 64) | w1, (w2 << 64) | w3


class _Pcg64:
    """numpy's PCG64 (XSL-RR 128/64) set_seed(seed, inc) (`_pcg_state`), and its buffered 32-bit draws."""

    def __init__(self, seed: int, inc: int) -> None:
        self.inc = (inc << 1 | 1) & _M128
        s = self.inc  # state 0, one step
        self.state = ((s + seed) * _PCG_MULT + self.inc) & _M128
        self.half: int | None = None

    def next32(self) -> int:
        if self.half is not None:
            out, self.half = self.half, None
            return out
        self.state = (self.state * _PCG_MULT + self.inc) & _M128
        s = self.state
        value, rot = ((s >> 64) ^ s) & _M64, s >> 122
        out64 = ((value >> rot) | (value << ((-rot) & 63))) & _M64
        self.half = out64 >> 32
        return out64 & _M32


def _bounded(gen: _Pcg64, high: int) -> int:
    """Generator.integers(0, high) for 1 < high <= 2**32: Lemire's method on 32-bit draws, as numpy does it."""
    rng = high - 1
    m = gen.next32() * high
    leftover = m & _M32
    if leftover < high:
        threshold = (_M32 - rng) % high
        while leftover < threshold:
            m = gen.next32() * high
            leftover = m & _M32
    return m >> 32


def python_integer(entropy: list[int], high: int) -> int:
    """`int(np.random.default_rng(entropy).integers(0, high))` for 1 <= high <= 2**32, in Python integers."""
    if high == 1:
        return 0
    if len(entropy) == 3 and 0 <= min(entropy) and max(entropy) <= _M32:
        return _draw3(entropy[0], entropy[1], entropy[2], high)
    return _bounded(_Pcg64(*_pcg_state(seed_pool(entropy))), high)


def _draw3(a: int, b: int, c: int, high: int) -> int:
    """`python_integer([a, b, c], high)` for three 32-bit words and 1 < high <= 2**32: the first PCG64 output and
    Lemire's draw written out; a draw Lemire rejects (rare) goes through `_Pcg64`."""
    seed, inc = _pcg_state(_three_word_pool(a, b, c))
    inc = (inc << 1 | 1) & _M128
    state = (((inc + seed) * _PCG_MULT + inc) * _PCG_MULT + inc) & _M128  # set_seed's two steps, then the draw's
    value, rot = ((state >> 64) ^ state) & _M64, state >> 122
    low = ((value >> rot) | (value << ((-rot) & 63))) & _M32  # the 32-bit draw: the output's low half
    m = low * high
    if (m & _M32) < high and (m & _M32) < (_M32 - high + 1) % high:
        return _bounded(_Pcg64(*_pcg_state(_three_word_pool(a, b, c))), high)
    return m >> 32


def _mixed(pool_dst: int, value: int, x: int, y: int) -> int:
    """One cross-mixing step of the pool: mix(pool_dst, hashmix(value))."""
    v = ((value ^ x) * y) & _M32
    r = (_MIX_L * pool_dst - _MIX_R * (v ^ (v >> 16))) & _M32
    return r ^ (r >> 16)


@functools.lru_cache(maxsize=256)
def _prefix(a: int, c: int) -> tuple[int, int, int, int]:
    """What the hash of the words [a, b, c] leaves before b enters the cross-mixing: pool[0], pool[2], pool[3] and
    hashmix(pool[0]) of step 4 (steps 0, 2, 3, 5, 6 and that hash depend on a and c alone)."""
    (x0, y0), _, (x2, y2), (x3, y3), (x4, y4), (x5, y5), (x6, y6) = _MIX_STEPS[:7]
    p0 = ((a ^ x0) * y0) & _M32
    p0 ^= p0 >> 16
    p2 = ((c ^ x2) * y2) & _M32
    p2 ^= p2 >> 16
    p3 = (x3 * y3) & _M32  # the pool's fourth word hashes a 0
    p3 ^= p3 >> 16
    h4 = ((p0 ^ x4) * y4) & _M32
    return p0, _mixed(p2, p0, x5, y5), _mixed(p3, p0, x6, y6), h4 ^ (h4 >> 16)


def _three_word_pool(a: int, b: int, c: int) -> list[int]:
    """`seed_pool([a, b, c])` for three 32-bit words, the part that does not depend on b taken from `_prefix`:
    steps 1, 4 and 7-15 of the hash, written out (this runs once per window)."""
    p0, p2, p3, h4 = _prefix(a, c)
    m, ml, mr = _M32, _MIX_L, _MIX_R
    (x1, y1), (x7, y7), (x8, y8), (x9, y9), (x10, y10), (x11, y11), (x12, y12), (x13, y13), (x14, y14), \
        (x15, y15) = _MIX_STEPS[1], *_MIX_STEPS[7:16]
    v = ((b ^ x1) * y1) & m
    r = (ml * (v ^ (v >> 16)) - mr * h4) & m
    p1 = r ^ (r >> 16)
    # src 1 -> dst 0, 2, 3
    v = ((p1 ^ x7) * y7) & m
    r = (ml * p0 - mr * (v ^ (v >> 16))) & m
    p0 = r ^ (r >> 16)
    v = ((p1 ^ x8) * y8) & m
    r = (ml * p2 - mr * (v ^ (v >> 16))) & m
    p2 = r ^ (r >> 16)
    v = ((p1 ^ x9) * y9) & m
    r = (ml * p3 - mr * (v ^ (v >> 16))) & m
    p3 = r ^ (r >> 16)
    # src 2 -> dst 0, 1, 3
    v = ((p2 ^ x10) * y10) & m
    r = (ml * p0 - mr * (v ^ (v >> 16))) & m
    p0 = r ^ (r >> 16)
    v = ((p2 ^ x11) * y11) & m
    r = (ml * p1 - mr * (v ^ (v >> 16))) & m
    p1 = r ^ (r >> 16)
    v = ((p2 ^ x12) * y12) & m
    r = (ml * p3 - mr * (v ^ (v >> 16))) & m
    p3 = r ^ (r >> 16)
    # src 3 -> dst 0, 1, 2
    v = ((p3 ^ x13) * y13) & m
    r = (ml * p0 - mr * (v ^ (v >> 16))) & m
    p0 = r ^ (r >> 16)
    v = ((p3 ^ x14) * y14) & m
    r = (ml * p1 - mr * (v ^ (v >> 16))) & m
    p1 = r ^ (r >> 16)
    v = ((p3 ^ x15) * y15) & m
    r = (ml * p2 - mr * (v ^ (v >> 16))) & m
    p2 = r ^ (r >> 16)
    return [p0, p1, p2, p3]


def numpy_integer(entropy: list[int], high: int) -> int:
    """The same draw by numpy itself."""
    return int(np.random.default_rng(entropy).integers(0, high))


@functools.lru_cache(maxsize=1)
def _drawer() -> object:
    """`python_integer` when it gives numpy's draws on a fixed set of cases (seeds and positions of 1 to 3 words,
    ranges that need Lemire's rejection), else `numpy_integer` (a numpy whose `integers` changed)."""
    rng = np.random.default_rng(0x5EED)
    cases = [([0, 0, 0xD907], 2), ([0, 1, 0xD907], 91), ([2**32, 2**64 + 5, 0xD907], 3), ([7, 5, 0xD907], 2**32),
             ([1, 2**40, 0xD907], 3 * 2**30 + 7), ([123, 99, 0xD907], 2**31 + 1)]
    cases += [([int(rng.integers(0, 2**40)), int(rng.integers(0, 2**48)), 0xD907], int(rng.integers(1, 5000)))
              for _ in range(64)]
    same = all(python_integer(e, h) == numpy_integer(e, h) for e, h in cases)
    return python_integer if same else numpy_integer


def window_start_at(seed: int, position: int, frames: int, length: int, tag: int = 0xD907) -> int:
    """First frame of the window of `length` frames of the sample at stream `position`: exactly
    `windows.window_start(np.random.default_rng([seed, position, tag]), frames, length)`."""
    if frames < length:
        raise ValueError(f"a window of {length} frames does not fit in {frames} frames")
    high = frames - length + 1
    if high == 1:
        return 0
    if high > 2**32:
        return numpy_integer([seed, position, tag], high)
    if _drawer() is python_integer and 0 <= seed <= _M32 and 0 <= position <= _M32 and 0 <= tag <= _M32:
        return _draw3(seed, position, tag, high)
    return _drawer()([seed, position, tag], high)  # type: ignore[operator]
