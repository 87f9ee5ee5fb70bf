"""An output made from inputs at one path is the same ingest for byte-identical inputs at another (sha256, as the
manifest records them): the README's corpus flow — one dataset ingested, then the whole download folder — keeps
it instead of refusing; inputs that really differ are still refused, naming the file."""

from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.synth.cfdbench import write_cfdbench
from dpot_data.synth.pdebench import write_diff_react

RUNNER = CliRunner()


def _ingest(*args: str):  # noqa: ANN202 - click Result
    return RUNNER.invoke(app, ["ingest", *args, "--resolution", "16", "--no-progress"])


def test_the_readme_corpus_flow_keeps_a_dataset_ingested_from_the_same_file_elsewhere(tmp_path: Path) -> None:
    first = write_diff_react(tmp_path / "here", n=3, frames=6, res=16, seed=3)
    downloads = tmp_path / "downloads"
    (downloads / "pdebench").mkdir(parents=True)
    shutil.copy2(first, downloads / "pdebench" / first.name)  # the same bytes at another path
    corpus = tmp_path / "corpus"
    done = _ingest("--dataset", "pdebench-dr", str(first), "--out", str(corpus / "pdebench-dr"))
    assert done.exit_code == 0, done.output
    manifest = (corpus / "pdebench-dr" / "manifest.json").read_bytes()

    again = _ingest("corpus", str(downloads), "--out", str(corpus))
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines()[0].startswith(f"kept {corpus / 'pdebench-dr' / 'manifest.json'}: pdebench-dr")
    warnings = [ln for ln in again.stderr.splitlines() if ln.startswith("warning:")]
    assert warnings == ["warning: 11 of the 12 pre-training datasets have no raw files here: fno-ns-v1e-5, "
                        "fno-ns-v1e-4, fno-ns-v1e-3, pdebench-cfd-m1-eta0.1, pdebench-cfd-m1-eta0.01, "
                        "pdebench-cfd-m0.1-eta0.1, pdebench-cfd-m0.1-eta0.01, pdebench-swe, pdearena-ns, "
                        "pdearena-ns-cond, cfdbench (`dpot-data catalog NAME` names each one's files and where they "
                        "come from)"]
    assert (corpus / "pdebench-dr" / "manifest.json").read_bytes() == manifest  # left alone

    other = write_diff_react(tmp_path / "other", n=3, frames=6, res=16, seed=4)  # same name and size, other bytes
    shutil.copy2(other, downloads / "pdebench" / first.name)
    refused = _ingest("corpus", str(downloads), "--out", str(corpus))
    copy = downloads / "pdebench" / first.name
    assert refused.exit_code == 2
    errors = [ln for ln in refused.stderr.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: pdebench-dr: {corpus / 'pdebench-dr'}: holds pdebench-dr, made from other inputs than "
                      f"{copy} ({copy}: no recorded input has its size and sha256); one output folder holds one "
                      "ingest: choose another --out (`ingest corpus` writes one sub-folder per dataset) or pass "
                      "--overwrite to replace it"]
    assert (corpus / "pdebench-dr" / "manifest.json").read_bytes() == manifest


def test_a_folder_of_inputs_is_compared_file_by_file_at_the_same_relative_paths(tmp_path: Path) -> None:
    """CFDBench trees: a copy is the same ingest (the dam cases the reference skips may be there too); a copy with
    one file changed, or one case more, is not."""
    tree = tmp_path / "cfd"
    write_cfdbench(tree, problems=("cavity", "dam"), cases=2, frames=(20, 22), res=8, seed=5)
    out = tmp_path / "out"
    assert _ingest("--dataset", "cfdbench", str(tree), "--out", str(out)).exit_code == 0
    copy = tmp_path / "downloads" / "cfdbench"
    shutil.copytree(tree, copy)
    kept = _ingest("--dataset", "cfdbench", str(copy), "--out", str(out))
    assert kept.exit_code == 0 and kept.stdout.startswith(f"kept {out / 'manifest.json'}: cfdbench"), kept.output

    changed = copy / "cavity" / "bc" / "case0001" / "u.npy"
    changed.write_bytes(changed.read_bytes()[:-4] + b"\0\0\0\0")
    refused = _ingest("--dataset", "cfdbench", str(copy), "--out", str(out))
    assert refused.exit_code == 2
    assert (f"made from other inputs than {copy} ({changed}: differs from the recorded "
            f"{tree.resolve() / 'cavity' / 'bc' / 'case0001' / 'u.npy'} (size or sha256))") in refused.stderr

    shutil.copy2(tree / "cavity" / "bc" / "case0001" / "u.npy", changed)  # the same again, then one case more
    shutil.copytree(copy / "cavity" / "bc" / "case0001", copy / "cavity" / "bc" / "case0002")
    refused = _ingest("--dataset", "cfdbench", str(copy), "--out", str(out))
    assert refused.exit_code == 2 and "case0002" in refused.stderr and "not among the recorded inputs" in refused.stderr
