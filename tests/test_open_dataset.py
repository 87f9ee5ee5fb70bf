"""`from dpot_train import open_dataset`: launch's windows as a torch IterableDataset, split over ranks and workers,
and the training loop of docs/api.md run verbatim."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from dpot_train import open_dataset
from dpot_train.core.config import DataConfig
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.stream import EpochPlans, WindowStream
from dpot_train.preview import model_input

ROOT = Path(__file__).resolve().parents[1]


def _ids(items: list[dict]) -> list[tuple[str, int, int]]:
    return [(it["id"], int(it["position"]), int(it["t0"])) for it in items]


def test_shuffled_windows_are_launchs_stream(fno_train_shards: Path) -> None:
    spec, reader = prepare_stream(DataConfig(manifests=[str(fno_train_shards)], t_in=10, t_out=1), seed=3)
    data = open_dataset(fno_train_shards, t_in=10, t_out=1, seed=3)
    items = list(data)
    assert len(items) == len(data) == spec.epoch_length == 12
    batches = WindowStream(spec, reader, start=0, global_batch=4).worker_batches(0, 1)
    launch = [next(batches) for _ in range(3)]
    x = torch.cat([b["x"] for b in launch])
    y = torch.cat([b["y"] for b in launch])
    assert torch.equal(torch.stack([it["x"] for it in items]), x)
    assert torch.equal(torch.stack([it["y"] for it in items]), y)
    assert torch.equal(torch.stack([it["mask"] for it in items]), torch.cat([b["mask"] for b in launch]))
    assert [it["id"] for it in items] == [i for b in launch for i in b["id"]]
    assert items[0]["x"].shape == (32, 32, 10, 4) and items[0]["x"].is_contiguous()
    # the next epoch continues the stream, as launch does
    data.set_epoch(1)
    assert torch.equal(next(iter(data))["x"], next(batches)["x"][0])


def test_ordered_test_split_starts_with_previews_array(fno_train_shards: Path) -> None:
    data = open_dataset(fno_train_shards, split="test", t_in=10, t_out=1, shuffle=False)
    items = list(data)
    np.testing.assert_array_equal(items[0]["x"].numpy(), model_input(fno_train_shards, split="test", index=0,
                                                                      frames=10))
    # every window of every trajectory, in stored order: 2 trajectories x 3 first frames
    assert [(it["t0"]) for it in items] == [0, 1, 2, 0, 1, 2]
    np.testing.assert_array_equal(items[4]["y"].numpy(), model_input(fno_train_shards, split="test", index=1,
                                                                     start=11, frames=1))
    resized = next(iter(open_dataset(fno_train_shards, split="test", shuffle=False, res=16)))
    np.testing.assert_array_equal(resized["x"].numpy(), model_input(fno_train_shards, split="test", index=0,
                                                                    frames=10, res=16))
    assert resized["mask"].shape == (16, 16)


def test_windows_are_normalised_as_launch_normalises_them(tmp_path: Path) -> None:
    """A canonical-convention output: data.normalize auto applies the manifest's train statistics."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.fno import synth_fno

    files = synth_fno(tmp_path / "raw", n=4, frames=6, viscosity=1e-3, seed=0, resolution=16)
    out = tmp_path / "shards"
    ingest_files("fno", [files[0]], out, IngestOptions(resolution=16, split=(0.5, 0.0), seed=0,
                                                       convention="canonical"))
    spec, reader = prepare_stream(DataConfig(manifests=[str(out)], t_in=2, t_out=1), seed=0)
    assert spec.norm[spec.datasets[0].name] is not None  # launch normalises this dataset
    launch = WindowStream(spec, reader, start=0, global_batch=spec.epoch_length).batch(0, EpochPlans(spec))
    items = list(open_dataset(out, t_in=2, t_out=1))
    assert torch.equal(torch.stack([it["x"] for it in items]), launch["x"])
    raw = next(iter(open_dataset(out, t_in=2, t_out=1, normalize="none")))
    assert not torch.equal(raw["x"], items[0]["x"])
    first = next(iter(open_dataset(out, split="test", t_in=2, t_out=1, shuffle=False)))
    np.testing.assert_array_equal(first["x"].numpy(), model_input(out, split="test", index=0, frames=2))


@pytest.mark.parametrize("shuffle", [True, False])
def test_two_ranks_split_one_ranks_windows(fno_train_shards: Path, shuffle: bool) -> None:
    one = _ids(list(open_dataset(fno_train_shards, shuffle=shuffle, seed=1, t_in=4)))
    ranks = [_ids(list(open_dataset(fno_train_shards, shuffle=shuffle, seed=1, t_in=4, rank=r, world_size=2)))
             for r in (0, 1)]
    assert len(one) == (12 if shuffle else 12 * 9)
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == sorted(one)
    # with launch's global batch, each rank holds launch's share of each step
    halves = [_ids(list(open_dataset(fno_train_shards, shuffle=shuffle, seed=1, t_in=4, rank=r, world_size=2,
                                     global_batch=4))) for r in (0, 1)]
    assert halves[0][:2] == one[:2] and halves[1][:2] == one[2:4]


def test_process_group_rank_is_used(fno_train_shards: Path, tmp_path: Path) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        data = open_dataset(fno_train_shards, seed=1)
        assert len(data) == 12
        with pytest.raises(ValueError, match="rank and world_size together"):
            open_dataset(fno_train_shards, rank=1)
    finally:
        torch.distributed.destroy_process_group()


def test_dataloader_workers_deliver_each_window_once(fno_train_shards: Path) -> None:
    data = open_dataset(fno_train_shards, seed=2, t_in=4)
    alone = _ids(list(data))
    batches = list(DataLoader(data, batch_size=3, num_workers=2))
    seen = [(i, int(p), int(t)) for b in batches for i, p, t in zip(b["id"], b["position"], b["t0"])]
    assert len(seen) == len(set(seen)) == len(alone)
    assert sorted(seen) == sorted(alone)
    assert batches[0]["x"].shape == (3, 32, 32, 4, 4) and batches[0]["mask"].dtype == torch.bool


def test_3d_windows_are_x_y_z_t_c(tmp_path_factory: pytest.TempPathFactory) -> None:
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.pdebench import write_cfd

    base = tmp_path_factory.mktemp("cfd3d_api")
    raw = write_cfd(base / "raw", dims=3, m=1.0, eta=1e-8, kind="Rand", n=5, frames=6, res=8, seed=0)
    ingest_files("pdebench", [raw], base / "shards", IngestOptions(resolution=None, split=(0.6, 0.0), seed=0))
    item = next(iter(open_dataset(base / "shards", split="test", t_in=3, t_out=1, shuffle=False)))
    assert item["x"].shape == (8, 8, 8, 3, 5) and item["y"].shape == (8, 8, 8, 1, 5)
    assert item["mask"].shape == (8, 8, 8)
    np.testing.assert_array_equal(item["x"].numpy(), model_input(base / "shards", split="test", index=0, frames=3))


def test_urls_read_through_the_shard_cache(fno_train_shards: Path, tmp_path: Path) -> None:
    pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    pytest.importorskip("s3fs", reason="needs s3fs (the test or cloud extra)")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import s3_local

    server = s3_local.start()
    try:
        s3_local.upload(str(fno_train_shards), "s3://dpot/api")
        server.reset_counts()
        remote = list(open_dataset("s3://dpot/api", seed=4, t_in=4, cache_dir=str(tmp_path / "cache")))
        gets = server.shard_gets()
        assert gets and set(gets.values()) == {1}  # each shard fetched once, then read from the cache
        assert any((tmp_path / "cache").rglob("*.tar"))
    finally:
        server.stop()
        s3_local.unconfigure_this_process(server)
    local = list(open_dataset(fno_train_shards, seed=4, t_in=4))
    assert _ids(remote) == _ids(local)
    for a, b in zip(remote, local):
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"])


def test_bad_arguments_are_one_line(fno_train_shards: Path) -> None:
    with pytest.raises(ValueError, match=r"global_batch 3 is not divisible by the 2 processes"):
        len(open_dataset(fno_train_shards, rank=0, world_size=2, global_batch=3))
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        open_dataset(fno_train_shards, rank=2, world_size=2)


@pytest.mark.parametrize("kwargs, line", [
    (dict(res=100000), "res: expected a grid side from 1 to 4096 (0: the stored grid), got 100000"),
    (dict(t_in=-3), "t_in: expected a frame count from 1 to 4096, got -3"),
    (dict(t_in=0), "t_in: expected a frame count from 1 to 4096, got 0"),
    (dict(t_out=0), "t_out: expected a frame count from 1 to 4096, got 0"),
    (dict(seed="x"), "seed: expected a whole number, got 'x'"),
    (dict(seed=-1), "seed: expected a whole number >= 0, got -1"),
    (dict(shuffle="yes"), "shuffle: expected true or false, got 'yes'"),
    (dict(rank=0, world_size=0), "world_size: expected a whole number of 1 or more, got 0"),
])
def test_arguments_are_checked_as_launch_checks_its_options(fno_train_shards: Path, kwargs: dict,
                                                            line: str) -> None:
    """Before anything is read, each argument against launch's limits for the same option (dpot_train.core.config:
    MAX_RES, the frame counts): one ValueError line naming it, not a 1.6 TB allocation at the first window, a
    traceback deep in the stream, or windows of 0 input frames."""
    with pytest.raises(ValueError) as err:
        open_dataset(fno_train_shards, **kwargs)
    assert str(err.value) == line


def _python_blocks(path: Path, heading: str | None = None) -> list[str]:
    """The ```python blocks of `path` (under `## heading`, up to the next `## `, when given)."""
    text = path.read_text(encoding="utf-8")
    if heading is not None:
        match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
        assert match, f"{path.name} has no section {heading!r}"
        text = match.group(1)
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"{path.name} has no ```python block"
    return blocks


def _run_in(folder: Path, shards: Path, code: str, where: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Run `code` in `folder`, where the output `shards/` of the README's path lies; its global names."""
    (folder / "shards").symlink_to(shards)
    monkeypatch.chdir(folder)
    scope: dict = {"__name__": "__main__"}
    exec(compile(code, str(where), "exec"), scope)  # noqa: S102 - the project's own documented example
    return scope


def test_docs_api_example_runs_verbatim(fno_train_shards: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = ROOT / "docs" / "api.md"
    scope = _run_in(tmp_path, fno_train_shards, _python_blocks(path)[0], path, monkeypatch)
    losses = scope["losses"]
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_readme_snippet_runs_verbatim(fno_train_shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = ROOT / "README.md"
    (block,) = _python_blocks(path, "Your own training loop")
    scope = _run_in(tmp_path, fno_train_shards, block, path, monkeypatch)
    assert len(scope["data"]) == 12
    shapes = re.findall(r"torch.Size\(\[(\d+), 32, 32, 10, 4\]\) torch.Size\(\[\1, 32, 32, 1, 4\]\)",
                        capsys.readouterr().out)
    assert sum(int(b) for b in shapes) == 12  # each worker batches its own windows: 6 + 6
