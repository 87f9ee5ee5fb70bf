"""Checkpoints by name from the Hugging Face Hub (dpot_train.integrations.hub), without a network: a Hub cache laid out
as huggingface_hub lays it out (models--OWNER--REPO/{blobs,refs,snapshots/<commit>/FILE}), HF_HUB_CACHE pointing at it
and HF_HUB_OFFLINE=1, read by `hf_hub_download` itself in every command."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpot_train.core.checkpoint import checkpoint_payload, file_sha256, load_pretrained
from dpot_train.integrations.hub import DPOT_REPO, RELEASED, HubError, parse_reference
from tests import train_runs
from tests.cli_batch import run_batch

GOLDEN = Path(__file__).resolve().parent / "golden"
DPOT_FILE = GOLDEN / "dpot_small.pth"  # laid out as the Hub's model_Ti.pth
OLD_FILE = GOLDEN / "fno_small.pth"  # model_Ti.pth of an older commit (tag v1): another network, easy to tell apart
MAIN = hashlib.sha1(b"main").hexdigest()
OLD = hashlib.sha1(b"v1").hexdigest()
RUNS_REPO = "someone/dpot-runs"  # a repo holding one of our checkpoints in a subfolder (for `model export`)


def _put(repo: Path, commit: str, filename: str, data: bytes) -> None:
    """One file of one commit, as huggingface_hub stores it: the content under blobs/<sha256> (an LFS file's etag),
    the snapshot entry a relative symlink to it."""
    blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    entry = repo / "snapshots" / commit / filename
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.symlink_to(os.path.relpath(blob, entry.parent))


def _ref(repo: Path, name: str, commit: str) -> None:
    (repo / "refs" / name).parent.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / name).write_text(commit)  # no newline, as huggingface_hub writes it


def put_hub_file(cache: Path, repo_id: str, commit: str, filename: str, data: bytes, ref: str | None = None) -> None:
    """One file of one commit of the Hub repo `repo_id` in the huggingface_hub cache folder `cache` (what
    HF_HUB_CACHE names), laid out as huggingface_hub lays it out; `ref` (a branch or tag) then names that commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    _put(repo, commit, filename, data)
    if ref is not None:
        _ref(repo, ref, commit)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A Hub cache holding hzk17/DPOT's model_Ti.pth (main: the golden DPOT file; tag v1: the golden FNO file) and
    one of our checkpoints in someone/dpot-runs; plus the local copy of our checkpoint."""
    base = tmp_path_factory.mktemp("hub")
    cache = base / "hub"
    put_hub_file(cache, DPOT_REPO, MAIN, RELEASED["Ti"], DPOT_FILE.read_bytes(), ref="main")
    put_hub_file(cache, DPOT_REPO, OLD, RELEASED["Ti"], OLD_FILE.read_bytes(), ref="v1")
    ours = base / "ours.pt"
    torch.save(checkpoint_payload(load_pretrained(DPOT_FILE)), ours)
    put_hub_file(cache, RUNS_REPO, MAIN, "ckpt/step-00000002.pt", ours.read_bytes(), ref="main")
    return {"cache": cache, "home": base / "hf-home", "ours": ours}


@pytest.fixture
def offline(hub: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The environment of the commands: huggingface_hub's cache is the test's, offline, no token of the user's."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.setenv("HF_HOME", str(hub["home"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return hub


def _cli(*args: str, pythonpath: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m dpot_train ...` in a fresh process (huggingface_hub reads its environment when imported)."""
    env = train_runs.env()
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env["PYTHONPATH"]
    return subprocess.run([sys.executable, "-m", "dpot_train", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=train_runs.ROOT)


def _one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The command's only stderr line, after checking it failed with exit code 2."""
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    assert lines[0].startswith("error: ")
    return lines[0]


# --- the reference forms (pure) -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,repo,filename,revision", [
    ("dpot:Ti", DPOT_REPO, "model_Ti.pth", None),
    ("dpot:h", DPOT_REPO, "model_H.pth", None),
    ("dpot:S@v1", DPOT_REPO, "model_S.pth", "v1"),
    ("hf://hzk17/DPOT/model_Ti.pth", DPOT_REPO, "model_Ti.pth", None),
    (f"hf://hzk17/DPOT/model_Ti.pth@{OLD}", DPOT_REPO, "model_Ti.pth", OLD),
    ("hf://o/r/sub/dir/w.pt@refs/pr/3", "o/r", "sub/dir/w.pt", "refs/pr/3"),
    ("hf://o/r@dev/w.pt", "o/r", "w.pt", "dev"),  # huggingface_hub's own placement of the revision
])
def test_references_parse(text: str, repo: str, filename: str, revision: str | None) -> None:
    ref = parse_reference(text)
    assert (ref.repo_id, ref.filename, ref.revision) == (repo, filename, revision)


@pytest.mark.parametrize("text,expected", [
    ("hf://hzk17/DPOT", "no file named"),
    ("hf://hzk17/DPOT/", "no file named"),
    ("hf://hzk17/DPOT/model_Ti.pth@", "expected a revision"),
    ("hf://hzk17/DPOT/../x.pth", "no '.' or '..'"),
    ("hf://hzk17/DPOT/sub/./x.pth", "no '.' or '..'"),
    ("dpot:XL", "expected one of dpot:Ti, dpot:S, dpot:M, dpot:L, dpot:H"),
])
def test_bad_references_are_one_line(text: str, expected: str) -> None:
    with pytest.raises(HubError) as err:
        parse_reference(text)
    assert expected in str(err.value) and str(err.value).startswith(text) and "\n" not in str(err.value)


# --- the commands, through hf_hub_download and the cache above ------------------------------------------------------

def test_model_info_by_name_prints_what_the_local_file_does(offline: dict[str, Path]) -> None:
    refs = ("dpot:Ti", "hf://hzk17/DPOT/model_Ti.pth", "hf://hzk17/DPOT/model_Ti.pth@main")
    local, *by_ref, ref_json, plain_json = run_batch(
        [("model", "info", str(DPOT_FILE)), *[("model", "info", ref) for ref in refs],
         ("model", "info", "dpot:Ti", "--json"), ("model", "info", str(DPOT_FILE), "--json")])
    assert local.returncode == 0, local.stderr[-2000:]
    sha = file_sha256(DPOT_FILE)
    for ref, r in zip(refs, by_ref):
        assert r.returncode == 0, r.stderr[-2000:]
        head, *rest = r.stdout.splitlines()
        assert head.endswith(f"from checkpoint {ref}")
        hub_lines = [line for line in rest if line.startswith("hub: ")]
        assert hub_lines == [f"hub: hf://hzk17/DPOT/model_Ti.pth@{MAIN} (commit {MAIN}), sha256 {sha}"]
        assert [line for line in rest if line not in hub_lines] == local.stdout.splitlines()[1:]
    as_json = json.loads(ref_json.stdout)
    assert as_json.pop("hub") == {"reference": "dpot:Ti", "repo_id": DPOT_REPO, "filename": "model_Ti.pth",
                                  "revision": MAIN, "pinned": f"hf://hzk17/DPOT/model_Ti.pth@{MAIN}", "sha256": sha}
    plain = json.loads(plain_json.stdout)
    assert {**as_json, "source": None} == {**plain, "source": None}


def test_revision_selects_the_snapshot(offline: dict[str, Path]) -> None:
    refs = ("dpot:Ti@v1", f"hf://hzk17/DPOT/model_Ti.pth@{OLD}", f"hf://hzk17/DPOT@{OLD}/model_Ti.pth")
    for r in run_batch([("model", "info", ref, "--json") for ref in refs]):
        assert r.returncode == 0, r.stderr[-2000:]
        info = json.loads(r.stdout)
        assert info["family"] == "fno" and info["hub"]["revision"] == OLD
        assert info["hub"]["sha256"] == file_sha256(OLD_FILE)


def test_the_cache_under_hf_home_is_found(offline: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(offline["cache"].parent))  # huggingface_hub's default: $HF_HOME/hub
    r = _cli("model", "info", "dpot:Ti", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["hub"]["revision"] == MAIN


def test_load_pretrained_and_export_take_references(offline: dict[str, Path], tmp_path: Path) -> None:
    script = (
        "import sys, torch\n"
        "from dpot_train.core.checkpoint import load_pretrained\n"
        f"a, b = load_pretrained('dpot:Ti'), load_pretrained({str(DPOT_FILE)!r})\n"
        "assert a.state_dict().keys() == b.state_dict().keys()\n"
        "assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())\n"
        "print(type(load_pretrained('dpot:Ti@v1')).__name__)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                       env=train_runs.env(), cwd=train_runs.ROOT)
    assert r.returncode == 0 and r.stdout.strip() == type(load_pretrained(OLD_FILE)).__name__, r.stderr[-2000:]
    out = tmp_path / "exported.pth"
    r = _cli("model", "export", f"hf://{RUNS_REPO}/ckpt/step-00000002.pt", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    exported = torch.load(out, weights_only=True)["model"]
    original = torch.load(offline["ours"], weights_only=True)["model"]
    assert exported.keys() == original.keys() and all(torch.equal(v, original[k]) for k, v in exported.items())


def test_evaluate_by_name_scores_as_the_local_file_and_records_the_commit(offline: dict[str, Path],
                                                                          fno_train_shards: Path,
                                                                          tmp_path: Path) -> None:
    found = {}
    for name, ckpt in (("local", str(DPOT_FILE)), ("hub", "dpot:Ti")):
        out = tmp_path / f"{name}.json"
        r = _cli("evaluate", ckpt, "--manifest", str(fno_train_shards), "--rollout-steps", "2",
                 "--max-trajectories", "1", "--out", str(out))
        assert r.returncode == 0, r.stderr[-2000:]
        found[name] = json.loads(out.read_text())
    assert found["hub"]["datasets"] == found["local"]["datasets"]
    assert found["hub"]["checkpoint"] == f"hf://hzk17/DPOT/model_Ti.pth@{MAIN}"
    assert found["hub"]["hub"]["revision"] == MAIN and found["hub"]["hub"]["reference"] == "dpot:Ti"
    assert found["hub"]["hub"]["sha256"] == file_sha256(DPOT_FILE)
    assert "hub" not in found["local"] and found["local"]["checkpoint"] == str(DPOT_FILE)


@pytest.mark.slow
def test_launch_init_by_name_records_the_commit_and_sha256(offline: dict[str, Path], fno_train_shards: Path,
                                                            tmp_path: Path) -> None:
    import yaml

    out = tmp_path / "ft"
    r = train_runs.run(train_runs.launch_args(fno_train_shards, out, "--init", "dpot:Ti", "--no-eval", steps=2,
                                              nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["init"] == f"hf://hzk17/DPOT/model_Ti.pth@{MAIN}"
    assert config["init_sha256"] == file_sha256(DPOT_FILE)
    plan = json.loads((out / "plan.json").read_text())
    assert plan["init"]["hub"]["reference"] == "dpot:Ti" and plan["init"]["hub"]["revision"] == MAIN
    assert plan["init"]["released"] is True
    # the workers loaded the released weights: the frozen classification head is the file's, bit for bit
    got = torch.load(out / "checkpoints" / "step-00000002.pt", weights_only=True)["model"]
    assert torch.equal(got["cls_head.0.weight"], torch.load(DPOT_FILE, weights_only=True)["model"]["cls_head.0.weight"])
    # a resume reads the pinned reference back from config.yaml, offline; naming it again as given is no change
    for again in ((), ("--init", "dpot:Ti")):
        r = train_runs.run(train_runs.launch_args(fno_train_shards, out, "--resume", "--no-eval", *again, steps=2,
                                                  nproc=1))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "already reached its last step" in r.stderr


def test_launch_dry_run_resolves_the_reference(offline: dict[str, Path], fno_train_shards: Path,
                                                tmp_path: Path) -> None:
    import yaml

    r = train_runs.run(train_runs.launch_args(fno_train_shards, tmp_path / "ft", "--init", "dpot:Ti@v1", "--dry-run",
                                              "--no-eval", steps=2, nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    config = yaml.safe_load(r.stdout)
    assert config["init"] == f"hf://hzk17/DPOT/model_Ti.pth@{OLD}"
    assert config["init_sha256"] == file_sha256(OLD_FILE)


# --- one line and exit code 2 for what cannot be resolved -----------------------------------------------------------

def test_errors_are_one_line(offline: dict[str, Path], fno_train_shards: Path, tmp_path: Path) -> None:
    no_file, xl, not_cached, no_tag, evaluate = run_batch(
        [("model", "info", "hf://hzk17/DPOT"), ("model", "info", "dpot:XL"), ("model", "info", "dpot:S"),
         ("model", "info", "dpot:Ti@v9"),
         ("evaluate", "dpot:M", "--manifest", str(fno_train_shards), "--out", str(tmp_path / "e.json"))])
    line = _one_error_line(no_file)
    assert "hf://hzk17/DPOT: expected hf://OWNER/REPO/PATH/IN/REPO[@REVISION]" in line and "no file named" in line
    line = _one_error_line(xl)
    assert "unknown released checkpoint 'XL'" in line and "dpot:Ti, dpot:S, dpot:M, dpot:L, dpot:H" in line
    line = _one_error_line(not_cached)  # not laid out in the cache
    assert "hf://hzk17/DPOT/model_S.pth is not in the Hugging Face cache" in line
    assert "and HF_HUB_OFFLINE=1 is set" in line and str(offline["cache"]) in line
    line = _one_error_line(no_tag)  # no such tag in the cache
    assert "dpot:Ti@v9: hf://hzk17/DPOT/model_Ti.pth@v9 is not in the Hugging Face cache" in line
    line = _one_error_line(evaluate)
    assert "dpot:M: hf://hzk17/DPOT/model_M.pth is not in the Hugging Face cache" in line
    assert not (tmp_path / "e.json").exists()
    line = _one_error_line(train_runs.run(train_runs.launch_args(fno_train_shards, tmp_path / "ft", "--init",
                                                                 "dpot:XL", steps=2, nproc=1)))
    assert "unknown released checkpoint 'XL'" in line and not (tmp_path / "ft").exists()


def _http_error(kind: str) -> Exception:
    """One of huggingface_hub's errors as hf_hub_download raises it after a Hub answer (`kind`: its class name)."""
    from types import SimpleNamespace

    from huggingface_hub import errors

    # what the error reads of the HTTP response (its class is the HTTP client's, which differs between releases)
    response = SimpleNamespace(status_code=404, headers={}, request=None)
    return getattr(errors, kind)(f"{kind} (the Hub's answer)", response=response)


@pytest.mark.parametrize("raised,expected", [
    ("RepositoryNotFoundError", "hf://o/r/w.pt: the Hub repo o/r was not found or needs access"),
    ("GatedRepoError", "the Hub repo o/r was not found or needs access (a private or gated repo: set HF_TOKEN"),
    ("RevisionNotFoundError", "hf://o/r/w.pt: revision 'main' not found in the Hub repo o/r"),
    ("RemoteEntryNotFoundError", "hf://o/r/w.pt: no file 'w.pt' in the Hub repo o/r at revision main"),
    ("HfHubHTTPError", "hf://o/r/w.pt: hf://o/r/w.pt could not be downloaded (HfHubHTTPError (the Hub's answer))"),
    ("unreachable", "hf://o/r/w.pt: hf://o/r/w.pt is not in the Hugging Face cache"),
])
def test_hub_answers_become_one_line(raised: str, expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub
    from huggingface_hub import constants, errors

    from dpot_train.integrations import hub as hub_module
    from dpot_train.integrations.hub import resolve

    def refuse(*args: object, **kwargs: object) -> str:
        if raised == "unreachable":  # what hf_hub_download raises when the HEAD request fails and nothing is cached
            raise errors.LocalEntryNotFoundError("cannot find the requested files") from ConnectionError("refused")
        raise _http_error(raised)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_module, "hub_unreachable", lambda endpoint: None)  # the Hub answers: its errors come
    with pytest.raises(HubError) as err:
        resolve("hf://o/r/w.pt")
    assert expected in str(err.value) and "\n" not in str(err.value)
    if raised == "unreachable":
        assert "and the Hub could not be reached (refused)" in str(err.value)


def test_without_huggingface_hub_the_error_says_what_to_install(offline: dict[str, Path], tmp_path: Path) -> None:
    blocker = tmp_path / "site" / "huggingface_hub"  # shadows the installed package: its import fails
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named huggingface_hub')\n")
    line = _one_error_line(_cli("model", "info", "dpot:Ti", pythonpath=str(tmp_path / "site")))
    assert "dpot:Ti: loading weights from the Hugging Face Hub needs huggingface_hub; install dpot[hub]" in line
    r = _cli("model", "info", str(DPOT_FILE), pythonpath=str(tmp_path / "site"))  # local files need none
    assert r.returncode == 0, r.stderr[-2000:]


# --- the documented names -------------------------------------------------------------------------------------------

def test_the_documented_names_are_the_ones_resolved() -> None:
    import re

    from tests.test_readme_path import README, bash_blocks

    script = "\n".join(bash_blocks(README.read_text(encoding="utf-8"), "Released DPOT checkpoints"))
    refs = re.findall(r"(?:dpot:|hf://)\S+", script)
    for step in ("model info dpot:Ti", "evaluate dpot:Ti", "--init dpot:Ti"):
        assert step in script, f"the README's released checkpoints lost {step!r}"
    assert any(r.startswith("hf://") for r in refs) and all(parse_reference(r) for r in refs)
    table = (train_runs.ROOT / "docs" / "training.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(dpot:\w+)` \| `hf://hzk17/DPOT/(\S+)` \|", table, flags=re.M))
    assert rows == {f"dpot:{k}": v for k, v in RELEASED.items()}


@pytest.fixture
def unreachable(hub: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """Online mode with a Hub nobody answers at (a closed port on this machine): the cache of the test, no token."""
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.setenv("HF_HOME", str(hub["home"]))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return hub


def test_an_unreachable_hub_is_asked_once_and_the_cache_read(unreachable: dict[str, Path]) -> None:
    """Without HF_HUB_OFFLINE a Hub that cannot be reached costs one attempt, not huggingface_hub's five retries:
    a cached file loads with nothing said, an uncached one fails in one line naming HF_HUB_OFFLINE and the cache."""
    cached, missing = run_batch([("model", "info", "dpot:Ti", "--json"), ("model", "info", "dpot:S")])
    assert cached.returncode == 0 and cached.stderr.strip() == "", cached.stderr[-2000:]
    assert json.loads(cached.stdout)["hub"]["revision"] == MAIN
    line = _one_error_line(missing)  # before: "Retrying in 1s [Retry 1/5]" ... five times, then the error
    assert "hf://hzk17/DPOT/model_S.pth is not in the Hugging Face cache" in line and "could not be reached" in line
    assert "HF_HUB_OFFLINE=1" in line and str(unreachable["cache"]) in line
