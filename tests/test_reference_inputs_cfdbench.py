"""The CFDBench reader under the dpot-reference convention returns exactly the pieces the reference DPOT pipeline
hands its model: the golden files in ../shared/reference/inputs/cfdbench/ (raw cases, index.json, official.npz,
official_128.npz), compared at the reader, before any ingest.

- every stored reference piece (official.npz, (H, W, T=20, C=3): u, v, geometry channel at 64^2) equals our sample
  `reference_piece_id(raw.piece)` put into model layout by `model_layout`, to 1e-6;
- our train and test pieces are the reference's, and the dev cases we leave out are the ones it drops;
- test piece 0's first 10 frames, resized to 128^2 as the reference resizes (bilinear, align_corners=False, no
  antialiasing) and padded to 4 channels with 1.0, equal official_128.npz `x`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpot_data.sources import cfdbench
from dpot_data.sources.base import check_result

BASE = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "inputs" / "cfdbench"
TOL = 1e-6


@pytest.fixture(scope="module")
def golden() -> dict:
    needed = [BASE / "raw", BASE / "index.json", BASE / "official.npz", BASE / "official_128.npz"]
    missing = [str(p) for p in needed if not p.exists()]
    if missing:
        pytest.skip(f"CFDBench reference inputs not found ({', '.join(missing)}): they live in ../shared beside the "
                    "repository")
    index = json.loads((BASE / "index.json").read_text())
    with np.load(BASE / "official.npz", allow_pickle=False) as z:
        official = {k.replace("|", "/"): z[k] for k in z.files}
    with np.load(BASE / "official_128.npz", allow_pickle=False) as z:
        x128 = {k.replace("|", "/"): z[k] for k in z.files}
    return {"index": index, "official": official, "x128": x128}


@pytest.fixture(scope="module")
def ours(golden):
    result = cfdbench.read([BASE / "raw"])  # the default convention is dpot-reference
    check_result(result)
    ids = [str(s) for s in result.data["sample"].values]
    fields = result.data["fields"].values  # (sample, time, channel, y, x), float32
    return result, {sid: fields[i] for i, sid in enumerate(ids)}


def to_model(fields: np.ndarray, layout: str) -> np.ndarray:
    """Stored (T, C, Y, X) -> the model's (H, W, T, C): (X, Y, T, C) for "xy", (Y, X, T, C) for "yx"."""
    return np.transpose(fields, {"xy": (3, 2, 0, 1), "yx": (2, 3, 0, 1)}[layout])


def test_reader_attributes(ours):
    result, _ = ours
    ds = result.data
    assert ds.attrs["model_layout"] == "yx"  # the reference's H is the row axis of u.npy, W its column axis
    assert "random.seed(0)" in ds.attrs["split_rule"]
    assert list(ds["channel"].values) == ["u", "v", "mask"] and ds.sizes["time"] == 20
    assert result.lengths is None  # the reader cuts the pieces itself
    assert ds["mask"].dtype == np.uint8 and set(np.unique(ds["mask"].values).tolist()) <= {0, 1}


def test_every_stored_piece_equals_the_reference(golden, ours):
    result, by_id = ours
    layout = result.data.attrs["model_layout"]
    trajectories = golden["index"]["trajectories"]
    assert golden["official"], "official.npz holds no piece"
    for key, ref in golden["official"].items():
        sid = cfdbench.reference_piece_id(trajectories[key]["raw"]["piece"])
        assert sid in by_id, (key, sid)
        mine = to_model(by_id[sid], layout)
        assert mine.shape == ref.shape == (64, 64, 20, 3), (key, mine.shape, ref.shape)
        assert mine.dtype == ref.dtype == np.float32
        diff = float(np.abs(mine - ref).max())
        assert diff <= TOL, (key, sid, diff)


def test_split_and_dropped_cases_are_the_reference(golden, ours):
    result, _ = ours
    ids = [str(s) for s in result.data["sample"].values]
    split = dict(zip(ids, result.split.tolist()))
    trajectories = golden["index"]["trajectories"].values()
    for name in ("train", "test"):
        expected = sorted(cfdbench.reference_piece_id(t["raw"]["piece"]) for t in trajectories if t["split"] == name)
        assert sorted(s for s, v in split.items() if v == name) == expected, name
    assert set(split.values()) == {"train", "test"}  # dev cases are left out, never stored as "valid"
    dropped = set(json.loads(golden["index"]["note"])["dev_cases_dropped"])
    skipped = {what: why for what, why in result.skipped}
    assert {w for w, why in skipped.items() if "dev" in why} == dropped
    assert not any(s.split("#")[0] in dropped for s in ids)


def test_piece_ids_map_both_ways():
    piece = "cylinder/geo/case0003/seg5"
    assert cfdbench.reference_piece_id(piece) == "cylinder/geo/case0003#0/seg5"
    assert cfdbench.raw_piece(cfdbench.reference_piece_id(piece)) == piece


def test_first_test_window_at_128_equals_the_reference(golden, ours):
    import torch
    import torch.nn.functional as F

    result, by_id = ours
    ((key, x128),) = golden["x128"].items()
    assert x128.shape == (128, 128, 10, 4)
    assert golden["index"]["trajectories"][key]["split"] == "test"
    sid = cfdbench.reference_piece_id(golden["index"]["trajectories"][key]["raw"]["piece"])
    model = to_model(by_id[sid], result.data.attrs["model_layout"])[:, :, :10]  # (H, W, 10, 3)
    frames = torch.from_numpy(np.ascontiguousarray(model.transpose(2, 3, 0, 1)))  # (10, 3, H, W)
    resized = F.interpolate(frames, size=(128, 128), mode="bilinear", align_corners=False, antialias=False)
    mine = resized.numpy().transpose(2, 3, 0, 1)  # (128, 128, 10, 3)
    mine = np.concatenate([mine, np.ones((128, 128, 10, 1), np.float32)], axis=-1)
    diff = float(np.abs(mine - x128).max())
    assert diff <= TOL, (key, sid, diff)
    assert np.all(x128[..., 3] == 1.0)  # the padded fourth channel


def test_geometry_channel_is_the_padded_and_resized_reference_channel(golden, ours):
    """Tube and cylinder: the inlet column and wall rows (mask 0) resized back to 64^2 with align_corners=True land
    exactly on the first row, the last row and the first column of the model's (H, W), which are 0 (they blend into
    values between 0 and 1 only at 128^2); cavity's channel is all ones. Our binary `mask` variable is the true
    fluid mask: the cylinder's disc, where the reference's channel (disc at (0.5, 0.5), off the grid) has none."""
    result, by_id = ours
    trajectories = golden["index"]["trajectories"]
    frame = np.ones((64, 64), np.float32)
    frame[0, :] = frame[-1, :] = frame[:, 0] = 0
    for key, ref in golden["official"].items():
        piece = trajectories[key]["raw"]["piece"]
        channel = ref[..., 2]  # (H, W, T)
        expected = np.ones((64, 64), np.float32) if piece.startswith("cavity/") else frame
        assert np.array_equal(channel, np.broadcast_to(expected[..., None], channel.shape)), key
        mask = result.data["mask"].sel(sample=cfdbench.reference_piece_id(piece)).values
        if piece.startswith("cylinder/"):  # the true disc, centred at (-x_min, -y_min), which the channel misses
            assert 0 < (mask == 0).sum() < 400 and set(np.unique(mask).tolist()) == {0, 1}, key
        else:
            assert np.all(mask == 1), key
