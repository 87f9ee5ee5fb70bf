"""Ingest failures where data was lost or left behind: concurrent and repeated ingests into one URL, a folder holding
the user's own files, leftovers of killed runs, and inputs that are not files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.errors import InputError
from dpot_data.ingest import IngestOptions, run_ingest
from dpot_format.manifest import read_manifest
from dpot_format.validate import validate_output
from tests.toy_output import write_fno_raw

ROOT = Path(__file__).resolve().parents[1]


def _opts(**kw) -> IngestOptions:
    return IngestOptions(**{"resolution": 0, "shard_size": 60_000, "workers": 1, "command": "test", **kw})


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    return write_fno_raw(tmp_path_factory.mktemp("raw"), n=4, res=16, frames=4)


def _names(manifest: dict) -> list[str]:
    return [d["name"] for d in manifest["datasets"]]


_PAUSED = textwrap.dedent("""
    import os, sys, time
    import dpot_data.fs as fs
    from dpot_data.ingest import IngestOptions, run_ingest

    raw, url, name, flag, go = sys.argv[1:6]
    real = fs.upload_tree

    def upload_tree(*a, **k):  # the upload waits until the test says go
        open(flag, "w").close()
        while not os.path.exists(go):
            time.sleep(0.05)
        return real(*a, **k)

    fs.upload_tree = upload_tree  # the module attribute every upload goes through
    run_ingest("fno", [raw], url, IngestOptions(resolution=0, shard_size=60_000, workers=1, command="test",
                                                 name=name, overwrite="--overwrite" in sys.argv))
    print("wrote", name)
""")


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_second_ingest_into_a_url_being_uploaded_is_refused(raw: Path, tmp_path: Path, overwrite: bool) -> None:
    """Failure 1: while one ingest uploads into `local://DIR`, a second one into the same URL is refused with one
    line (with --overwrite on both too); the first completes and the URL holds its dataset, whole."""
    url = f"local://{tmp_path}/out"
    script, flag, go = tmp_path / "paused.py", tmp_path / "uploading", tmp_path / "go"
    script.write_text(_PAUSED)
    extra = ["--overwrite"] if overwrite else []
    first = subprocess.Popen([sys.executable, str(script), str(raw), url, "first", str(flag), str(go), *extra],
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read() if first.stdout else ""
            time.sleep(0.05)
        result = CliRunner().invoke(app, ["ingest", "fno", str(raw), "--out", url, "--resolution", "0", "--name",
                                          "second", "--no-progress", *extra])
        assert result.exit_code == 2, result.output
        errors = [x for x in result.output.splitlines() if x.startswith("error:")]
        assert errors == [f"error: {url}: another ingest is writing into this folder; wait for it to finish (or "
                          "choose another --out)"], result.output
    finally:
        go.touch()
        out, _ = first.communicate(timeout=300)
    assert first.returncode == 0 and "wrote first" in out, out
    assert _names(read_manifest(url)) == ["first"]
    assert validate_output(url) == []


def test_a_manifest_committed_at_the_url_during_the_upload_is_never_replaced(raw: Path, tmp_path: Path,
                                                                             monkeypatch) -> None:
    """Failure 1, the check before the commit: another writer (another machine) commits a manifest at the URL while
    this ingest uploads: this one is refused with one line and the other's output stays, complete."""
    import dpot_data.fs as fs
    from dpot_data.ingest.publish import relocated

    other = tmp_path / "other"
    theirs = run_ingest("fno", [raw], other, _opts(name="theirs")).manifest
    url, dest = f"local://{tmp_path}/out", tmp_path / "out"
    real = fs.upload_tree

    def other_commits_then_upload(local, target, *a, **k):
        if not (dest / "manifest.json").exists():  # the other writer, under folder names of its own
            names = {"data.zarr": "data.7.zarr", "shards": "shards.7"}
            dest.mkdir(exist_ok=True)
            for old, new in names.items():
                os.rename(other / old, dest / new)
            doc = {**theirs, "datasets": [relocated(e, names) for e in theirs["datasets"]]}
            (dest / "manifest.json").write_text(json.dumps(doc))
        return real(local, target, *a, **k)

    monkeypatch.setattr(fs, "upload_tree", other_commits_then_upload)
    with pytest.raises(InputError, match="now holds a manifest that this ingest did not see"):
        run_ingest("fno", [raw], url, _opts(name="mine"), workdir=tmp_path / "work")
    assert _names(read_manifest(url)) == ["theirs"]
    assert not [p for p in validate_output(url) if p.fatal]


def test_an_ingest_into_a_folder_of_the_users_files_removes_none_of_them(raw: Path, tmp_path: Path) -> None:
    """Failure 2: files and folders of the user's in OUT, whatever their names, are left as they were."""
    out = tmp_path / "U"
    theirs = {"data.zarr/mine/a.txt": b"a", "shards/b.txt": b"b", "shards.2/c.txt": b"c", "movie.mkv.part": b"m",
              ".vimrc.tmp": b"v", "results.partial": b"r", ".staging-notes/n.txt": b"n"}
    for rel, data in theirs.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    first = run_ingest("fno", [raw], out, _opts())
    again = run_ingest("fno", [raw], out, _opts(overwrite=True, split=(0.5,)))
    assert first.written and again.written
    assert {rel: (out / rel).read_bytes() for rel in theirs} == theirs
    entry = again.manifest["datasets"][0]
    assert entry["zarr"]["path"] not in ("data.zarr",) and not entry["shards"][0]["path"].startswith("shards/")
    assert not [p for p in validate_output(str(out)) if p.fatal]


def test_a_url_output_takes_another_job_after_a_cut_upload(raw: Path, tmp_path: Path, monkeypatch) -> None:
    """Failure 3: an upload cut short after the local output was complete; another job into the same URL (another
    name, another resolution) ingests its own data instead of uploading the first job's output."""
    import dpot_data.fs as fs

    url = f"local://{tmp_path}/out"
    real = fs.upload_tree

    def cut(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(fs, "upload_tree", cut)
    with pytest.raises(KeyboardInterrupt):
        run_ingest("fno", [raw], url, _opts(name="first"))
    monkeypatch.setattr(fs, "upload_tree", real)
    outcome = run_ingest("fno", [raw], url, _opts(name="second", resolution=8))
    assert outcome.written
    manifest = read_manifest(url)
    assert _names(manifest) == ["second"] and manifest["datasets"][0]["grid"]["shape"] == [8, 8]
    assert validate_output(url) == []
    from dpot_data.ingest.job import url_key, work_root

    assert not (work_root() / url_key(url)).exists()  # the cut job's working folder went with the URL's next job


def test_a_url_output_and_a_local_folder_treat_a_second_dataset_alike(raw: Path, tmp_path: Path) -> None:
    """Failure 3: the same job again leaves a complete output alone, at a URL exactly as in a local folder; another
    job (other inputs, another --name or --resolution) is refused in one line instead of being told "kept", and
    --overwrite replaces the output."""
    other = write_fno_raw(tmp_path / "other", n=4, res=16, frames=4, seed=8)  # same name, other bytes: another input
    url, local = f"local://{tmp_path}/url", tmp_path / "local"
    for out in (url, local):
        run_ingest("fno", [raw], out, _opts(name="first"))
        kept = run_ingest("fno", [raw], out, _opts(name="first"))
        assert not kept.written and "left alone" in kept.notes[0]
        for paths, opts, why in (([other], _opts(name="first"), "made from other inputs than"),
                                 ([raw], _opts(name="second"), "not the dataset --name second"),
                                 ([raw], _opts(name="first", resolution=8), "not the 8x8 that --resolution 8")):
            with pytest.raises(InputError, match=f"holds first.*{why}.*choose another --out.*--overwrite"):
                run_ingest("fno", paths, out, opts)
        assert run_ingest("fno", [raw], out, _opts(name="second", overwrite=True)).written
    assert _names(read_manifest(url)) == _names(read_manifest(str(local))) == ["second"]
    line = CliRunner().invoke(app, ["ingest", "fno", str(other), "--out", str(local), "--no-progress"])
    assert line.exit_code == 2 and line.output.count("\n") == 1 and "holds second" in line.output


_KILL_AFTER_COMMIT = textwrap.dedent("""
    import os, signal, sys
    import dpot_data.ingest.publish as pub
    from dpot_data.ingest import IngestOptions, run_ingest

    real = pub.mf.write
    def write(*a, **k):
        real(*a, **k)
        os.kill(os.getpid(), signal.SIGKILL)

    pub.mf.write = write
    run_ingest("fno", [sys.argv[1]], sys.argv[2], IngestOptions(resolution=0, shard_size=60_000, workers=1,
                                                                 command="test"))
""")


def test_a_kill_right_after_the_commit_leaves_nothing_a_rerun_does_not_clean(raw: Path, tmp_path: Path) -> None:
    """Failure 8: killed right after the manifest's rename, the lock file and the staging folder stay; the same
    command run again leaves the output alone and removes both."""
    out = tmp_path / "out"
    script = tmp_path / "kill.py"
    script.write_text(_KILL_AFTER_COMMIT)
    proc = subprocess.run([sys.executable, str(script), str(raw), str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert (out / ".dpot-ingest.lock").exists() and list(out.glob(".staging-*"))  # what the kill left
    again = run_ingest("fno", [raw], out, _opts())
    assert not again.written
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["datasets"][0]
    tops = {entry["zarr"]["path"], *(s["path"].split("/", 1)[0] for s in entry["shards"])}
    assert sorted(p.name for p in out.iterdir()) == sorted({"manifest.json", *tops})
    assert validate_output(str(out)) == []


def test_inflated_mat_variables_of_a_dead_process_are_reclaimed(tmp_path: Path, monkeypatch) -> None:
    """Failure 8: a kill while a compressed MAT v5 file is open leaves its inflated `u` in the temporary folder; the
    next read removes files of processes no longer alive and keeps those of live ones."""
    import scipy.io
    import tempfile

    from dpot_data.ingest import read_source

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale, live = tmp / f"dpot-mat5-{dead.pid}-abc.bin", tmp / f"dpot-mat5-{os.getppid()}-def.bin"
    stale.write_bytes(b"\0" * 1000)
    live.write_bytes(b"\0" * 10)
    rng = np.random.default_rng(0)
    path = tmp_path / "NavierStokes_V1e-3_N2_T3.mat"
    scipy.io.savemat(path, {"a": rng.random((2, 8, 8), dtype=np.float32), "u": rng.random((2, 8, 8, 3),
                     dtype=np.float32), "t": np.arange(1, 4, dtype=np.float32)[None]}, format="5",
                     do_compression=True, oned_as="row")
    result = read_source("fno", [path])
    assert result.data["fields"].shape[:2] == (2, 3)
    assert not stale.exists() and live.exists()


@pytest.mark.parametrize("kind", ["loop", "device", "dangling"])
def test_inputs_that_are_not_files_are_one_line_naming_the_path_given(tmp_path: Path, kind: str) -> None:
    """Failures 10 and 11: a symbolic link loop, a link to /dev/zero, a dangling link: one line naming the path the
    user gave (not the link's target), exit code 2, nothing written."""
    link = tmp_path / "NavierStokes_V1e-3_N2_T3.mat"
    if kind == "loop":
        os.symlink(tmp_path / "other.mat", link)
        os.symlink(link, tmp_path / "other.mat")
    else:
        os.symlink("/dev/zero" if kind == "device" else tmp_path / "gone.mat", link)
    out = tmp_path / "out"
    for source in (["fno"], []):
        result = CliRunner().invoke(app, ["ingest", *source, str(link), "--out", str(out), "--no-progress"])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        expected = {"loop": "is a symbolic link loop, expected a file",
                    "device": "is a character device, expected a regular file",
                    "dangling": "is a dangling symbolic link, expected a file"}[kind]
        assert result.output.strip().splitlines()[-1] == f"error: {link}: {expected}", result.output
    assert not out.exists()


def test_out_naming_a_file_or_a_lock_that_is_a_folder_is_one_line(raw: Path, tmp_path: Path) -> None:
    """Failure 10: `--out` naming an existing file, and the output's lock path a folder: one line, exit code 2."""
    file = tmp_path / "file.txt"
    file.write_text("mine")
    result = CliRunner().invoke(app, ["ingest", "fno", str(raw), "--out", str(file), "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.strip().splitlines()[-1] == (f"error: {file}: is a file, expected an output folder (or a "
                                                      "path that does not exist yet)")
    assert file.read_text() == "mine"
    out = tmp_path / "out"
    (out / ".dpot-ingest.lock").mkdir(parents=True)
    result = CliRunner().invoke(app, ["ingest", "fno", str(raw), "--out", str(out), "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert result.output.strip().splitlines()[-1].startswith(f"error: {out / '.dpot-ingest.lock'}: is a directory")
    assert sorted(p.name for p in out.iterdir()) == [".dpot-ingest.lock"]


def _fno_file(folder: Path, x: int, y: int, frames: int) -> Path:
    from dpot_data.synth.fno import write_mat_v5

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"NavierStokes_V1e-3_N2_T{frames}.mat"
    t = np.arange(1, frames + 1, dtype=np.float32)[None, :]
    write_mat_v5(path, np.zeros((2, x, y), np.float32), np.zeros((2, x, y, frames), np.float32), t)
    return path


@pytest.mark.parametrize("shape, expected", [
    ((8200, 2), "cells along an axis 8200 is more than the limit of 8192"),
    ((8, 0), "expected at least one cell along every axis, got [0, 8]")])  # stored (y, x)
def test_a_grid_the_format_refuses_is_refused_before_anything_is_written(tmp_path: Path, shape, expected) -> None:
    """The format's limits are checked when the ingest is planned: a native grid above the limit, or an empty one,
    is one line and exit code 2, and OUT is not created (it was published, then a FormatError traceback)."""
    path = _fno_file(tmp_path / "raw", *shape, frames=2)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["ingest", "fno", str(path), "--out", str(out), "--resolution", "0",
                                      "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: {path}: the output would break the format's limits: ") and expected in last
    assert not out.exists()


def test_a_full_disk_while_copying_a_url_input_in_is_one_line(raw: Path, tmp_path: Path, monkeypatch) -> None:
    """Failure 10: the local copy of a URL input fills the disk: one line naming the output, nothing written."""
    import errno

    import dpot_data.fs as fs

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fs, "localize", full)
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"no space left on the device \(No space left on device\)"):
        run_ingest("fno", [f"memory://in-{tmp_path.name}/{raw.name}"], out, _opts())
    assert not out.exists()


def _ingest_line(paths: list[Path], source: str, out: Path) -> str:
    """Run `dpot-data ingest SOURCE PATHS`: it must fail with exit code 2 and one error line, writing nothing."""
    result = CliRunner().invoke(app, ["ingest", source, *map(str, paths), "--out", str(out), "--resolution", "0",
                                      "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert not out.exists()
    return [x for x in result.output.strip().splitlines() if x.startswith("error:")][-1]


@pytest.mark.parametrize("case", ["u-int32", "u-bool", "t-length"])
def test_fno_values_that_are_not_the_published_layout_are_refused(tmp_path: Path, case: str) -> None:
    """Failure 11: FNO `u` of integers or logicals, `t` not one time per frame: one line naming the file."""
    import scipy.io

    rng = np.random.default_rng(0)
    u = rng.random((2, 8, 8, 3), dtype=np.float32)
    t = np.arange(1, 4, dtype=np.float32)[None]
    if case == "u-int32":
        u = (u * 100).astype(np.int32)
    elif case == "u-bool":
        u = u > 0.5
    else:
        t = np.arange(1, 6, dtype=np.float32)[None]
    path = tmp_path / "NavierStokes_V1e-3_N2_T3.mat"
    scipy.io.savemat(path, {"a": rng.random((2, 8, 8), dtype=np.float32), "u": u, "t": t}, format="5",
                     oned_as="row")
    line = _ingest_line([path], "fno", tmp_path / "out")
    expected = {"u-int32": "expected 'u' of floating-point values (single or double), found int32",
                "u-bool": "expected 'u' of floating-point values (single or double), found uint8",
                "t-length": "expected 't' to hold one time per frame of 'u' (3), found shape (1, 5)"}[case]
    assert line == f"error: {path}: {expected}"


def test_a_cns_coordinate_of_the_wrong_length_and_a_text_mach_number_are_refused(tmp_path: Path) -> None:
    """Failures 10 and 11: PDEBench CNS with an `x-coordinate` of another length than the grid, or an attribute
    `M` that is text: one line naming the file and the key."""
    import h5py

    from dpot_data.synth.pdebench import write_cfd

    path = write_cfd(tmp_path / "a", n=2, frames=3, res=8)
    with h5py.File(path, "r+") as f:
        del f["x-coordinate"]
        f["x-coordinate"] = np.linspace(0, 1, 5)
    line = _ingest_line([path], "pdebench", tmp_path / "out")
    assert line == f"error: {path}: 'x-coordinate': expected 8 coordinates (one per cell along x), found (5,)"
    path = write_cfd(tmp_path / "b", n=2, frames=3, res=8)
    with h5py.File(path, "r+") as f:
        f.attrs["M"] = "fast"
    line = _ingest_line([path], "pdebench", tmp_path / "out")
    assert line == f"error: {path}: attribute 'M': expected a number, found 'fast'"


def test_pdearena_buo_y_as_bytes_is_one_line(tmp_path: Path) -> None:
    """Failure 10: a PDEArena file whose `buo_y` holds bytes: one line naming the file and the key."""
    import h5py

    from dpot_data.synth.pdearena import write_ns

    path = write_ns(tmp_path / "raw", split="test", seed=0, buo_y=0.5, n=2, frames=4, res=8)
    with h5py.File(path, "r+") as f:
        del f["test/buo_y"]
        f["test/buo_y"] = np.array([b"0.5", b"0.5"])
    line = _ingest_line([path], "pdearena", tmp_path / "out")
    assert line == f"error: {path}: test/buo_y: expected numbers, found |S3"


def test_a_case_json_nested_deeper_than_the_parser_goes_is_one_line(tmp_path: Path) -> None:
    """Failure 10: a CFDBench `case.json` nested 100 000 deep is an unreadable case, not a RecursionError."""
    from dpot_data.synth.cfdbench import write_cfdbench

    folders = write_cfdbench(tmp_path / "raw", problems=("cavity",), cases=1, frames=(4, 4), res=8)
    (folders[0] / "case.json").write_text("[" * 100_000 + "]" * 100_000)
    line = _ingest_line([tmp_path / "raw"], "cfdbench", tmp_path / "out")
    assert "case.json is unreadable" in line and "maximum recursion depth" in line


def test_a_nonfinite_fill_is_refused_before_reading(raw: Path, tmp_path: Path) -> None:
    """Failure 11: `--fill nan` would write a manifest whose fill_value is NaN; refused as an option."""
    result = CliRunner().invoke(app, ["ingest", "fno", str(raw), "--out", str(tmp_path / "out"), "--fill", "nan",
                                      "--no-progress"])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1] == (
        "error: --fill: expected a finite value for padded channels, got nan")
    assert not (tmp_path / "out").exists()


def test_a_manifest_with_a_nan_fill_value_or_linked_from_outside_is_refused(raw: Path, tmp_path: Path) -> None:
    """Failure 11: the format refuses a manifest whose fill_value is NaN, and a manifest.json that is a symbolic
    link to a file outside its folder (every path the manifest names is already held to that rule)."""
    from dpot_format.errors import FormatError

    out = tmp_path / "out"
    run_ingest("fno", [raw], out, _opts())
    text = (out / "manifest.json").read_text()
    doc = json.loads(text)
    doc["datasets"][0]["fill_value"] = float("nan")
    (out / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"datasets/0/fill_value: nan is not a finite number"):
        read_manifest(str(out))
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(text)
    (out / "manifest.json").unlink()
    (out / "manifest.json").symlink_to(elsewhere)
    with pytest.raises(FormatError, match="is a symbolic link to .*elsewhere.json, outside the output folder"):
        read_manifest(str(out))


@pytest.mark.parametrize("offset, bit", [(16, 7), (19, 0), (25, 7)])
def test_a_bit_flip_in_an_hdf5_header_is_one_line(tmp_path: Path, offset: int, bit: int) -> None:
    """Failure 10: a flipped bit in the superblock of a PDEBench file (h5py raises RuntimeError, not OSError,
    for some): one line naming the file, exit code 2."""
    from dpot_data.synth.pdebench import write_diff_react

    path = write_diff_react(tmp_path / "raw", n=2, frames=3, res=8)
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))
    line = _ingest_line([path], "pdebench", tmp_path / "out")
    assert line.startswith(f"error: {path}: ") and "HDF5" in line, line
