"""Inputs and outputs as fsspec URLs: file:// and memory:// give the same output as plain local paths."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import fsspec
import pytest

from dpot_data.errors import InputError
from dpot_data.ingest import IngestOptions
from dpot_data.output import datasets, recompute_stats
from dpot_data.plot import PlotOptions, render
from dpot_data.ingest import run_ingest
from dpot_data.stats import compare
from dpot_format.manifest import read_manifest
from dpot_format.validate import validate_output
from tests.toy_output import write_fno_raw, write_toy_output


def _opts(**kw) -> IngestOptions:
    return IngestOptions(resolution=16, shard_size=100 << 10, block=4, workers=2, command="test", **kw)


def _shards(manifest: dict) -> dict[str, str]:
    return {s["path"]: s["sha256"] for d in manifest["datasets"] for s in d["shards"]}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("fsspec")
    raw = write_fno_raw(base / "raw", n=10, res=32, frames=5)
    outcome = run_ingest("fno", [raw], base / "local", _opts(), workdir=base / "work")
    return raw, outcome.manifest


def test_memory_input_and_output_match_local_paths(local_run, tmp_path: Path) -> None:
    raw, local = local_run
    mem = fsspec.filesystem("memory")
    tag = uuid.uuid4().hex[:8]
    mem.pipe(f"/raw-{tag}/{raw.name}", raw.read_bytes())
    url_in, url_out = f"memory://raw-{tag}/{raw.name}", f"memory://out-{tag}"
    outcome = run_ingest("fno", [url_in], url_out, _opts(), workdir=tmp_path / "work")
    assert outcome.written and outcome.notes[-1] == f"uploaded to {url_out}"
    remote = read_manifest(url_out)
    assert _shards(remote) == _shards(local)
    assert remote["datasets"][0]["zarr"]["arrays"] == local["datasets"][0]["zarr"]["arrays"]
    assert remote["datasets"][0]["inputs"][0]["path"] == url_in
    assert remote["datasets"][0]["inputs"][0]["sha256"] == local["datasets"][0]["inputs"][0]["sha256"]
    assert not (tmp_path / "work").exists()  # the local working copy is gone once uploaded
    # readers of the output work on the URL too
    assert validate_output(url_out) == []
    again = recompute_stats(url_out)
    assert compare(remote["datasets"][0]["stats"], again[remote["datasets"][0]["name"]]) == []
    assert render(url_out, PlotOptions(trajectories=1))[:4] == b"\x89PNG"
    # a complete output is left alone
    second = run_ingest("fno", [url_in], url_out, _opts(), workdir=tmp_path / "work")
    assert not second.written and "left alone" in second.notes[0]


def test_file_urls(local_run, tmp_path: Path) -> None:
    raw, local = local_run
    outcome = run_ingest("fno", [f"file://{raw}"], f"file://{tmp_path}/out", _opts())
    assert outcome.written
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert _shards(manifest) == _shards(local)
    assert validate_output(f"file://{tmp_path}/out") == []


def test_toy_output_readers_on_memory_urls() -> None:
    url = f"memory://toy-{uuid.uuid4().hex[:8]}"
    fields, mask = write_toy_output(url)
    view = datasets(url)[0]
    assert list(view.split_labels()) == ["train", "train", "valid", "train", "test"]
    assert [int(s.meta["index"]) for s in view.iter_shards()] == [0, 1, 3, 2, 4]
    sample = view.trajectory(3)
    assert (sample.fields == fields[3]).all() and (sample.mask == mask[3]).all()
    fsspec.filesystem("memory").pipe(url.replace("memory://", "/") + "/shards/toy/train-000000.tar", b"broken")
    assert [(p.what, p.kind) for p in validate_output(url)] == [("shards/toy/train-000000.tar", "bytes"),
                                                               ("shards/toy/train-000000.tar", "sha256")]


def test_cli_ingest_memory_urls_then_verify_and_stats(local_run, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dpot_data.cli import app

    raw, local = local_run
    tag = uuid.uuid4().hex[:8]
    fsspec.filesystem("memory").pipe(f"/cli-raw-{tag}/{raw.name}", raw.read_bytes())
    url_in, url_out = f"memory://cli-raw-{tag}/{raw.name}", f"memory://cli-out-{tag}"
    runner = CliRunner()
    args = ["ingest", "fno", url_in, "--out", url_out, "--resolution", "16", "--shard-size", "100KiB", "--block", "4",
            "--workers", "2", "--no-progress"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"uploaded to {url_out}" in result.output
    assert _shards(read_manifest(url_out)) == _shards(local)
    assert runner.invoke(app, ["verify", url_out]).exit_code == 0
    assert "manifest: matches" in runner.invoke(app, ["stats", url_out]).output
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "left alone" in again.output


@pytest.mark.parametrize("fail_at", ["first-file", "manifest"])
def test_overwriting_a_url_output_keeps_the_old_one_readable_until_the_new_manifest(local_run, tmp_path: Path,
                                                                                  monkeypatch, fail_at: str) -> None:
    """--overwrite of an output at a URL, the upload failing (a full bucket, a lost connection) on its first file or
    on the new manifest: the old output is still there, complete and valid; a re-run replaces it and leaves nothing
    of either upload behind."""
    import errno

    from fsspec.implementations.memory import MemoryFileSystem

    raw, _ = local_run
    mem = fsspec.filesystem("memory")
    tag = uuid.uuid4().hex[:8]
    mem.pipe(f"/ow-raw-{tag}/{raw.name}", raw.read_bytes())
    url_in, url_out = f"memory://ow-raw-{tag}/{raw.name}", f"memory://ow-out-{tag}"
    run_ingest("fno", [url_in], url_out, _opts(), workdir=tmp_path / "work")
    old = read_manifest(url_out)
    real_mv = MemoryFileSystem.mv

    def mv(self, path1, path2, *args, **kwargs):
        if fail_at == "first-file" or str(path2).endswith("/manifest.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_mv(self, path1, path2, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "mv", mv)
    with pytest.raises(InputError, match=rf"^{url_out}: no space left on the device \(No space left on device\); "
                                         "nothing was published"):  # one line, no traceback, from the CLI
        run_ingest("fno", [url_in], url_out, _opts(overwrite=True, split=(0.5,)), workdir=tmp_path / "work")
    monkeypatch.undo()
    assert read_manifest(url_out) == old
    assert not [p for p in validate_output(url_out) if p.fatal]  # every file the old manifest names is intact
    outcome = run_ingest("fno", [url_in], url_out, _opts(overwrite=True, split=(0.5,)), workdir=tmp_path / "work")
    assert outcome.written
    new = read_manifest(url_out)
    assert new["datasets"][0]["splits"]["counts"] != old["datasets"][0]["splits"]["counts"]
    assert validate_output(url_out) == []  # no leftover: no temporary, no unlisted shard
    entry = new["datasets"][0]
    tops = {entry["zarr"]["path"], *(s["path"].split("/", 1)[0] for s in entry["shards"])}
    listed = {p.rsplit("/", 1)[-1] for p in mem.ls(f"/ow-out-{tag}", detail=False)}
    assert listed == {"manifest.json", *tops}
