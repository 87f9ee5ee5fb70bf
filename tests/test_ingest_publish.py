"""What is published, and when: one writer per output folder, an old output that stays valid until the new one is
complete and durable (full disk, SIGKILL at each publish step), and nothing temporary ever published or left."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.ingest import IngestOptions, run_ingest
from dpot_data.ingest.publish import LOCK_NAME, OutputLock
from dpot_format.names import is_temporary
from dpot_data.synth.fno import synth_fno
from dpot_format.validate import validate_output as verify_output

ROOT = Path(__file__).resolve().parents[1]


def _opts(**kw) -> IngestOptions:
    return IngestOptions(**{"resolution": 0, "shard_size": 60_000, "workers": 1, "command": "test", **kw})


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    files = synth_fno(tmp_path_factory.mktemp("raw"), n=6, frames=8, resolution=32, seed=3)
    return files[0]


@pytest.fixture()
def done(raw: Path, tmp_path: Path) -> Path:
    """An output folder holding a complete ingest."""
    out = tmp_path / "out"
    run_ingest("fno", [raw], out, _opts())
    return out


def _state(out: Path) -> tuple[bytes, list[str]]:
    """The manifest's bytes and the names in the folder."""
    return (out / "manifest.json").read_bytes(), sorted(p.name for p in out.iterdir())


def _clean(out: Path) -> None:
    """A complete output and nothing else: the manifest, the store and shard folder it names, no temporaries."""
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["datasets"][0]
    tops = {entry["zarr"]["path"], *(s["path"].split("/", 1)[0] for s in entry["shards"])}
    assert sorted(p.name for p in out.iterdir()) == sorted({"manifest.json", *tops})
    assert not [p for p in out.rglob("*") if is_temporary(p.name)]
    assert verify_output(str(out)) == []


def test_a_second_ingest_into_a_folder_being_written_is_refused(raw: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with OutputLock(out):
        result = CliRunner().invoke(app, ["ingest", "fno", str(raw), "--out", str(out), "--no-progress"])
        assert result.exit_code == 2
        assert result.output.strip().splitlines() == [
            f"error: {out}: another ingest is writing into this folder; wait for it to finish (or choose another --out)"]
    assert not (out / "manifest.json").exists() and not (out / LOCK_NAME).exists()
    assert run_ingest("fno", [raw], out, _opts()).written  # the lock went with its holder
    _clean(out)


def test_two_ingests_at_once_never_delete_each_others_output(raw: Path, tmp_path: Path) -> None:
    """Started together into one folder under different names: one writes, the other is refused or finds the
    output complete and leaves it alone; the dataset in the folder is complete either way."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dpot_data", "ingest", "fno", str(raw), "--out", str(out), "--resolution", "64",
           "--no-progress", "--shard-size", "60000"]
    procs = [subprocess.Popen([*cmd, "--name", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name in ("first", "second")]
    results = [(p.wait(timeout=300), p.stdout.read()) for p in procs]
    wrote = [r for r in results if r[0] == 0 and "wrote" in r[1]]
    assert len(wrote) == 1, results
    for code, text in results:
        if (code, text) != wrote[0]:
            assert (code == 2 and "another ingest is writing into this folder" in text
                    or code == 0 and "left alone" in text), text
    _clean(out)


def test_a_complete_output_appearing_during_the_run_is_not_replaced(raw: Path, done: Path, tmp_path: Path,
                                                                    monkeypatch) -> None:
    """The check at publish time: an output completed by someone else while this ingest ran is left alone."""
    import dpot_data.ingest.pipeline as ingest_mod

    out = tmp_path / "late"
    original = ingest_mod.run_plan

    def run_then_other_writer(*args, **kwargs):
        written = original(*args, **kwargs)
        for child in done.iterdir():
            os.rename(child, out / child.name)
        return written

    monkeypatch.setattr(ingest_mod, "run_plan", run_then_other_writer)
    with pytest.raises(Exception, match="now holds a complete manifest that this ingest did not write"):
        run_ingest("fno", [raw], out, _opts(name="mine"))
    assert json.loads((out / "manifest.json").read_text())["datasets"][0]["name"] == "fno-ns-v1e-3"
    assert not [p for p in verify_output(str(out)) if p.fatal]


def test_disk_full_at_the_manifest_keeps_the_old_output(raw: Path, done: Path, monkeypatch) -> None:
    import dpot_data.ingest.publish as pub

    before = _state(done)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pub.mf, "write", full)
    result = CliRunner().invoke(app, ["ingest", "fno", str(raw), "--out", str(done), "--resolution", "0",
                                      "--shard-size", "60000", "--overwrite", "--no-progress"])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if not line.startswith("warning:")]
    assert len(errors) == 1 and "no space left on the device" in errors[0] and "Traceback" not in result.output
    assert (done / "manifest.json").read_bytes() == before[0]
    assert not [p for p in verify_output(str(done)) if p.fatal]
    monkeypatch.undo()
    assert run_ingest("fno", [raw], done, _opts(overwrite=True)).written
    _clean(done)


def test_disk_full_while_writing_shards_is_one_line(raw: Path, done: Path, monkeypatch) -> None:
    from dpot_data.writers import wds_shards

    before = _state(done)

    def full(self, *_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wds_shards.SplitShardWriter, "_finish", full)
    with pytest.raises(Exception, match=r"no space left on the device \(No space left on device\); nothing was "
                                        "published"):
        run_ingest("fno", [raw], done, _opts(overwrite=True))
    assert _state(done)[0] == before[0]
    assert not [p for p in verify_output(str(done)) if p.fatal]


_KILLER = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import dpot_data.ingest.publish as pub
    from dpot_data.ingest import IngestOptions, run_ingest

    stage, raw, out = sys.argv[1], sys.argv[2], sys.argv[3]

    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)

    def after(fn):
        def wrapped(*a, **k):
            fn(*a, **k)
            die()
        return wrapped

    if stage == "before-move":
        pub._move_into_place = die
    elif stage == "after-move":
        pub._move_into_place = after(pub._move_into_place)
    elif stage == "manifest-temp":  # the new manifest is written under its temporary name, not yet renamed
        real = os.replace
        def replace(src, dst, *a, **k):
            if str(dst).endswith("manifest.json"):
                die()
            return real(src, dst, *a, **k)
        pub.os.replace = replace  # the os module itself: the manifest's atomic write renames through it too
    elif stage == "after-manifest":
        pub.mf.write = after(pub.mf.write)
    run_ingest("fno", [raw], out, IngestOptions(resolution=0, shard_size=60_000, workers=1, overwrite=True,
                                                 command="test", split=(0.5,)))
""")


@pytest.mark.parametrize("stage", ["before-move", "after-move", "manifest-temp", "after-manifest"])
def test_sigkill_at_each_publish_step_leaves_a_valid_output(raw: Path, done: Path, tmp_path: Path,
                                                            stage: str) -> None:
    """Replacing an output (--overwrite, another split) and killed at each step of its publish: the folder holds
    the old or the new output, complete; a re-run finishes the replacement and leaves nothing behind."""
    old = json.loads((done / "manifest.json").read_text())
    script = tmp_path / "kill.py"
    script.write_text(_KILLER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), stage, str(raw), str(done)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    now = json.loads((done / "manifest.json").read_text())
    new_split = now["datasets"][0]["splits"]["counts"] != old["datasets"][0]["splits"]["counts"]
    assert new_split == (stage == "after-manifest")
    assert not [p for p in verify_output(str(done)) if p.fatal]  # whichever it is, it is whole
    assert run_ingest("fno", [raw], done, _opts(overwrite=True, split=(0.5,))).written
    _clean(done)


def test_temporaries_of_a_killed_run_are_never_published(raw: Path, tmp_path: Path, monkeypatch) -> None:
    """A kill inside a Zarr chunk write leaves `*.partial` files in the staged store, a kill at the manifest write
    a `.manifest.json.tmp-<pid>`: the resumed run publishes neither and removes both."""
    import dpot_data.ingest.journal as jn

    out = tmp_path / "out"
    original = jn.Journal.record

    def record(self, block, *args, **kwargs):
        original(self, block, *args, **kwargs)
        if block == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(jn.Journal, "record", record)
    with pytest.raises(KeyboardInterrupt):
        run_ingest("fno", [raw], out, _opts(block=1))
    monkeypatch.undo()
    staged = out / ".staging-fno-ns-v1e-3"
    chunk = next((staged / "data.zarr").rglob("fields/c.0.0.0.0.0"))
    (chunk.parent / f"{chunk.name}.1f3a.partial").write_bytes(b"half a chunk")
    (staged / "shards" / "fno-ns-v1e-3" / ".train-000009.tar.tmp").write_bytes(b"half a shard")
    (out / ".manifest.json.tmp-4242").write_bytes(b"{")
    outcome = run_ingest("fno", [raw], out, _opts(block=1))
    assert any("resumed an interrupted ingest" in n for n in outcome.notes), outcome.notes
    _clean(out)


def test_sigkill_at_the_manifest_write_of_a_first_ingest_then_a_plain_rerun_leaves_nothing(raw: Path,
                                                                                          tmp_path: Path) -> None:
    """No earlier output, killed with the new manifest under its temporary name: no manifest is there, and the same
    command run again (no --overwrite) publishes a complete output and removes the `.manifest.json.tmp-<pid>`."""
    out = tmp_path / "first"
    script = tmp_path / "kill.py"
    script.write_text(_KILLER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), "manifest-temp", str(raw), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (out / "manifest.json").exists()
    assert [p.name for p in out.iterdir() if p.name.startswith(".manifest.json.tmp-")]  # what the kill left
    assert run_ingest("fno", [raw], out, _opts(split=(0.5,))).written
    _clean(out)


_CHUNK_KILLER = textwrap.dedent("""
    import os, signal, sys
    import dpot_data.writers.zarr_store as zs
    from dpot_data.ingest import IngestOptions, run_ingest

    raw, out = sys.argv[1], sys.argv[2]
    kill_row = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    real = zs.put_chunk  # every chunk file is written by it, in the block tasks or by the writer

    def put(array_dir, row, ndim, data):
        if os.path.basename(array_dir) == "fields" and row == kill_row and data is not None:
            real(array_dir, row, ndim, data[: len(data) // 2])  # half the chunk's bytes under its final name
            os.kill(os.getpid(), signal.SIGKILL)
        return real(array_dir, row, ndim, data)

    zs.put_chunk = put
    run_ingest("fno", [raw], out, IngestOptions(resolution=0, shard_size=60_000, workers=1, block=1, formats=("zarr",),
                                                command="test"))
""")


def test_sigkill_inside_a_zarr_chunk_write_then_rerun_gives_the_uninterrupted_output(raw: Path,
                                                                                     tmp_path: Path) -> None:
    """Killed while a chunk file is half written (a Zarr-only ingest, so the resume point is the journal's alone):
    the re-run never keeps that chunk, and publishes the same arrays as a run that was never interrupted, with
    nothing temporary left."""
    out = tmp_path / "out"
    script = tmp_path / "kill.py"
    script.write_text(_CHUNK_KILLER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), str(raw), str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (out / "manifest.json").exists()
    assert list((out / ".staging-fno-ns-v1e-3").rglob("fields/c.3.*"))  # the half-written chunk is there
    outcome = run_ingest("fno", [raw], out, _opts(block=1, formats=("zarr",)))
    # blocks run ahead of the journal: the resume point is at most the trajectory whose chunk was cut short
    resumed = [int(m.group(1)) for n in outcome.notes if (m := re.search(r"resumed an interrupted ingest at "
                                                                          r"trajectory (\d+)", n))]
    assert all(row <= 3 for row in resumed), outcome.notes
    clean = run_ingest("fno", [raw], tmp_path / "clean", _opts(block=1, formats=("zarr",))).manifest
    done = json.loads((out / "manifest.json").read_text())
    for key in ("zarr", "stats"):
        assert done["datasets"][0][key] == clean["datasets"][0][key], key
    _clean(out)


def test_disk_full_after_the_store_moved_in_keeps_the_old_output(raw: Path, done: Path, monkeypatch) -> None:
    """--overwrite, the disk full while the staged folders move in (the store moved, the shard folder not): the
    old output is still complete and valid, one line says so, and a re-run finishes the replacement."""
    before = _state(done)
    real = os.replace

    def replace(src, dst, *a, **k):
        if Path(dst).parent == done and Path(dst).name.startswith("shards"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Exception, match=r"no space left on the device \(No space left on device\); nothing was "
                                        "published"):
        run_ingest("fno", [raw], done, _opts(overwrite=True, split=(0.5,)))
    monkeypatch.undo()
    assert _state(done)[0] == before[0]
    assert not [p for p in verify_output(str(done)) if p.fatal]
    assert run_ingest("fno", [raw], done, _opts(overwrite=True, split=(0.5,))).written
    _clean(done)


def test_disk_full_when_creating_the_output_folder_is_one_line(raw: Path, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "out"
    real = Path.mkdir

    def mkdir(self, *a, **k):
        if self == out:
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    result = CliRunner().invoke(app, ["ingest", "fno", str(raw), "--out", str(out), "--resolution", "0",
                                      "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no space left on the device" in errors[0], result.output
    assert not out.exists()


def test_a_staged_chunk_lost_after_the_journal_recorded_it_is_caught_on_resume(raw: Path, tmp_path: Path) -> None:
    """A power cut can lose chunk files the journal already counts (chunks are synced once, at the end): the resumed
    run finds the staged rows short of the digests the journal recorded for them, says so, and ingests afresh
    instead of publishing fill values with matching digests."""
    out = tmp_path / "out"
    script = tmp_path / "kill.py"
    script.write_text(_CHUNK_KILLER)
    proc = subprocess.run([sys.executable, str(script), str(raw), str(out), "5"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    staging = out / ".staging-fno-ns-v1e-3"
    lines = [json.loads(x) for x in (staging / "journal.jsonl").read_text().splitlines()]
    assert [x["zarr"]["rows"] for x in lines if "block" in x][:1] == [1]  # the journal holds the writer's state
    next(staging.rglob("fields/c.0.*")).unlink()  # row 0, journalled, lost
    with pytest.warns(UserWarning, match="do not hash to what the journal recorded for them; ingesting this dataset "
                                         "afresh"):
        outcome = run_ingest("fno", [raw], out, _opts(block=1, formats=("zarr",)))
    clean = run_ingest("fno", [raw], tmp_path / "clean", _opts(block=1, formats=("zarr",))).manifest
    assert outcome.manifest["datasets"][0]["zarr"] == clean["datasets"][0]["zarr"]
    _clean(out)
