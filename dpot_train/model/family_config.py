"""What every baseline family's config shares: reading one back from the dict stored with its weights."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

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
