"""What every baseline family's config shares: reading one back from the dict stored with its weights."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

from dpot_format.grid import grid_text

C = TypeVar("C")


def config_from_dict(cls: type[C], data: Mapping[str, Any], family: str) -> C:
    """`cls` (a frozen dataclass config) from its `to_dict()`; ValueError for another family or an unknown key, so a
    checkpoint of one family is never read as another's."""
    values = dict(data)
    found = values.pop("family", family)
    if found != family:
        raise ValueError(f"{cls.__name__}.from_dict: a {found!r} config, not {family!r}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; known keys: {sorted(known)}")
    return cls(**values)


# --- the grid a config records: one side (square 2D, cubic 3D: the reference's form) or one side per axis ----------

Grid = int | tuple[int, ...]


class GridError(ValueError):
    """A grid a model cannot take (a side not a multiple of its patch size); `nearest`: the closest grid it can."""

    def __init__(self, message: str, grid: tuple[int, ...], multiple: int) -> None:
        super().__init__(message)
        self.grid, self.multiple, self.nearest = tuple(grid), multiple, nearest_grid(grid, multiple)


def canonical_grid(value: Any, ndim: int) -> Any:
    """A config's grid field as stored: a sequence of `ndim` equal sides becomes that one side (so a square grid is
    the same config however it was given, and reads as the reference's int); another sequence a tuple; anything
    else as it is (the config's validation names what is wrong)."""
    if isinstance(value, (list, tuple)):
        value = tuple(value)
        if len(value) == ndim and len(set(value)) == 1 and _side(value[0]):
            return value[0]
    return value


def grid_sides(value: Grid, ndim: int) -> tuple[int, ...]:
    """The grid as one side per axis: an int is the side of a square (cubic) grid."""
    return tuple(value) if isinstance(value, tuple) else (value,) * ndim


def grid_problem(name: str, value: Any, ndim: int) -> str | None:
    """Why `value` is no grid of `ndim` axes (one positive integer, or `ndim` of them); None when it is one."""
    if _side(value) or (isinstance(value, tuple) and len(value) == ndim and all(_side(s) for s in value)):
        return None
    return f"{name} must be a positive integer or {ndim} of them (one per axis), got {value!r}"


def nearest_grid(grid: tuple[int, ...], multiple: int) -> tuple[int, ...]:
    """Each side rounded to the nearest multiple of `multiple` (at least one multiple; ties round up)."""
    return tuple(max(multiple, multiple * ((s + multiple // 2) // multiple)) for s in grid)


def multiple_problem(name: str, grid: tuple[int, ...], multiple: int, what: str) -> str | None:
    """A line naming the nearest valid grid when a side of `grid` is not a multiple of `multiple`; None when all are."""
    if all(s % multiple == 0 for s in grid):
        return None
    return (f"{name} {grid_text(grid)}: every side must be a multiple of {what} {multiple}; the nearest such grid is "
            f"{grid_text(nearest_grid(grid, multiple))}")


def _side(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
