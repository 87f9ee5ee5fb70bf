"""torch.distributed setup from the torchrun environment: NCCL on GPUs, gloo on CPU, and a single-process fallback."""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """This process's place in the job."""

    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, logs and eval.json."""
        return self.rank == 0


def pick_device(preference: str, local_rank: int) -> torch.device:
    """'auto' picks CUDA when available; 'cuda' requires it."""
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but no CUDA device is available")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_distributed(device_preference: str = "auto") -> DistInfo:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK); plain single process otherwise."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = pick_device(device_preference, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank, world, local_rank, device)


def barrier() -> None:
    """No-op without a process group."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def all_gather_object(obj: Any) -> list[Any]:
    """Objects of every rank (a one-element list without a process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def mean_across_ranks(t: torch.Tensor) -> torch.Tensor:
    """Average a tensor over ranks (identity without a process group)."""
    if dist.is_available() and dist.is_initialized():
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    return t


class CollectiveError(RuntimeError):
    """A failure every rank raises together, from a decision they share (a non-finite loss): rank 0 reports it in one
    line, the other ranks stay quiet."""


# what gloo's and NCCL's transports say when a peer process is gone (it failed, and says why itself)
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing", "Broken pipe",
              "NCCL communicator was aborted")


def peer_failed(exc: BaseException) -> bool:
    """Whether `exc` is a collective of this process that failed because another process of the job is gone (its own
    error is the one to show): a distributed network error, or a transport message saying the peer closed."""
    network = tuple(t for t in (getattr(dist, "DistNetworkError", None),) if t is not None)
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, network) or any(words in str(seen) for words in _PEER_GONE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def shutdown() -> None:
    """Destroy the process group if one exists, after freeing what still holds it.

    A DistributedDataParallel wrapper sits in reference cycles, so it outlives its last name until the cyclic garbage
    collector runs, and its reducer holds the process group. Left to a collection during the interpreter's
    finalization, that teardown (gloo's threads, tensors with Python references) aborted a process now and then
    (SIGABRT after a run that had ended well); collected here, the group is destroyed while everything is alive."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
