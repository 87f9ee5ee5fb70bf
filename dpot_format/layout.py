"""The model's axis order, one rule for fields and masks, 2D and 3D (docs/conventions.md, `model_layout`).

A stored trajectory is (T, C, Y, X) or (T, C, Z, Y, X) and its mask (Y, X) or (Z, Y, X) whatever the convention; the
manifest's `convention.model_layout` says how the model sees them: 2D "xy" as (X, Y), 2D "yx" as (Y, X), and 3D
always as (X, Y, Z) (a 3D "yx", written by older ingests of own data and The Well, means the same).
"""

from __future__ import annotations

MODEL_LAYOUTS = ("xy", "yx")


def space_order(space_ndim: int, model_layout: str) -> tuple[int, ...]:
    """The stored space axes ((Y, X) or (Z, Y, X), numbered from 0) in the order the model reads them: 2D "xy"
    (1, 0) = (X, Y); 2D "yx" (0, 1) = (Y, X); 3D (2, 1, 0) = (X, Y, Z). ValueError for another layout."""
    if model_layout not in MODEL_LAYOUTS:
        raise ValueError(f"model_layout {model_layout!r}: expected one of {MODEL_LAYOUTS}")
    if space_ndim == 2 and model_layout == "yx":
        return (0, 1)
    return tuple(range(space_ndim - 1, -1, -1))


def own_data_layout(space_ndim: int) -> str:
    """The model_layout recorded for data no reference orientation exists for (`ingest xarray`, `ingest
    the-well`): 2D "yx" (the model's H, W are the stored y, x: no axis swap before a resize), 3D "xy"."""
    return "yx" if space_ndim == 2 else "xy"
