"""The reference pre-training mixtures (manifests/mixtures/dpot-pretrain-{ti,s,m,l}.yaml) and the ntrain cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dpot_data.catalog import load_catalog
from dpot_train.core.config import DataConfig
from dpot_train.data.mixture import parse_caps, parse_mixture
from dpot_train.data.prepare import prepare_stream

ROOT = Path(__file__).resolve().parents[1]
NTRAIN = [1000, 9800, 1000, 9000, 9000, 9000, 9000, 900, 900, 6500, 3100, 9000]
WEIGHTS = {"ti": [8, 2, 8, 1, 1, 1, 1, 20, 20, 1, 3, 1], "l": [8, 2, 8, 1, 1, 1, 1, 15, 20, 1, 3, 1],
           "s": [1] * 12, "m": [1] * 12}


@pytest.mark.parametrize("size", sorted(WEIGHTS))
def test_reference_mixture_shares_and_caps(size: str) -> None:
    path = ROOT / "manifests" / "mixtures" / f"dpot-pretrain-{size}.yaml"
    order = list(yaml.safe_load((ROOT / "manifests" / "mixtures" / "dpot-pretrain.yaml").read_text())["weights"])
    weights, caps = parse_mixture(str(path)), parse_caps(str(path))
    assert list(weights) == list(caps) == order  # the reference's dataset order, our manifest names
    assert [weights[n] for n in order] == [n * w for n, w in zip(NTRAIN, WEIGHTS[size])]
    assert [caps[n] for n in order] == NTRAIN
    catalog = {e.manifest_name for e in load_catalog().entries.values()}
    assert set(order) <= catalog
    if size == "ti":  # SWE and DR each hold 900 x 20 / 132400 of the draws
        assert weights["pdebench-swe"] / sum(weights.values()) == pytest.approx(18000 / 132400)


def test_max_trajectories_trains_on_the_first_n(fno_train_shards: Path, tmp_path: Path) -> None:
    mixture = tmp_path / "mix.yaml"
    mixture.write_text("weights: {fno-ns-v1e-3: 1}\nmax_trajectories: {fno-ns-v1e-3: 5}\n")
    full, _ = prepare_stream(DataConfig(manifests=[str(fno_train_shards)]), seed=0)
    capped, _ = prepare_stream(DataConfig(manifests=[str(fno_train_shards)], mixture=str(mixture)), seed=0)
    assert len(full.refs[0]) == 12 and capped.refs[0] == full.refs[0][:5]
    assert capped.epoch_length == 5
    mixture.write_text("weights: {fno-ns-v1e-3: 1}\nmax_trajectories: {fno-ns-v1e-3: 0}\n")
    with pytest.raises(ValueError, match="positive integers"):
        prepare_stream(DataConfig(manifests=[str(fno_train_shards)], mixture=str(mixture)), seed=0)
