"""Pure array transforms: spectral/bilinear/bicubic resampling, binary mask resampling, channel padding."""

from __future__ import annotations

import numpy as np
import pytest

from dpot_data.transform import (
    choose_method,
    pad_channels,
    resample_bicubic,
    resample_bilinear,
    resample_fields,
    resample_fourier,
    resample_mask,
)

RNG = np.random.default_rng(0)


def _grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.arange(n) / n
    return np.meshgrid(g, g, indexing="ij")


@pytest.mark.parametrize("native,target", [((64, 64), (128, 128)), ((33, 31), (66, 64)), ((16, 8, 12), (32, 16, 24))])
def test_fourier_upsample_then_truncate_is_exact(native, target):
    x = RNG.standard_normal((2, 3) + native)
    up = resample_fourier(x, target)
    assert up.shape == (2, 3) + target and up.dtype == x.dtype
    np.testing.assert_allclose(resample_fourier(up, native), x, atol=1e-12)


def test_fourier_upsample_keeps_the_original_samples_and_float32():
    x = RNG.standard_normal((4, 64, 64)).astype(np.float32)
    up = resample_fourier(x, (128, 128))
    assert up.dtype == np.float32
    np.testing.assert_allclose(up[:, ::2, ::2], x, atol=1e-5)


def test_fourier_splits_and_sums_the_nyquist_mode():
    alt = np.cos(np.pi * np.arange(8))  # the Nyquist mode of an 8-point grid
    up = resample_fourier(alt, (16,))
    np.testing.assert_allclose(up, np.cos(np.pi * np.arange(16) / 2), atol=1e-12)
    np.testing.assert_allclose(resample_fourier(up, (8,)), alt, atol=1e-12)


def test_fourier_downsampling_a_band_limited_field_is_exact():
    xx, yy = _grid(128)
    f = np.sin(2 * np.pi * 3 * xx) * np.cos(2 * np.pi * 5 * yy) + 0.5 * np.cos(2 * np.pi * (7 * xx + 2 * yy))
    x2, y2 = _grid(32)
    g = np.sin(2 * np.pi * 3 * x2) * np.cos(2 * np.pi * 5 * y2) + 0.5 * np.cos(2 * np.pi * (7 * x2 + 2 * y2))
    np.testing.assert_allclose(resample_fourier(f, (32, 32)), g, atol=1e-12)


def test_bilinear_and_bicubic_shapes_identity_and_antialiasing():
    x = RNG.standard_normal((2, 5, 1, 32, 32)).astype(np.float32)
    for fn in (resample_bilinear, resample_bicubic):
        assert fn(x, (64, 48)).shape == (2, 5, 1, 64, 48)
        np.testing.assert_array_equal(fn(x, (32, 32)), x)
    checker = np.indices((128, 128)).sum(axis=0) % 2 * 2.0 - 1.0  # +-1 at the grid scale
    small = resample_bilinear(checker[None], (32, 32))[0]
    assert np.abs(small).max() < 0.05  # antialiased: averaged away, not aliased into +-1
    smooth = np.sin(2 * np.pi * _grid(128)[0])
    np.testing.assert_allclose(resample_bicubic(smooth[None], (64, 64))[0], np.sin(2 * np.pi * (_grid(64)[0] + 1 / 256)),
                               atol=0.02)


def test_bilinear_3d_is_separable_and_keeps_constants():
    x = np.full((1, 2, 8, 16, 16), 3.0, dtype=np.float32)
    out = resample_bilinear(x, (4, 32, 8))
    assert out.shape == (1, 2, 4, 32, 8)
    np.testing.assert_allclose(out, 3.0, rtol=1e-6)


@pytest.mark.parametrize("method", ["nearest", "area-threshold"])
def test_masks_stay_binary(method):
    mask = (RNG.random((3, 64, 64)) > 0.3).astype(np.uint8)
    for shape in [(128, 128), (32, 32), (100, 50)]:
        out = resample_mask(mask, shape, method)
        assert out.shape == (3,) + shape and out.dtype == np.uint8
        assert set(np.unique(out)) <= {0, 1}
    np.testing.assert_array_equal(resample_mask(mask, (128, 128), method)[:, ::2, ::2], mask)


def test_area_threshold_marks_cells_at_least_half_fluid():
    mask = np.zeros((1, 4, 4), np.uint8)
    mask[0, 0, :2] = 1  # block (0,0) of 2x2 cells: half fluid
    mask[0, 2, 2] = 1  # block (1,1): a quarter fluid
    out = resample_mask(mask, (2, 2), "area-threshold")
    np.testing.assert_array_equal(out[0], [[1, 0], [0, 0]])


def test_pad_channels_records_validity_and_fill():
    x = RNG.standard_normal((2, 3, 2, 8, 8)).astype(np.float32)
    padded, valid = pad_channels(x, 4, 1.0)
    assert padded.shape == (2, 3, 4, 8, 8) and padded.dtype == np.float32
    np.testing.assert_array_equal(valid, [True, True, False, False])
    np.testing.assert_array_equal(padded[:, :, :2], x)
    assert (padded[:, :, 2:] == 1.0).all()
    with pytest.raises(ValueError, match="more than the 1 requested"):
        pad_channels(x, 1, 0.0)


def test_choose_method_and_dispatch():
    assert choose_method("periodic") == "fourier" and choose_method("non-periodic") == "bilinear-antialias"
    assert choose_method("periodic", convention="dpot-reference") == "bilinear"
    assert choose_method("non-periodic", convention="dpot-reference") == "bilinear"
    assert choose_method("non-periodic", "bicubic") == "bicubic"
    with pytest.raises(ValueError, match="periodic"):
        choose_method("non-periodic", "fourier")
    with pytest.raises(ValueError, match="unknown resample method"):
        choose_method("periodic", "lanczos")
    x = RNG.standard_normal((1, 16, 16))
    assert resample_fields(x, (16, 16), "fourier").dtype == np.float32
    np.testing.assert_array_equal(resample_fields(x, (32, 32), "fourier"), resample_fourier(x.astype(np.float32), (32, 32)))
