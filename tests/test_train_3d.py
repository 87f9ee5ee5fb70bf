"""3D data in the trainer: windows (B, X, Y, Z, T, C) equal the stored fields, the per-run resize is the reference's
trilinear one, masked/relative L2 and rollouts over three axes, 2D + 3D in one run refused, evaluate and preview."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpot_train.core.config import DataConfig
from dpot_train.data.datasets import DataError, check_compatible, read_manifests
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.stream import EpochPlans, WindowStream
from dpot_train.data.windows import inject_noise, resize_frames, resize_mask, to_model_layout
from dpot_train.core.metrics import l2re, original_grid_cells, persistence, rollout

T_IN = 3


@pytest.fixture(scope="module")
def shards_3d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PDEBench 3D compressible NS in the published layout: 5 trajectories of 6 frames on 8^3, ingested at the
    native grid (3 train, 2 test), 5 channels."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.pdebench import write_cfd

    base = tmp_path_factory.mktemp("cfd3d")
    raw = write_cfd(base / "raw", dims=3, m=1.0, eta=1e-8, kind="Rand", n=5, frames=6, res=8, seed=0)
    out = base / "shards"
    ingest_files("pdebench", [raw], out, IngestOptions(resolution=None, split=(0.6, 0.0), seed=0))
    return out


def _reference_pad_data(sample: torch.Tensor, res: int) -> torch.Tensor:
    """thu-ml/DPOT utils/griddataset.py TemporalDataset3D.pad_data (without the channel padding): (H, W, L, T, C)."""
    h, w, length, t, c = sample.shape
    x = sample.reshape(h, w, length, -1).permute(3, 0, 1, 2)
    x = F.interpolate(x.unsqueeze(0), size=(res, res, res), mode="trilinear").squeeze(0).permute(1, 2, 3, 0)
    return x.reshape(*x.shape[:3], t, c)


def test_3d_windows_are_the_stored_fields_in_model_layout(shards_3d: Path) -> None:
    spec, reader = prepare_stream(DataConfig(manifests=[str(shards_3d)], t_in=T_IN, t_out=1), seed=0)
    ds = spec.datasets[0]
    assert ds.dims == ["z", "y", "x"] and len(ds.channels) == 5
    batch = WindowStream(spec, reader, start=0, global_batch=2).batch(0, EpochPlans(spec))
    assert batch["x"].shape == (2, 8, 8, 8, T_IN, 5) and batch["y"].shape == (2, 8, 8, 8, 1, 5)
    assert batch["mask"].shape == (2, 8, 8, 8) and batch["mask"].all()
    plans = EpochPlans(spec)
    for i in range(2):
        k, ref, _ = plans.lookup(i)
        t0 = int(np.random.default_rng([0, i, 0xD907]).integers(0, ds.frames - T_IN - 1 + 1))  # make_sample's rule
        fields, _ = reader.read(ref, t0, T_IN + 1)  # (T, C, Z, Y, X)
        expected = torch.from_numpy(np.transpose(fields, (4, 3, 2, 0, 1)))  # (X, Y, Z, T, C)
        assert torch.equal(batch["x"][i], expected[..., :T_IN, :])
        assert torch.equal(batch["y"][i], expected[..., T_IN:, :])
        assert np.array_equal(to_model_layout(fields), expected.numpy())


def test_resize_is_the_reference_trilinear_and_keeps_masks_binary() -> None:
    torch.manual_seed(0)
    frames = torch.randn(2, 6, 6, 6, 4, 5)
    ours = resize_frames(frames, 16)
    assert ours.shape == (2, 16, 16, 16, 4, 5)
    for i in range(2):
        assert torch.allclose(ours[i], _reference_pad_data(frames[i], 16), atol=0, rtol=0)
    assert resize_frames(frames, 6) is frames and resize_frames(frames, 0) is frames
    two_d = torch.randn(1, 8, 8, 3, 2)
    expected = F.interpolate(two_d[0].flatten(-2).permute(2, 0, 1)[None], size=(16, 16), mode="bilinear")
    assert torch.equal(resize_frames(two_d, 16)[0], expected[0].permute(1, 2, 0).reshape(16, 16, 3, 2))
    mask = torch.zeros(1, 4, 4, 4, dtype=torch.bool)
    mask[0, :2] = True
    big = resize_mask(mask, 8)
    assert big.dtype == torch.bool and big.shape == (1, 8, 8, 8)
    assert big[0, :4].all() and not big[0, 4:].any()


def test_3d_loss_noise_and_rollout_use_every_axis() -> None:
    torch.manual_seed(0)
    true = torch.randn(2, 4, 4, 4, 3, 2)
    pred = true + 0.1 * torch.randn_like(true)
    mask = torch.ones(2, 4, 4, 4, dtype=torch.bool)
    mask[:, :, :, 2:] = False  # the upper half of z is solid
    cv = torch.tensor([[True, True], [True, False]])
    got = l2re(pred, true, mask, cv)
    m = mask[..., None, None].float()
    per_channel = ((pred - true) * m).flatten(1, 4).norm(dim=1) / ((true * m).flatten(1, 4).norm(dim=1) + 1e-8)
    assert torch.allclose(got, torch.stack([per_channel[0].mean(), per_channel[1, 0]]))
    noisy = inject_noise(true, 0.1, torch.tensor([3, 4]), 0, mask, cv)
    assert torch.equal(noisy[:, :, :, 2:], true[:, :, :, 2:])  # no noise on solid cells
    assert torch.equal(noisy[1, ..., 1], true[1, ..., 1])  # nor on a padded channel
    assert not torch.equal(noisy[:, :, :, :2], true[:, :, :, :2])
    frames = torch.randn(1, 4, 4, 4, 6, 2)
    out = rollout(persistence, frames, 3, 3)
    assert out.shape == (1, 4, 4, 4, 3, 2) and torch.equal(out, frames[..., 2:3, :].expand(-1, -1, -1, -1, 3, -1))
    cells = original_grid_cells((8, 8, 8), [4, 4, 4])
    assert cells.sum() == 64 and cells[::2, ::2, ::2].all()


def test_2d_and_3d_datasets_in_one_run_are_refused_in_one_line(shards_3d: Path) -> None:
    three = read_manifests([str(shards_3d)])[0]
    two = dataclasses.replace(three, name="flat", dims=["y", "x"], shape=(8, 8))
    with pytest.raises(DataError) as err:
        check_compatible([three, two], T_IN, 1, "train")
    assert str(err.value).startswith("2D and 3D datasets in one run: dataset 'flat'")
    assert "\n" not in str(err.value)
    other_grid = dataclasses.replace(three, name="big", shape=(16, 16, 16))
    with pytest.raises(DataError, match="mismatched grids"):
        check_compatible([three, other_grid], T_IN, 1, "train")
    check_compatible([three, other_grid], T_IN, 1, "train", res=16)  # both resized to the run's grid


def test_evaluate_and_preview_read_3d_at_the_model_grid(shards_3d: Path, tmp_path: Path) -> None:
    from dpot_train.evaluation.evaluate import evaluate_checkpoint
    from dpot_train.model import build_model
    from dpot_train.preview import model_input

    torch.manual_seed(0)
    model = build_model("tiny", spatial_dims=3, img_size=16, in_channels=5, out_channels=5, in_timesteps=T_IN)
    ckpt = tmp_path / "tiny3d.pth"
    torch.save({"model": model.state_dict()}, ckpt)  # released format: evaluated with the reference recipe
    result = evaluate_checkpoint(str(ckpt), [str(shards_3d)], device="cpu")
    scores = result["datasets"]["pdebench-cfd3d-m1-rand"]
    assert scores["trajectories"] == 2 and scores["rollout_steps"] == 6 - T_IN
    assert np.isfinite(scores["model"]["rollout_l2re"]) and scores["persistence"]["rollout_l2re"] > 0
    x = model_input(str(shards_3d), res=16)
    assert x.shape == (16, 16, 16, 6, 5)
    native = model_input(str(shards_3d))
    assert np.allclose(x, resize_frames(torch.from_numpy(native)[None], 16)[0].numpy())
    flat = build_model("tiny", img_size=16, in_channels=5, out_channels=5, in_timesteps=T_IN)
    torch.save({"model": flat.state_dict()}, tmp_path / "tiny2d.pth")
    with pytest.raises(ValueError, match=r"a 2D model, but dataset 'pdebench-cfd3d-m1-rand' is 3D"):
        evaluate_checkpoint(str(tmp_path / "tiny2d.pth"), [str(shards_3d)], device="cpu")


def test_launch_refuses_2d_and_3d_together_in_one_line(shards_3d: Path, fno_train_shards: Path,
                                                      tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dpot_train.cli import app

    result = CliRunner().invoke(app, ["launch", "--manifest", str(shards_3d), "--manifest", str(fno_train_shards),
                                      "--out", str(tmp_path / "run"), "--dry-run", "--device", "cpu"])
    assert result.exit_code == 2
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: 2D and 3D datasets in one run: dataset 'fno-ns")
    assert not (tmp_path / "run").exists()  # nothing written
