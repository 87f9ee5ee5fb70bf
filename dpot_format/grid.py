"""Grid sizes as users give them: `dpot-data ingest --resolution` and `dpot-train --res` (and `open_dataset(res=...)`)
take one side N for every axis, or one side per axis in the order of the manifest's `grid.dims` (H,W = y,x in 2D;
D,H,W = z,y,x in 3D); 0 alone keeps the grid as it is."""

from __future__ import annotations

from typing import Sequence

Res = int | tuple[int, ...]  # 0: keep the grid; N: N on every axis; (sides): one per stored axis


def parse_grid(value: str | int | Sequence[int] | None, option: str, maximum: int | None = None) -> Res:
    """`value` ("128", "48,64", "16,24,32", an int or a sequence of ints) as 0, one side, or a tuple of 2 or 3 sides;
    ValueError in one line `<option> <value>: expected ...` otherwise."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise ValueError(f"{option} {value}: expected a grid side or sides, not true/false")
    text = value if isinstance(value, str) else ",".join(map(str, value)) if isinstance(value, (list, tuple)) \
        else str(value)
    parts = [p.strip() for p in text.split(",")]
    bound = f" from 1 to {maximum}" if maximum else " of at least 1"
    expected = (f"{option} {text}: expected one grid side N (0: the grid as it is) or one side per axis, H,W (D,H,W "
                f"for 3D), each a whole number{bound}")
    if not all(p.isascii() and p.isdigit() for p in parts) or len(parts) > 3:
        raise ValueError(expected)
    sides = tuple(int(p) for p in parts)
    if len(sides) == 1 and sides[0] == 0:
        return 0
    if any(s < 1 or (maximum is not None and s > maximum) for s in sides):
        raise ValueError(expected)
    return sides[0] if len(sides) == 1 else sides


def target_shape(shape: Sequence[int], res: Res | Sequence[int], option: str,
                 dims: Sequence[str] | None = None) -> tuple[int, ...]:
    """The grid `shape` (stored order) after `res`: itself for 0, N on every axis, or the sides given, one per axis;
    ValueError in one line when the sides do not match the grid's axes."""
    if isinstance(res, (list, tuple)):
        if len(res) != len(shape):
            names = f" ({', '.join(dims)})" if dims else ""
            raise ValueError(f"{option} {','.join(map(str, res))}: expected {len(shape)} sides{names} for "
                             f"{len(shape)}D data, or one side for every axis")
        return tuple(int(s) for s in res)
    return tuple(int(s) for s in shape) if not res else (int(res),) * len(shape)


def grid_text(grid: int | Sequence[int]) -> str:
    """A grid as messages write it: 48x64 (a single side: itself)."""
    return "x".join(str(int(s)) for s in grid) if isinstance(grid, (list, tuple)) else str(grid)


def cell_aspect(shape: Sequence[int], native: Sequence[int] | None) -> float:
    """imshow's `aspect` for a picture of the last two axes of a grid of `shape` resampled from `native` (rows,
    then columns): a cell's height over its width in native cells, so that the picture keeps the native grid's
    proportions (1.0, square cells, when the grid was not resampled or was resampled evenly, or `native` is None)."""
    if not native or len(native) < 2 or len(shape) < 2:
        return 1.0
    (rows, cols), (n_rows, n_cols) = shape[-2:], native[-2:]
    return (n_rows / rows) / (n_cols / cols)
