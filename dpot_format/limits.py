"""Sane bounds on what a manifest or shard may declare, so that a hostile or broken file is refused in one line
before anything is allocated or read from it."""

from __future__ import annotations

from dataclasses import dataclass

from dpot_format.errors import FormatError


@dataclass(frozen=True)
class Limits:
    """Upper bounds a reader enforces (inclusive); the defaults are far above every published dataset."""

    max_grid_side: int = 8192  # cells along one axis
    max_grid_cells: int = 1 << 28  # cells of one frame (8192^2 in 2D, 645^3 in 3D)
    max_channels: int = 256
    max_frames: int = 100_000  # frames per stored trajectory
    max_trajectories: int = 10_000_000  # per dataset: keys have 7 digits
    max_sample_bytes: int = 64 << 30  # fields.npy of one trajectory (frames * channels * cells * 4)
    max_manifest_bytes: int = 64 << 20
    max_meta_bytes: int = 1 << 20  # one meta.json member
    max_members_per_shard: int = 300_000
    max_npy_header_bytes: int = 1 << 16


LIMITS = Limits()


def check_limit(where: str, what: str, value: int, limit: int) -> None:
    """Refuse `value` above `limit` with one line naming where it came from (FormatError)."""
    if value > limit:
        raise FormatError(where, f"{what} {value} is more than the limit of {limit}")


def limit_error(where: str, what: str, value: int, limit: int) -> str | None:
    """The one-line refusal `check_limit` would raise, or None when `value` is within `limit`."""
    try:
        check_limit(where, what, value, limit)
    except FormatError as exc:
        return str(exc)
    return None
