"""CFDBench reader: geometry masks where case.json puts them, variable-length trajectories read exactly, broken
cases skipped, and errors that name the file and the key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dpot_data.errors import InputError
from dpot_data.sources import cfdbench
from dpot_data.sources.base import check_result
from dpot_data.synth import cfdbench as synth


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cfdbench")
    synth.write_cfdbench(root, cases=2, frames=(21, 30))
    return root


def _case(root: Path, problem: str, k: int) -> tuple[dict, np.ndarray, np.ndarray]:
    folder = root / problem / "bc" / f"case{k:04d}"
    return (json.loads((folder / "case.json").read_text()), np.load(folder / "u.npy"), np.load(folder / "v.npy"))


def test_tree_reads_as_variable_length_trajectories(tree):
    result = cfdbench.read(convention="canonical", paths=[tree])
    check_result(result)
    ds = result.data
    assert ds.attrs["dataset"] == "cfdbench" and ds.attrs["boundary"] == "non-periodic"
    assert list(ds["channel"].values) == ["u", "v"]
    assert result.sample_params["problem"].tolist() == ["cavity"] * 2 + ["tube"] * 2 + ["cylinder"] * 2 + ["dam"] * 2
    assert list(ds["sample"].values[:2]) == ["cavity/bc/case0000#0", "cavity/bc/case0001#0"]
    assert result.segment == 20
    values = ds["fields"].values
    for i, problem in enumerate(["cavity", "tube", "cylinder", "dam"]):
        for k in range(2):
            case, u, v = _case(tree, problem, k)
            n = 2 * i + k
            assert result.lengths[n] == len(u)
            np.testing.assert_array_equal(values[n, : len(u), 0], u.astype(np.float32))
            np.testing.assert_array_equal(values[n, : len(u), 1], v.astype(np.float32))
            assert np.isnan(values[n, len(u):]).all()  # NaN past the case's own end
            assert result.sample_params["viscosity"][n] == case["viscosity"]
    assert {d for c in ds.attrs["provenance"]["cases"].values() for d in c["dtype"]} == {"float32", "float64"}


def _cell_centres(n: int, length: float) -> np.ndarray:
    return np.array([(i + 0.5) * length / n for i in range(n)])


def test_cylinder_disc_is_solid_where_case_json_puts_it(tree):
    result = cfdbench.read(convention="canonical", paths=[tree / "cylinder"])
    for n in range(2):
        case, u, _ = _case(tree, "cylinder", n)
        xs = _cell_centres(64, case["x_max"] - case["x_min"])
        ys = _cell_centres(64, case["y_max"] - case["y_min"])
        expected = np.ones((64, 64), np.uint8)
        for iy, y in enumerate(ys):
            for ix, x in enumerate(xs):
                if np.hypot(x + case["x_min"], y + case["y_min"]) <= case["radius"]:
                    expected[iy, ix] = 0
        mask = result.data["mask"].values[n]
        np.testing.assert_array_equal(mask, expected)
        assert 20 < (mask == 0).sum() < 400  # a disc of several cells, not a point or the whole box
        assert np.all(u[:, mask == 0] == 0)  # the solver's data is zero inside the solid too


def test_dam_barrier_is_solid_where_case_json_puts_it(tree):
    result = cfdbench.read(convention="canonical", paths=[tree / "dam" / "bc" / "case0001" / "u.npy"])  # a file names its case
    case, u, _ = _case(tree, "dam", 1)
    mask = result.data["mask"].values[0]
    xs, ys = _cell_centres(64, case["width"]), _cell_centres(64, case["height"])
    cols = [i for i, x in enumerate(xs) if 0.5 <= x <= 0.5 + case["barrier_width"]]
    rows = [i for i, y in enumerate(ys) if y <= case["barrier_height"]]
    expected = np.ones((64, 64), np.uint8)
    expected[np.ix_(rows, cols)] = 0
    np.testing.assert_array_equal(mask, expected)
    assert rows[0] == 0 and mask[0, cols[0] - 1] == 1  # the barrier stands on the floor, fluid beside it


def test_cavity_and_tube_are_all_fluid(tree):
    result = cfdbench.read(convention="canonical", paths=[tree / "cavity", tree / "tube"])
    assert result.data["mask"].values.min() == 1


def test_broken_case_is_skipped_and_bad_keys_are_errors(tree, tmp_path):
    copy = tmp_path / "tree"
    shutil.copytree(tree / "dam", copy / "dam")
    u = copy / "dam" / "bc" / "case0000" / "u.npy"
    u.write_bytes(u.read_bytes()[:1000])
    result = cfdbench.read(convention="canonical", paths=[copy])
    assert result.n_samples == 1
    assert result.skipped[0][0] == "dam/bc/case0000" and "u.npy is unreadable" in result.skipped[0][1]
    case_json = copy / "dam" / "bc" / "case0001" / "case.json"
    params = json.loads(case_json.read_text())
    del params["barrier_height"]
    case_json.write_text(json.dumps(params))
    with pytest.raises(InputError, match=r"case0001/case.json: dam case: missing key\(s\) \['barrier_height'\]"):
        cfdbench.read(convention="canonical", paths=[copy])


def test_wrong_shape_names_the_file(tree, tmp_path):
    copy = tmp_path / "tree"
    shutil.copytree(tree / "tube", copy / "tube")
    np.save(copy / "tube" / "bc" / "case0001" / "v.npy", np.zeros((5, 64, 64), np.float32))
    with pytest.raises(InputError, match=r"case0001/v.npy: expected the shape of u.npy \(\d+, 64, 64\)"):
        cfdbench.read(convention="canonical", paths=[copy])


# ------------------------------------------------------------------------------------------------ through ingest

def _ingest(paths, out, **options):
    import zarr

    from dpot_data.ingest import IngestOptions, ingest

    opts = IngestOptions(convention="canonical", formats=("zarr",), stats=False, **options)
    manifest = ingest(cfdbench.read(paths, convention="canonical"), out, opts).manifest
    entry = manifest["datasets"][0]
    return entry, zarr.open_group(str(out / "data.zarr" / entry["name"]), mode="r")


def test_ingest_segments_after_the_split_and_keeps_raw_values(tree, tmp_path):
    entry, group = _ingest([tree], tmp_path / "out", resolution=None, split=(0.5, 0.25), seed=3)
    assert entry["frames"] == 20 and entry["segment"] == 20
    ids, splits = [str(s) for s in group["sample"][:]], [str(s) for s in group["split"][:]]
    fields = group["fields"][:]
    by_case: dict[str, set[str]] = {}
    for sid, split in zip(ids, splits):
        by_case.setdefault(sid.split("/seg")[0], set()).add(split)
    assert all(len(s) == 1 for s in by_case.values())  # every piece of a case has its case's split
    assert len(by_case) == 8 and set().union(*by_case.values()) == {"train", "valid", "test"}
    _, u, v = _case(tree, "dam", 1)
    assert sum(1 for s in ids if s.startswith("dam/bc/case0001#0/seg")) == len(u) // 20
    row = ids.index("dam/bc/case0001#0/seg0")
    np.testing.assert_array_equal(fields[row, :, 0], u[:20].astype(np.float32))
    np.testing.assert_array_equal(fields[row, :, 1], v[:20].astype(np.float32))
    assert np.isfinite(fields).all()  # no NaN padding reaches a stored piece


@pytest.mark.parametrize("method", ["nearest", "area-threshold"])
def test_masks_stay_binary_at_128(tree, tmp_path, method):
    entry, group = _ingest([tree / "cylinder", tree / "dam"], tmp_path / method, mask_resample=method)
    assert group["fields"].shape[1:] == (20, 4, 128, 128)
    assert entry["channels"] == ["u", "v", "pad2", "pad3"] and entry["channel_valid"] == [True, True, False, False]
    assert entry["resample"]["mask"] == method
    masks = group["mask"][:]
    assert masks.dtype == np.uint8 and set(np.unique(masks).tolist()) == {0, 1}
    ids = [str(s) for s in group["sample"][:]]
    for problem in ("cylinder", "dam"):
        row = ids.index(f"{problem}/bc/case0000#0/seg0")
        native = cfdbench.read(convention="canonical", paths=[tree / problem / "bc" / "case0000"]).data["mask"].values[0]
        np.testing.assert_array_equal(masks[row], np.kron(native, np.ones((2, 2), np.uint8)))
        # and close to the geometry evaluated directly on the 128 grid (differences only at the solid's edge)
        case, _, _ = _case(tree, problem, 0)
        direct = cfdbench.geometry_mask(problem, case, (128, 128))
        assert np.mean(masks[row] != direct) < 0.01


def test_nonfinite_case_is_left_out_but_padding_is_not(tree, tmp_path):
    copy = tmp_path / "tree"
    shutil.copytree(tree / "cavity", copy / "cavity")
    u = np.load(copy / "cavity" / "bc" / "case0001" / "u.npy")
    u[-1, 10, 10] = np.nan
    np.save(copy / "cavity" / "bc" / "case0001" / "u.npy", u)
    result = cfdbench.read(convention="canonical", paths=[copy])
    assert result.skipped == [("cavity/bc/case0001#0", f"NaN or Inf in 1 of {len(u)} frames (first: frame {len(u) - 1})")]
    assert list(result.data["sample"].values) == ["cavity/bc/case0000#0"] and result.lengths.tolist() == [
        len(np.load(copy / "cavity" / "bc" / "case0000" / "u.npy"))]


def test_synth_tree_follows_formats_md(tree):
    cases = sorted(p.relative_to(tree).as_posix() for p in tree.glob("*/*/case*"))
    assert cases == [f"{p}/bc/case{k:04d}" for p in ("cavity", "cylinder", "dam", "tube") for k in range(2)]
    for problem in ("cavity", "tube", "cylinder", "dam"):
        case, u, v = _case(tree, problem, 0)
        assert set(case) >= set(cfdbench.KEYS[problem]) and u.shape == v.shape and u.shape[1:] == (64, 64)
        assert not (tree / problem / "bc" / "case0000" / "mask.npy").exists()  # the geometry is in case.json only
    lengths = {len(_case(tree, p, k)[1]) for p in ("cavity", "tube", "cylinder", "dam") for k in range(2)}
    assert len(lengths) > 1  # trajectories of different lengths
    _, u, _ = _case(tree, "tube", 0)
    case = _case(tree, "tube", 0)[0]
    assert np.all(u[:, 1:-1, 0] == case["vel_in"]) and np.all(u[:, [0, -1], :] == 0)  # inlet column, wall rows


def test_reference_convention_gives_the_reference_pieces_and_leaves_out_dam(tree):
    result = cfdbench.read([tree])  # the default dpot-reference convention
    check_result(result)
    ds = result.data
    assert list(ds["channel"].values) == ["u", "v", "mask"] and ds.sizes["time"] == 20
    assert ds.attrs["model_layout"] == "yx" and ds.attrs["pred_channels"] == 2
    ids = [str(s) for s in ds["sample"].values]
    assert all(i.split("#0/seg")[1].isdigit() for i in ids) and result.lengths is None
    dam = [w for w, why in result.skipped if w.startswith("dam/")]
    assert dam and all("not part of the DPOT reference pre-training" in why
                       for w, why in result.skipped if w.startswith("dam/"))
    assert not any(i.startswith("dam/") for i in ids)
    # a 30-frame case gives two pieces, the second padded with its last frame; cavity's u is stored unchanged
    info, u, _ = _case(tree, "cavity", 1)
    u = u.astype(np.float32)
    pieces = [i for i in ids if i.startswith("cavity/bc/case0001#0/")]
    if pieces:  # (unless the reference split put this case into its dev part)
        assert len(pieces) == int(np.ceil(len(u) / 20))
        last = ds["fields"].sel(sample=pieces[-1]).values  # (20, 3, y, x)
        tail = len(u) - 20 * (len(pieces) - 1)
        np.testing.assert_array_equal(last[:tail, 0], u[20 * (len(pieces) - 1):])
        np.testing.assert_array_equal(last[tail:, 0], np.broadcast_to(u[-1], last[tail:, 0].shape))
    with pytest.raises(InputError, match="no cavity, tube or cylinder case"):
        cfdbench.read([tree / "dam"])


# ------------------------------------------------------------------------------- dpot-reference split and geometry

@pytest.fixture(scope="module")
def full_tree(tmp_path_factory) -> Path:
    """cavity and tube with 4 cases in each of prop, bc, geo (12 per problem, as in the reference's golden set)."""
    root = tmp_path_factory.mktemp("cfdbench_full")
    synth.write_cfdbench(root, problems=("cavity", "tube"), subsets=("prop", "bc", "geo"), cases=4, frames=(21, 25))
    return root


def _case_splits(result) -> dict[str, str]:
    return {str(s).split("#")[0]: v for s, v in zip(result.data["sample"].values, result.split)}


def test_reference_split_lists_prop_bc_geo_by_number_then_shuffles_with_seed_0(full_tree):
    # the case folders listed prop, bc, geo and by number, then random.seed(0); random.shuffle gives
    order = ["prop/case0001", "geo/case0001", "geo/case0000", "bc/case0001", "geo/case0002", "prop/case0002",
             "prop/case0003", "bc/case0003", "bc/case0000", "prop/case0000", "geo/case0003", "bc/case0002"]
    result = cfdbench.read([full_tree])
    splits = _case_splits(result)
    # cavity rounds: 10 train, 1 dev, 1 test; tube truncates: 9 train, 1 dev, 2 test
    assert {c: splits.get(f"cavity/{c}") for c in order} == dict(zip(order, ["train"] * 10 + [None, "test"]))
    assert {c: splits.get(f"tube/{c}") for c in order} == dict(zip(order, ["train"] * 9 + [None, "test", "test"]))
    dev = {w: why for w, why in result.skipped if "dev part" in why}
    assert set(dev) == {"cavity/geo/case0003", "tube/prop/case0000"}
    assert "random.seed(0)" in result.data.attrs["split_rule"]
    # the same rule, per problem, over the cases given: one problem folder alone keeps its split
    alone = _case_splits(cfdbench.read([full_tree / "tube"]))
    assert alone == {k: v for k, v in splits.items() if k.startswith("tube/")}
    # pieces: ceil(T/20) per case, ids map to the reference's piece names
    ids = [str(s) for s in result.data["sample"].values]
    assert cfdbench.raw_piece(ids[0]) == ids[0].replace("#0/", "/")
    assert all(cfdbench.reference_piece_id(cfdbench.raw_piece(i)) == i for i in ids)


def test_reference_split_ignores_cases_left_out_for_bad_data(full_tree, tmp_path):
    copy = tmp_path / "tree"
    shutil.copytree(full_tree / "cavity", copy / "cavity")
    u_file = copy / "cavity" / "prop" / "case0001" / "u.npy"  # a train case
    u = np.load(u_file)
    u[0, 3, 3] = np.inf
    np.save(u_file, u)
    (copy / "cavity" / "bc" / "case0000" / "v.npy").write_bytes(b"broken")  # another train case, unreadable
    extra = copy / "cavity" / "extra" / "case0000"  # a subset the reference does not list
    shutil.copytree(full_tree / "cavity" / "bc" / "case0001", extra)
    result = cfdbench.read([copy])
    full = {k: v for k, v in _case_splits(cfdbench.read([full_tree / "cavity"])).items()}
    left_out = {"cavity/prop/case0001", "cavity/bc/case0000"}
    assert _case_splits(result) == {k: v for k, v in full.items() if k not in left_out}
    reasons = dict(result.skipped)
    assert "NaN or Inf" in reasons["cavity/prop/case0001#0"] and "unreadable" in reasons["cavity/bc/case0000"]
    assert "lists the subsets prop, bc, geo only" in reasons["cavity/extra/case0000"]
    assert "dev part" in reasons["cavity/geo/case0003"]


def test_reference_geometry_channel_places_the_disc_at_half_on_grid_corners(tree, tmp_path):
    folder = tmp_path / "cylinder" / "bc" / "case0000"
    shutil.copytree(tree / "cylinder" / "bc" / "case0000", folder)
    params = json.loads((folder / "case.json").read_text())
    params.update(x_min=0.0, x_max=1.0, y_min=0.0, y_max=1.0, radius=0.1)  # the disc at (0.5, 0.5) inside the grid
    (folder / "case.json").write_text(json.dumps(params))
    case = cfdbench._check_case(folder)
    channel = cfdbench.reference_mask_channel(case, (64, 64))
    expected = np.ones((64, 64))
    for i in range(64):
        for j in range(64):
            x, y = 0.0 + j * (1.0 / 64), 0.0 + i * (1.0 / 64)
            if (x - 0.5) ** 2 + (y - 0.5) ** 2 <= 0.1**2:
                expected[i, j] = 0
    np.testing.assert_array_equal(channel, expected)
    # on grid corners x = j / 64 the disc spans columns 26..38 of row 32 (on cell centres it would be 26..37)
    assert channel[32, 26] == channel[32, 38] == 0 and channel[32, 25] == channel[32, 39] == 1
    # after the inlet/wall padding and the align_corners resize, the channel holds values between 0 and 1
    fields = cfdbench.read([folder]).data["fields"].values[0, 0, 2]
    assert fields.min() == 0.0 and fields.max() <= 1.0 and np.any((fields > 0) & (fields < 1))


def test_unknown_convention_is_an_input_error(tree):
    with pytest.raises(InputError, match=r"^--convention: expected one of dpot-reference, canonical, got 'ours'$"):
        cfdbench.read([tree], convention="ours")
