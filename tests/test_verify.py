"""`dpot-data verify` / `inspect --verify` (dpot_format.validate): every shard and Zarr array re-hashed against the
manifest; each mismatch named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zarr

from dpot_data.ingest.scheduler import SchedulerOptions, scheduler_context
from dpot_format.validate import Problem, summarise, validate_output
from tests.toy_output import write_toy_output


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_intact_output_verifies(tmp_path: Path) -> None:
    write_toy_output(str(tmp_path))
    with scheduler_context(SchedulerOptions(workers=2)) as runner:
        problems = validate_output(str(tmp_path), runner=runner)
    assert problems == []
    assert summarise(problems, 6) == (0, ["OK: 6 item(s) match the manifest"])


def test_flipped_byte_in_a_shard_is_named(tmp_path: Path) -> None:
    write_toy_output(str(tmp_path))
    shard = tmp_path / "shards/toy/valid-000000.tar"
    _flip_byte(shard, 700)  # inside the first member's data
    problems = validate_output(str(tmp_path))
    assert [(p.what, p.kind) for p in problems] == [("shards/toy/valid-000000.tar", "sha256")]
    code, lines = summarise(problems)
    assert code == 1
    assert lines[0].startswith("shards/toy/valid-000000.tar: sha256 mismatch (manifest ")
    assert lines[-1] == "FAILED: 1 problem(s)"


def test_truncated_and_missing_shards_and_changed_zarr_values(tmp_path: Path) -> None:
    write_toy_output(str(tmp_path))
    train = tmp_path / "shards/toy/train-000000.tar"
    train.write_bytes(train.read_bytes()[:-512])
    (tmp_path / "shards/toy/test-000000.tar").unlink()
    g = zarr.open_group(str(tmp_path / "data.zarr"), mode="a", path="toy")
    g["mask"][1, 0, 0] = 1 - g["mask"][1, 0, 0]
    found = {(p.what, p.kind) for p in validate_output(str(tmp_path))}
    assert found == {
        ("shards/toy/train-000000.tar", "bytes"),
        ("shards/toy/train-000000.tar", "sha256"),
        ("shards/toy/test-000000.tar", "missing"),
        ("data.zarr/toy/mask", "sha256"),
    }


def test_leftover_temp_file_is_a_warning_only(tmp_path: Path) -> None:
    write_toy_output(str(tmp_path))
    (tmp_path / "shards/toy/.train-000001.tar.tmp").write_bytes(b"partial")
    (tmp_path / "shards/toy/stray.tar").write_bytes(b"")
    problems = validate_output(str(tmp_path))
    assert problems == [Problem("shards/toy/.train-000001.tar.tmp", "temporary"),
                        Problem("shards/toy/stray.tar", "unlisted")]
    assert [p.fatal for p in problems] == [False, False]
    assert summarise(problems) == (0, ["shards/toy/.train-000001.tar.tmp: temporary file left by an interrupted "
                                       "write (warning)", "shards/toy/stray.tar: not listed in the manifest (warning)",
                                       "OK"])


def test_missing_or_invalid_manifest(tmp_path: Path) -> None:
    problems = validate_output(str(tmp_path))
    assert [str(p) for p in problems] == ["manifest.json: expected a manifest.json written by `dpot-data ingest` "
                                          "(none found)"]
    write_toy_output(str(tmp_path))
    doc = json.loads((tmp_path / "manifest.json").read_text())
    del doc["datasets"][0]["frames"]
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    problems = validate_output(str(tmp_path))
    assert [str(p) for p in problems] == ["manifest.json: datasets/0: 'frames' is a required property"]


@pytest.mark.parametrize("target", ["outside", "inside"])
def test_a_symlinked_manifest_is_refused(tmp_path: Path, target: str) -> None:
    from typer.testing import CliRunner

    from dpot_data.cli import app

    out = tmp_path / "out"
    write_toy_output(str(out))
    real = tmp_path / "elsewhere.json" if target == "outside" else out / "real-manifest.json"
    (out / "manifest.json").rename(real)
    (out / "manifest.json").symlink_to(real)
    problems = validate_output(str(out))
    assert [str(p) for p in problems] == [f"manifest.json: is a symbolic link (to {str(real)!r}), expected the "
                                          "manifest file itself inside the output folder"]
    assert problems[0].fatal
    result = CliRunner().invoke(app, ["verify", str(out)])
    assert result.exit_code == 1 and "manifest.json: is a symbolic link" in result.output, result.output


def _ingested(tmp_path: Path) -> Path:
    from dpot_data.ingest import IngestOptions, run_ingest
    from tests.toy_output import write_fno_raw

    raw = write_fno_raw(tmp_path / "raw", n=8, res=32, frames=4)
    out = tmp_path / "out"
    run_ingest("fno", [raw], out, IngestOptions(resolution=16, shard_size=40 << 10, workers=2, command="test"))
    return out


def test_cli_verify_and_inspect_verify_name_the_flipped_shard(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dpot_data.cli import app

    out = _ingested(tmp_path)
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", str(out), "--workers", "2"])
    manifest = json.loads((out / "manifest.json").read_text())
    shards = [s["path"] for s in manifest["datasets"][0]["shards"]]
    assert ok.exit_code == 0, ok.output
    assert ok.output.strip().endswith(f"OK: {len(shards) + len(manifest['datasets'][0]['zarr']['arrays'])} item(s) "
                                      "match the manifest")
    victim = shards[len(shards) // 2]
    _flip_byte(out / victim, (out / victim).stat().st_size // 2)
    bad = runner.invoke(app, ["verify", str(out)])
    assert bad.exit_code == 1
    assert f"{victim}: sha256 mismatch (manifest " in bad.output
    assert bad.output.count("mismatch") == 1 and "FAILED: 1 problem(s)" in bad.output
    inspected = runner.invoke(app, ["inspect", str(out), "--verify", "--json"])
    assert inspected.exit_code == 1
    failed = [f for d in json.loads(inspected.output)["datasets"] for f in d["checksums"]["failed"]]
    assert [f["path"] for f in failed] == [victim]


@pytest.mark.parametrize("where", ["local", "memory"])
def test_verify_and_inspect_verify_name_the_same_files_locally_and_at_urls(tmp_path: Path, where: str) -> None:
    """One validator behind both commands: a shard with a changed byte, a Zarr array with a chunk that does not
    decode, and an unlisted file under shards/ are named alike by `verify` and `inspect --verify`, on a local folder
    and at an fsspec URL."""
    import uuid

    from typer.testing import CliRunner

    from dpot_data.cli import app
    from dpot_format.io import filesystem, join

    root = str(tmp_path / "out") if where == "local" else f"memory://inspect-{uuid.uuid4().hex[:8]}"
    write_toy_output(root)
    fsys, base = filesystem(root)
    shard = f"{base}/shards/toy/valid-000000.tar"
    data = bytearray(fsys.cat_file(shard))
    data[700] ^= 0x01
    fsys.pipe_file(shard, bytes(data))
    chunk = sorted(p for p in fsys.find(f"{base}/data.zarr/toy/fields") if not p.endswith("zarr.json"))[1]
    fsys.pipe_file(chunk, b"\x00" * 64)
    fsys.pipe_file(f"{base}/shards/toy/stray.tar", b"")
    runner = CliRunner()
    verified = runner.invoke(app, ["verify", root])
    assert verified.exit_code == 1, verified.output
    inspected = runner.invoke(app, ["inspect", root, "--verify", "--json"])
    assert inspected.exit_code == 1, inspected.output
    report = json.loads(inspected.stdout)
    lines = verified.output.splitlines()
    assert lines[-1] == "FAILED: 2 problem(s)"
    assert sorted(report["problems"] + report["warnings"]) == sorted(lines[:-1])
    assert [line.split(": ", 1)[0] for line in report["problems"]] == ["shards/toy/valid-000000.tar",
                                                                      "data.zarr/toy/fields"]
    assert report["warnings"] == ["shards/toy/stray.tar: not listed in the manifest (warning)"]
    failed = {f["path"]: f["kind"] for f in report["datasets"][0]["checksums"]["failed"]}
    assert failed == {"shards/toy/valid-000000.tar": "sha256", "data.zarr/toy/fields": "unreadable"}
    assert report["manifest"] == join(root, "manifest.json")
