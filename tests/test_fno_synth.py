"""`dpot-data synth fno`: real vorticity solutions in the published MAT v5 and v7.3 layouts."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import scipy.io

from dpot_data.sources.fno import format_viscosity, parse_viscosity
from dpot_data.synth.fno import forcing, gaussian_random_field, navier_stokes_2d


def test_file_names_follow_the_published_pattern(fno_pair):
    assert fno_pair["v5"].name == "NavierStokes_V1e-3_N4_T4.mat"
    assert fno_pair["v73"].name == "ns_V1e-3_N4_T4.mat"
    assert format_viscosity(1e-5) == "1e-5" and format_viscosity(1.5e-4) == "1.5e-4"
    assert parse_viscosity("ns_V1e-4_N10000_T30.mat") == pytest.approx(1e-4)
    assert parse_viscosity("NavierStokes_V1.5e-4_N2_T3.mat") == pytest.approx(1.5e-4)
    assert parse_viscosity("vorticity.mat") is None


def test_v5_layout_is_scipy_savemat_default(fno_pair):
    with open(fno_pair["v5"], "rb") as fh:
        header = fh.read(128)
    assert header.startswith(b"MATLAB 5.0 MAT-file") and header[126:128] == b"IM"
    names = {name: (shape, cls) for name, shape, cls in scipy.io.whosmat(fno_pair["v5"])}
    assert names == {"a": ((4, 64, 64), "single"), "u": ((4, 64, 64, 4), "single"), "t": ((1, 4), "single")}
    m = scipy.io.loadmat(fno_pair["v5"])
    assert m["u"].dtype == np.float32 and m["a"].dtype == np.float32
    np.testing.assert_allclose(m["t"], [[1, 2, 3, 4]], rtol=1e-6)


def test_v73_is_hdf5_with_matlab_header_and_reversed_axes(fno_pair):
    with pytest.raises(NotImplementedError):  # scipy recognises the v7.3 header and refuses it
        scipy.io.loadmat(fno_pair["v73"])
    with open(fno_pair["v73"], "rb") as fh:
        header = fh.read(512)
    assert header.startswith(b"MATLAB 7.3 MAT-file") and header[124:128] == b"\x00\x02IM"
    v5 = scipy.io.loadmat(fno_pair["v5"])
    with h5py.File(fno_pair["v73"], "r") as h5:
        assert h5.userblock_size == 512
        assert h5["u"].shape == (4, 64, 64, 4)[::-1] and h5["a"].shape == (64, 64, 4) and h5["t"].shape == (4, 1)
        for name in ("a", "u", "t"):
            assert h5[name].attrs["MATLAB_class"] == b"single"
            assert h5[name].dtype == np.float32
            np.testing.assert_array_equal(np.transpose(h5[name][()]), v5[name])


def test_synthesized_fields_are_smooth_solutions_not_noise(fno_pair):
    m = scipy.io.loadmat(fno_pair["v5"])
    a, u = m["a"].astype(np.float64), m["u"].astype(np.float64)
    assert np.isfinite(u).all() and 0.1 < np.abs(a).max() < 5
    # successive frames are close (a time-continuous solution), and the spectrum decays fast (no grid noise)
    change = np.linalg.norm(u[..., 1] - u[..., 0]) / np.linalg.norm(u[..., 0])
    assert 1e-3 < change < 0.5
    spec = np.abs(np.fft.fft2(u[..., -1], axes=(1, 2))) ** 2
    k = np.abs(np.fft.fftfreq(64, 1 / 64))
    kk = np.maximum.outer(k, k)
    assert spec[:, kk >= 22].sum() < 1e-6 * spec[:, kk <= 4].sum()  # 2/3 dealiasing leaves nothing above k=21


def test_single_fourier_mode_decays_at_the_viscous_rate():
    # for one mode the nonlinear term vanishes: w(t) = w0 * ((1 - dt nu lam/2) / (1 + dt nu lam/2))^steps
    s, nu, dt, final = 32, 1e-2, 1e-2, 1.0
    x = np.arange(s) / s
    w0 = np.cos(2 * np.pi * 3 * x)[:, None] * np.ones((1, s))
    sol, t = navier_stokes_2d(w0[None], np.zeros((s, s)), nu, final, dt=dt, record_steps=1)
    lam = 4 * math.pi**2 * 9
    factor = ((1 - 0.5 * dt * nu * lam) / (1 + 0.5 * dt * nu * lam)) ** 100
    np.testing.assert_allclose(sol[0, ..., 0], factor * w0, atol=1e-12)
    assert abs(factor - math.exp(-nu * lam * final)) < 1e-3
    np.testing.assert_allclose(t, [1.0])


def test_grf_has_the_fno_covariance_scale():
    w = gaussian_random_field(64, 64, np.random.default_rng(0))
    assert w.shape == (64, 64, 64) and abs(w.mean()) < 0.05
    assert 0.1 < w.std() < 1.0  # the FNO fixture's a has std ~0.2-0.3


def test_solver_reproduces_the_public_generator(raw_fixtures):
    """From the real fixture's a, our solver (dt=1e-2) matches the generator's own u (dt=1e-4) at t=1, 2."""
    m = scipy.io.loadmat(raw_fixtures / "NavierStokes_V1e-3_N6_T20.mat")
    a, u = m["a"][:2].astype(np.float64), m["u"][:2].astype(np.float64)
    sol, t = navier_stokes_2d(a, forcing(64), 1e-3, 2.0, dt=1e-2, record_steps=2)
    np.testing.assert_allclose(t, [1.0, 2.0])
    for k in range(2):
        err = np.linalg.norm(sol[..., k] - u[..., k]) / np.linalg.norm(u[..., k])
        assert err < 2e-3, (k, err)
