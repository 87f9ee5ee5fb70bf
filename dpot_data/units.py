"""CF `units` of every numeric array of a Zarr dataset group, from dpot_format.units (the file's units where it
states them, the publisher's per source, "1" for what is dimensionless by construction, an explicit "unknown" where
nothing states one: no unit is guessed)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from dpot_format.units import DIMENSIONLESS, MIXED, UNKNOWN, channel_units, coordinate_units, fields_units, \
    parameter_units

__all__ = ["DIMENSIONLESS", "MIXED", "UNKNOWN", "array_units", "channel_units"]


def array_units(source: str, channels: Sequence[str], valid: Sequence[bool], dims: Sequence[str],
                params: Sequence[str] = (), parameters: Mapping[str, Any] | None = None) -> dict[str, object]:
    """`units` of every numeric array of a dataset group (by array name), and `channel_units` for `fields`;
    `parameters`: the entry's, where the reader recorded the units its file states (`ingest xarray`)."""
    per_channel = channel_units(source, channels, valid, parameters)
    coords = coordinate_units(source, dims, parameters)
    starts = {"time_start": coords["time"]} if "time_start" in params else {}  # each trajectory's start time
    return {"fields": fields_units(per_channel, valid), "channel_units": per_channel,
            "mask": DIMENSIONLESS, "channel_valid": DIMENSIONLESS, **coords, **parameter_units(source, params),
            **starts}
