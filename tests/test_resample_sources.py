"""Resampling on real source layouts: 512² → 128² spectral downsampling of PDEBench CFD is accurate for a
band-limited field and lets no high-frequency component alias in; non-periodic downsampling is antialiased."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import zarr

from dpot_data.ingest import IngestOptions, ingest
from dpot_data.sources import pdearena, pdebench
from dpot_data.synth import pdearena as synth_arena
from dpot_data.synth import pdebench as synth

HIGH = (200, 0.5)  # wave number 200 along x: above the 128-grid Nyquist (64), below the 512-grid one (256)


def _ingest_fields(read_result, out, **options) -> tuple[dict, zarr.Group]:
    opts = IngestOptions(convention="canonical", formats=("zarr",), stats=False, **options)
    entry = ingest(read_result, out, opts).manifest["datasets"][0]
    return entry, zarr.open_group(str(out / "data.zarr" / entry["name"]), mode="r")


def _expected(group: zarr.Group, sample: int, high: tuple[int, float] | None = None) -> np.ndarray:
    """The analytic synth field (low modes only unless `high`) on the output grid: (time, channel, y, x)."""
    yy, xx = np.meshgrid(group["y"][:], group["x"][:], indexing="ij")
    return np.stack([
        np.stack([synth.cfd_channel(sample, c, high_freq=high)((xx, yy), float(t)) for c in range(4)])
        for t in group["time"][:]
    ])


@pytest.fixture(scope="module")
def cfd512(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfd512")
    clean = synth.write_cfd(d / "clean", n=1, frames=2, res=512, m=1.0, eta=0.1)
    noisy = synth.write_cfd(d / "noisy", n=1, frames=2, res=512, m=1.0, eta=0.1, high_freq=HIGH)
    return clean, noisy


def test_512_to_128_spectral_downsampling_is_accurate(cfd512, tmp_path):
    entry, group = _ingest_fields(pdebench.read(convention="canonical", paths=[cfd512[0]]), tmp_path / "clean")
    assert entry["resample"] == {"fields": "fourier", "mask": "nearest", "antialias": False}
    assert entry["grid"]["native_shape"] == [512, 512] and group["fields"].shape == (1, 2, 4, 128, 128)
    err = np.abs(group["fields"][0] - _expected(group, 0)).max()
    assert err < 2e-5, err  # float32 rounding only: the field is band-limited well below 64


def test_512_to_128_lets_no_high_frequency_alias_in(cfd512, tmp_path):
    entry, group = _ingest_fields(pdebench.read(convention="canonical", paths=[cfd512[1]]), tmp_path / "noisy")
    got = group["fields"][0]
    low = _expected(group, 0)
    assert np.abs(got - low).max() < 2e-5  # the k=200 component (amplitude 0.5) is gone, nothing folded back
    # what plain subsampling (or bilinear without antialiasing, as DPOT's preprocessing does) would store instead
    raw = pdebench.read(convention="canonical", paths=[cfd512[1]]).data["fields"].values[0]
    assert np.abs(raw[..., ::4, ::4] - low).max() > 0.3  # every 4th point sits on the output grid: k=200 folds to 72
    naive = F.interpolate(torch.from_numpy(raw), size=(128, 128), mode="bilinear", align_corners=False).numpy()
    assert np.abs(naive - low).max() > 0.1


def test_non_periodic_downsampling_is_antialiased(tmp_path):
    path = synth_arena.write_ns(tmp_path / "raw", split="train", n=1, frames=2, res=512)
    read = pdearena.read(convention="canonical", paths=[path])
    raw = read.data["fields"].values[0]
    entry, group = _ingest_fields(read, tmp_path / "out", split=(1.0,))
    assert entry["resample"] == {"fields": "bilinear-antialias", "mask": "nearest", "antialias": True}
    got = group["fields"][0, :, :3]
    # antialiased bilinear is a local average: close to the smooth plume and to a 4x4 box average of the raw grid
    box = raw.reshape(2, 3, 128, 4, 128, 4).mean(axis=(3, 5))
    assert np.abs(got - box).max() < 0.02 * np.abs(raw).max()
    assert got.shape == (2, 3, 128, 128) and entry["channel_valid"] == [True, True, True, False]
