"""Baseline for benchmarks/loader.py: a loader built the way DPOT's own training code reads its data.

DPOT's preprocessing (see FORMATS.md section 5) stores each trajectory as its own HDF5 file `data_<i>.hdf5` holding
one dataset `data` of shape (X, Y, T, C) at the source's native grid and channel count. Its training `Dataset`
opens the file on every `__getitem__`, reads the whole trajectory, resamples every frame to 128x128 with
`F.interpolate(mode="bilinear")` (no antialiasing), copies it into a tensor of ones with the common channel count,
and cuts a window of t_in + t_out frames at a uniformly random start. This module reproduces that access pattern
from the same raw files our ingest reads, so both loaders deliver the same trajectories. It is a benchmark
baseline, not product code.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from dpot_data.ingest import read_source


def write_reference_files(source: str, paths: list[str | Path], out: str | Path) -> list[Path]:
    """One `data_<i>.hdf5` per trajectory (dataset `data`, float32 (H, W, T, C) in the model's orientation (the
    reader's model_layout), native grid and channels).

    The trajectories are those the project's own reader of `source` returns, in its order, so file i holds the
    trajectory our ingest stores under index i. Returns the file paths.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = read_source(source, paths)
    fields = result.data["fields"].data  # dask (sample, time, channel, y, x)
    order = (3, 2, 0, 1) if result.data.attrs.get("model_layout", "xy") == "xy" else (2, 3, 0, 1)
    if fields.ndim != 5:
        raise ValueError(f"the reference loader handles 2D data only; {source} gave fields of shape {fields.shape}")
    files = []
    for i in range(fields.shape[0]):
        traj = np.asarray(fields[i].compute(), dtype=np.float32)  # (T, C, Y, X)
        path = out / f"data_{i}.hdf5"
        with h5py.File(path, "w") as f:
            f.create_dataset("data", data=np.ascontiguousarray(traj.transpose(order)))  # (H, W, T, C)
        files.append(path)
    return files


def pad_data(x: torch.Tensor, res: int, n_channels: int) -> torch.Tensor:
    """(X, Y, T, C) at any grid -> (res, res, T, n_channels): bilinear resize of every frame, pad channels with 1."""
    nx, ny, t, c = x.shape
    flat = x.reshape(nx, ny, t * c).permute(2, 0, 1)  # (T*C, X, Y)
    flat = F.interpolate(flat.unsqueeze(0), size=(res, res), mode="bilinear").squeeze(0).permute(1, 2, 0)
    out = torch.ones(res, res, t, n_channels)
    out[..., :c] = flat.reshape(res, res, t, c)
    return out


class ReferenceWindows(Dataset):
    """Random (t_in + t_out)-frame windows from per-trajectory HDF5 files, resampled and padded on every access."""

    def __init__(self, folder: str | Path, count: int, res: int = 128, n_channels: int = 4, t_in: int = 10,
                 t_out: int = 1) -> None:
        self.folder = Path(folder)
        self.count, self.res, self.n_channels, self.t_in, self.t_out = count, res, n_channels, t_in, t_out

    def __len__(self) -> int:
        return self.count

    def load(self, idx: int) -> torch.Tensor:
        """Open trajectory `idx`, read all of it, resample and pad: (res, res, T, n_channels) float32."""
        with h5py.File(self.folder / f"data_{idx}.hdf5", "r") as f:
            sample = torch.from_numpy(f["data"][:]).float()
        if sample.ndim == 3:
            sample = sample.unsqueeze(-1)
        return pad_data(sample, self.res, self.n_channels)

    def window(self, idx: int, t0: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs (res, res, t_in, C) and targets (res, res, t_out, C) starting at frame t0 of trajectory idx."""
        sample = self.load(idx)
        return sample[..., t0:t0 + self.t_in, :], sample[..., t0 + self.t_in:t0 + self.t_in + self.t_out, :]

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        sample = self.load(idx)
        frames = sample.shape[-2]
        t0 = np.random.randint(max(frames - (self.t_in + self.t_out) + 1, 1))
        x = sample[..., t0:t0 + self.t_in, :]
        y = sample[..., t0 + self.t_in:t0 + self.t_in + self.t_out, :]
        return x, y, torch.ones(*x.shape[:2], 1, x.shape[-1])
