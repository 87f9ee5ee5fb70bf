"""`dpot_data.ingest.plan`: everything about an output is decided before any byte is written, and checkable."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dpot_data.errors import InputError
from dpot_data.ingest import IngestOptions, read_source
from dpot_data.ingest.plan import plan
from dpot_data.synth.cfdbench import write_cfdbench
from dpot_data.synth.fno import synth_fno


@pytest.fixture(scope="module")
def fno(tmp_path_factory) -> Path:
    return synth_fno(tmp_path_factory.mktemp("fno"), n=5, frames=6, resolution=16, seed=2)[0]


def test_plan_of_an_fno_file_writes_nothing(fno: Path, tmp_path: Path) -> None:
    before = sorted(os.listdir(tmp_path))
    opts = IngestOptions(convention="canonical", resolution=32, split=(0.6, 0.2), seed=1, channels=5, block=2)
    p = plan(read_source("fno", [fno], opts), opts)
    assert sorted(os.listdir(tmp_path)) == before
    assert (p.grid.native, p.grid.target, p.grid.method, p.grid.mask_method) == ((16, 16), (32, 32), "fourier",
                                                                               "nearest")
    assert p.frames == 7 and p.channels == ["vorticity", "pad1", "pad2", "pad3", "pad4"]  # canonical: a, then u(t)
    assert p.channel_valid.tolist() == [True, False, False, False, False]
    assert [x.split for x in p.pieces].count("train") == 3 and p.count("valid") == 1 and p.count("test") == 1
    assert p.blocks == [(0, 2), (2, 4), (4, 5)] and p.rows_per_block() == [2, 4, 5]
    np.testing.assert_allclose(p.coords["x"], (np.arange(32) + 0.0) / 32)  # periodic point grid on [0, 1)
    e = p.entry
    assert e["trajectories"] == 5 and e["grid"] == {"dims": ["y", "x"], "shape": [32, 32], "native_shape": [16, 16]}
    assert e["splits"]["counts"] == {"train": 3, "valid": 1, "test": 1}
    assert e["convention"] == {"name": "canonical", "model_layout": "xy", "deviations": {}}
    assert e["shards"] == [] and e["zarr"] is None and e["stats"] is None  # the run fills these


def test_reference_convention_deviations_are_planned(fno: Path) -> None:
    opts = IngestOptions(resolution=32, resample="bicubic", fill=0.0, split=(0.5,))
    p = plan(read_source("fno", [fno], opts), opts)
    assert p.entry["convention"]["deviations"] == {
        "split": "seeded 0.5 (seed 0) instead of the reference rule", "resample": "bicubic", "fill": 0.0}
    assert not any("the split leaves no test trajectory" in w for w in p.warnings)
    assert any("multiplies the data 4x" in w for w in p.warnings)


def test_pieces_of_variable_length_trajectories(tmp_path: Path) -> None:
    write_cfdbench(tmp_path / "cfd", problems=("cavity",), cases=3, frames=(21, 45), res=16, seed=1)
    opts = IngestOptions(convention="canonical", resolution=0, segment=10)
    result = read_source("cfdbench", [tmp_path / "cfd"], opts)
    p = plan(result, opts)
    lengths = dict(zip([str(s) for s in result.data["sample"].values], result.lengths))
    for sid, n in lengths.items():
        assert [x.start for x in p.pieces if x.id.startswith(sid + "/")] == list(range(0, int(n) // 10 * 10, 10))
    assert p.frames == 10 and all(x.id.rsplit("/", 1)[1].startswith("seg") for x in p.pieces)


@pytest.mark.parametrize("options, option", [
    (dict(segment=99), "--segment"), (dict(channels=0), "--channels"), (dict(formats=("tar",)), "--format"),
    (dict(name="Bad Name"), "--name"), (dict(shard_size=0), "--shard-size"), (dict(resample="spline"), "--resample"),
    (dict(mask_resample="cubic"), "--mask-resample"), (dict(convention="mine"), "--convention"),
])
def test_bad_options_are_refused_by_the_plan(fno: Path, options: dict, option: str) -> None:
    opts = IngestOptions(**{"resolution": 32, **options})
    with pytest.raises(InputError) as info:
        plan(read_source("fno", [fno], IngestOptions()), opts)
    assert info.value.path == option
