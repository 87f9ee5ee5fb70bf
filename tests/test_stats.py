"""Normalisation statistics: float64, mask-aware, train-only, mergeable in any chunking."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpot_data.stats import FieldStats, Moments, block_stats, compare, merge_all, to_manifest, trajectory_stats


def _data(seed: int = 0, n: int = 7, t: int = 5, c: int = 4, y: int = 6, x: int = 5):
    rng = np.random.default_rng(seed)
    fields = (rng.normal(size=(n, t, c, y, x)) * np.array([1.0, 10.0, 0.1, 1.0])[None, None, :, None, None] + 3.0)
    fields = fields.astype(np.float32)
    mask = (rng.random((n, y, x)) > 0.3).astype(np.uint8)
    valid = np.array([True, True, True, False])
    fields[:, :, 3] = 1.0  # padded channel, fill value
    return fields, mask, valid


def _reference(fields: np.ndarray, mask: np.ndarray, valid: np.ndarray, keep: np.ndarray) -> dict:
    """Plain float64 numpy over the fluid cells of the kept trajectories, one channel at a time."""
    out = {"fields": [], "diff": []}
    f = fields[keep].astype(np.float64)
    m = mask[keep].astype(bool)
    d = np.diff(f, axis=1)
    for ch in np.flatnonzero(valid):
        for family, arr in (("fields", f), ("diff", d)):
            vals = np.concatenate([arr[i, :, ch][:, m[i]].ravel() for i in range(arr.shape[0])])
            out[family].append(
                {
                    "count": vals.size,
                    "mean": vals.mean(),
                    "std": vals.std(),
                    "rms": np.sqrt(np.mean(vals**2)),
                    "min": vals.min(),
                    "max": vals.max(),
                }
            )
    return out


def test_block_stats_equal_float64_numpy_over_valid_cells_of_train_split() -> None:
    fields, mask, valid = _data()
    keep = np.array([True, False, True, True, False, True, True])
    # a solid cell holding a huge value must not count
    for i in range(fields.shape[0]):
        fields[i][:, :, ~mask[i].astype(bool)] = 1e6
    got = block_stats(fields, mask, valid, include=keep)
    ref = _reference(fields, mask, valid, keep)
    assert got.trajectories == 5
    for family, moments in (("fields", got.values), ("diff", got.diffs)):
        summary = moments.summary()
        assert len(summary) == 3  # padded channel left out
        for ch in range(3):
            for key in ("mean", "std", "rms", "min", "max"):
                assert summary[ch][key] == pytest.approx(ref[family][ch][key], rel=1e-12, abs=1e-12), (family, ch, key)
            assert summary[ch]["count"] == ref[family][ch]["count"]
            assert summary[ch]["max"] < 1e5


def test_merge_is_independent_of_chunking_and_order() -> None:
    fields, mask, valid = _data(seed=3, n=9)
    whole = block_stats(fields, mask, valid)
    parts = [block_stats(fields[a:b], mask[a:b], valid) for a, b in ((0, 2), (2, 3), (3, 9))]
    forward = merge_all(parts, 3)
    backward = merge_all(reversed(parts), 3)
    tree = parts[0].merge(parts[1].merge(parts[2]))
    for other in (forward, backward, tree):
        assert other.trajectories == 9
        np.testing.assert_array_equal(other.values.count, whole.values.count)
        np.testing.assert_allclose(other.values.mean, whole.values.mean, rtol=1e-13)
        np.testing.assert_allclose(other.values.m2, whole.values.m2, rtol=1e-12)
        np.testing.assert_allclose(other.diffs.m2, whole.diffs.m2, rtol=1e-12)
        np.testing.assert_array_equal(other.values.min, whole.values.min)
        np.testing.assert_array_equal(other.values.max, whole.values.max)


def test_float64_accumulation_survives_large_offset() -> None:
    # float32 accumulation would lose the variance of 1e-3 noise around 1e4; float64 with Chan's merge keeps it
    rng = np.random.default_rng(1)
    base = (1e4 + rng.normal(scale=1e-2, size=(20, 3, 1, 8, 8))).astype(np.float32)
    mask = np.ones((20, 8, 8), np.uint8)
    parts = [block_stats(base[i : i + 1], mask[i : i + 1], [True]) for i in range(20)]
    merged = merge_all(parts, 1).values.summary()[0]
    ref = base.astype(np.float64).ravel()
    assert merged["std"] == pytest.approx(ref.std(), rel=1e-9)
    assert merged["mean"] == pytest.approx(ref.mean(), rel=1e-14)


def test_empty_moments_are_merge_identity_and_summarise_to_null() -> None:
    m = Moments.of_values(np.array([[1.0, 2.0, 3.0]]))
    e = Moments.empty(1)
    assert e.merge(m).summary() == m.summary()
    assert m.merge(e).summary() == m.summary()
    assert e.summary() == [{"count": 0, "mean": None, "std": None, "rms": None, "min": None, "max": None}]
    s = m.summary()[0]
    assert s["std"] == pytest.approx(math.sqrt(2 / 3))
    assert s["rms"] == pytest.approx(math.sqrt(14 / 3))


def test_single_frame_trajectory_has_no_differences() -> None:
    f = np.ones((1, 2, 3, 3), np.float32)
    st = trajectory_stats(f, np.ones((3, 3), np.uint8), [True, True])
    assert st.diffs.summary()[0]["count"] == 0
    assert st.values.summary()[1]["count"] == 9


def test_manifest_form_is_json_and_compare_reports_differences() -> None:
    fields, mask, valid = _data()
    st = block_stats(fields, mask, valid)
    doc = to_manifest(st, ["u", "v", "p", "pad3"], valid.tolist())
    doc = json.loads(json.dumps(doc))
    assert doc["channels"] == ["u", "v", "p"]
    assert set(doc["fields"]["u"]) == {"count", "mean", "std", "rms", "min", "max"}
    assert doc["trajectories"] == 7
    assert compare(doc, doc) == []
    changed = json.loads(json.dumps(doc))
    changed["diff"]["v"]["std"] *= 1.001
    assert compare(doc, changed) == [f"diff.v.std: {doc['diff']['v']['std']!r} vs {changed['diff']['v']['std']!r}"]


def test_bad_shapes_are_reported() -> None:
    with pytest.raises(ValueError, match="channel_valid has shape"):
        trajectory_stats(np.zeros((2, 3, 4, 4), np.float32), np.ones((4, 4), np.uint8), [True, False])
    with pytest.raises(ValueError, match="do not match"):
        trajectory_stats(np.zeros((2, 3, 4, 4), np.float32), np.ones((5, 4), np.uint8), [True] * 3)
    with pytest.raises(ValueError, match="cannot merge"):
        FieldStats.empty(2).merge(FieldStats.empty(3))


def test_ingested_stats_equal_numpy_over_fluid_cells_of_stored_train_trajectories(tmp_path) -> None:
    """End to end on a source with geometry (CFDBench cylinders): the manifest's statistics are those of the
    stored train trajectories, valid channels only, solid cells left out, and `recompute_stats` finds them again."""
    import zarr

    from dpot_data.ingest import IngestOptions, run_ingest
    from dpot_data.output import recompute_stats
    from dpot_data.synth.cfdbench import write_cfdbench

    write_cfdbench(tmp_path / "raw", problems=("cylinder", "dam"), cases=3, frames=(12, 16), res=32)
    opts = IngestOptions(resolution=32, segment=6, split=(0.6,), channels=4, workers=2, command="test",
                         convention="canonical")
    manifest = run_ingest("cfdbench", [tmp_path / "raw"], tmp_path / "out", opts).manifest
    entry = manifest["datasets"][0]
    g = zarr.open_group(str(tmp_path / "out" / "data.zarr"), mode="r", path=entry["zarr"]["group"])
    split = np.array([str(s) for s in g["split"][:].tolist()])
    train = np.flatnonzero(split == "train")
    mask = np.asarray(g["mask"][:]).astype(bool)
    assert (~mask).any(), "the geometry must put solid cells into the stored masks"
    fields = np.asarray(g["fields"][:]).astype(np.float64)
    stats = entry["stats"]
    assert stats["channels"] == ["u", "v"] and entry["channels"][2:] == ["pad2", "pad3"]
    assert stats["trajectories"] == len(train) == entry["splits"]["counts"]["train"]
    for c, name in enumerate(["u", "v"]):
        vals = np.concatenate([fields[i, :, c][:, mask[i]].ravel() for i in train])
        diffs = np.concatenate([np.diff(fields[i, :, c], axis=0)[:, mask[i]].ravel() for i in train])
        for family, ref in (("fields", vals), ("diff", diffs)):
            got = stats[family][name]
            assert got["count"] == ref.size
            assert got["mean"] == pytest.approx(ref.mean(), rel=1e-10, abs=1e-12)
            assert got["std"] == pytest.approx(ref.std(), rel=1e-10)
            assert got["rms"] == pytest.approx(np.sqrt(np.mean(ref**2)), rel=1e-10)
            assert got["min"] == ref.min() and got["max"] == ref.max()
    again = recompute_stats(str(tmp_path / "out"))[entry["name"]]
    assert compare(stats, again) == []


def test_cli_stats_recomputes_prints_and_checks_the_manifest(tmp_path) -> None:
    from typer.testing import CliRunner

    from dpot_data.cli import app
    from dpot_data.ingest import IngestOptions, run_ingest
    from tests.toy_output import write_fno_raw

    raw = write_fno_raw(tmp_path / "raw", n=8, res=32, frames=4)
    out = tmp_path / "out"
    manifest = run_ingest("fno", [raw], out, IngestOptions(resolution=32, workers=2, command="test")).manifest
    runner = CliRunner()
    shown = runner.invoke(app, ["stats", str(out), "--workers", "2"])
    assert shown.exit_code == 0, shown.output
    name = manifest["datasets"][0]["name"]
    assert f"{name}: {manifest['datasets'][0]['splits']['counts']['train']} train trajectories" in shown.output
    assert "vorticity" in shown.output and "manifest: matches" in shown.output
    as_json = json.loads(runner.invoke(app, ["stats", str(out), "--json"]).output)
    assert as_json["datasets"][name]["fields"] == manifest["datasets"][0]["stats"]["fields"]
    doc = json.loads((out / "manifest.json").read_text())
    doc["datasets"][0]["stats"]["fields"]["vorticity"]["mean"] += 1.0
    (out / "manifest.json").write_text(json.dumps(doc))
    changed = runner.invoke(app, ["stats", str(out)])
    assert changed.exit_code == 1 and "DIFFERS: fields.vorticity.mean" in changed.output
