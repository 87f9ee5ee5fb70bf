"""What a picture of the data says, the same way wherever it is drawn (`dpot-data inspect --plot`, the dataset card's
preview, `dpot-train evaluate --plot`): colour bars named with the quantity and its unit (`temperature [K]`), axes in
the file's coordinates and units (`x [m]`), titles with the frame's time (`t = 1.5 s`) where the file states times,
and colour ranges taken over fluid cells only, solid and NaN cells drawn in a colour of their own (SOLID_COLOUR)
outside the range. Proportions come from the coordinates (one metre as long across as up); without coordinates,
from the native grid's cells (`Plane.native`), so that a grid resampled at ingest or by `--res` keeps its native
aspect. Pure numpy, but for `draw_field`, which is handed the matplotlib axes to draw on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from dpot_format.grid import cell_aspect
from dpot_format.units import UNKNOWN, label, time_symbol

SOLID_COLOUR = "0.6"  # mid grey: in neither viridis nor RdBu_r, so a solid or NaN cell never reads as a value
SEQUENTIAL, DIVERGING = "viridis", "RdBu_r"
_MAX_ASPECT = 8.0  # coordinates stretched further than this (one axis in m, the other in km) are drawn square


def fluid_range(values: np.ndarray, fluid: np.ndarray | None = None) -> tuple[float, float]:
    """(min, max) of the finite values on fluid cells (`fluid` broadcasts against `values`; None: every cell); (0, 1)
    when there is none, and a flat field widened by 0.5 either way so that it still has a colour scale."""
    values = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(values)
    if fluid is not None:
        keep &= np.broadcast_to(np.asarray(fluid, dtype=bool), values.shape)
    shown = values[keep]
    if not shown.size:
        return 0.0, 1.0
    lo, hi = float(shown.min()), float(shown.max())
    return (lo - 0.5, hi + 0.5) if lo == hi else (lo, hi)


def colour_scale(lo: float, hi: float) -> tuple[float, float, str]:
    """(vmin, vmax, colour map) of a value range: a signed one on a diverging map centred on zero, else the range
    itself on a sequential map."""
    if lo < 0 < hi:
        top = max(-lo, hi)
        return -top, top, DIVERGING
    return lo, hi, SEQUENTIAL


def error_scale(error: np.ndarray, fluid: np.ndarray | None = None) -> tuple[float, float, str]:
    """A symmetric diverging scale of a prediction error: +-max |error| over fluid cells (+-1 when it is 0)."""
    lo, hi = fluid_range(error, fluid)
    top = max(abs(lo), abs(hi)) if np.isfinite([lo, hi]).all() else 1.0
    return -(top or 1.0), top or 1.0, DIVERGING


def stated_times(times: Sequence[float] | np.ndarray | None, dt: float | None) -> np.ndarray | None:
    """The frame times a picture may show: None when there are none, or when they are only the frame indices an
    output stores where its source states no times (docs/format.md, "Times": dt is then null)."""
    if times is None:
        return None
    times = np.asarray(times, dtype=np.float64)
    if dt is None and np.array_equal(times, np.arange(len(times))):
        return None
    return times


def time_title(index: int, times: np.ndarray | None, unit: str | None) -> str:
    """How a picture names frame `index`: `t = 1.5 s` (the time and its unit; `t = 1.5` when the unit is unknown),
    `frame 3` where the source states no times."""
    if times is None:
        return f"frame {index}"
    symbol = time_symbol(unit)
    return f"t = {float(times[index]):.4g}" + (f" {symbol}" if symbol else "")


@dataclass(frozen=True)
class Plane:
    """The two axes of a picture: the stored spatial axes drawn across (x, the last) and up (y, the one before it),
    their names, cell-centre coordinates (None where the output stores none: cell indices are shown) and units."""

    names: tuple[str, str]  # (across, up), e.g. ("x", "y")
    coords: tuple[np.ndarray | None, np.ndarray | None]
    units: tuple[str, str]
    native: tuple[int, int] | None = None  # (rows, columns) of the grid the data was resampled from (None: as drawn)

    def labels(self) -> tuple[str, str]:
        """The axis labels, `x [m]` and `y [m]`; `x [cell]` where there are no coordinates."""
        return tuple(label(n, u if c is not None else "cell")  # type: ignore[return-value]
                     for n, c, u in zip(self.names, self.coords, self.units))

    def extent(self, shape: tuple[int, int]) -> tuple[float, float, float, float]:
        """imshow's extent (left, right, bottom, top) of a (rows, columns) plane: the outer cell edges."""
        across = _edges(self.coords[0], shape[1])
        up = _edges(self.coords[1], shape[0])
        return across[0], across[1], up[0], up[1]

    def aspect(self, shape: tuple[int, int]) -> str | float:
        """"equal" (one metre is as long across as up) unless that would stretch the picture past _MAX_ASPECT. Drawn
        in cell indices (no coordinates), a cell is as tall as wide in the native grid's cells (`native`), so a grid
        resampled at ingest or by `--res` (48x64 to 128x128) keeps its native proportions."""
        if self.coords[0] is None and self.coords[1] is None:
            cell = cell_aspect(shape, self.native)
            drawn = cell * shape[0] / shape[1]
            return cell if 1 / _MAX_ASPECT <= drawn <= _MAX_ASPECT else "auto"
        left, right, bottom, top = self.extent(shape)
        width, height = abs(right - left), abs(top - bottom)
        ratio = height / width if width > 0 else np.inf
        if self.units[0] != self.units[1] and all(c is not None for c in self.coords):
            return "auto"  # axes in different units (degrees and metres): no common length
        return "equal" if 1 / _MAX_ASPECT <= ratio <= _MAX_ASPECT else "auto"


def _edges(centres: np.ndarray | None, n: int) -> tuple[float, float]:
    """The outer edges of n cells with these centres (evenly spaced cells assumed at the ends); (-0.5, n - 0.5), the
    cell indices' edges, when there are no coordinates or they do not match the n cells."""
    if centres is None or len(centres) != n or not np.isfinite(centres).all():
        return -0.5, n - 0.5
    c = np.asarray(centres, dtype=np.float64)
    if n == 1:
        return float(c[0]) - 0.5, float(c[0]) + 0.5
    return float(c[0] - (c[1] - c[0]) / 2), float(c[-1] + (c[-1] - c[-2]) / 2)


def regrid(centres: np.ndarray | None, n: int) -> np.ndarray | None:
    """Cell centres of n cells spanning the same extent as `centres` (a trajectory resized to another grid)."""
    if centres is None or len(centres) == n:
        return centres
    lo, hi = _edges(np.asarray(centres, dtype=np.float64), len(centres))
    return lo + (np.arange(n) + 0.5) * (hi - lo) / n


def plane_of(dims: Sequence[str], coords: Mapping[str, np.ndarray | None], units: Mapping[str, str],
             shape: tuple[int, int] | None = None, native: Sequence[int] | None = None) -> Plane:
    """The Plane of the last two of the stored spatial `dims` (e.g. ["y", "x"] or ["z", "y", "x"]); `shape`, the
    (rows, columns) drawn, regrids coordinates stored for another grid; `native`, the grid before any resampling
    (the manifest's `native_shape`, stored order), gives the cells' proportions where there are no coordinates."""
    up, across = (list(dims)[-2:] if len(dims) >= 2 else ["y", "x"])
    pick = [coords.get(across), coords.get(up)]
    if shape is not None:
        pick = [regrid(pick[0], shape[1]), regrid(pick[1], shape[0])]
    rows_cols = (int(native[-2]), int(native[-1])) if native is not None and len(native) >= 2 else None
    return Plane((across, up), (pick[0], pick[1]), (units.get(across, UNKNOWN), units.get(up, UNKNOWN)), rows_cols)


def draw_field(ax: Any, data: np.ndarray, fluid: np.ndarray, plane: Plane, vmin: float, vmax: float,
               cmap: str) -> Any:
    """Draw one 2D field on `ax` in its coordinates: solid (and NaN) cells in SOLID_COLOUR, outside the colour
    scale, and outlined in black; axis labels with units. Returns the image (for a colour bar)."""
    import matplotlib

    fluid = np.asarray(fluid, dtype=bool)
    shown = np.ma.masked_where(~fluid | ~np.isfinite(data), data)
    extent = plane.extent(data.shape)
    colours = matplotlib.colormaps[cmap].with_extremes(bad=SOLID_COLOUR)
    image = ax.imshow(shown, origin="lower", cmap=colours, vmin=vmin, vmax=vmax, interpolation="nearest",
                      extent=extent, aspect=plane.aspect(data.shape))
    if not fluid.all():
        ax.contour(fluid.astype(float), levels=[0.5], colors="k", linewidths=0.8, origin="lower", extent=extent)
    across, up = plane.labels()
    ax.set_xlabel(across, fontsize=7)
    ax.set_ylabel(up, fontsize=7)
    ax.tick_params(labelsize=6)
    return image


@dataclass(frozen=True)
class DataAxes:
    """What the pictures of one dataset need besides its values: the stated frame times (None: frame indices),
    the spatial coordinates the output stores (by dim name) and the units of channels, time and coordinates."""

    times: np.ndarray | None
    coords: dict[str, np.ndarray]
    units: dict[str, Any]  # entry_units: "channels" (one per stored channel), "time", each spatial dim
    native: tuple[int, ...] | None = None  # the manifest's grid.native_shape (stored order)

    def title(self, index: int) -> str:
        """How a picture names stored frame `index` (`time_title`)."""
        return time_title(index, self.times, self.units.get("time"))

    def channel_label(self, channels: Sequence[str], c: int) -> str:
        """`temperature [K]`: stored channel c with its unit."""
        return label(str(channels[c]), self.units["channels"][c])

    def plane(self, dims: Sequence[str], shape: tuple[int, int] | None = None) -> Plane:
        """The Plane of the last two spatial dims (plane_of)."""
        return plane_of(dims, self.coords, self.units, shape, self.native)


def data_axes(entry: Mapping[str, Any], group: Any | None = None) -> DataAxes:
    """The DataAxes of a manifest entry: times and coordinates from its Zarr `group` (an opened group, or None for a
    shards-only output: then times are frame x dt where dt is known), units from the entry (dpot_format.units)."""
    from dpot_format.units import entry_units

    dims = [str(d) for d in (entry.get("grid") or {}).get("dims", [])]
    coords = {d: np.asarray(group[d][:], dtype=np.float64) for d in dims if group is not None and d in group}
    dt, frames = entry.get("dt"), int(entry.get("frames", 0))
    if group is not None and "time" in group:
        times = np.asarray(group["time"][:], dtype=np.float64)
    else:
        times = np.arange(frames) * float(dt) if dt is not None else None
    native = (entry.get("grid") or {}).get("native_shape")
    return DataAxes(stated_times(times, dt), coords, entry_units(entry),
                    tuple(int(s) for s in native) if native else None)
