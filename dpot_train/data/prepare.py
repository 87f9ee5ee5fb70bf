"""Turn a DataConfig into a checked StreamSpec: manifests, mixture, shard checks, trajectory index.

Every check here runs before any training step, so bad input (missing shard, wrong checksum, unknown dataset in the
mixture, mismatched channel counts or grids) fails in seconds with a message naming the file.
"""

from __future__ import annotations

from typing import Sequence

from dpot_format.tar import SampleIndex
from dpot_train.core.config import DataConfig
from dpot_train.data.cached_reader import cache_settings, reader_for, uses_cache
from dpot_train.data.datasets import (DataError, DatasetInfo, check_compatible, note_scanned, read_manifests,
                                      recorded_index, verify_shards)
from dpot_train.data.mixture import parse_caps, parse_mixture, resolve_weights, visit_counts
from dpot_train.data.readers import ShardIndex, TrajectoryReader
from dpot_train.data.stream import StreamSpec
from dpot_train.data.verified import RecordPolicy, named_cache
from dpot_train.core.normalize import resolve


def load_datasets(cfg: DataConfig, split: str, verify: bool | None = None
                  ) -> tuple[list[DatasetInfo], dict[str, list[SampleIndex]]]:
    """Read the manifests and check their data for `split` (`checked_index`): the datasets and the shards' index."""
    datasets = read_manifests(list(cfg.manifests))
    return datasets, checked_index(cfg, datasets, split, verify)


def checked_index(cfg: DataConfig, datasets: list[DatasetInfo], split: str, verify: bool | None = None
                  ) -> dict[str, list[SampleIndex]]:
    """Check compatibility and the shards of `split` (size always, sha256 if enabled); the member index of each
    shard the check read (shard url -> samples), so that a reader's `refs` need not read its headers again."""
    check_compatible(datasets, cfg.t_in, cfg.t_out, split, cfg.res)
    index: dict[str, list[SampleIndex]] = {}
    if not uses_cache(list(cfg.manifests), cfg.backend):  # the cache checks each shard's sha256 as it downloads it
        verify_shards(datasets, split, cfg.backend, cfg.verify_checksums if verify is None else verify, index,
                      record_policy(cfg))
    elif cfg.backend == "webdataset":  # the recorded member indexes: the cache builds its entries from them
        index = recorded_index(datasets, split)
        note_scanned((d.manifest, d.entry) for d in datasets)
    return index


def record_policy(cfg: DataConfig) -> RecordPolicy:
    """How a check outside launch (evaluate, the trainer's own, open_dataset) uses the records of verified shards:
    consulted unless `checksum_record` is off, written beside the data or in a cache folder the user named."""
    return RecordPolicy(cfg.checksum_record, True, named_cache(cfg.cache_dir))


def data_reader(cfg: DataConfig, datasets: Sequence[DatasetInfo] = ()) -> TrajectoryReader:
    """The reader of cfg's shards: through the node's shard cache for shards in object storage. `datasets`: those
    read through trajectories it did not index itself (a run's plan)."""
    return reader_for(cfg.backend, list(cfg.manifests), cache_settings(cfg.cache_dir, cfg.cache_limit), datasets)


def norm_table(cfg: DataConfig, datasets: Sequence[DatasetInfo]) -> dict:
    """Per dataset, the statistics cfg normalises it with (dpot_train.core.normalize.resolve); DataError naming the
    manifest (or the config key) when a dataset to normalise has none."""
    try:
        return resolve(cfg.normalize, datasets, cfg.norm_stats)
    except ValueError as exc:
        raise DataError(str(exc)) from None


def prepare_stream(cfg: DataConfig, seed: int, verify: bool | None = None, validated: bool = False,
                   datasets: list[DatasetInfo] | None = None,
                   index: ShardIndex | None = None) -> tuple[StreamSpec, TrajectoryReader]:
    """Weighted datasets of the training split, indexed and checked, ready for WindowStream. `validated`: the
    outputs were just checked by `dpot_format.validate` (`dpot-train launch` does), so `verify_shards` is skipped.
    `datasets`: the manifests' datasets when already read (else they are read here). `index`: the shards' member
    indexes the validator read (their tar headers are not read again)."""
    datasets = read_manifests(list(cfg.manifests)) if datasets is None else datasets
    weights = resolve_weights([d.name for d in datasets], parse_mixture(cfg.mixture), cfg.mixture_partial)
    datasets = [d for d in datasets if weights[d.name] > 0]
    check_compatible(datasets, cfg.t_in, cfg.t_out, cfg.split, cfg.res)
    if not validated and not uses_cache(list(cfg.manifests), cfg.backend):
        index = {**(index or {})}
        verify_shards(datasets, cfg.split, cfg.backend, cfg.verify_checksums if verify is None else verify, index,
                      record_policy(cfg))
    elif not validated and cfg.backend == "webdataset":
        index = {**recorded_index(datasets, cfg.split), **(index or {})}
        note_scanned((d.manifest, d.entry) for d in datasets)
    reader = data_reader(cfg)
    refs = [reader.refs(d, cfg.split, index) for d in datasets]
    for d, r in zip(datasets, refs):
        if len(r) != d.split_counts.get(cfg.split, 0):
            raise DataError(f"{d.manifest}: dataset {d.name!r} lists {d.split_counts.get(cfg.split, 0)} "
                            f"{cfg.split!r} trajectories but its {cfg.backend} data holds {len(r)}")
    caps = parse_caps(cfg.mixture)
    refs = [r[:caps[d.name]] if d.name in caps else r for d, r in zip(datasets, refs)]
    counts = visit_counts({d.name: len(r) for d, r in zip(datasets, refs)}, weights)
    spec = StreamSpec(datasets=datasets, refs=refs, visits=[counts[d.name] for d in datasets],
                      t_in=cfg.t_in, t_out=cfg.t_out, seed=seed, norm=norm_table(cfg, datasets))
    return spec, reader
