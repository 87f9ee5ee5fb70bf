"""CF `units` of what an output holds (docs/format.md, "Opening the store with xarray"), read from a manifest entry:
the units the raw file states (`ingest xarray` records each variable's and dimension's attributes in `parameters`),
else those the publisher states for a source, "1" for what is dimensionless by construction (padding, masks,
coordinates given as fractions of the domain), and an explicit "unknown" where nothing states one, so that no unit is
guessed. The writer (dpot_data: Zarr attributes, dataset card, pictures) and the reader (dpot_train: eval.json,
pictures) read units through this one module."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dpot_format.text import bound

UNKNOWN = "unknown"
DIMENSIONLESS = "1"
MIXED = "see channel_units"  # `fields` units when its channels differ

# CFDBench (github.com/luo-yining/CFDBench, src/dataset/tube.py and cylinder.py, the case tables): inlet velocities
# in m/s, density in kg/m^3, dynamic viscosity in Pa s, lengths in m. Its `mask` channel (the reference's geometry
# channel) is a 0..1 fraction.
_CHANNELS = {"cfdbench": {"u": "m/s", "v": "m/s", "mask": DIMENSIONLESS}}
_PARAMETERS = {"cfdbench": {"velocity": "m/s", "density": "kg m-3", "viscosity": "Pa s", "domain_width": "m",
                            "domain_height": "m"}}
_ANY_PARAMETERS = {"seed": DIMENSIONLESS}  # PDEBench's per-sample generator seed: a number, not a quantity
# coordinates the reader builds itself: CFDBench x and y are the cell centres of the unit square
_COORDINATES = {"cfdbench": {"x": DIMENSIONLESS, "y": DIMENSIONLESS}}


def stated(parameters: Mapping[str, Any] | None, kind: str, name: str) -> str | None:
    """The units a raw file states for variable `name` (kind "variables") or dimension `name` (kind "dims", "time"
    included), as the reader recorded them in the entry's `parameters`; None when it states none."""
    block = (parameters or {}).get(kind)
    item = block.get(name) if isinstance(block, Mapping) else None
    unit = item.get("units") if isinstance(item, Mapping) else None
    return str(unit).strip() if isinstance(unit, str) and unit.strip() else None


def channel_units(source: str, channels: Sequence[str], valid: Sequence[bool],
                  parameters: Mapping[str, Any] | None = None) -> list[str]:
    """Units of each stored channel: the file's, else the source's where it states them, "1" for padded channels."""
    known = _CHANNELS.get(source, {})
    return [(stated(parameters, "variables", str(c)) or known.get(str(c), UNKNOWN)) if ok else DIMENSIONLESS
            for c, ok in zip(channels, valid)]


def coordinate_units(source: str, dims: Sequence[str], parameters: Mapping[str, Any] | None = None
                     ) -> dict[str, str]:
    """Units of `time` and of each spatial coordinate (by canonical name: z, y, x): the file's, else the source's."""
    known = _COORDINATES.get(source, {})
    return {d: stated(parameters, "dims", d) or known.get(d, UNKNOWN) for d in ("time", *dims)}


def parameter_units(source: str, params: Sequence[str]) -> dict[str, str]:
    """Units of the per-trajectory parameters (`sample_params`) a source states."""
    table = _PARAMETERS.get(source, _ANY_PARAMETERS)
    return {p: table.get(p, _ANY_PARAMETERS.get(p, UNKNOWN)) for p in params}


def fields_units(per_channel: Sequence[str], valid: Sequence[bool]) -> str:
    """The one `units` of the `fields` array: its data channels' unit when they agree, else MIXED."""
    data = {u for u, ok in zip(per_channel, valid) if ok}
    return data.pop() if len(data) == 1 else MIXED


def entry_units(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The units of a manifest entry's data: {"channels": one per stored channel, "time": ..., and each spatial dim}."""
    source, parameters = str(entry.get("source", "")), entry.get("parameters") or {}
    dims = [str(d) for d in (entry.get("grid") or {}).get("dims", [])]
    channels = [str(c) for c in entry.get("channels", [])]
    valid = [bool(v) for v in entry.get("channel_valid", [True] * len(channels))]
    return {"channels": channel_units(source, channels, valid, parameters),
            **coordinate_units(source, dims, parameters)}


def label(name: str, unit: str | None) -> str:
    """`name [unit]` (e.g. `temperature [K]`, `x [m]`), as a colour bar, an axis or a table names a quantity; each
    part one line of at most NAME_LIMIT characters (a file's attribute can be a megabyte: matplotlib would draw it
    for minutes)."""
    return f"{bound(name)} [{bound(unit or UNKNOWN)}]"


def stated_label(name: str, unit: str | None) -> str:
    """`name [unit]` where a unit is stated, the bare name where it is unknown (prose that lists units elsewhere)."""
    return bound(name) if not unit or unit == UNKNOWN else label(name, unit)


_TIME_SYMBOLS = {"second": "s", "seconds": "s", "sec": "s", "secs": "s", "s": "s", "minute": "min", "minutes": "min",
                 "min": "min", "hour": "h", "hours": "h", "hr": "h", "h": "h", "day": "d", "days": "d", "d": "d"}


def time_symbol(unit: str | None) -> str | None:
    """A time unit as a picture writes it after a value: CF "seconds since 2000-01-01" -> "s", "hours" -> "h",
    another unit as given; None when unknown."""
    if not unit or unit == UNKNOWN:
        return None
    head = unit.split(" since ", 1)[0].strip()
    return _TIME_SYMBOLS.get(head.lower(), bound(head))
