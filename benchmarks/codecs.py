"""Zarr chunk codecs for the `fields` array, side by side in one run: encode and decode rate on one core, and size.

Run:  .venv/bin/python benchmarks/codecs.py [--trajectories 24]

Chunks are what ingest stores: one trajectory (frames, 4 channels, 128, 128) float32 per chunk. Two kinds of data:
- `cns`: the smooth band-limited compressible-NS fields of `dpot_data.synth.pdebench` (what benchmarks/ingest.py
  writes), on a 128² grid;
- `fno`: the vorticity of the FNO Navier–Stokes fixture (`../shared/fixtures/raw`, a pseudo-spectral solver's
  output at 64², bilinear to 128² as ingest does), padded to 4 channels with 1.0 as ingest pads; skipped when absent.
Each codec is timed on the same chunks (best of 3 passes); the ratio is stored bytes / raw bytes. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from numcodecs import Blosc, Zstd

ROOT = Path(__file__).resolve().parents[1]
CODECS = {
    "zstd-3": Zstd(level=3),
    "zstd-1": Zstd(level=1),
    "blosc-lz4-shuffle": Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE, blocksize=0),
    "blosc-zstd1-shuffle": Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=0),
}


def cns_chunks(n: int, frames: int = 21, res: int = 128) -> list[np.ndarray]:
    """Trajectories of the synthetic compressible-NS fields, (frames, 4, res, res) float32."""
    from dpot_data.synth.pdebench import cell_centres, cfd_channel

    x = cell_centres(res)
    t = np.linspace(0, 1, frames)
    out = []
    for s in range(n):
        chans = [np.stack([cfd_channel(s, c)((x, x), float(tt)) for tt in t]) for c in range(4)]
        out.append(np.ascontiguousarray(np.stack(chans, axis=1), dtype=np.float32))
    return out


def fno_chunks(n: int) -> list[np.ndarray]:
    """Trajectories of the FNO fixture's vorticity at 128², padded to 4 channels (empty when the fixture is absent)."""
    import scipy.io

    from dpot_data.transform import resample_fields

    path = ROOT.parent / "shared" / "fixtures" / "raw" / "NavierStokes_V1e-3_N6_T20.mat"
    if not path.is_file():
        return []
    u = scipy.io.loadmat(path)["u"].astype(np.float32)  # (N, 64, 64, T)
    out = []
    for s in range(min(n, u.shape[0])):
        f = np.moveaxis(u[s], -1, 0)[:, None]  # (T, 1, 64, 64)
        f = resample_fields(f, (128, 128), "bilinear")
        f = np.concatenate([f, np.ones((f.shape[0], 3, 128, 128), np.float32)], axis=1)
        out.append(np.ascontiguousarray(f, dtype=np.float32))
    return out


def measure(codec, chunks: list[np.ndarray]) -> dict[str, float]:
    """Encode and decode MB/s (raw bytes per second, one core, best of 3) and the stored/raw size ratio."""
    raw = sum(c.nbytes for c in chunks)
    best_enc = best_dec = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        enc = [codec.encode(c) for c in chunks]
        t1 = time.perf_counter()
        for e in enc:
            codec.decode(e)
        t2 = time.perf_counter()
        best_enc, best_dec = min(best_enc, t1 - t0), min(best_dec, t2 - t1)
    return {"encode_mb_s": round(raw / best_enc / 1e6, 1), "decode_mb_s": round(raw / best_dec / 1e6, 1),
            "ratio": round(sum(len(e) for e in enc) / raw, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trajectories", type=int, default=24)
    args = parser.parse_args()
    import numcodecs

    numcodecs.blosc.set_nthreads(1)
    data = {"cns": cns_chunks(args.trajectories), "fno": fno_chunks(args.trajectories)}
    result: dict = {"benchmark": "codecs", "machine": f"{platform.machine()} {platform.processor()}".strip(),
                    "numcodecs": numcodecs.__version__, "figures": {}}
    print(f"{'codec':22s} {'data':5s} {'encode MB/s':>12s} {'decode MB/s':>12s} {'stored/raw':>11s}")
    for kind, chunks in data.items():
        for name, codec in CODECS.items():
            if not chunks:
                continue
            m = measure(codec, chunks)
            result["figures"][f"{name}/{kind}"] = m
            print(f"{name:22s} {kind:5s} {m['encode_mb_s']:12.1f} {m['decode_mb_s']:12.1f} {m['ratio']:11.3f}")
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
