"""CF `units` of what a Zarr store holds, per source: the units the publisher states, "1" for what is dimensionless
by construction (padding, masks, coordinates given as fractions of the domain), and an explicit "unknown" where the
source states none (the simulations are non-dimensional, but no publisher says so), so that no unit is guessed."""

from __future__ import annotations

from typing import Sequence

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


def channel_units(source: str, channels: Sequence[str], valid: Sequence[bool]) -> list[str]:
    """Units of each stored channel: the source's where it states them, "1" for padded channels (a constant)."""
    known = _CHANNELS.get(source, {})
    return [known.get(str(c), UNKNOWN) if ok else DIMENSIONLESS for c, ok in zip(channels, valid)]


def array_units(source: str, channels: Sequence[str], valid: Sequence[bool], dims: Sequence[str],
                params: Sequence[str] = ()) -> dict[str, object]:
    """`units` of every numeric array of a dataset group (by array name), and `channel_units` for `fields`."""
    per_channel = channel_units(source, channels, valid)
    data = {u for u, ok in zip(per_channel, valid) if ok}
    coords = _COORDINATES.get(source, {})
    out: dict[str, object] = {
        "fields": data.pop() if len(data) == 1 else MIXED, "channel_units": per_channel,
        "mask": DIMENSIONLESS, "channel_valid": DIMENSIONLESS, "time": coords.get("time", UNKNOWN),
        **{d: coords.get(d, UNKNOWN) for d in dims},
        **{p: _PARAMETERS.get(source, _ANY_PARAMETERS).get(p, _ANY_PARAMETERS.get(p, UNKNOWN)) for p in params},
    }
    return out
