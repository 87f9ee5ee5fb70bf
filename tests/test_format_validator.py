"""dpot_format's validator and readers refuse what docs/format.md does not allow, naming the file, member or array:
paths leaving the output folder, odd tar members, lying .npy headers, absurd sizes, unreadable manifests, corrupted
Zarr chunks. Both sides (`dpot-data verify` / `inspect` and dpot_train's reading) refuse the same things."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_format.errors import FormatError
from dpot_format.manifest import read_manifest
from dpot_format.tar import iter_samples
from dpot_format.validate import Problem, validate_output
from dpot_train.data.datasets import DataError, read_manifests, verify_shards
from dpot_train.data.readers import WebDatasetReader
from tests import train_runs
from tests.toy_output import toy_arrays, write_toy_output

VALID = "shards/toy/valid-000000.tar"  # the toy output's valid split: one sample, trajectory 2
TRAIN = "shards/toy/train-000000.tar"
ROOT = Path(__file__).resolve().parents[1]

# every file this process opens while `_OPENED` is a list (os.open and open() both raise the "open" audit event)
_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_audit)


class _Recording:
    """Context: the paths opened inside it."""

    def __enter__(self) -> list[str]:
        global _OPENED
        _OPENED = []
        return _OPENED

    def __exit__(self, *exc: object) -> None:
        global _OPENED
        _OPENED = None


def _manifest(root: Path) -> dict[str, Any]:
    return json.loads((root / "manifest.json").read_text())


def _write_manifest(root: Path, doc: dict[str, Any]) -> None:
    (root / "manifest.json").write_text(json.dumps(doc))  # raw: the point is a manifest the writer would refuse


def _set_shard(root: Path, rel: str, data: bytes) -> None:
    """Replace a shard's bytes and make the manifest agree (sha256 and size), so only the content is wrong."""
    (root / rel).write_bytes(data)
    doc = _manifest(root)
    for shard in doc["datasets"][0]["shards"]:
        if shard["path"] == rel:
            shard["sha256"], shard["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    _write_manifest(root, doc)


def _npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """A .npy 1.0 header declaring anything (the data after it is up to the caller)."""
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def _member(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 5
    return info, data


def _tar(members: list[tuple]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for info, data in members:
            if data is None:
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _sample2(fields: bytes | None = None) -> dict[str, bytes]:
    """The members of the toy output's valid trajectory (index 2), fields replaceable."""
    f, m = toy_arrays()
    meta = {"id": "toy#2", "dataset": "toy", "split": "valid", "index": 2}
    return {"s0000002.fields.npy": _npy(f[2]) if fields is None else fields, "s0000002.mask.npy": _npy(m[2]),
            "s0000002.meta.json": json.dumps(meta).encode()}


@pytest.fixture()
def toy(tmp_path: Path) -> Path:
    root = tmp_path / "out"
    write_toy_output(str(root))
    return root


def _verify(root: Path, *args: str) -> Any:
    result = CliRunner().invoke(app, ["verify", str(root), *args])
    assert "Traceback" not in result.output
    return result


# --- paths that leave the output folder -------------------------------------------------------------------------

def _zarr_path_up(root: Path, outside: Path) -> str:
    doc = _manifest(root)
    doc["datasets"][0]["zarr"]["path"] = "../x"
    _write_manifest(root, doc)
    return "datasets/0/zarr/path: '../x' contains '..'"


def _zarr_path_absolute(root: Path, outside: Path) -> str:
    doc = _manifest(root)
    doc["datasets"][0]["zarr"]["path"] = str(outside)
    _write_manifest(root, doc)
    return f"datasets/0/zarr/path: {str(outside)!r} is absolute"


def _zarr_group_up(root: Path, outside: Path) -> str:
    doc = _manifest(root)
    doc["datasets"][0]["zarr"]["group"] = "../../etc"
    _write_manifest(root, doc)
    return "datasets/0/zarr/group: '../../etc' contains '..'"


def _shard_path_up(root: Path, outside: Path) -> str:
    doc = _manifest(root)
    doc["datasets"][0]["shards"][0]["path"] = f"shards/../../{outside.name}/train-000000.tar"
    _write_manifest(root, doc)
    return "datasets/0/shards/0/path"


def _zarr_group_absolute(root: Path, outside: Path) -> str:
    doc = _manifest(root)
    doc["datasets"][0]["zarr"]["group"] = str(outside)
    _write_manifest(root, doc)
    return f"datasets/0/zarr/group: {str(outside)!r} is absolute"


def _shard_symlink_out(root: Path, outside: Path) -> str:
    target = outside / "train-000000.tar"
    (root / TRAIN).replace(target)  # the same bytes, so the manifest's size and sha256 still hold
    (root / TRAIN).symlink_to(target)
    return f"{TRAIN} is a symbolic link (to {str(target)!r})"


def _shard_folder_symlink_out(root: Path, outside: Path) -> str:
    target = outside / "toy"
    (root / "shards/toy").replace(target)  # the whole shard folder moved out, a link left in its place
    (root / "shards/toy").symlink_to(target)
    return f"shards/toy is a symbolic link (to {str(target)!r})"


def _zarr_store_symlink_out(root: Path, outside: Path) -> str:
    target = outside / "data.zarr"
    (root / "data.zarr").replace(target)
    (root / "data.zarr").symlink_to(target)
    return f"data.zarr is a symbolic link (to {str(target)!r})"


@pytest.mark.parametrize("damage", [_zarr_path_up, _zarr_path_absolute, _zarr_group_up, _zarr_group_absolute,
                                    _shard_path_up, _shard_symlink_out, _shard_folder_symlink_out,
                                    _zarr_store_symlink_out])
def test_paths_outside_the_folder_are_refused_and_nothing_outside_is_read(toy: Path, tmp_path: Path,
                                                                          damage: Any) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "zarr.json").write_text("{}")
    expected = damage(toy, outside)
    with _Recording() as opened:
        result = _verify(toy)
        with pytest.raises(DataError) as refused:
            verify_shards(read_manifests([str(toy)]), "train")
    assert result.exit_code == 1
    assert expected in result.output
    assert expected in str(refused.value) and "\n" not in str(refused.value)
    inside = os.path.realpath(toy) + os.sep  # a path opened under tmp_path must resolve to a file inside the output
    leaked = [p for p in opened if "etc" in Path(p).parts or p.startswith(str(tmp_path))
              and not os.path.realpath(p).startswith(inside)]
    assert leaked == []


# --- tar members --------------------------------------------------------------------------------------------------

def _members(case: str) -> tuple[list[tuple], str, str]:
    """(members of the valid shard, the member to be named, the words saying what is wrong)."""
    parts = _sample2()
    fields, mask, meta = (parts[k] for k in ("s0000002.fields.npy", "s0000002.mask.npy", "s0000002.meta.json"))
    regular = [_member("s0000002.fields.npy", fields), _member("s0000002.mask.npy", mask),
               _member("s0000002.meta.json", meta)]
    if case == "symlink":
        return ([_member("s0000002.fields.npy", None, tarfile.SYMTYPE, "/etc/passwd"), *regular[1:]],
                "s0000002.fields.npy", "is a symbolic link (to '/etc/passwd')")
    if case == "hardlink":
        return ([regular[0], _member("s0000002.mask.npy", None, tarfile.LNKTYPE, "s0000002.fields.npy"),
                 regular[2]], "s0000002.mask.npy", "is a hard link")
    if case == "device":
        return ([regular[0], _member("s0000002.mask.npy", None, tarfile.CHRTYPE), regular[2]],
                "s0000002.mask.npy", "is a character device")
    if case == "fifo":
        return ([*regular[:2], _member("s0000002.meta.json", None, tarfile.FIFOTYPE)], "s0000002.meta.json",
                "is a FIFO")
    if case == "duplicate":
        return ([regular[0], *regular], "s0000002.fields.npy", "appears twice")
    assert case == "dotdot"
    return [*regular, _member("../x", b"outside")], "../x", "does not follow the member rule"


@pytest.mark.parametrize("case", ["symlink", "hardlink", "device", "fifo", "duplicate", "dotdot"])
def test_odd_tar_members_are_refused_by_name_on_both_sides(toy: Path, case: str) -> None:
    members, name, words = _members(case)
    _set_shard(toy, VALID, _tar(members))
    for rehash in (True, False):
        problems = [p for p in validate_output(str(toy), rehash=rehash) if p.fatal]
        assert [(p.what, p.kind) for p in problems] == [(VALID, "member")]
        assert f"member {name!r} {words}" in problems[0].actual
    result = _verify(toy)
    assert result.exit_code == 1 and f"{VALID}: member {name!r} {words}" in result.output
    datasets = read_manifests([str(toy)])
    with pytest.raises(DataError, match=re.escape(f"member {name!r} {words}")):
        verify_shards(datasets, "valid", checksums=False)
    with pytest.raises(DataError) as direct:  # the trainer's reader applies the same rules on its own
        WebDatasetReader().refs(datasets[0], "valid")
    assert f"member {name!r} {words}" in str(direct.value) and VALID in str(direct.value)
    with pytest.raises(FormatError) as streamed:  # and so does the read-back of dpot_data (stats, plots)
        list(iter_samples(str(toy / VALID)))
    assert f"member {name!r} {words}" in str(streamed.value)


# --- .npy headers -------------------------------------------------------------------------------------------------

def _fields_member(case: str) -> tuple[bytes, str]:
    """A fields.npy for trajectory 2 that breaks the format, and a phrase the problem must contain."""
    f, _ = toy_arrays()
    if case == "float64":
        return _npy(f[2].astype(np.float64)), "dtype <f8 (float64)"
    if case == "object":
        return _npy(np.array([{"a": 1}, None], dtype=object), allow_pickle=True), "'|O'"
    if case == "lying-shape":
        return _npy_header("<f4", (7, 4, 16, 16)) + f[2].tobytes(), "shape (7, 4, 16, 16)"
    if case == "200-channels":
        return _npy(np.zeros((6, 200, 16, 16), np.float32)), "shape (6, 200, 16, 16)"
    assert case == "1e9-frames"
    return _npy_header("<f4", (10**9, 4, 16, 16)) + f[2].tobytes(), "shape (1000000000, 4, 16, 16)"


@pytest.mark.parametrize("case", ["float64", "object", "lying-shape", "200-channels", "1e9-frames"])
def test_npy_headers_are_checked_against_the_manifest(toy: Path, case: str) -> None:
    data, phrase = _fields_member(case)
    parts = _sample2(fields=data)
    _set_shard(toy, VALID, _tar([_member(name, body) for name, body in parts.items()]))
    for rehash in (True, False):  # hash-consistent: the cheap mode must find it as well
        problems = [p for p in validate_output(str(toy), rehash=rehash) if p.fatal]
        assert [(p.what, p.kind) for p in problems] == [(f"{VALID}:s0000002.fields.npy", "npy")], problems
        assert phrase in problems[0].actual
    result = _verify(toy)
    assert result.exit_code == 1 and f"{VALID}:s0000002.fields.npy: " in result.output and phrase in result.output
    with pytest.raises(DataError, match="s0000002.fields.npy"):
        verify_shards(read_manifests([str(toy)]), "valid", checksums=True)


def test_launch_runs_the_validator_before_torchrun(toy: Path, tmp_path: Path) -> None:
    """A hash-consistent shard of the valid split whose fields.npy header lies: `launch` refuses it (it checks every
    split of every output, not just the one it trains on) with one line naming the member, and starts nothing."""
    from dpot_train.cli import app as train_app

    data, phrase = _fields_member("lying-shape")
    _set_shard(toy, VALID, _tar([_member(name, body) for name, body in _sample2(fields=data).items()]))
    run = tmp_path / "run"
    result = CliRunner().invoke(train_app, ["launch", "--manifest", str(toy), "--out", str(run), "--model", "tiny",
                                            "--steps", "24", "--batch-size", "4", "--nproc-per-node", "1",
                                            "--device", "cpu", "--no-progress", "--dry-run"])
    assert result.exit_code == 2, result.output
    errors = result.stderr.splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"error: {toy}/{VALID}:s0000002.fields.npy: "), errors
    assert phrase in errors[0] and "dpot_train.run.torchrun" not in result.output
    assert not run.exists()


def test_a_shard_holding_another_sample_count_than_listed_is_named(toy: Path) -> None:
    """Hash-consistent, well-formed members, but not the samples the manifest lists for the shard."""
    _set_shard(toy, VALID, _tar([]))  # an empty archive where one sample is listed
    problems = [p for p in validate_output(str(toy), rehash=False) if p.fatal]
    assert (VALID, "samples", "1 samples (the manifest)", "0 samples") in [
        (p.what, p.kind, p.expected, p.actual) for p in problems]
    result = _verify(toy)
    assert result.exit_code == 1 and f"{VALID}: 0 samples (expected 1 samples (the manifest))" in result.output
    with pytest.raises(DataError, match=re.escape(f"{VALID}: 0 samples")):
        verify_shards(read_manifests([str(toy)]), "valid", checksums=False)


def test_meta_json_must_agree_with_its_shard(toy: Path) -> None:
    parts = _sample2()
    parts["s0000002.meta.json"] = json.dumps({"id": "toy#2", "dataset": "other", "split": "train",
                                              "index": 2}).encode()
    _set_shard(toy, VALID, _tar([_member(name, body) for name, body in parts.items()]))
    problems = validate_output(str(toy))
    assert [(p.what, p.kind, p.expected, p.actual) for p in problems] == [
        (f"{VALID}:s0000002.meta.json", "meta", "split 'valid'", "split 'train'"),
        (f"{VALID}:s0000002.meta.json", "meta", "dataset 'toy'", "dataset 'other'")]


def test_keys_must_be_the_split_indices_in_order(toy: Path) -> None:
    f, m = toy_arrays()
    members = []
    for i in (0, 3, 1):  # the train trajectories, out of order
        meta = {"id": f"toy#{i}", "dataset": "toy", "split": "train", "index": i}
        members += [_member(f"s{i:07d}.fields.npy", _npy(f[i])), _member(f"s{i:07d}.mask.npy", _npy(m[i])),
                    _member(f"s{i:07d}.meta.json", json.dumps(meta).encode())]
    _set_shard(toy, TRAIN, _tar(members))
    problems = validate_output(str(toy))
    assert [(p.what, p.kind) for p in problems] == [(TRAIN, "member")]
    assert "sample s0000001 comes after sample s0000003" in problems[0].actual
    members = []
    for i in (0, 1, 4):  # increasing, but 4 is the test trajectory (and 3 is missing)
        meta = {"id": f"toy#{i}", "dataset": "toy", "split": "train", "index": i}
        members += [_member(f"s{i:07d}.fields.npy", _npy(f[i])), _member(f"s{i:07d}.mask.npy", _npy(m[i])),
                    _member(f"s{i:07d}.meta.json", json.dumps(meta).encode())]
    _set_shard(toy, TRAIN, _tar(members))
    problems = validate_output(str(toy))
    assert [(p.what, p.kind, p.actual) for p in problems] == [
        (TRAIN, "keys", "s0000004"), ("shards/toy/test-000000.tar", "keys", "s0000004 is also in a train shard")]


# --- sizes --------------------------------------------------------------------------------------------------------

def test_a_huge_grid_is_refused_in_one_line_everywhere(toy: Path, tmp_path: Path) -> None:
    doc = _manifest(toy)
    doc["datasets"][0]["grid"]["shape"] = [65536, 65536]
    doc["datasets"][0]["grid"]["native_shape"] = [65536, 65536]
    _write_manifest(toy, doc)  # the shards' sha256 and sizes are still right: only the grid is absurd
    line = "datasets/0/grid/shape: cells along an axis 65536 is more than the limit of 8192"
    with pytest.raises(FormatError) as refused:
        read_manifest(str(toy))
    assert str(refused.value) == (f"{toy / 'manifest.json'}: expected a manifest following schema version 2: "
                                  f"{line}")
    result = _verify(toy)
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"manifest.json: {line}", "FAILED: 1 problem(s)"]
    r = train_runs.run(train_runs.launch_args(toy, tmp_path / "run", steps=2, nproc=1) + ["--model", "tiny"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.splitlines() == [f"error: {refused.value}"]
    assert not (tmp_path / "run").exists()


def _verify_subprocess(root: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`dpot-data verify` in its own process, so that a hang fails the test instead of blocking it."""
    return subprocess.run([sys.executable, "-m", "dpot_data", "verify", str(root)], capture_output=True, text=True,
                          timeout=timeout, env=train_runs.env(), cwd=ROOT)


def test_a_fifo_shard_is_named_without_being_opened(toy: Path) -> None:
    (toy / VALID).unlink()
    os.mkfifo(toy / VALID)
    r = _verify_subprocess(toy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{VALID}: a FIFO (named pipe) (expected a regular file)" in r.stdout.splitlines()
    assert "Traceback" not in r.stdout + r.stderr
    with pytest.raises(DataError, match=r"a FIFO \(named pipe\)"):
        verify_shards(read_manifests([str(toy)]), "valid", checksums=True)


def test_a_fifo_in_the_zarr_store_is_named_without_being_opened(toy: Path) -> None:
    """A chunk replaced by a FIFO: reading it would block for ever; it is named, on both sides, and never opened."""
    chunk = sorted(p for p in (toy / "data.zarr/toy/fields").rglob("*") if p.is_file() and p.name != "zarr.json")[1]
    chunk.unlink()
    os.mkfifo(chunk)
    rel = chunk.relative_to(toy).as_posix()
    r = _verify_subprocess(toy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{rel}: a FIFO (named pipe) (expected a regular file)" in r.stdout.splitlines()
    assert "Traceback" not in r.stdout + r.stderr
    with pytest.raises(DataError, match=re.escape(f"{rel}: a FIFO (named pipe)")):
        verify_shards(read_manifests([str(toy)]), "train", backend="zarr")


def test_a_shard_linked_to_dev_zero_is_named_without_being_read(toy: Path) -> None:
    (toy / VALID).unlink()
    (toy / VALID).symlink_to("/dev/zero")
    r = _verify_subprocess(toy)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{VALID}: {VALID} is a symbolic link (to '/dev/zero')" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr
    with pytest.raises(DataError, match="is a symbolic link"):
        read_manifests([str(toy)])


# --- reading the manifest -----------------------------------------------------------------------------------------

def _as_directory(path: Path) -> str:
    path.unlink()
    path.mkdir()
    return "is a directory, expected the manifest file"


def _not_utf8(path: Path) -> str:
    path.write_bytes(b'{"schema_version": 1, "command": "\xff\xfe"}')
    return "is not UTF-8 text (byte 34: b'\\xff'), expected a JSON manifest"


def _empty(path: Path) -> str:
    path.write_bytes(b"")
    return "is empty, expected a JSON manifest"


def _fifo(path: Path) -> str:
    path.unlink()
    os.mkfifo(path)
    return "is a FIFO (named pipe), expected the manifest file"


def _dev_zero(path: Path) -> str:
    path.unlink()
    path.symlink_to("/dev/zero")
    return "is a character device, expected the manifest file"


@pytest.mark.parametrize("damage", [_as_directory, _not_utf8, _empty, _fifo, _dev_zero])
def test_unreadable_manifests_are_one_line_errors(toy: Path, damage: Any) -> None:
    path = toy / "manifest.json"
    words = damage(path)
    with pytest.raises(FormatError) as refused:
        read_manifest(str(toy))
    assert str(refused.value) == f"{path}: {words}"
    with pytest.raises(DataError) as trainer:
        read_manifests([str(toy)])
    assert str(trainer.value) == f"{path}: {words}"
    result = _verify(toy)
    assert result.exit_code == 1 and result.output.splitlines() == [f"manifest.json: {words}", "FAILED: 1 problem(s)"]
    inspected = CliRunner().invoke(app, ["inspect", str(toy)])
    assert inspected.exit_code == 2 and inspected.stderr.splitlines() == [f"error: {path}: {words}"]
    raw = toy.parent / "NavierStokes_V1e-3_N2_T3.mat"
    raw.write_bytes(b"MATLAB")  # never read: the output folder is judged first
    ingested = CliRunner().invoke(app, ["ingest", "fno", str(raw), "--out", str(toy), "--no-progress"])
    assert ingested.exit_code == 2 and ingested.stderr.splitlines() == [f"error: {path}: {words}"]
    from dpot_train.cli import app as train_app

    launched = CliRunner().invoke(train_app, ["launch", "--manifest", str(toy), "--out", str(toy.parent / "run"),
                                              "--model", "tiny", "--device", "cpu", "--dry-run"])
    assert launched.exit_code == 2 and launched.stderr.splitlines() == [f"error: {path}: {words}"]
    assert not (toy.parent / "run").exists()


# --- Zarr ---------------------------------------------------------------------------------------------------------

def test_a_corrupted_zarr_chunk_is_named_not_raised(toy: Path) -> None:
    chunks = sorted(p for p in (toy / "data.zarr/toy/fields").rglob("*") if p.is_file() and p.name != "zarr.json")
    assert len(chunks) == 5  # one trajectory per chunk
    victim = chunks[1]
    victim.write_bytes(bytes(range(256)) * (victim.stat().st_size // 256 + 1))
    problems = validate_output(str(toy))
    assert [(p.what, p.kind) for p in problems] == [("data.zarr/toy/fields", "unreadable")]
    result = _verify(toy)
    assert result.exit_code == 1
    assert result.output.startswith("data.zarr/toy/fields: ") and "FAILED: 1 problem(s)" in result.output
    assert validate_output(str(toy), rehash=False) == []  # the cheap mode reads no chunk
    with pytest.raises(DataError) as trainer:  # the trainer's check of the Zarr backend names the array too
        verify_shards(read_manifests([str(toy)]), "train", backend="zarr")
    assert "data.zarr/toy/fields: " in str(trainer.value) and "\n" not in str(trainer.value)


def test_zarr_metadata_must_match_the_manifest(toy: Path) -> None:
    import zarr

    g = zarr.open_group(str(toy / "data.zarr"), mode="a", path="toy")
    data = g["mask"][:]
    del g["mask"]
    g.create_array("mask", data=data.astype(np.int16), chunks=(5, 16, 16))
    found = [p for p in validate_output(str(toy), rehash=False)]
    assert found == [Problem("data.zarr/toy/mask", "zarr", "uint8 shape (5, 16, 16) chunks (1, 16, 16)",
                             "int16 shape (5, 16, 16) chunks (5, 16, 16)")]


@pytest.mark.parametrize("array,expected", [
    ("split", "shape (5,)"),
    ("channel_valid", "shape (4,)"),
    ("fields", "float32 shape (5, 6, 4, 16, 16) chunks (1, 6, 4, 16, 16)"),
])
def test_zarr_arrays_declaring_huge_shapes_are_refused_before_they_are_read(toy: Path, array: str,
                                                                           expected: str) -> None:
    """A few bytes of Zarr metadata (not covered by any digest) declare 10^8 rows: the validator compares the shape
    with the manifest before reading or hashing anything, instead of walking 10^8 missing chunks."""
    meta = toy / "data.zarr/toy" / array / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["shape"][0] = 10**8
    meta.write_text(json.dumps(doc))
    found = doc["shape"]
    r = _verify_subprocess(toy, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    line = f"data.zarr/toy/{array}: "
    assert [ln for ln in r.stdout.splitlines() if ln.startswith(line)] == [
        f"{line}{'float32 ' if array == 'fields' else ''}shape {_shape_text(found)}"
        f"{' chunks (1, 6, 4, 16, 16)' if array == 'fields' else ''} (expected {expected})"], r.stdout
    with pytest.raises(DataError, match=re.escape(f"data.zarr/toy/{array}: ")):
        verify_shards(read_manifests([str(toy)]), "train", backend="zarr")


@pytest.mark.parametrize("damage", ["huge-split", "fifo-chunk"])
def test_stats_and_plot_check_the_zarr_store_before_reading_it(toy: Path, tmp_path: Path, damage: str) -> None:
    """`stats` and `inspect --plot` read trajectories from the Zarr store: a split array declaring 10^8 labels or a
    chunk that is a FIFO is one line naming it, not a read that runs for ever."""
    if damage == "huge-split":
        meta = toy / "data.zarr/toy/split/zarr.json"
        doc = json.loads(meta.read_text())
        doc["shape"] = [10**8]
        meta.write_text(json.dumps(doc))
        named = "data.zarr/toy/split: shape (100000000,) (expected shape (5,))"
    else:
        chunk = sorted(p for p in (toy / "data.zarr/toy/fields").rglob("*") if p.is_file() and p.name != "zarr.json")[0]
        chunk.unlink()
        os.mkfifo(chunk)
        named = f"{chunk.relative_to(toy).as_posix()}: a FIFO (named pipe) (expected a regular file)"
    r = subprocess.run([sys.executable, "-m", "dpot_data", "stats", str(toy)], capture_output=True, text=True,
                       timeout=60, env=train_runs.env(), cwd=ROOT)  # its own process: a hang fails, not blocks
    assert r.returncode == 2 and r.stderr.splitlines() == [f"error: {toy}/{named}"], r.stdout + r.stderr
    png = tmp_path / "frames.png"
    plotted = CliRunner().invoke(app, ["inspect", str(toy), "--plot", str(png)])
    assert plotted.exit_code == 2 and plotted.stderr.splitlines() == [f"error: {toy}/{named}"], plotted.output
    assert not png.exists()


def _shape_text(shape: list[int]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def test_links_inside_the_zarr_store_are_refused(toy: Path, tmp_path: Path) -> None:
    chunk = sorted(p for p in (toy / "data.zarr/toy/mask").rglob("*") if p.is_file() and p.name != "zarr.json")[0]
    outside = tmp_path / "elsewhere"
    chunk.replace(outside)
    chunk.symlink_to(outside)
    with _Recording() as opened:
        problems = validate_output(str(toy))
    rel = chunk.relative_to(toy).as_posix()
    assert [(p.what, p.kind) for p in problems if p.fatal] == [(rel, "path")]
    assert not [p for p in opened if p in (str(outside), str(chunk))]


def test_a_missing_zarr_store_is_named_on_both_sides(toy: Path) -> None:
    import shutil

    shutil.rmtree(toy / "data.zarr")
    assert [(p.what, p.kind) for p in validate_output(str(toy)) if p.fatal] == [("data.zarr/toy", "missing")]
    with pytest.raises(DataError, match=re.escape(f"dataset 'toy': Zarr store missing: {toy}/data.zarr/toy")):
        verify_shards(read_manifests([str(toy)]), "train", backend="zarr")


# --- the building blocks ------------------------------------------------------------------------------------------

def test_file_hash_is_bounded_and_refuses_non_regular_files(tmp_path: Path) -> None:
    import threading

    from dpot_format.io import atomic_write, read_bounded, sha256_file

    big = tmp_path / "big"
    big.write_bytes(bytes(range(256)) * 4096)
    assert sha256_file(big) == (hashlib.sha256(big.read_bytes()).hexdigest(), 1 << 20)
    assert sha256_file(big, expected_bytes=100) == (hashlib.sha256(big.read_bytes()[:101]).hexdigest(), 101)
    with pytest.raises(FormatError, match="larger than the limit of 1000 bytes"):
        read_bounded(big, 1000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            sha256_file(fifo)
        except BaseException as exc:  # noqa: BLE001
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the open before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not worker.is_alive() and isinstance(outcome[0], FormatError)
    assert str(outcome[0]) == f"{fifo}: is a FIFO (named pipe), expected a regular file"
    for path, words in ((tmp_path, "is a directory"), (Path("/dev/null"), "is a character device")):
        with pytest.raises(FormatError, match=words):
            sha256_file(path)
    (tmp_path / "target").mkdir()
    with pytest.raises(OSError):
        atomic_write(tmp_path / "target", b"data")  # a folder is in the way: the rename fails
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big", "fifo", "target"]  # no temporary file left


def test_docs_format_names_the_validator_and_its_limits() -> None:
    """docs/format.md says which function enforces it (and that function exists), and its table of limits is the
    one dpot_format.limits.Limits applies."""
    import importlib

    from dpot_format.limits import Limits

    text = (ROOT / "docs" / "format.md").read_text(encoding="utf-8")
    assert "`dpot_format.validate.validate_output(OUT)` enforces this page" in text
    assert callable(getattr(importlib.import_module("dpot_format.validate"), "validate_output"))
    table = text[text.index("**Limits**"):text.index("The cheap mode")]
    rows = dict(re.findall(r"^\| (.+?) \| ([0-9][0-9^ ]*?(?: [KMG]iB)?)(?: \([^|]*\))? \|$", table, flags=re.M))

    def number(cell: str) -> int:
        cell = cell.replace(" ", "")
        for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
            if cell.endswith(unit):
                return int(cell[: -len(unit)]) * scale
        base, _, power = cell.partition("^")
        return int(base) ** int(power) if power else int(base)

    documented = {label.split(" (")[0]: number(value) for label, value in rows.items()}
    limits = Limits()
    assert documented == {
        "cells along one grid axis": limits.max_grid_side, "cells per frame": limits.max_grid_cells,
        "channels": limits.max_channels, "frames per trajectory": limits.max_frames,
        "trajectories per dataset": limits.max_trajectories,
        "bytes of one trajectory's `fields`": limits.max_sample_bytes,
        "manifest size": limits.max_manifest_bytes, "one `meta.json` member": limits.max_meta_bytes,
        "members per shard": limits.max_members_per_shard, "one `.npy` header": limits.max_npy_header_bytes}


def test_temporary_names_of_every_writer() -> None:
    from dpot_format.names import is_temporary, sample_key

    for name in (".train-000001.tar.tmp", ".manifest.json.tmp-4242", ".step-00000010.pt.tmp-7", "0.3fa9c2.partial",
                 ".s0000001.tar.part", "NavierStokes.mat.part", ".staging-fno-ns-v1e-3"):
        assert is_temporary(name), name
    for name in ("train-000001.tar", "manifest.json", "zarr.json", "0", "c", "tmp", "staging-x", ".hidden"):
        assert not is_temporary(name), name
    assert sample_key(42) == "s0000042"
    with pytest.raises(ValueError):
        sample_key(10**7)


def test_a_manifest_over_the_size_limit_is_refused_before_it_is_read(toy: Path) -> None:
    from dpot_format.limits import Limits

    path = toy / "manifest.json"
    size = path.stat().st_size
    with pytest.raises(FormatError) as refused:
        read_manifest(str(toy), Limits(max_manifest_bytes=size - 1))
    assert str(refused.value) == f"{path}: {size} bytes, more than the limit of {size - 1} for a manifest"
    problems = validate_output(str(toy), limits=Limits(max_manifest_bytes=size - 1))
    assert problems == [Problem("manifest.json", "manifest", actual=f"{size} bytes, more than the limit of "
                                                                    f"{size - 1} for a manifest")]
