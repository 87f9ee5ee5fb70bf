"""Dataset cards (`dpot-data card OUT`, `ingest --card`, dpot_data.card): the Hugging Face front matter, what the body
says (grid, frames, dt, channels with units, splits, statistics, catalog citation and licence), shard checksums read
back from the table, provenance, the preview picture, and the refusals."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from dpot_data.card import CARD_NAME, card_text, preview_path, size_category, write_card
from dpot_data.catalog import CatalogError, load_catalog
from dpot_data.cli import app
from tests.test_readme_path import bash_blocks

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
DATASET = "pdebench-cfd-m1-eta0p1"
SHA_ROW = re.compile(r"^\| (shards/\S+) \| (train|valid|test) \| (\d+) \| (\d+) \| ([0-9a-f]{64}) \|$", re.M)


def _cli(*args: str):  # noqa: ANN202 - click Result
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def _one_line_error(result) -> str:  # noqa: ANN001 - click Result
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def _front(text: str) -> dict:
    assert text.startswith("---\n")
    head, _, _ = text[4:].partition("\n---\n")
    return yaml.safe_load(head)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small PDEBench CFD file ingested as a catalog dataset with `--card`, by the installed `dpot-data` (so the
    manifest records a real command line); the card's bytes as ingest wrote them are kept beside it."""
    from dpot_data.synth.pdebench import write_cfd

    base = tmp_path_factory.mktemp("card")
    raw = write_cfd(base / "raw", m=1.0, eta=0.1, n=4, frames=5, res=16)
    proc = subprocess.run([str(BIN / "dpot-data"), "ingest", "--dataset", "pdebench-cfd-m1-eta0.1", str(raw),
                           "--out", "shards", "--resolution", "16", "--split", "0.5", "--no-progress", "--card"],
                          cwd=base, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    shards = base / "shards"
    (base / "ingest-card.md").write_bytes((shards / CARD_NAME).read_bytes())
    (base / "ingest-card.png").write_bytes((shards / preview_path(DATASET)).read_bytes())
    return shards


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text(encoding="utf-8"))


def test_front_matter_parses_as_yaml_with_the_hugging_face_keys(out: Path) -> None:
    front = _front((out / CARD_NAME).read_text(encoding="utf-8"))
    manifest = _manifest(out)
    assert set(front) >= {"license", "pretty_name", "tags", "task_categories", "size_categories", "configs"}
    assert front["license"] == load_catalog().sources["pdebench"].license == "cc-by-4.0"
    assert front["pretty_name"] == DATASET and "pdebench" in front["tags"]
    assert front["task_categories"] == ["time-series-forecasting", "other"] and front["size_categories"] == ["n<1K"]
    (config,) = front["configs"]
    shards = manifest["datasets"][0]["shards"]
    assert config["config_name"] == DATASET
    assert {f["split"]: f["path"] for f in config["data_files"]} == {
        s: [x["path"] for x in shards if x["split"] == s] for s in ("train", "test")}


def test_body_names_grid_frames_dt_channels_units_splits_citation_and_licence(out: Path) -> None:
    text = (out / CARD_NAME).read_text(encoding="utf-8")
    entry = _manifest(out)["datasets"][0]
    facts = load_catalog().sources["pdebench"]
    assert "- Grid: 16x16 (y, x), native 16x16" in text
    assert "a stored trajectory is (T, C, Y, X)" in text and "the model reads space as (X, Y)" in text
    assert f"- Frames per trajectory: {entry['frames']}" in text
    assert f"- dt: {entry['dt']}" in text and entry["dt"] is not None
    for name, ok in zip(entry["channels"], entry["channel_valid"]):
        assert (f"| {name} | unknown | data |" if ok else f"| {name} | 1 | padding (constant 1.0) |") in text
    counts = entry["splits"]["counts"]
    assert counts["train"] == counts["test"] == 2
    for split in ("train", "test"):
        shards = [s for s in entry["shards"] if s["split"] == split]
        assert f"| {split} | 2 | {len(shards)} | {sum(s['bytes'] for s in shards)} |" in text
    assert facts.citation in text and "```bibtex" in text
    assert f"- Licence: cc-by-4.0 (stated in {facts.license_stated})" in text
    assert facts.equation(DATASET) in text and "compressible Navier–Stokes" in text
    stats = entry["stats"]["fields"][entry["stats"]["channels"][0]]
    assert f"| {entry['stats']['channels'][0]} | value | {stats['count']} | {stats['mean']:.6g} |" in text


def test_every_shard_sha256_in_the_card_is_the_manifests(out: Path) -> None:
    rows = SHA_ROW.findall((out / CARD_NAME).read_text(encoding="utf-8"))
    listed = {s["path"]: (s["split"], s["samples"], s["bytes"], s["sha256"])
              for s in _manifest(out)["datasets"][0]["shards"]}
    assert len(rows) == len(listed) >= 2
    assert {p: (split, int(n), int(b), sha) for p, split, n, b, sha in rows} == listed


def test_the_ingest_command_and_version_are_in_the_card(out: Path) -> None:
    text = (out / CARD_NAME).read_text(encoding="utf-8")
    manifest = _manifest(out)
    assert manifest["command"].startswith("dpot-data ingest --dataset pdebench-cfd-m1-eta0.1 ")
    raw = str(out.parent / "raw")  # the input was named by its absolute path: the card names it by its file name
    assert raw in manifest["command"] and str(out.parent) not in text
    assert f"```bash\n{manifest['command'].replace(raw + '/', '')}\n```" in text
    assert f"- Written by dpot {manifest['tool']['version']} on {manifest['created']}" in text


def test_the_preview_is_a_png_of_the_first_test_trajectory(out: Path) -> None:
    import matplotlib.image

    png = out / preview_path(DATASET)
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    image = matplotlib.image.imread(str(png))
    assert image.shape[0] > 100 and image.shape[1] > 300 and float(np.std(image[..., :3])) > 0.05
    text = (out / CARD_NAME).read_text(encoding="utf-8")
    assert f"![first frame of {DATASET}]({preview_path(DATASET)})" in text
    assert "The first frame of test trajectory " in text


def test_card_command_writes_the_card_ingest_card_wrote(out: Path) -> None:
    before = (out.parent / "ingest-card.md").read_bytes()
    result = _cli("card", str(out))
    assert result.exit_code == 0, result.output
    assert (out / CARD_NAME).read_bytes() == before
    assert (out / preview_path(DATASET)).read_bytes() == (out.parent / "ingest-card.png").read_bytes()
    assert not [p.name for p in out.rglob("*.tmp*")]


def test_a_folder_without_a_manifest_is_refused_in_one_line(tmp_path: Path) -> None:
    line = _one_line_error(_cli("card", str(tmp_path)))
    assert "manifest.json" in line and "none found" in line
    assert list(tmp_path.iterdir()) == []


def test_an_output_that_fails_the_format_check_is_refused_in_one_line(out: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(out, broken, ignore=shutil.ignore_patterns(CARD_NAME, "card"))
    first = _manifest(broken)["datasets"][0]["shards"][0]["path"]
    (broken / first).unlink()
    line = _one_line_error(_cli("card", str(broken)))
    assert str(broken) in line and first in line
    assert not (broken / CARD_NAME).exists() and not (broken / "card").exists()
    bad = tmp_path / "bad"
    shutil.copytree(out, bad, ignore=shutil.ignore_patterns(CARD_NAME, "card"))
    doc = _manifest(bad)
    doc["datasets"][0]["trajectories"] += 1
    (bad / "manifest.json").write_text(json.dumps(doc), encoding="utf-8")
    line = _one_line_error(_cli("card", str(bad)))
    assert "manifest.json" in line and "trajectories" in line
    assert not (bad / CARD_NAME).exists()


def test_a_corpus_folder_gets_one_card_per_dataset_folder(out: Path, tmp_path: Path) -> None:
    for name in ("a", "b"):
        shutil.copytree(out, tmp_path / "corpus" / name, ignore=shutil.ignore_patterns(CARD_NAME, "card"))
    result = _cli("card", str(tmp_path / "corpus"))
    assert result.exit_code == 0, result.output
    for name in ("a", "b"):
        assert (tmp_path / "corpus" / name / CARD_NAME).read_bytes() == (out / CARD_NAME).read_bytes()
    assert not (tmp_path / "corpus" / CARD_NAME).exists()


def test_own_xarray_data_gets_a_card_saying_not_given(tmp_path: Path) -> None:
    from dpot_data.ingest import IngestOptions, run_ingest
    from dpot_data.synth.gridded import write_netcdf

    nc = write_netcdf(tmp_path / "raw", members=3, frames=4, ny=12, nx=16, land=True)
    run_ingest("xarray", [nc], tmp_path / "own", IngestOptions(progress=False, resolution=0, split=(0.6,),
                                                                card=True))
    text = (tmp_path / "own" / CARD_NAME).read_text(encoding="utf-8")
    assert "- Citation: not given" in text and "- Licence: not given" in text
    assert "- Equation: not given" in text and "```bibtex" not in text
    assert _front(text)["license"] == "unknown"
    fluid = float(re.search(r"; ([\d.]+)% of the cells of the previewed trajectory are fluid", text).group(1))
    assert 0 < fluid < 100  # the land block is solid
    assert "| u | m s-1 | data |" in text  # the file's units (dpot_format.units), as the Zarr store has them


def test_a_url_output_gets_its_card_through_fsspec() -> None:
    from tests.toy_output import write_toy_output

    root = "memory://card-toy/out"
    write_toy_output(root)
    written = write_card(root)
    assert written == [f"{root}/{preview_path('toy')}", f"{root}/{CARD_NAME}"]
    fsys = fsspec.filesystem("memory")
    text = fsys.cat(f"/card-toy/out/{CARD_NAME}").decode("utf-8")
    assert "## toy" in text and "- dt: unknown" in text and "- Citation: not given" in text
    assert fsys.cat(f"/card-toy/out/{preview_path('toy')}").startswith(b"\x89PNG")
    fsys.rm("/card-toy", recursive=True)


def test_card_text_is_pure_and_names_no_time_of_writing(out: Path) -> None:
    manifest = _manifest(out)
    catalog = load_catalog()
    assert card_text(manifest, catalog) == card_text(json.loads(json.dumps(manifest)), catalog)
    assert "- Citation: not given" in card_text(manifest, None)
    older = {**manifest, "command": ""}  # an output whose command line was not recorded
    assert "- Ingest command: not recorded" in card_text(older, catalog) and "```bash" not in card_text(older, catalog)
    assert [size_category(n) for n in (0, 999, 1000, 123_456, 10**9)] == [
        "n<1K", "n<1K", "1K<n<10K", "100K<n<1M", "n>100M"]


def test_catalog_source_facts_are_checked(tmp_path: Path) -> None:
    facts = {"title": "t", "homepage": "https://x", "equations": {"*": "e"}, "license": "cc-by-4.0",
             "license_stated": "s", "citation": "@misc{x}"}
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"datasets": [], "sources": {"fno": facts}}), encoding="utf-8")
    assert load_catalog(good).sources["fno"].equation("anything") == "e"
    for key, value, said in (("citation", "", "citation must be non-empty"),
                             ("license", "CC BY 4.0", "license must be a Hugging Face licence id")):
        bad = tmp_path / f"bad-{key}.yaml"
        bad.write_text(yaml.safe_dump({"datasets": [], "sources": {"fno": {**facts, key: value}}}), encoding="utf-8")
        with pytest.raises(CatalogError, match=f"sources.fno: {said}"):
            load_catalog(bad)
    catalog = load_catalog()  # every catalog dataset's source has its facts, and they give its equation
    assert set(catalog.sources) == {e.source for e in catalog.entries.values()}
    for entry in catalog.entries.values():
        facts = catalog.sources[entry.source]
        assert facts.citation.startswith("@") and facts.equation(entry.name, entry.manifest_name), entry.name


def test_readme_section_runs_verbatim(out: Path, tmp_path: Path) -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (block,) = bash_blocks(text, "Dataset cards")
    shutil.copytree(out, tmp_path / "shards", ignore=shutil.ignore_patterns(CARD_NAME, "card"))
    (tmp_path / ".venv").symlink_to(BIN.parent)
    proc = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "shards" / CARD_NAME).read_bytes() == (out / CARD_NAME).read_bytes()
    assert (tmp_path / "shards" / preview_path(DATASET)).is_file()


def test_a_card_folder_that_cannot_be_written_is_refused_in_one_line(out: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns(CARD_NAME, "card"))
    (copy / "card").write_text("a file of the user's where the pictures go", encoding="utf-8")
    line = _one_line_error(_cli("card", str(copy)))
    assert line == f"error: {copy / 'card'}: is a regular file; expected a folder or a new name"
    assert (copy / "card").read_text(encoding="utf-8").startswith("a file") and not (copy / CARD_NAME).exists()


def _table(text: str, header: str) -> list[str]:
    """The rows of the Markdown table that starts with `header` (its header and separator included)."""
    block = text.split(header, 1)[1].split("\n\n", 1)[0]
    return [header] + [ln for ln in block.splitlines() if ln]


def test_every_text_from_the_manifest_is_escaped_bounded_and_names_no_machine_folder(out: Path) -> None:
    manifest = _manifest(out)
    entry = manifest["datasets"][0]
    hostile = ["<script>alert(1)</script>", "a|b\n# heading", "<img src=x onerror=alert(2)>" + "u" * 1_000_000]
    entry["channels"][: len(hostile)] = hostile
    entry["stats"]["channels"] = list(hostile)
    entry["stats"]["fields"] = entry["stats"]["diff"] = {}
    entry["source"] = "<b onmouseover=alert(3)>pdebench</b>"
    entry["parameters"] = {"variables": {"T": {"units": "<i>K</i>" + "K" * 1_000_000, "long_name": "x\n# title"}}}
    entry["inputs"] = [{"path": "/home/alice/private/raw data/heat.nc", "bytes": 12, "sha256": "ab" * 32}]
    entry["skipped"] = [{"what": "/home/alice/private/bad.nc: sample 3", "reason": "NaN in /home/alice/x.nc"}] * 500
    manifest["command"] = ("dpot-data ingest xarray '/home/alice/private/raw data/heat.nc' --out=/home/alice/out "
                           "--name '```<script>'")
    text = card_text(manifest, load_catalog())
    assert len(text.encode()) < 40_000  # megabyte attributes are cut (NAME_LIMIT characters, then an ellipsis)
    fenced = "````bash\ndpot-data ingest xarray heat.nc --out=out --name '```<script>'\n````"
    assert fenced in text  # a code block shows its text as it is: its fence is longer than any run of backticks
    for raw in ("<script", "<img", "<b ", "<i>", "/home/alice", "private"):
        assert raw not in text.replace(fenced, ""), raw
    assert not [ln for ln in text.splitlines() if ln.startswith("#") and ("heading" in ln or "title" in ln)]
    channels = _table(text, "| channel | units | holds |")
    assert len(channels) == 2 + len(entry["channels"])
    assert channels[2].startswith("| &lt;script&gt;alert(1)&lt;/script&gt; | ") and channels[3].startswith(
        "| a\\|b # heading | ")
    assert all(len(re.findall(r"(?<!\\)\|", ln)) == 4 for ln in channels)  # no row gains a cell
    assert "| heat.nc | 12 | " + "ab" * 32 + " |" in text  # the raw input by file name and sha256
    assert "- and 400 more (manifest.json lists them)" in text and "- bad.nc: sample 3: NaN in x.nc" in text


def test_own_netcdf_with_html_and_huge_attributes_gets_a_small_escaped_card(tmp_path: Path) -> None:
    import hashlib

    import xarray as xr

    from dpot_data.synth.gridded import write_user_netcdf

    ds = xr.open_dataset(write_user_netcdf(tmp_path / "synth", samples=3, frames=5, ny=12, nx=16, obstacle=2)).load()
    name = "<img src=x onerror=alert(1)>"
    ds = ds.rename({"temperature": name})
    ds[name].attrs.update(units="<script>alert(2)</script>" + "K" * 1_000_000, long_name="a | b\n# heading")
    ds["x"].attrs["units"] = "m" * 1_000_000
    raw = tmp_path / "raw" / "heat.nc"
    raw.parent.mkdir()
    ds.to_netcdf(raw, engine="h5netcdf")
    proc = subprocess.run([str(BIN / "dpot-data"), "ingest", "xarray", str(raw), "--out", str(tmp_path / "out"),
                           "--resolution", "0", "--split", "0.7", "--no-progress", "--card"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "out" / CARD_NAME).read_text(encoding="utf-8")
    assert len(text.encode()) < 16_000
    assert "<script" not in text and "<img" not in text and str(tmp_path) not in text
    assert "| &lt;img src=x onerror=alert(1)&gt; | " in text and "&lt;script&gt;alert(2)&lt;/script&gt;KKK" in text
    assert "K" * 100 not in text and "m" * 100 not in text and "a \\| b # heading" in text
    digest = hashlib.sha256(raw.read_bytes()).hexdigest()
    assert f"| heat.nc | {raw.stat().st_size} | {digest} |" in text
    assert "dpot-data ingest xarray heat.nc --out out " in text
