"""The loader of a window stream: picks the worker kind (none, threads, or processes writing into a shared ring of
batch slots), so that neither the stream nor the workers need to know about each other."""

from __future__ import annotations

from typing import Any

import torch

from dpot_train.data import process_ring
from dpot_train.data.prefetch import ThreadLoader
from dpot_train.data.stream import WindowStream

WORKER_KINDS = ("thread", "process")


def make_loader(stream: WindowStream, num_workers: int, pin_memory: bool = False, kind: str = "thread") -> Any:
    """Iterable of the stream's batches in step order; worker w of K builds the steps s with s % K == w.

    num_workers=0: built in this thread (a DataLoader without workers). kind="thread": K threads of this process
    (dpot_train.data.prefetch; the default: the reads and copies release the GIL and no batch crosses a process
    boundary). kind="process": K forked processes writing batches into a shared ring of slots
    (dpot_train.data.process_ring; where fork or memfd is missing, a DataLoader with K worker processes). All give
    the same batches. pin_memory: page-locked batches (CUDA only; ignored without CUDA).
    """
    if kind not in WORKER_KINDS:
        raise ValueError(f"unknown loader worker kind {kind!r}; expected one of {list(WORKER_KINDS)}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be 0 or more, got {num_workers}")
    if num_workers and kind == "thread":
        return ThreadLoader(stream, num_workers, pin_memory=pin_memory and torch.cuda.is_available())
    if num_workers and process_ring.supported():
        return process_ring.ProcessLoader(stream, num_workers, pin_memory=pin_memory and torch.cuda.is_available())
    return torch.utils.data.DataLoader(stream, batch_size=None, num_workers=num_workers, pin_memory=pin_memory,
                                       persistent_workers=False, prefetch_factor=2 if num_workers else None)
