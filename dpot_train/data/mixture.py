"""Dataset mixture weights and the balanced per-epoch visit counts derived from them.

DPOT samples dataset k with probability proportional to its weight w_k, independent of its size. An epoch here
is a fixed list of trajectory visits: dataset k contributes ``n_k = max(1, round(N * w_k / sum(w)))`` visits,
with N the total number of trajectories of all weighted datasets, so an epoch is about as long as one pass over
the data and dataset k fills a share w_k / sum(w) of it. When ``n_k == |D_k|`` (one dataset, or weights
proportional to the sizes) every trajectory is visited exactly once per epoch; otherwise each trajectory of
dataset k is visited ``n_k // |D_k|`` or that plus one times (see stream.epoch_plan).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping


from dpot_train.data.datasets import DataError

MAX_WEIGHT = 1e9  # weights are relative: a larger one only overflows the visit counts (N * w / sum w)


def parse_mixture(spec: str | Mapping[str, float] | None) -> dict[str, float] | None:
    """Read weights from a YAML file (mapping name -> weight, or {weights: mapping}), an inline "a=1,b=2", or a dict."""
    if spec is None:
        return None
    if isinstance(spec, Mapping):
        raw: object = dict(spec)
        where = "data.mixture"
    elif Path(spec).is_file() or packaged_mixture(str(spec)) is not None:
        where = str(spec)
        raw = _read(spec if Path(spec).is_file() else packaged_mixture(str(spec)))
        if isinstance(raw, dict) and isinstance(raw.get("weights"), dict):
            raw = raw["weights"]
    elif re.fullmatch(r"\s*[a-z0-9_-]+\s*=\s*[^,=]+(\s*,\s*[a-z0-9_-]+\s*=\s*[^,=]+)*\s*", str(spec)):
        where = "--mixture"
        raw = {k.strip(): v.strip() for k, v in (item.split("=") for item in str(spec).split(","))}
    else:
        raise DataError(f"mixture {spec!r}: not a file, and not of the inline form name=weight[,name=weight...]")
    if not isinstance(raw, dict) or not raw:
        raise DataError(f"{where}: a mixture must be a non-empty mapping dataset name -> weight")
    out: dict[str, float] = {}
    for k, v in raw.items():
        try:
            w = float(v)
        except (TypeError, ValueError):
            raise DataError(f"{where}: weight of {k!r} must be a number, got {v!r}") from None
        if not 0 <= w <= MAX_WEIGHT:
            raise DataError(f"{where}: weight of {k!r} must be a number from 0 to {MAX_WEIGHT:.0e} (weights are "
                            f"relative shares), got {v!r}")
        out[str(k)] = w
    return out


def packaged_mixture(name: str) -> Path | None:
    """A mixture shipped with the package by name (`dpot-pretrain-ti`), so installed copies find them too."""
    if not re.fullmatch(r"[a-z0-9_-]+", name):
        return None
    from importlib.util import find_spec

    # located, not imported: the mixtures are data files shipped in the dpot_data distribution
    spec = find_spec("dpot_data")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / "manifests" / "mixtures" / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def _read(path: str | Path) -> object:
    from dpot_train.core.config import read_yaml

    try:
        return read_yaml(path)
    except ValueError as exc:
        raise DataError(str(exc)) from None


def parse_caps(spec: str | Mapping[str, float] | None) -> dict[str, int]:
    """A mixture file's optional `max_trajectories` (dataset -> n): train on the first n training trajectories of
    that dataset in stored order (the reference pre-training set takes the first `ntrain` of each)."""
    if not isinstance(spec, (str, Path)):
        return {}
    path = Path(spec) if Path(spec).is_file() else packaged_mixture(str(spec))
    if path is None:
        return {}
    raw = _read(path)
    caps = raw.get("max_trajectories") if isinstance(raw, dict) else None
    if caps is None:
        return {}
    if not isinstance(caps, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                             for v in caps.values()):
        raise DataError(f"{spec}: max_trajectories must map dataset names to positive integers")
    return {str(k): int(v) for k, v in caps.items()}


def resolve_weights(names: list[str], mixture: Mapping[str, float] | None,
                    partial: bool = False) -> dict[str, float]:
    """Weight per dataset name; every mixture name must be a loaded dataset unless `partial` (then the present ones
    keep their weights, which are relative: the shares renormalise over them). Unlisted datasets get weight 0."""
    if mixture is None:
        return {n: 1.0 for n in names}
    unknown = sorted(set(mixture) - set(names))
    if unknown and not partial:
        import difflib

        close = {u: difflib.get_close_matches(u, names, n=1) for u in unknown}
        hints = "".join(f" ({u!r}: did you mean {c[0]!r}?)" for u, c in close.items() if c)
        raise DataError(f"the mixture names {len(unknown)} dataset(s) absent from the given manifests: {unknown}"
                        f"{hints}; the manifests hold: {sorted(names)}. Fix the names, add their manifests, or pass "
                        "--mixture-partial to train on the present ones with their shares renormalised")
    weights = {n: float(mixture.get(n, 0.0)) for n in names}
    if sum(weights.values()) <= 0:
        raise DataError(f"mixture gives no dataset a positive weight: {weights}")
    return weights


def visit_counts(sizes: Mapping[str, int], weights: Mapping[str, float]) -> dict[str, int]:
    """Visits per dataset in one epoch: n_k = max(1, round(N * w_k / sum w)) for w_k > 0, else 0."""
    active = {k: sizes[k] for k in sizes if weights.get(k, 0.0) > 0}
    total_w = sum(weights[k] for k in active)
    n = sum(active.values())
    return {k: (max(1, round(n * weights[k] / total_w)) if k in active else 0) for k in sizes}
