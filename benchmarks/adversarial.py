"""Adversarial run: bad raw inputs and hostile arguments through the real CLIs, each outcome classified.

Builds in `--out DIR` (a folder of its own) small raw files from the dpot_data.synth writers and the real-format
fixtures (../shared/fixtures/raw), corrupts them (truncations, flipped bytes, wrong dtypes/shapes, missing
datasets, NaN/Inf, empty files, folders and links where files are expected, other formats under a dataset suffix,
HDF5 external links / virtual datasets / external storage pointing at a sentinel file outside the input, hostile
attributes), plants files that must survive (a dataset store, a user file, a FIFO, as root a character device),
then runs each case in a subprocess with a timeout and classifies it:

refused (exit 2, one `error:`/`<file>:` line besides `warning:` lines, nothing written at the output), ingested (exit 0 and `dpot-data
verify` passes), ok (exit 0 where the input is valid), traceback, hang, lost (a planted file changed or gone),
outside read (the sentinel found in an output), outside write (a file of DIR changed outside the case's output),
accepted wrongly (exit 0 on an input bad by construction, or a check of the output failed), other.

    python benchmarks/adversarial.py --out /tmp/adv [--quick]

One line per case, a table of counts, and a final JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FIXTURES = ROOT.parent / "shared" / "fixtures" / "raw"
SENTINEL = 424242.0
SENTINEL_TEXT = b"SENTINEL-OUTSIDE-9f3e1c7a"
READERS_LOCK = ".dpot-readers.lock"  # the empty shared lock a reader leaves in an output (docs/training.md)
KINDS = ("refused", "ingested", "ok", "traceback", "hang", "lost", "outside read", "outside write",
         "accepted wrongly", "other")
PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"
       b"\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00IEND\xaeB`\x82")


@dataclass
class Case:
    """One adversarial run: the command, what must survive, where it writes, and whether its input is bad."""

    name: str
    cmd: list[str]
    bad: bool | None  # True: must not exit 0; None: refused or a clean success are both fine
    out: Path | None = None  # the one path the command may write
    verify: bool = False  # exit 0 must leave an output that `dpot-data verify` passes
    planted: list[Path] = field(default_factory=list)
    check: Callable[[Case], str] | None = None  # extra check of a success; returns what is wrong, or ""
    quick: bool = False
    timeout: float = 60.0
    refuse_rc: int = 2  # the exit code of a refusal (`verify`: 1, with its problem lines and a FAILED line)


# --- snapshots ------------------------------------------------------------------------------------------------------

def _digest(path: Path) -> str:
    """What a planted path is: sha256 of a regular file (of each file below a folder), or its type and device."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return "gone"
    if stat.S_ISLNK(st.st_mode):
        return "link:" + os.readlink(path)
    if stat.S_ISDIR(st.st_mode):
        h = hashlib.sha256()
        for p in sorted(q for q in path.rglob("*") if q.name != READERS_LOCK):
            h.update(str(p.relative_to(path)).encode() + _digest(p).encode())
        return "dir:" + h.hexdigest()
    if stat.S_ISREG(st.st_mode):
        return "file:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return f"node:{stat.S_IFMT(st.st_mode)}:{st.st_rdev}"


def snapshot(base: Path, skip: tuple[Path, ...]) -> dict[str, tuple]:
    """(type, size, mtime_ns, inode) of every path under `base` outside `skip`: what an outside write changes."""
    snap: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        d = Path(dirpath)
        dirnames[:] = [n for n in dirnames if not any(_under(d / n, s) for s in skip)]
        for n in filenames + dirnames:
            p = d / n
            if n == READERS_LOCK or any(_under(p, s) for s in skip):
                continue
            try:
                st = p.lstat()
            except FileNotFoundError:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            snap[str(p)] = (stat.S_IFMT(st.st_mode), 0 if is_dir else st.st_size, 0 if is_dir else st.st_mtime_ns,
                            st.st_ino)
    return snap


def _under(p: Path, top: Path) -> bool:
    return p == top or top in p.parents


def sentinel_found(paths: list[Path], extra: bytes) -> str:
    """Where the sentinel (its text, or SENTINEL as float32/float64 cells) is found in the outputs; '' if nowhere."""
    pats = [SENTINEL_TEXT, np.full(4, SENTINEL, "<f4").tobytes(), np.full(2, SENTINEL, "<f8").tobytes()]
    if any(p in extra for p in pats):
        return "stdout/stderr"
    for top in paths:
        if not top.exists() or top.is_symlink():
            continue
        for p in [top] if top.is_file() else top.rglob("*"):
            if p.is_file() and not p.is_symlink():
                data = p.read_bytes()
                if any(q in data for q in pats):
                    return str(p)
        zarr_dir = top / "data.zarr" if top.is_dir() else None
        if zarr_dir is not None and zarr_dir.is_dir():
            import zarr
            try:
                g = zarr.open_group(str(zarr_dir), mode="r")
                for name in list(g.group_keys()):
                    f = g[name]["fields"][...]
                    if np.isclose(f, SENTINEL, rtol=1e-4).any():
                        return f"{zarr_dir}/{name}/fields"
            except Exception:  # noqa: BLE001 - an unreadable store is judged by verify
                pass
    return ""


# --- running ----------------------------------------------------------------------------------------------------------

def run_case(case: Case, base: Path, env: dict[str, str]) -> tuple[str, str]:
    """Run one case; (kind, detail)."""
    cwd = base / "cwd" / case.name
    cwd.mkdir(parents=True, exist_ok=True)
    before_planted = {p: _digest(p) for p in case.planted}
    # the output, and the sha256 record a checkpoint writer puts beside it (docs/training.md)
    skip = (case.out, case.out.with_name(case.out.name + ".sha256")) if case.out is not None else ()
    before = snapshot(base, skip + (base / "cwd" / case.name / "__pycache__",))
    out_existed = case.out is not None and (case.out.exists() or case.out.is_symlink())
    t0 = time.monotonic()
    proc = subprocess.Popen(case.cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        so, se = proc.communicate(timeout=case.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        so, se = proc.communicate()
        return "hang", f"no end after {case.timeout:.0f} s"
    secs = time.monotonic() - t0
    text = se.decode(errors="replace")
    lines = [ln for ln in (so + se).decode(errors="replace").splitlines() if ln.strip()]
    err_lines = [ln for ln in text.splitlines() if ln.strip()]
    if "Traceback (most recent call last)" in text:
        return "traceback", _tail(text)
    lost = [f"{p}: {before_planted[p]} -> {_digest(p)}" for p in case.planted if _digest(p) != before_planted[p]]
    if lost:
        return "lost", "; ".join(lost)
    after = snapshot(base, skip + (base / "cwd" / case.name / "__pycache__",))
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        return "outside write", ", ".join(changed[:4])
    outs = [case.out] if case.out is not None else []
    where = sentinel_found(outs, so + se)
    if where:
        return "outside read", where
    if proc.returncode == 0:
        if case.bad:
            return "accepted wrongly", f"exit 0: {_tail(' | '.join(lines[-2:]))}"
        if case.check is not None:
            wrong = case.check(case)
            if wrong:
                return "accepted wrongly", wrong
        if case.verify and case.out is not None:
            v = subprocess.run([str(BIN / "dpot-data"), "verify", str(case.out)], env=env, capture_output=True)
            if v.returncode != 0:
                return "accepted wrongly", "verify failed: " + _tail(v.stdout.decode() + v.stderr.decode())
            return "ingested", f"{secs:.1f} s"
        return "ok", f"{secs:.1f} s"
    if proc.returncode == case.refuse_rc:
        said = err_lines if case.refuse_rc == 2 else [ln for ln in lines if not ln.startswith("FAILED:")]
        errs = [ln for ln in said if not ln.startswith("warning: ")]  # what was chosen/guessed, said first
        one = len(errs) == 1 and (errs[0].startswith("error: ") or ": " in errs[0])
        if not one:
            return "other", f"exit 2 with {len(errs)} error lines: {_tail(text)}"
        if case.out is not None and not out_existed and (case.out.exists() or case.out.is_symlink()):
            return "other", f"refused but wrote {case.out}: {errs[0]}"
        return "refused", errs[0][:160]
    return "other", f"exit {proc.returncode}: {_tail(text)}"


def _tail(text: str, n: int = 220) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else "..." + text[-n:]


# --- inputs -----------------------------------------------------------------------------------------------------------

def _copy(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def truncated(src: Path, dst: Path, size: int) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fo.write(fi.read(size))
    return dst


def flipped(src: Path, dst: Path, at: int) -> Path:
    data = bytearray(src.read_bytes())
    for i in range(at, min(at + 8, len(data))):
        data[i] ^= 0xFF
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bytes(data))
    return dst


def largest_dataset(f: h5py.File) -> str:
    """The name of the largest dataset of an HDF5 file (the field a reader reads)."""
    found: list[tuple[int, str]] = []
    f.visititems(lambda n, o: found.append((o.size, n)) if isinstance(o, h5py.Dataset) else None)
    return max(found)[1]


def h5_variant(src: Path, dst: Path, how: str, outside: Path) -> Path:
    """A copy of `src` with its largest dataset replaced: `how` = extlink | virtual | external | missing | int8 |
    complex | string | flat | nan | inf | allnan | attrs | bigattr."""
    _copy(src, dst)
    with h5py.File(dst, "r+") as f:
        name = largest_dataset(f)
        ds = f[name]
        shape, dtype = ds.shape, ds.dtype
        data = ds[...]
        if how in ("attrs", "bigattr"):
            val = ("<script>alert(1)</script>|a|b\n# heading" if how == "attrs" else "x" * 100_000)
            for obj in (f, ds):
                for k in ("units", "long_name", "dataset_name", "description", "name"):
                    obj.attrs[k] = val
            return dst
        del f[name]
        if how == "extlink":
            ext = outside / f"ext_{dst.stem}.h5"
            with h5py.File(ext, "w") as g:
                g.create_dataset("data", data=np.full(shape, SENTINEL, dtype))
            f[name] = h5py.ExternalLink(str(ext), "data")
        elif how == "virtual":
            ext = outside / f"vds_{dst.stem}.h5"
            with h5py.File(ext, "w") as g:
                g.create_dataset("data", data=np.full(shape, SENTINEL, dtype))
            layout = h5py.VirtualLayout(shape=shape, dtype=dtype)
            layout[...] = h5py.VirtualSource(str(ext), "data", shape=shape)
            f.create_virtual_dataset(name, layout, fillvalue=0)
        elif how == "external":
            raw = outside / f"raw_{dst.stem}.bin"
            raw.write_bytes(np.full(shape, SENTINEL, dtype).tobytes())
            f.create_dataset(name, shape=shape, dtype=dtype, external=[(str(raw), 0, raw.stat().st_size)])
        elif how == "missing":
            pass
        elif how == "int8":
            f.create_dataset(name, data=data.astype(np.int8))
        elif how == "complex":
            f.create_dataset(name, data=data.astype(np.complex64))
        elif how == "string":
            f.create_dataset(name, data=np.array([b"abc"] * 4))
        elif how == "flat":
            f.create_dataset(name, data=data.reshape(-1)[:100])
        elif how in ("nan", "inf", "allnan"):
            d = data.astype(dtype, copy=True)
            if how == "allnan":
                d[...] = np.nan
            else:
                d.reshape(-1)[:: max(1, d.size // 50)] = np.nan if how == "nan" else np.inf
            f.create_dataset(name, data=d)
            if how == "allnan":  # every field of every sample (PDEBench keeps one group per sample)
                others: list[str] = []
                f.visititems(lambda n, o: others.append(n) if isinstance(o, h5py.Dataset) and o.ndim >= 3
                             and o.dtype.kind == "f" and n != name else None)
                for n in others:
                    f[n][...] = np.nan
        else:
            raise ValueError(how)
    return dst


def build(base: Path, quick: bool) -> list[Case]:
    """Write every input under `base` and return the cases."""
    import torch
    from scipy.io import savemat

    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth import gridded, pdearena, pdebench
    from dpot_data.synth.fno import synth_fno
    from dpot_train.core.checkpoint import checkpoint_payload
    from dpot_train.model import build_model

    dd, dt = str(BIN / "dpot-data"), str(BIN / "dpot-train")
    raw, bad, outs, outside, prot = (base / n for n in ("raw", "bad", "outs", "outside", "protected"))
    for d in (raw, bad, outs, outside, prot):
        d.mkdir(parents=True, exist_ok=True)
    (outside / "secret.txt").write_bytes(SENTINEL_TEXT + b"\n")
    with h5py.File(outside / "secret.h5", "w") as g:
        g.create_dataset("data", data=np.full((4, 4), SENTINEL, np.float32))

    # valid small raw files of each source
    v5, v73 = synth_fno(raw / "fno", n=2, frames=4, viscosity=1e-3, seed=1, resolution=16)
    dr = pdebench.write_diff_react(raw / "pdebench", n=2, frames=5, res=16)
    arena = pdearena.write_standard(raw / "pdearena", n=2, frames=5, res=16)[0]
    nc = gridded.write_user_netcdf(raw / "own", samples=2, frames=5, ny=8, nx=10)
    well = gridded.write_the_well(raw / "well", n=1, frames=4, res=8, alphas=(0.5,))
    well_file = sorted(p for p in well if "train" in str(p))[0]
    bases: list[tuple[str, Path, list[str]]] = [
        ("fno5", v5, ["ingest", "fno"]), ("fno73", v73, ["ingest", "fno"]),
        ("pdebench", dr, ["ingest", "pdebench"]), ("pdearena", arena, ["ingest", "pdearena"]),
        ("own", nc, ["ingest", "xarray"]), ("well", well_file, ["ingest", "the-well"]),
    ]
    fixtures = [(FIXTURES / "NavierStokes_V1e-3_N6_T20.mat", ["ingest", "fno"]),
                (FIXTURES / "2D_diff-react_NA_NA.h5", ["ingest", "pdebench"])]

    cases: list[Case] = []

    def ingest(name: str, sub: list[str], src: Path | str, bad_: bool | None, *extra: str, quick_: bool = False,
               planted: list[Path] | None = None, check: Callable[[Case], str] | None = None) -> None:
        out = outs / name
        cases.append(Case(name, [dd, *sub, str(src), "--out", str(out), "--no-progress", *extra], bad_, out,
                          verify=True, planted=planted or [], check=check, quick=quick_))

    # valid baselines: each source must ingest cleanly
    for key, src, sub in bases:
        ingest(f"valid-{key}", sub, src, None, quick_=key in ("fno5", "own"))

    # corruptions of each small raw file
    for key, src, sub in bases:
        size = src.stat().st_size
        d = bad / key
        for off in (0, 32, 512, 4096, size // 2, size - 1):
            if off < size:
                ingest(f"{key}-trunc{off}", sub, truncated(src, d / f"t{off}" / src.name, off), True,
                       quick_=(key == "pdebench" and off == 512))
        for at in (100, size // 2, size - 64):
            ingest(f"{key}-flip{at}", sub, flipped(src, d / f"f{at}" / src.name, at), None)
        for fmt, payload in (("png", PNG), ("json", b'{"u": [1, 2, 3]}'),
                             ("pickle", pickle.dumps({"u": np.zeros(3).tolist()}))):
            p = d / fmt / src.name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(payload)
            ingest(f"{key}-{fmt}", sub, p, True, quick_=(key == "fno73" and fmt == "pickle"))
        (d / "dir" / src.name).mkdir(parents=True, exist_ok=True)
        ingest(f"{key}-dir", sub, d / "dir" / src.name, True)
        link = d / "link" / src.name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(outside / "secret.txt")
        ingest(f"{key}-link-outside", sub, link, True, quick_=key == "own")
        if src.suffix in (".h5", ".hdf5", ".nc", ".mat") and h5py.is_hdf5(src):
            for how in ("extlink", "virtual", "external", "missing", "complex", "string", "flat", "allnan"):
                ingest(f"{key}-{how}", sub, h5_variant(src, d / how / src.name, how, outside),
                       True, quick_=(how in ("extlink", "virtual", "external") and key in ("pdebench", "fno73")))
            for how in ("int8", "nan", "inf", "attrs", "bigattr"):
                ingest(f"{key}-{how}", sub, h5_variant(src, d / how / src.name, how, outside), None,
                       check=_card_clean if how == "attrs" else None)

    # MAT v5 built wrong: missing u, u 1-D, u complex, u text
    for how, content in (("missing", {"a": np.zeros((2, 16, 16))}), ("flat", {"u": np.zeros(10)}),
                         ("complex", {"u": np.zeros((2, 16, 16, 4), np.complex64)}), ("text", {"u": "hello"}),
                         ("zero", {"u": np.zeros((0, 16, 16, 4))})):
        p = bad / "fno5mat" / how / v5.name
        p.parent.mkdir(parents=True, exist_ok=True)
        savemat(p, content)
        ingest(f"fno5-mat-{how}", ["ingest", "fno"], p, True)

    # the real-format fixtures, corrupted
    for src, sub in fixtures:
        if not src.exists():
            continue
        size = src.stat().st_size
        key = "fx-" + sub[1]
        for off in (0, 4096, size // 3, size - 1):
            ingest(f"{key}-trunc{off}", sub, truncated(src, bad / key / f"t{off}" / src.name, off), True,
                   quick_=(off == 4096 and sub[1] == "pdebench"))
        ingest(f"{key}-flip64", sub, flipped(src, bad / key / "f64" / src.name, 64), None)
        if h5py.is_hdf5(src):
            for how in ("extlink", "virtual", "external", "missing"):
                ingest(f"{key}-{how}", sub, h5_variant(src, bad / key / how / src.name, how, outside), True)

    # own data (xarray) built hostile: zero-length time, coords named x/y/sample on 2-D, NetCDF-3 cut to 32 bytes
    import xarray as xr
    own = bad / "own-x"
    own.mkdir(parents=True, exist_ok=True)
    xr.Dataset({"T": (("time", "y", "x"), np.zeros((0, 4, 5)))}).to_netcdf(own / "empty_time.nc")
    ingest("own-zero-time", ["ingest", "xarray"], own / "empty_time.nc", True, quick_=True)
    xr.Dataset({"T": (("a", "b"), np.zeros((4, 5)))},
               coords={"x": (("a", "b"), np.zeros((4, 5))), "y": (("a", "b"), np.zeros((4, 5))),
                       "sample": (("a", "b"), np.zeros((4, 5)))}).to_netcdf(own / "coords2d.nc")
    ingest("own-2d-coords-xy-sample", ["ingest", "xarray"], own / "coords2d.nc", None)
    xr.Dataset({"x": (("time", "y", "sample"), np.random.rand(3, 4, 5)),
                "sample": (("time",), np.arange(3.0))}).to_netcdf(own / "vars_named.nc")
    ingest("own-vars-named-x-sample", ["ingest", "xarray"], own / "vars_named.nc", None)
    xr.Dataset({"T": (("time", "y", "x"), np.random.rand(3, 4, 5))}).to_netcdf(own / "nc3.nc", format="NETCDF3_64BIT")
    truncated(own / "nc3.nc", own / "nc3_cut.nc", 32)
    ingest("own-netcdf3-cut32", ["ingest", "xarray"], own / "nc3_cut.nc", True, quick_=True)
    xr.Dataset({"T": (("time", "y", "x"), np.full((3, 4, 5), np.nan))}).to_netcdf(own / "allnan.nc")
    ingest("own-all-nan", ["ingest", "xarray"], own / "allnan.nc", True)
    xr.Dataset({"T": (("time", "y", "x"), np.random.rand(3, 4, 5)),
                }).assign_attrs(title="<script>x</script>").to_netcdf(own / "tiny.nc")
    ingest("own-1-sample-3-frames", ["ingest", "xarray"], own / "tiny.nc", None)
    np.save(own / "arr.npy", np.random.rand(2, 3, 4, 5).astype(np.float32))
    ingest("own-npy-no-axes", ["ingest", "xarray"], own / "arr.npy", None)
    ingest("own-npy-bad-axes", ["ingest", "xarray"], own / "arr.npy", True, "--axes", "q,q,q,q")
    (own / "obj.npy").write_bytes(b"\x93NUMPY\x01\x00v\x00{'descr': '|O', 'fortran_order': False, 'shape': (2,), }"
                                  + b" " * 50 + b"\n" + pickle.dumps([1, 2]))
    ingest("own-npy-object", ["ingest", "xarray"], own / "obj.npy", True)

    # The Well: a 100 kB dataset_name
    wb = bad / "well-name" / well_file.name
    _copy(well_file, wb)
    with h5py.File(wb, "r+") as f:
        f.attrs["dataset_name"] = "w" * 100_000
    ingest("well-100kB-dataset-name", ["ingest", "the-well"], wb, None, quick_=True)

    # options and paths
    ingest("opt-workers-minus3", ["ingest", "fno"], v5, True, "--workers", "-3", quick_=True)
    ingest("opt-resolution-x", ["ingest", "fno"], v5, True, "--resolution", "abc")
    ingest("opt-split-2", ["ingest", "fno"], v5, True, "--split", "2")
    ingest("opt-shard-size-0", ["ingest", "fno"], v5, True, "--shard-size", "0")
    ingest("opt-name-slash", ["ingest", "fno"], v5, True, "--name", "../../evil")
    ingest("opt-channels-0", ["ingest", "fno"], v5, True, "--channels", "0")
    ingest("missing-local-url", ["ingest", "fno"], f"local://{base}/nope/NavierStokes_V1e-3_N2_T4.mat", True,
           quick_=True)
    ingest("missing-file", ["ingest", "fno"], base / "nope.mat", True)
    ingest("hub-offline", ["ingest", "auto"], "hf://datasets/nobody/nothing/x.h5", True)

    # a valid output, a checkpoint and an eval.json for the train-side cases
    files = synth_fno(raw / "fno32", n=4, frames=13, viscosity=1e-3, seed=0, resolution=32)
    shards = base / "shards"
    ingest_files("fno", [files[0]], shards, IngestOptions(resolution=32, split=(0.5, 0.25), seed=0))
    ck = base / "ck.pt"
    torch.manual_seed(0)
    torch.save(checkpoint_payload(build_model("tiny", img_size=32), step=1), ck)
    ev = base / "evals" / "eval.json"
    ev.parent.mkdir()
    ev.write_text(json.dumps(_eval_doc()))
    user = prot / "notes.txt"
    user.write_text("the user's own notes\n")
    fifo = prot / "fifo"
    os.mkfifo(fifo)
    dev = prot / "null-dev"
    if os.geteuid() == 0:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    nodes = [fifo] + ([dev] if dev.exists() else [])
    keep = [shards, user, *nodes]

    def train(name: str, args: list[str], bad_: bool | None, out: Path | None, quick_: bool = False,
              check: Callable[[Case], str] | None = None, timeout: float = 120.0) -> None:
        cases.append(Case(name, [dt, *args], bad_, out, planted=keep, check=check, quick=quick_, timeout=timeout))

    evargs = ["--manifest", str(shards), "--recipe", "dpot", "--rollout-steps", "2", "--device", "cpu"]
    # 1: predictions over the dataset's store
    train("evaluate-predictions-over-dataset", ["evaluate", str(ck), *evargs, "--out", str(outs / "e1.json"),
                                                "--predictions", str(shards / "data.zarr")], True, outs / "e1.json",
          quick_=True)
    # 2: report / model export onto a FIFO or a device
    for node in nodes:
        train(f"report-out-{node.name}", ["report", str(ev), "--out", str(node)], True, None, quick_=True)
        train(f"export-out-{node.name}", ["model", "export", str(ck), "--out", str(node)], True, None)
        train(f"export-safetensors-{node.name}", ["model", "export", str(ck), "--out", str(node), "--format",
                                                  "safetensors"], True, None)
    train("report-out-user-dir", ["report", str(ev), "--out", str(prot)], True, None)
    train("export-out-dataset", ["model", "export", str(ck), "--out", str(shards / "data.zarr")], True, None)
    train("export-out-inside-dataset", ["model", "export", str(ck), "--out", str(shards / "w.pt")], True,
          shards / "w.pt")
    train("export-out-link", ["model", "export", str(ck), "--out", str(_link(outs / "exp-link.pt", user))], True,
          None)
    train("export-safetensors-ok", ["model", "export", str(ck), "--out", str(outs / "w.safetensors")], None,
          outs / "w.safetensors", check=_safetensors_ok)
    # 4, 5, 11, 14: report of hostile eval.json files
    for tag, doc in _hostile_evals(outside).items():
        p = base / "evals" / f"{tag}.json"
        p.write_text(json.dumps(doc))
        out = outs / f"report-{tag}.md"
        train(f"report-{tag}", ["report", str(p), "--out", str(out)],
              True if tag in ("schema99", "no-datasets", "not-json", "list") else None, out, check=_report_clean,
              quick_=tag in ("plots-secret", "inject"))
    (base / "evals" / "not-json.json").write_text("{nope")
    train("report-not-json", ["report", str(base / "evals" / "not-json.json"), "--out", str(outs / "nj.md")], True,
          outs / "nj.md")
    train("report-out-txt", ["report", str(ev), "--out", str(outs / "r.txt")], True, outs / "r.txt")
    train("report-missing", ["report", str(base / "nope.json"), "--out", str(outs / "rm.md")], True, outs / "rm.md")
    # 6: --plot folder with a link and a user file named like a plot; --predictions LINK
    plot = base / "plotdir"
    plot.mkdir()
    ds_name = json.loads((shards / "manifest.json").read_text())["datasets"][0]["name"] \
        if isinstance(json.loads((shards / "manifest.json").read_text()).get("datasets"), list) else "fno"
    _link(plot / f"{ds_name}_fields.png", user)
    (plot / f"{ds_name}_error.png").write_bytes(PNG)
    keep_plot = keep + [plot / f"{ds_name}_error.png"]
    cases.append(Case("evaluate-plot-link-and-user-file",
                      [dt, "evaluate", str(ck), *evargs, "--out", str(outs / "e6.json"), "--plot", str(plot),
                       "--max-trajectories", "1"], True, outs / "e6.json", planted=keep_plot, timeout=180))
    cases.append(Case("evaluate-predictions-link",
                      [dt, "evaluate", str(ck), *evargs, "--out", str(outs / "e7.json"), "--predictions",
                       str(_link(outs / "pred-link.zarr", prot))], True, outs / "e7.json", planted=keep))
    train("evaluate-plot-existing-file", ["evaluate", str(ck), *evargs, "--out", str(outs / "e8.json"), "--plot",
                                          str(user)], True, outs / "e8.json", quick_=True)
    # 9: damaged checkpoints
    bad_ck = bad / "ckpt"
    bad_ck.mkdir()
    truncated(ck, bad_ck / "cut.pt", ck.stat().st_size // 2)
    (bad_ck / "zero.pt").write_bytes(b"")
    (bad_ck / "json.pt").write_text('{"model": {}}')
    (bad_ck / "evil.pt").write_bytes(pickle.dumps(_Evil(str(base / "PWNED"))))
    torch.save({"model": {"nope": torch.zeros(3)}}, bad_ck / "wrongkeys.pt")
    for p in sorted(bad_ck.iterdir()):
        train(f"evaluate-ckpt-{p.stem}", ["evaluate", str(p), *evargs, "--out", str(outs / f"e-{p.stem}.json")],
              True, outs / f"e-{p.stem}.json", quick_=p.stem == "evil")
        train(f"export-ckpt-{p.stem}", ["model", "export", str(p), "--out", str(outs / f"x-{p.stem}.pt")], True,
              outs / f"x-{p.stem}.pt")
    run_dir = base / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    truncated(ck, run_dir / "checkpoints" / "best.pt", 1000)
    (run_dir / "checkpoints" / "best.json").write_text("{garbage")
    train("evaluate-damaged-best", ["evaluate", str(run_dir / "checkpoints" / "best.pt"), *evargs, "--out",
                                    str(outs / "e9.json")], True, outs / "e9.json")
    train("model-info-damaged-best", ["model", "info", str(run_dir / "checkpoints" / "best.pt")], True, None)
    # 10: card / inspect / verify on wrong things
    cases.append(Case("card-on-manifest-file", [dd, "card", str(shards / "manifest.json")], True, None,
                      planted=keep, quick=True))
    cases.append(Case("verify-on-user-file", [dd, "verify", str(user)], True, None, planted=keep, refuse_rc=1))
    cases.append(Case("inspect-on-fifo", [dd, "inspect", str(fifo)], True, None, planted=keep, timeout=30))
    cases.append(Case("verify-on-raw-h5", [dd, "verify", str(dr)], True, None, planted=keep, refuse_rc=1))
    cases.append(Case("card-on-empty-dir", [dd, "card", str(_mkdir(outs / "empty-card"))], True, None,
                      planted=keep))
    cases.append(Case("preview-out-fifo", [dt, "preview", "--manifest", str(shards), "--out", str(fifo)], True, None,
                      planted=keep))
    # open_dataset with hostile arguments
    for tag, kw in (("res100000", "res=100000"), ("t_in-3", "t_in=-3"), ("seed-x", "seed='x'"),
                    ("t_in0", "t_in=0"), ("split-nope", "split='nope'"), ("t_out0", "t_out=0"),
                    ("mixture-bad", "mixture='nope:1'")):
        code = (f"import sys\nfrom dpot_train.api import open_dataset\n"
                f"try:\n    ds = open_dataset({str(shards)!r}, {kw})\n    next(iter(ds))\n"
                f"except (ValueError, TypeError, OSError) as e:\n"
                f"    print('error: ' + str(e).splitlines()[0] if str(e) else 'error: ' + type(e).__name__,"
                f" file=sys.stderr); sys.exit(2)\n")
        cases.append(Case(f"open_dataset-{tag}", [sys.executable, "-c", code], True, None, planted=keep,
                          quick=tag in ("res100000", "seed-x")))
    # 8: a killed ingest leaves nothing once the same command runs again
    cases.append(Case("ingest-killed-then-rerun", [sys.executable, "-c", _KILL_RERUN.format(
        dd=dd, src=str(v73), out=str(outs / "killed"))], None, outs / "killed", verify=True, planted=keep,
        timeout=180))
    if quick:
        cases = [c for c in cases if c.quick]
    return cases


_KILL_RERUN = """
import os, signal, subprocess, sys, time
cmd = [{dd!r}, 'ingest', 'fno', {src!r}, '--out', {out!r}, '--no-progress']
p = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(2.5)
os.killpg(p.pid, signal.SIGKILL); p.wait()
r = subprocess.run(cmd, capture_output=True, text=True)
sys.stderr.write(r.stderr); sys.exit(r.returncode)
"""


class _Evil:
    """A pickle that creates a file when loaded: a checkpoint must never be unpickled without --trust."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # noqa: ANN204
        return (open, (self.path, "w"))


def _link(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _eval_doc(name: str = "fno-ns-v1e-3", **extra: object) -> dict:
    doc = {"schema": "dpot-eval/2", "split": "test", "t_in": 10, "recipe": "dpot", "datasets": {
        name: {"trajectories": 2, "rollout_steps": 2,
               "model": {"rollout_l2re": 0.1, "one_step_l2re": 0.05, "l2re_per_step": [0.05, 0.1]},
               "persistence": {"rollout_l2re": 0.2, "one_step_l2re": 0.1}}}}
    doc.update(extra)
    return doc


def _hostile_evals(outside: Path) -> dict[str, object]:
    return {
        "plots-secret": _eval_doc(plots=[str(outside / "secret.txt")]),
        "plots-secret-map": _eval_doc(plots={"fno-ns-v1e-3": [str(outside / "secret.txt"),
                                                              "../../outside/secret.h5"]}),
        "plots-relative-secret": _eval_doc(plots=["../outside/secret.txt"]),
        "inject": _eval_doc("<script>alert(1)</script>|x\n# owned"),
        "inject-recipe": _eval_doc(recipe="<img src=x onerror=alert(1)>|\n# owned"),
        "schema99": _eval_doc(schema="dpot-eval/99"),
        "no-datasets": {"schema": "dpot-eval/2"},
        "list": [1, 2, 3],
        "nan-values": json.loads(json.dumps(_eval_doc()).replace("0.1,", "NaN,")),
    }


def _report_clean(case: Case) -> str:
    """A report holds no raw HTML tag, no injected heading line, and no absolute path of this run's folder."""
    if case.out is None or not case.out.exists():
        return ""
    text = case.out.read_text(errors="replace")
    if "<script" in text or "<img" in text:
        return f"{case.out}: raw HTML from the eval.json"
    if any(ln.startswith("# owned") for ln in text.splitlines()):
        return f"{case.out}: a heading injected by a dataset name"
    src = Path(case.cmd[2])  # the eval.json: a path it holds itself may be quoted back
    if str(case.out.parents[1]) in text and str(case.out.parents[1]) not in src.read_text(errors="replace"):
        return f"{case.out}: holds an absolute path"
    return ""


def _card_clean(case: Case) -> str:
    """After a clean ingest of hostile attributes, `dpot-data card` writes a card without raw HTML or headings."""
    if case.out is None or not (case.out / "manifest.json").exists():
        return ""
    r = subprocess.run([str(BIN / "dpot-data"), "card", str(case.out)], capture_output=True, text=True)
    if "Traceback" in r.stderr:
        return "card: " + _tail(r.stderr)
    card = case.out / "README.md"
    if r.returncode == 0 and card.exists():
        text = card.read_text()
        if "<script" in text:
            return f"{card}: raw <script> from an attribute"
        if any(ln.startswith("# heading") for ln in text.splitlines()):
            return f"{card}: a heading injected by an attribute"
        if str(case.out.parent.parent) in text:
            return f"{card}: holds an absolute path"
    # the card is not part of the check of the data itself
    card.unlink(missing_ok=True)
    shutil.rmtree(case.out / "card", ignore_errors=True)
    return ""


def _safetensors_ok(case: Case) -> str:
    from safetensors.numpy import load_file
    try:
        tensors = load_file(str(case.out))
    except Exception as e:  # noqa: BLE001
        return f"{case.out}: not readable as safetensors ({e})"
    return "" if tensors else f"{case.out}: no tensors"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="a new folder of this run's own")
    ap.add_argument("--quick", action="store_true", help="a small subset (for the test suite)")
    ap.add_argument("--only", default="", help="comma-separated case names: run only these (a rerun of findings)")
    args = ap.parse_args(argv)
    base = args.out.resolve()
    if base.exists() and any(base.iterdir()):
        ap.error(f"--out {base}: expected a new or empty folder")
    base.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1", NO_COLOR="1", COLUMNS="200",
               OMP_NUM_THREADS="1")
    t0 = time.monotonic()
    cases = build(base, args.quick)
    if args.only:
        cases = [c for c in cases if c.name in set(args.only.split(","))]
    print(f"{len(cases)} cases built in {time.monotonic() - t0:.0f} s", flush=True)
    counts: Counter[str] = Counter()
    bad: list[dict] = []
    for i, case in enumerate(cases, 1):
        kind, detail = run_case(case, base, env)
        if (base / "PWNED").exists():
            kind, detail = "outside write", f"{base / 'PWNED'} created (a pickle was loaded)"
            (base / "PWNED").unlink()
        counts[kind] += 1
        print(f"[{i:3d}/{len(cases)}] {kind:16s} {case.name}: {detail}", flush=True)
        if kind not in ("refused", "ingested", "ok"):
            bad.append({"case": case.name, "kind": kind, "cmd": " ".join(case.cmd)[:400], "detail": detail})
    print("\n| outcome | cases |\n|---|---|")
    for k in KINDS:
        print(f"| {k} | {counts.get(k, 0)} |")
    result = {"cases": len(cases), "counts": {k: counts.get(k, 0) for k in KINDS}, "not_clean": bad,
              "seconds": round(time.monotonic() - t0, 1)}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
