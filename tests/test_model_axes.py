"""One axis order for the model's fields and mask (dpot_format.layout), 2D and 3D: own 3D data (`ingest xarray`,
`ingest the-well`) on an asymmetric grid (z 4, y 6, x 8) with an off-centre obstacle reaches the model as
(X, Y, Z) with its mask cell for cell in the same order, in what the loss of a launched run sees, in what `evaluate`
scores and in `preview` (--mask-out); and commands write files only where they should."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import xarray as xr
import yaml
import zarr
from typer.testing import CliRunner

from dpot_format.layout import own_data_layout, space_order
from dpot_format.readers import READERS_LOCK
from dpot_train.data.windows import as_model_order, model_shape, to_model_layout, to_model_mask

NZ, NY, NX, FRAMES = 4, 6, 8, 3
OBSTACLE = (slice(0, 2), slice(2, 4), slice(5, 8))  # stored (z, y, x): z 0-1, y 2-3, x 5-7
RES = 8  # the cubic grid the 3D model needs: z and y resized, x kept


def _code(t: int) -> np.ndarray:
    """(Z, Y, X) values that name their own cell: x + 10 y + 100 z + 1 + 1000 t."""
    z, y, x = np.meshgrid(np.arange(NZ), np.arange(NY), np.arange(NX), indexing="ij")
    return (x + 10 * y + 100 * z + 1 + 1000 * t).astype(np.float64)


@pytest.fixture(scope="module")
def obstacle_nc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A NetCDF by xarray, u(sample, time, z, y, x), 3 samples of the same field, NaN over the obstacle."""
    u = np.stack([np.stack([_code(t) for t in range(FRAMES)])] * 3)
    u[(slice(None), slice(None), *OBSTACLE)] = np.nan
    ds = xr.Dataset({"u": (("sample", "time", "z", "y", "x"), u)},
                    coords={"time": np.arange(FRAMES, dtype=float), "z": np.arange(NZ, dtype=float),
                            "y": np.arange(NY, dtype=float), "x": np.arange(NX, dtype=float)})
    path = tmp_path_factory.mktemp("nc3d") / "obstacle.nc"
    ds.to_netcdf(path, engine="h5netcdf")
    return path


@pytest.fixture(scope="module")
def obstacle_out(obstacle_nc: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`dpot-data ingest xarray FILE --split 0.67`: 2 train, 1 test trajectory, shards and Zarr."""
    from dpot_data.cli import app

    out = tmp_path_factory.mktemp("ingested") / "out"
    r = CliRunner().invoke(app, ["ingest", "xarray", str(obstacle_nc), "--out", str(out), "--split", "0.67",
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def well_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A Well-layout file on an (x 8, y 6, z 4) grid, NaN over an obstacle (x 2-3, y 2, z 1: obstacle_cells),
    ingested with `dpot-data ingest the-well`; (output, file)."""
    from dpot_data.cli import app
    from dpot_data.synth.gridded import _well_file

    base = tmp_path_factory.mktemp("well3d")
    path = base / "data" / "train" / "waves_alpha_0.5.hdf5"
    path.parent.mkdir(parents=True)
    _well_file(path, 3, np.arange(FRAMES, dtype=np.float64) * 0.25, (NX, NY, NZ), False, 0.5, 0, obstacle_nan=True)
    out = base / "out"
    r = CliRunner().invoke(app, ["ingest", "the-well", str(path), "--out", str(out), "--split", "0.67",
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    return out, path


def _stored(out: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """The first stored trajectory (T, C, Z, Y, X), its mask (Z, Y, X) and the manifest's model_layout."""
    entry = json.loads((out / "manifest.json").read_text())["datasets"][0]
    group = zarr.open_group(str(out / "data.zarr"), mode="r")[entry["name"]]
    return np.asarray(group["fields"][0]), np.asarray(group["mask"][0]), entry["convention"]["model_layout"]


def _expected_at(stored_fields: np.ndarray, stored_mask: np.ndarray, res: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Written out here, independently of dpot_train: the stored (T, C, Z, Y, X) as (X, Y, Z, T, C) and the mask as
    (X, Y, Z), resized to res^3 by the mask-aware rule (docs/format.md): trilinear (align_corners False) of each
    kind's cells over that kind's weight, clamped to its range per frame and channel; a cell is fluid where the
    source cell nearest its centre (index floor((i + 0.5) n / res)) is fluid."""
    f = torch.from_numpy(np.transpose(stored_fields, (4, 3, 2, 0, 1)).copy())
    x, y, z, t, c = f.shape
    m = torch.from_numpy(stored_mask.T.astype(bool).copy())  # (X, Y, Z)
    cf = f.reshape(x, y, z, t * c).permute(3, 0, 1, 2).double()  # (K, X, Y, Z)

    def tri(a: torch.Tensor) -> torch.Tensor:
        return F.interpolate(a[None], size=(res,) * 3, mode="trilinear", align_corners=False)[0]

    idx = [np.minimum(((np.arange(res) + 0.5) * n / res).astype(int), n - 1) for n in m.shape]
    fluid = torch.from_numpy(m.numpy()[np.ix_(*idx)].copy())
    out = torch.zeros(t * c, res, res, res, dtype=torch.float64)
    for kind, target in ((m, fluid), (~m, ~fluid)):
        cells = cf[:, kind]  # (K, cells of this kind)
        mean = tri(cf * kind) / tri(kind[None].double()).clamp_min(1e-300)
        mean = torch.minimum(torch.maximum(mean, cells.min(1).values[:, None, None, None]),
                             cells.max(1).values[:, None, None, None])
        out = torch.where(target, mean, out)
    return out.permute(1, 2, 3, 0).reshape(res, res, res, t, c).float(), fluid


def test_one_rule_orders_fields_and_masks_alike() -> None:
    assert space_order(2, "xy") == (1, 0) and space_order(2, "yx") == (0, 1)
    assert space_order(3, "xy") == space_order(3, "yx") == (2, 1, 0)  # 3D is always (X, Y, Z)
    assert own_data_layout(2) == "yx" and own_data_layout(3) == "xy"
    with pytest.raises(ValueError, match="model_layout 'zyx'"):
        space_order(3, "zyx")
    rng = np.random.default_rng(0)
    for layout in ("xy", "yx"):
        for space in ((6, 8), (4, 6, 8)):
            fields = rng.standard_normal((3, 2, *space)).astype(np.float32)
            mask = rng.integers(0, 2, space).astype(np.uint8)
            fields[:, :, mask == 0] = 0.0
            x, m = to_model_layout(fields, layout), to_model_mask(mask, layout)
            assert x.shape[:-2] == m.shape == model_shape(space, layout)
            assert np.array_equal(x[..., 0, 0] == 0, m == 0)  # the field's zeros are the mask's zeros
            ordered_fields, ordered_mask = as_model_order(fields, mask, layout)  # the training stream's views
            assert np.array_equal(np.transpose(ordered_fields, (*range(ordered_fields.ndim - 1, 1, -1), 0, 1)), x)
            assert np.array_equal(ordered_mask.T, m)
    assert model_shape((4, 6, 8), "yx") == (8, 6, 4) and model_shape((6, 8), "yx") == (6, 8)


def test_own_3d_data_is_recorded_xy_and_2d_stays_yx(obstacle_out: Path, well_out: tuple[Path, Path],
                                                     tmp_path: Path) -> None:
    from dpot_data.sources import the_well
    from dpot_data.synth.gridded import write_netcdf, write_the_well
    from dpot_data.sources import xarray as xsrc

    assert _stored(obstacle_out)[2] == "xy" and _stored(well_out[0])[2] == "xy"
    flat_nc = write_netcdf(tmp_path / "nc", members=1, frames=2, ny=6, nx=8)
    assert xsrc.read([flat_nc]).data.attrs["model_layout"] == "yx"
    flat_well = write_the_well(tmp_path / "well", n=1, frames=2, res=4, dims=2, alphas=(0.5,))
    assert the_well.read([flat_well[0]]).data.attrs["model_layout"] == "yx"


@pytest.mark.parametrize("backend", ["webdataset", "zarr"])
def test_preview_writes_fields_and_loss_mask_in_the_same_xyz_order(obstacle_out: Path, tmp_path: Path,
                                                                   backend: str) -> None:
    from dpot_train.cli import app

    x_path, m_path = tmp_path / "x.npy", tmp_path / "mask.npy"
    r = CliRunner().invoke(app, ["preview", "--manifest", str(obstacle_out), "--split", "train", "--out",
                                 str(x_path), "--mask-out", str(m_path), "--backend", backend, "--normalize", "none"])
    assert r.exit_code == 0, r.output
    assert f"{x_path}: float32 (8, 6, 4, 3, 4) (X, Y, Z, T, C)" in r.output
    assert f"{m_path}: loss mask bool (8, 6, 4) (X, Y, Z)" in r.output
    x, mask = np.load(x_path, allow_pickle=False), np.load(m_path, allow_pickle=False)
    assert x.shape == (NX, NY, NZ, FRAMES, 4) and mask.shape == (NX, NY, NZ) and mask.dtype == bool
    solid = np.zeros((NX, NY, NZ), bool)
    solid[5:8, 2:4, 0:2] = True  # the obstacle, in the model's (X, Y, Z)
    assert np.array_equal(~mask, solid)
    for t in range(FRAMES):  # each fluid cell holds its own (x, y, z) value; the obstacle cells the stored fill
        np.testing.assert_array_equal(x[..., t, 0][mask], _code(t).T[mask])
        assert np.all(x[..., t, 0][~mask] == _stored(obstacle_out)[0][t, 0, 0, 2, 5])
    r = CliRunner().invoke(app, ["preview", "--manifest", str(obstacle_out), "--split", "train", "--out",
                                 str(x_path), "--mask-out", str(m_path), "--backend", backend, "--res", str(RES),
                                 "--normalize", "none"])
    assert r.exit_code == 0, r.output
    fields, stored_mask, _ = _stored(obstacle_out)
    want_x, want_mask = _expected_at(fields, stored_mask, RES)
    np.testing.assert_allclose(np.load(x_path), want_x.numpy(), rtol=0, atol=1e-3)
    assert np.array_equal(np.load(m_path), want_mask.numpy())


def test_preview_of_the_well_3d_is_xyz(well_out: tuple[Path, Path], tmp_path: Path) -> None:
    from dpot_data.synth.gridded import obstacle_cells
    from dpot_train.preview import window

    out, path = well_out
    x, mask, _ = window(out, split="train", index=0, normalize="none")  # as stored: the values name their cells
    assert x.shape[:3] == (NX, NY, NZ) and mask.shape == (NX, NY, NZ)
    assert np.array_equal(~mask, obstacle_cells((NX, NY, NZ)))  # the Well's (x, y, z) is the model's order
    entry = json.loads((out / "manifest.json").read_text())["datasets"][0]
    first = entry["splits"]["ids"]["train"][0]  # '<file>#<n>'
    with h5py.File(path, "r") as f:
        names = list(f["t0_fields"].attrs["field_names"])
        raw = f["t0_fields"][names[0]][int(first.rsplit("#", 1)[1])]  # (T, x, y, z)
    channel = entry["channels"].index(names[0] if isinstance(names[0], str) else names[0].decode())
    want = np.transpose(raw, (1, 2, 3, 0)).astype(np.float32)  # (x, y, z, T)
    np.testing.assert_array_equal(x[..., channel][mask], want[mask])
    assert np.all(x[..., channel][~mask] == x[..., channel][~mask].flat[0])  # one fill value over the obstacle


class _FirstLoss(Exception):
    """Stops the launched run after the loss of its first step was recorded."""


def _launched_loss_inputs(out: Path, run: Path, backend: str, monkeypatch: pytest.MonkeyPatch
                          ) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """What `launch` then the worker do, in this process (prepare_run writes RUN_DIR, the worker's train() reads
    its plan): (targets, mask) the loss gets in step 0, and the batch's ids."""
    from dpot_train.train import trainer
    from dpot_train.core.config import TrainConfig, apply_overrides
    from dpot_train.run.launch import Topology, prepare_run, release_run
    from dpot_train.train.run_plan import load_plan

    cfg = apply_overrides(TrainConfig(), {
        "out": str(run), "model": "tiny", "data.manifests": [str(out)], "data.res": RES, "data.t_in": 2,
        "data.t_out": 1, "data.backend": backend, "data.noise": 0.0, "data.normalize": "none", "batch_size": 2,
        "steps": 24,
        "device": "cpu", "progress": False})
    cfg, cfg_path = prepare_run(cfg, False, Topology())
    release_run(run)  # this process trains in place of torchrun
    seen: dict[str, object] = {}
    real = trainer.per_sample_loss

    def record(pred, true, mask, channel_valid, mode="valid"):  # noqa: ANN001, ANN202 - the loss's own signature
        seen.update(true=true.detach().clone(), mask=mask.detach().clone())
        real(pred, true, mask, channel_valid, mode)
        raise _FirstLoss

    monkeypatch.setattr(trainer, "per_sample_loss", record)
    real_step = trainer.train_step

    def step(cfg, model, opt, sched, batch, device, trainable):  # noqa: ANN001, ANN202
        seen["ids"] = list(batch["id"])
        return real_step(cfg, model, opt, sched, batch, device, trainable)

    monkeypatch.setattr(trainer, "train_step", step)
    with pytest.raises(_FirstLoss):
        trainer.train(cfg, plan=load_plan(cfg_path.parent, cfg.to_dict()))
    return seen["true"], seen["mask"], seen["ids"]  # type: ignore[return-value]


@pytest.mark.parametrize("source,backend", [("xarray", "webdataset"), ("xarray", "zarr"), ("the-well", "webdataset")])
def test_the_loss_of_a_launched_run_sees_mask_and_fields_in_one_order(obstacle_out: Path,
                                                                      well_out: tuple[Path, Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch, source: str,
                                                                      backend: str) -> None:
    out = obstacle_out if source == "xarray" else well_out[0]
    true, mask, ids = _launched_loss_inputs(out, tmp_path / "run", backend, monkeypatch)
    entry = json.loads((out / "manifest.json").read_text())["datasets"][0]
    assert true.shape == (2, RES, RES, RES, 1, len(entry["channels"])) and mask.shape == (2, RES, RES, RES)
    group = zarr.open_group(str(out / "data.zarr"), mode="r")[entry["name"]]
    for b, sample_id in enumerate(ids):  # 3 frames, 2 in and 1 out: every window starts at frame 0
        row = int(sample_id.rsplit(":", 1)[1])  # '<dataset>:<index>', the trajectory's row of the Zarr arrays
        want_x, want_mask = _expected_at(np.asarray(group["fields"][row]), np.asarray(group["mask"][row]), RES)
        torch.testing.assert_close(true[b], want_x[..., 2:, :], rtol=0, atol=1e-3)
        assert torch.equal(mask[b], want_mask)
    solid = torch.zeros(RES, RES, RES, dtype=torch.bool)  # the obstacle in the model's (X, Y, Z), resized by nearest
    if source == "xarray":  # x 5-7, y 2-3 -> 3-4, z 0-1 -> 0-3
        solid[5:8, 3:5, 0:4] = True
    else:  # x 2-3, y 2 -> 3, z 1 -> 2-3
        solid[2:4, 3, 2:4] = True
    assert all(torch.equal(~m, solid) for m in mask)


@pytest.mark.parametrize("backend", ["webdataset", "zarr"])
def test_evaluate_scores_with_mask_and_fields_in_one_order(obstacle_out: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    import dpot_train.evaluation.evaluate as ev
    from dpot_train.model import build_model

    torch.manual_seed(0)
    model = build_model("tiny", spatial_dims=3, img_size=RES, in_channels=4, out_channels=4, in_timesteps=2)
    ckpt = tmp_path / "tiny3d.pth"
    torch.save({"model": model.state_dict()}, ckpt)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = ev.l2re

    def record(pred, true, mask, channel_valid):  # noqa: ANN001, ANN202
        seen.append((true.clone(), mask.clone()))
        return real(pred, true, mask, channel_valid)

    monkeypatch.setattr(ev, "l2re", record)
    result = ev.evaluate_checkpoint(str(ckpt), [str(obstacle_out)], backend=backend, device="cpu", recipe="dpot",
                                    res=RES)
    assert result["datasets"]["obstacle"]["trajectories"] == 1 and seen
    fields, stored_mask, _ = _stored(obstacle_out)  # every trajectory holds the same field
    want_x, want_mask = _expected_at(fields, stored_mask, RES)
    for true, mask in seen:
        assert true.shape == (1, RES, RES, RES, 1, 4)
        torch.testing.assert_close(true[0], want_x[..., 2:, :], rtol=0, atol=1e-3)
        assert torch.equal(mask[0], want_mask)


# --- files where they should be ---------------------------------------------------------------------------------

def test_evaluate_checks_out_before_evaluating(obstacle_out: Path, tmp_path: Path) -> None:
    from dpot_train.cli import app

    folder = tmp_path / "results"
    folder.mkdir()
    missing = tmp_path / "no.pth"  # were --out checked after the evaluation, this would be the error
    for given in (str(folder), str(tmp_path / "new") + "/"):
        r = CliRunner().invoke(app, ["evaluate", str(missing), "--manifest", str(obstacle_out), "--out", given])
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert r.exit_code == 2 and len(lines) == 1, r.output
        assert lines[0].startswith(f"error: --out {given}: is a folder") and "eval.json" in lines[0]
    assert list(folder.iterdir()) == [] and not (tmp_path / "new").exists()
    (tmp_path / "file").write_text("")
    r = CliRunner().invoke(app, ["evaluate", str(missing), "--manifest", str(obstacle_out), "--out",
                                 str(tmp_path / "file" / "eval.json")])
    assert r.exit_code == 2 and "is a file, not a folder" in r.output


def test_preview_writes_exactly_the_path_it_prints(obstacle_out: Path, tmp_path: Path) -> None:
    from dpot_train.cli import app

    r = CliRunner().invoke(app, ["preview", "--manifest", str(obstacle_out), "--out", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"{tmp_path / 'run'}: float32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert np.load(tmp_path / "run", allow_pickle=False).shape == (NX, NY, NZ, FRAMES, 4)
    r = CliRunner().invoke(app, ["preview", "--manifest", str(obstacle_out), "--out", str(tmp_path / "run"),
                                 "--mask-out", str(tmp_path / "run")])
    assert r.exit_code == 2 and "--mask-out" in r.output and "same file as --out" in r.output


def test_a_failed_launch_leaves_no_lock_in_a_folder_without_output(tmp_path: Path) -> None:
    from dpot_train.cli import app

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "data.nc").write_bytes(b"not an output")
    r = CliRunner().invoke(app, ["launch", "--manifest", str(raw), "--out", str(tmp_path / "run"), "--device",
                                 "cpu"])
    assert r.exit_code == 2, r.output
    assert sorted(p.name for p in raw.iterdir()) == ["data.nc"]  # no READERS_LOCK
    assert not (raw / READERS_LOCK).exists()


def test_launch_dry_run_writes_nothing(obstacle_out: Path, tmp_path: Path) -> None:
    from dpot_train.cli import app

    before = sorted(p.name for p in obstacle_out.iterdir())
    config = tmp_path / "run.yaml"
    config.write_text("data:\n  t_in: 2\n  t_out: 1\n")  # the trajectories hold 3 frames
    run = tmp_path / "run"
    r = CliRunner().invoke(app, ["launch", "--config", str(config), "--manifest", str(obstacle_out), "--out",
                                 str(run), "--res", str(RES), "--device", "cpu", "--dry-run"])
    assert r.exit_code == 0, r.output + r.stderr
    assert "dpot_train.run.torchrun" in r.stderr and str(run / "config.yaml") in r.stderr
    printed = yaml.safe_load(r.stdout)  # the run config it would write
    assert printed["out"] == str(run) and printed["data"]["res"] == RES
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]
    assert sorted(p.name for p in obstacle_out.iterdir()) == before
