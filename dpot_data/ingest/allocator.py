"""Allocator settings for a process that runs an ingest: freed block buffers are kept and reused, not handed back
to the system and faulted in (and zeroed) again for the next block.

With glibc's defaults an ingest allocates every block buffer afresh: numpy arrays of tens of MB are served by mmap
(and from a worker thread's arena, anything over its 64 MB heap is), so each block's pages are faulted in and
zeroed by the kernel, then unmapped when it is freed. On a 2-core VM that page zeroing was a tenth of the default
ingest's CPU time (benchmarks/RESULTS.md). `reuse_freed_memory` makes every thread allocate from the one heap, serves
allocations up to `limit` bytes from it and keeps up to `limit` bytes of freed memory for reuse: the steady state of
an ingest (the same block sizes again and again) then faults nothing in. Peak memory is unchanged (what is kept is
what the ingest held at its peak, bounded by the blocks in flight); it only stops going back to the system between
blocks. The CLI calls it for `dpot-data ingest`, a process of its own; library callers are left with their process's
settings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt(3) parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
REUSE_LIMIT = 1 << 30  # allocations up to this size come from the heap, and this much freed memory is kept


def reuse_freed_memory(limit: int = REUSE_LIMIT) -> bool:
    """Tune glibc malloc as the module docstring says (call it before the ingest's threads start: a thread that has
    its own arena already keeps it); True when every setting took, False where there is no glibc mallopt."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    limit = min(int(limit), 2**31 - 1)
    settings = ((M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, limit), (M_TRIM_THRESHOLD, limit))
    return all([mallopt(param, value) == 1 for param, value in settings])
