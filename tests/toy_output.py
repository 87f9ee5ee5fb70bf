"""A tiny output folder written straight from docs/format.md (Zarr group, shards, manifest), local or fsspec URL.

It lets the readers of an output (`verify`, `plot`, `stats`) be tested on their own, independently of ingest.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import fsspec
import numpy as np
import zarr

from dpot_format import io as fs
from dpot_format.io import sha256_array
from dpot_format.manifest import build
from dpot_format.shard_index import INDEX_NAME, index_bytes, index_document
from dpot_format.tar import index_shard

CHANNELS = ["u", "v", "p", "pad3"]
VALID = [True, True, True, False]
SPLIT = ["train", "train", "valid", "train", "test"]


def toy_arrays(n: int = 5, frames: int = 6, res: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """Smooth moving waves (u, v, p) and a padded channel of ones; a disc of solid cells in the mask."""
    yy, xx = np.meshgrid(np.linspace(0, 1, res), np.linspace(0, 1, res), indexing="ij")
    fields = np.ones((n, frames, 4, res, res), np.float32)
    for i in range(n):
        for k in range(frames):
            fields[i, k, 0] = np.sin(2 * np.pi * (xx + 0.1 * k + 0.2 * i))
            fields[i, k, 1] = np.cos(2 * np.pi * (yy - 0.1 * k)) * (1 + i)
            fields[i, k, 2] = xx * yy + k
    mask = np.ones((n, res, res), np.uint8)
    mask[:, (yy - 0.5) ** 2 + (xx - 0.4) ** 2 < 0.04] = 0
    fields[:, :, :3] *= mask[:, None, None]
    return fields, mask


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def write_toy_output(root: str, n: int = 5, frames: int = 6, res: int = 16, index: bool = False
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Write the toy output at `root` (path or URL); returns (fields, mask). `index`: with the shards' member index
    (`shard_index`), as ingest now records it; without, an output written before it."""
    fields, mask = toy_arrays(n, frames, res)
    split = np.array((SPLIT * n)[:n])
    store = fs.zarr_store(fs.join(root, "data.zarr"), read_only=False)
    g = zarr.open_group(store, mode="w").create_group("toy")
    g.create_array("fields", data=fields, chunks=(1, frames, 4, res, res))
    g.create_array("mask", data=mask, chunks=(1, res, res))
    g.create_array("channel_valid", data=np.array(VALID))
    labels = g.create_array("split", shape=(n,), chunks=(n,), dtype=str, fill_value="")
    labels[:] = split
    shards, indexed = [], []
    for s in ("train", "valid", "test"):
        rel = f"shards/toy/{s}-000000.tar"
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in np.flatnonzero(split == s):
                meta = {"id": f"toy#{i}", "dataset": "toy", "split": s, "index": int(i)}
                for ext, data in (("fields.npy", _npy(fields[i])), ("mask.npy", _npy(mask[i])),
                                  ("meta.json", json.dumps(meta).encode())):
                    info = tarfile.TarInfo(f"s{i:07d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        data = buf.getvalue()
        with fsspec.open(fs.join(root, rel), "wb", auto_mkdir=True) as f:
            f.write(data)
        shards.append({"path": rel, "split": s, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data),
                       "samples": int((split == s).sum())})
        indexed.append((rel.rsplit("/", 1)[1], shards[-1]["sha256"], index_shard(io.BytesIO(data), rel)))
    recorded = index_bytes(index_document("toy", indexed))
    if index:
        with fsspec.open(fs.join(root, f"shards/toy/{INDEX_NAME}"), "wb", auto_mkdir=True) as f:
            f.write(recorded)
    entry = {
        "name": "toy", "source": "toy", "boundary": "periodic", "parameters": {}, "channels": CHANNELS,
        "channel_valid": VALID, "fill_value": 1.0,
        "grid": {"dims": ["y", "x"], "shape": [res, res], "native_shape": [res, res]},
        "frames": frames, "dt": None, "resample": {"fields": "none", "mask": "none", "antialias": False},
        "splits": {"seed": 0, "rule": "fixed",
                   "counts": {s: int((split == s).sum()) for s in ("train", "valid", "test")}},
        "trajectories": n, "shards": shards,
        "zarr": {"path": "data.zarr", "group": "toy",
                 "arrays": {k: sha256_array(g[k]) for k in ("fields", "mask", "channel_valid")}},
        "inputs": [], "skipped": [], "stats": None,
    }
    if index:
        entry["shard_index"] = {"path": f"shards/toy/{INDEX_NAME}", "sha256": hashlib.sha256(recorded).hexdigest(),
                                "bytes": len(recorded)}
    with fsspec.open(fs.join(root, "manifest.json"), "w") as f:
        json.dump(build([entry], command="toy", created="2026-01-01T00:00:00Z"), f)
    return fields, mask


def write_fno_raw(folder, n: int = 24, res: int = 64, frames: int = 10, seed: int = 7):
    """A small FNO Navier–Stokes v5 file of smooth travelling waves (fast to write; the reader only checks layout)."""
    from pathlib import Path

    from dpot_data.synth.fno import write_mat_v5

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    g = np.arange(res) / res
    xx, yy = np.meshgrid(g, g, indexing="ij")
    phase = np.random.default_rng(seed).uniform(0, 2 * np.pi, size=(n, 2))
    waves = np.stack([np.sin(2 * np.pi * (xx + 0.05 * k) + phase[:, :1, None]) *
                      np.cos(2 * np.pi * yy + phase[:, 1:, None]) for k in range(frames + 1)], axis=-1)
    path = folder / f"NavierStokes_V1e-3_N{n}_T{frames}.mat"
    t = np.arange(1, frames + 1, dtype=np.float32)[None, :]
    write_mat_v5(path, waves[..., 0].astype(np.float32), waves[..., 1:].astype(np.float32), t)
    return path
