"""`dpot-train launch` decides once: it reads each manifest and loads `--init` once, writes the RunPlan beside
config.yaml, and the workers (training and the final evaluation) read no manifest and load `--init` once each."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from dpot_train.core.config import load_config
from dpot_train.train.run_plan import PLAN_NAME, load_plan
from tests import train_runs

# Counts the opens for reading of manifest.json files and of one watched file, per process, through an audit hook
# installed at interpreter start-up (sitecustomize) in the launcher, torchrun and every worker; and every reading of a
# shard's tar headers (dpot_format.tar.index_shard), by shard name.
_SITECUSTOMIZE = textwrap.dedent('''
    import os
    import sys

    _LOG = os.environ.get("COUNT_OPENS_LOG")
    _WATCH = os.environ.get("COUNT_OPENS_WATCH")
    _busy = []


    def _hook(event, args):
        if event != "open" or _busy or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path, mode, flags = os.fsdecode(args[0]), args[1], args[2] or 0
        if (mode and any(c in mode for c in "wax+")) or flags & (os.O_WRONLY | os.O_RDWR):
            return
        kind = "manifest" if path.endswith("manifest.json") else "init" if path == _WATCH else None
        if kind is None:
            return
        _busy.append(1)
        try:
            with open(_LOG, "a") as f:
                f.write(f"{os.getpid()} {kind}\\n")
        finally:
            _busy.pop()


    if _LOG:
        sys.addaudithook(_hook)
        import dpot_format.tar as _tar  # before any module binds index_shard: every caller gets the counting one

        _index = _tar.index_shard

        def _counting(source, where=None, *args, **kwargs):
            name = os.path.basename(str(where if where is not None else os.fspath(source)))
            with open(_LOG, "a") as f:
                f.write(f"{os.getpid()} index:{name}\\n")
            return _index(source, where, *args, **kwargs)

        _tar.index_shard = _counting
''')


@pytest.mark.slow
def test_a_two_process_launch_reads_each_manifest_and_init_once_and_no_tar_header(
        fno_train_shards: Path, reference_dir: Path, tmp_path: Path) -> None:
    released = reference_dir / "dpot_tiny.pth"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    log = tmp_path / "opens.log"
    env = train_runs.env()
    env.update(PYTHONPATH=f"{site}{os.pathsep}{env['PYTHONPATH']}", COUNT_OPENS_LOG=str(log),
               COUNT_OPENS_WATCH=str(released.resolve()))
    out = tmp_path / "run"
    args = train_runs.launch_args(fno_train_shards, out, "--init", str(released.resolve()), "--noise", "0", steps=2,
                                  nproc=2)
    r = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=train_runs.ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (out / "eval.json").exists()  # the final evaluation ran in rank 0, from the plan

    assert log.exists(), r.stderr[-3000:]
    counts = collections.Counter(tuple(line.split()) for line in log.read_text().splitlines())
    per_kind: dict[str, list[int]] = collections.defaultdict(list)
    for (pid, kind), n in counts.items():
        per_kind[kind].append(n)
    assert per_kind["manifest"] == [1], counts  # the launcher, once; no worker reads a manifest
    assert sorted(per_kind["init"]) == [1, 1, 1], counts  # the launcher and the two workers, once each
    indexed = {kind: n for (pid, kind), n in counts.items() if kind.startswith("index:")}
    assert indexed == {}, counts  # no tar header read by anyone: the shards' member index was recorded at ingest

    plan = load_plan(out, load_config(out / "config.yaml").to_dict())
    assert plan is not None and plan.init is not None and plan.init.released
    assert plan.train == ["fno-ns-v1e-3"] and len(plan.refs[0]) == 12 and plan.topology["nproc_per_node"] == 2
    assert list(plan.manifests) == [str(fno_train_shards.resolve() / "manifest.json")]


def test_a_plan_written_for_another_config_is_refused(tmp_path: Path) -> None:
    from dpot_train.data.datasets import DataError
    from dpot_train.data.stream import StreamSpec
    from dpot_train.train.run_plan import make_plan, save_plan

    spec = StreamSpec(datasets=[], refs=[], visits=[], t_in=10, t_out=1, seed=0)
    save_plan(make_plan({"steps": 4}, {}, {}, spec, {}, None, {"nproc_per_node": 1}), tmp_path)
    assert load_plan(tmp_path, {"steps": 4}) is not None
    with pytest.raises(DataError, match=f"{PLAN_NAME}: written for another run config"):
        load_plan(tmp_path, {"steps": 5})
    (tmp_path / PLAN_NAME).write_text(json.dumps({"format": "x"}))
    with pytest.raises(DataError, match="expected a run plan written by `dpot-train launch`"):
        load_plan(tmp_path, {"steps": 4})
    assert load_plan(tmp_path / "none", {}) is None


def test_evaluate_loads_the_checkpoint_once(fno_train_shards: Path, reference_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from dpot_train.evaluation.evaluate import evaluate_checkpoint

    released = reference_dir / "dpot_tiny.pth"  # 16x16 weights on 32x32 data: the positional embedding is resampled
    loads: list[object] = []
    real = torch.load

    def counting(f: object, *args: object, **kwargs: object) -> object:
        loads.append(f)
        return real(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting)
    result = evaluate_checkpoint(str(released), [str(fno_train_shards)], rollout_steps=1, max_trajectories=1,
                                 verify_checksums=False)
    assert result["recipe"] == "reference" and result["datasets"]["fno-ns-v1e-3"]["rollout_steps"] == 1
    assert len(loads) == 1, loads


def test_launch_imports_neither_the_trainer_nor_the_worker() -> None:
    from tests.test_import_graph import ROOT, _imports

    for module in ("run/launch.py", "core/topology.py", "train/run_plan.py", "cli_train.py", "run/launch_request.py",
                   "cli/launch.py"):
        names = _imports(ROOT / "dpot_train" / module)
        assert not [n for n in names if n.startswith(("dpot_train.train.trainer", "dpot_train.run.worker"))], module
