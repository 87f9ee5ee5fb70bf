"""Two gloo processes through `dpot-train launch`: every training trajectory is consumed exactly once per epoch,
each by exactly one rank, following the documented partition rule; the stream does not depend on ranks or workers."""

from __future__ import annotations

import collections
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.core.config import DataConfig
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.loader import make_loader
from dpot_train.data.stream import WindowStream, rank_slice
from tests import train_runs


def _train_ids(shards: Path) -> list[str]:
    """Trajectory ids of the train split, read straight from the tar member names."""
    manifest = json.loads((shards / "manifest.json").read_text())
    ds = manifest["datasets"][0]
    ids = []
    for s in ds["shards"]:
        if s["split"] == "train":
            with tarfile.open(shards / s["path"]) as tar:
                ids += [f"{ds['name']}:{int(n.split('.')[0][1:])}" for n in tar.getnames() if n.endswith(".fields.npy")]
    return ids


def test_two_process_epoch_audit(fno_train_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = train_runs.uninterrupted_run(fno_train_shards, tmp_path_factory.mktemp("runs"))
    train_ids = _train_ids(fno_train_shards)
    assert len(train_ids) == 12
    records = {r: [json.loads(ln) for ln in (run / "audit" / f"rank-{r}.jsonl").read_text().splitlines()]
               for r in range(2)}
    assert [len(records[r]) for r in range(2)] == [train_runs.STEPS, train_runs.STEPS]
    by_position: dict[int, tuple[int, str]] = {}
    for r, recs in records.items():
        for rec in recs:
            first = (rec["step"] - 1) * train_runs.BATCH
            assert rec["positions"] == list(rank_slice(first, train_runs.BATCH, 2, r))  # the documented slice
            for p, i in zip(rec["positions"], rec["ids"]):
                assert p not in by_position, f"position {p} consumed twice"
                by_position[p] = (r, i)
    total = train_runs.STEPS * train_runs.BATCH
    assert sorted(by_position) == list(range(total))  # no gap, no duplicate, across both ranks
    m = len(train_ids)
    for epoch in range(total // m):
        ids = [by_position[p][1] for p in range(epoch * m, (epoch + 1) * m)]
        assert collections.Counter(ids) == collections.Counter(train_ids), f"epoch {epoch}"
        assert {by_position[p][0] for p in range(epoch * m, (epoch + 1) * m)} == {0, 1}  # both ranks worked
    orders = [[by_position[p][1] for p in range(e * m, (e + 1) * m)] for e in range(2)]
    assert orders[0] != orders[1]  # reshuffled every epoch
    losses = [json.loads(ln)["loss"] for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == train_runs.STEPS
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.05, losses  # the loss falls even in this short run
    eval_json = json.loads((run / "eval.json").read_text())
    assert set(eval_json["datasets"]) == {"fno-ns-v1e-3"}


def _batches(spec, reader, start: int, world: int, workers: int, steps: int, kind: str = "thread"
             ) -> list[list[dict]]:
    """steps x ranks batches of a stream."""
    loaders = [iter(make_loader(WindowStream(spec, reader, start, 4, world, r), workers, kind=kind))
               for r in range(world)]
    return [[next(it) for it in loaders] for _ in range(steps)]


def test_stream_is_independent_of_ranks_workers_and_resume_point(fno_train_shards: Path) -> None:
    spec, reader = prepare_stream(DataConfig(manifests=[str(fno_train_shards)], noise=5e-4), seed=7)
    assert spec.epoch_length == 12 and spec.visits == [12]
    single = _batches(spec, reader, 0, 1, 0, 6)
    split = _batches(spec, reader, 0, 2, 2, 6, kind="process")  # 2 ranks x 2 DataLoader worker processes each
    threads = _batches(spec, reader, 0, 2, 3, 6, kind="thread")  # 2 ranks x 3 loader threads each
    assert all(a[0]["id"] == b[0]["id"] and torch.equal(a[0]["x"], b[0]["x"]) for a, b in zip(split, threads))
    for a, b in zip(single, split):
        (one,), (r0, r1) = a, b
        assert one["id"] == r0["id"] + r1["id"]
        assert torch.equal(one["x"], torch.cat([r0["x"], r1["x"]]))
        assert torch.equal(one["y"], torch.cat([r0["y"], r1["y"]]))
    resumed = _batches(spec, reader, 3 * 4, 1, 0, 3)  # start at step 3
    for a, b in zip(single[3:], resumed):
        assert a[0]["id"] == b[0]["id"] and torch.equal(a[0]["x"], b[0]["x"])
    batch = single[0][0]
    assert batch["x"].shape == (4, 32, 32, 10, 4) and batch["y"].shape == (4, 32, 32, 1, 4)
    assert batch["x"].dtype == torch.float32 and batch["mask"].dtype == torch.bool
    assert batch["channel_valid"].tolist() == [[True, False, False, False]] * 4
    # padded channels carry the fill value untouched by noise; the valid one is noisy but close to the data
    assert torch.all(batch["x"][..., 1:] == 1.0)
    clean, _ = reader.read(spec.refs[0][0], 0, 1)
    assert np.isfinite(clean).all()


def test_two_datasets_with_mixture_weights_follow_the_epoch_rule(fno_train_shards: Path, tmp_path: Path) -> None:
    from dpot_data.ingest import IngestOptions, ingest_files

    raw = sorted((fno_train_shards.parent / "raw").glob("NavierStokes_*.mat"))[0]  # see conftest
    other = tmp_path / "copy"
    ingest_files("fno", [raw], other, IngestOptions(resolution=32, split=(0.5,), seed=1, name="ns-copy",
                                                    formats=("wds",)))
    spec, reader = prepare_stream(DataConfig(manifests=[str(fno_train_shards), str(other)],
                                             mixture={"fno-ns-v1e-3": 1.0, "ns-copy": 3.0}), seed=0)
    sizes = [len(r) for r in spec.refs]
    assert sizes == [12, 8]
    assert spec.visits == [5, 15]  # n_k = round(20 * w_k / 4): shares 1:3 whatever the sizes
    stream = iter(make_loader(WindowStream(spec, reader, 0, 4, 1, 0), 0))
    ids = [i for _ in range(5) for i in next(stream)["id"]]  # exactly one epoch (20 visits)
    counts = collections.Counter(ids)
    assert sum(v for k, v in counts.items() if k.startswith("fno-ns-v1e-3:")) == 5
    copy_counts = [counts.get(f"ns-copy:{r.index}", 0) for r in spec.refs[1]]
    assert sum(copy_counts) == 15 and set(copy_counts) <= {1, 2}  # 15 visits of 8: each once or twice
    assert max(counts[k] for k in counts if k.startswith("fno-ns-v1e-3:")) == 1  # 5 of 12: none twice
    for kind in ("thread", "process"):  # loader workers give the mixture's batches, bit for bit
        for a, b in zip(_batches(spec, reader, 0, 1, 0, 5), _batches(spec, reader, 0, 1, 2, 5, kind=kind)):
            assert a[0]["id"] == b[0]["id"] and torch.equal(a[0]["dataset"], b[0]["dataset"])
            assert torch.equal(a[0]["x"], b[0]["x"]) and torch.equal(a[0]["mask"], b[0]["mask"])


def test_zarr_backend_streams_the_same_windows(fno_train_shards: Path) -> None:
    wds_spec, wds_reader = prepare_stream(DataConfig(manifests=[str(fno_train_shards)]), seed=3)
    zarr_spec, zarr_reader = prepare_stream(DataConfig(manifests=[str(fno_train_shards)], backend="zarr"), seed=3)
    assert [r.index for r in wds_spec.refs[0]] == [r.index for r in zarr_spec.refs[0]]
    for a, b in zip(_batches(wds_spec, wds_reader, 0, 1, 0, 4), _batches(zarr_spec, zarr_reader, 0, 1, 0, 4)):
        assert a[0]["id"] == b[0]["id"]
        assert torch.equal(a[0]["x"], b[0]["x"]) and torch.equal(a[0]["y"], b[0]["y"])
        assert torch.equal(a[0]["mask"], b[0]["mask"])


def test_forked_workers_never_share_the_parents_file_handles(fno_train_shards: Path) -> None:
    spec, reader = prepare_stream(DataConfig(manifests=[str(fno_train_shards)]), seed=0)
    ref = spec.refs[0][0]
    first, _ = reader.read(ref, 0, 11)  # opens a handle in this process
    handles = reader._handles
    inherited = next(iter(handles.files.values()))
    handles.pid = -1  # as seen from a forked child: the handle belongs to another process (shared file offset)
    again, _ = reader.read(ref, 0, 11)
    assert next(iter(handles.files.values())) is not inherited and not inherited.closed
    assert np.array_equal(first, again)
    # and end to end: a parent that has read keeps getting the same data as its DataLoader workers
    for _ in range(3):
        direct = _batches(spec, reader, 0, 1, 0, 4)
        forked = _batches(spec, reader, 0, 1, 2, 4, kind="process")
        assert all(torch.equal(a[0]["x"], b[0]["x"]) for a, b in zip(direct, forked))
