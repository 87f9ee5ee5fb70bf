"""`dpot-train preview` / `dpot_train.preview.model_input`: exactly the windows the training stream hands the model,
in the manifest's model layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import zarr
from typer.testing import CliRunner

from dpot_train.cli import app
from dpot_train.core.config import DataConfig
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.stream import EpochPlans, make_sample
from dpot_train.preview import model_input


def test_preview_equals_the_training_windows(fno_train_shards: Path) -> None:
    entry = json.loads((fno_train_shards / "manifest.json").read_text())["datasets"][0]
    assert entry["convention"]["model_layout"] == "yx"  # FNO under the dpot-reference convention
    spec, reader = prepare_stream(DataConfig(manifests=[str(fno_train_shards)]), seed=0)
    stream = EpochPlans(spec)
    refs = spec.refs[0]
    for position in range(5):
        k, ref, _ = stream.lookup(position)
        sample = make_sample(spec, reader, k, ref, position)
        window = np.concatenate([sample["x"], sample["y"]], axis=2)
        expected = model_input(fno_train_shards, split="train", index=refs.index(ref), start=sample["t0"],
                               frames=window.shape[2])
        np.testing.assert_array_equal(window, expected)
    # "yx": the model's H is the stored y axis
    group = zarr.open_group(str(fno_train_shards / "data.zarr"), mode="r")[entry["name"]]
    rows = [i for i, s in enumerate(group["split"][:]) if str(s) == "test"]
    stored = np.asarray(group["fields"][rows[1]])  # (T, C, Y, X)
    np.testing.assert_array_equal(model_input(fno_train_shards, split="test", index=1, backend="zarr"),
                                  np.transpose(stored, (2, 3, 0, 1)))


def test_preview_cli_writes_the_array_and_refuses_bad_indices(fno_train_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.npy"
    result = CliRunner().invoke(app, ["preview", "--manifest", str(fno_train_shards), "--split", "test", "--index",
                                      "0", "--frames", "10", "--out", str(out)])
    assert result.exit_code == 0, result.output
    x = np.load(out, allow_pickle=False)
    assert x.shape == (32, 32, 10, 4) and x.dtype == np.float32
    np.testing.assert_array_equal(x, model_input(fno_train_shards, split="test", index=0, frames=10))
    assert (x[..., 1:] == 1.0).all()  # padded channels at the fill value
    bad = CliRunner().invoke(app, ["preview", "--manifest", str(fno_train_shards), "--index", "99", "--out",
                                   str(out)])
    assert bad.exit_code == 2 and "outside the 2 'test' trajectories" in bad.output
