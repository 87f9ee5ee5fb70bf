"""The mask-aware resampling rule (docs/format.md, "Resampling with solid cells"), one function for every place a
grid is resized: ingest (`dpot_data.transform`) and `dpot-train --res` (training windows, evaluation, `preview`).

A trajectory with solid cells (mask 0) is resampled so that every target cell is made only from source cells of its
own kind: a fluid value from fluid values, a solid value from solid values, each within the range those source
values span (per channel and frame). Trajectories without a solid cell are left to the plain resize of each site,
so their values do not change at all. torch is imported inside the functions: dpot_format stays light to import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

MASK_METHODS = ("nearest", "area-threshold")

# the paper's sources: under the dpot-reference convention their resize stays the reference's plain one (CFDBench's
# obstacle cells included), so that the released checkpoints' inputs are reproduced element for element
REFERENCE_SOURCES = frozenset({"fno", "pdebench", "pdearena", "cfdbench"})


def keeps_reference_resize(source: str | None, convention: str | None) -> bool:
    """True where a dataset keeps the reference's plain resize (one of the paper's sources under `dpot-reference`);
    every other dataset with solid cells is resampled by `fluid_resample`."""
    return convention == "dpot-reference" and source in REFERENCE_SOURCES


def nearest_index(n: int, m: int) -> np.ndarray:
    """Source index of each of m target cells (cell-centre nearest neighbour, like align_corners=False)."""
    return np.minimum(((np.arange(m) + 0.5) * n / m).astype(np.int64), n - 1)


def mask_candidates(fluid: "torch.Tensor", shape: Sequence[int], method: str = "nearest") -> "torch.Tensor":
    """(B, *S) bool fluid -> (B, *shape) bool: the cells the mask method calls fluid. `nearest`: the source cell
    under the target cell's centre is fluid; `area-threshold`: at least half of the target cell's area is fluid."""
    import torch
    import torch.nn.functional as F

    shape = tuple(int(s) for s in shape)
    nd = len(shape)
    src = tuple(fluid.shape[1:])

    def refine(t: torch.Tensor, to: tuple[int, ...]) -> torch.Tensor:
        for i, (n, m) in enumerate(zip(src, to)):
            if n != m:
                t = t.index_select(1 + i, torch.from_numpy(nearest_index(n, m)).to(t.device))
        return t

    if method == "nearest":
        return refine(fluid.bool(), shape)
    if method == "area-threshold":
        up = tuple(max(a, b) for a, b in zip(src, shape))
        t = refine(fluid.bool(), up).float()[:, None]  # every target cell covers at least one source cell
        pool = F.adaptive_avg_pool2d if nd == 2 else F.adaptive_avg_pool3d
        return pool(t, shape)[:, 0] >= 0.5 - 1e-6
    raise ValueError(f"unknown mask resample method {method!r}: expected one of {MASK_METHODS}")


def fluid_resample(fields: "torch.Tensor", mask: "torch.Tensor", shape: Sequence[int],
                   kernel: Callable[["torch.Tensor"], "torch.Tensor"], mask_method: str = "nearest"
                   ) -> tuple["torch.Tensor", "torch.Tensor"]:
    """The rule for trajectories with solid cells: fields (B, K, *S) (K: frames x channels), mask (B, *S) (nonzero:
    fluid) -> fields (B, K, *shape) and mask (B, *shape) bool, where `kernel` is a linear resize (B, K, *S) ->
    (B, K, *shape) with non-negative weights (bilinear/trilinear, antialiased or not).

    A target cell is fluid when it has a fluid source (a source cell of positive weight) and either all its sources
    are fluid or `mask_method` calls it fluid; else solid. Each cell takes the weighted mean of its sources of its
    own kind, kernel(f * kind) / kernel(kind), clamped to the range of those cells' values in the frame: no fluid
    value outside the source's fluid range (a channel constant on fluid stays exactly constant), and solid cells
    stored as 0 stay 0 (padded channels keep their fill)."""
    import torch

    shape = tuple(int(s) for s in shape)
    f = fields.float()
    fluid = mask.bool()
    if tuple(fluid.shape[1:]) == shape:
        return fields, fluid
    space = tuple(range(2, 2 + len(shape)))
    kinds = (fluid[:, None], ~fluid[:, None])
    weights = [kernel(k.to(f.dtype)) for k in kinds]  # (B, 1, *shape): each kind's share of a target cell
    new_fluid = (weights[0] > 0) & ((weights[1] <= 0) | mask_candidates(fluid, shape, mask_method)[:, None])
    values = []
    for kind, w in zip(kinds, weights):
        lo = torch.where(kind, f, torch.inf).amin(dim=space, keepdim=True)
        hi = torch.where(kind, f, -torch.inf).amax(dim=space, keepdim=True)
        mean = kernel(torch.where(kind, f, 0.0)) / w.clamp_min(torch.finfo(f.dtype).tiny)
        values.append(torch.clamp(mean, lo, hi))  # a kind absent from a sample: never selected below
    return torch.where(new_fluid, *values).to(fields.dtype), new_fluid[:, 0]
