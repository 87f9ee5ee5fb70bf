"""The WebDataset reader for shards in object storage: every read goes to the node's shard cache (dpot_train.data.cache),
the member index comes from the cache's node-shared index, and the stream asks for the shards it will read next.

Reads are the local reader's (`readers.read_window`) on the cached copy, so the batches are bitwise those of a run on a
local copy of the same shards, whatever the number of ranks, workers or cache misses.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from dpot_format.errors import FormatError
from dpot_format.io import is_local
from dpot_format.shard_index import shard_samples
from dpot_format.tar import SampleIndex
from dpot_train.data.cache import DEFAULT_LIMIT, CacheSettings, ShardCache, check_limit, parse_size
from dpot_train.data.datasets import DataError, DatasetInfo, Shard, recorded_index
from dpot_train.data.verified import CACHE_ENV
from dpot_train.data.readers import (MaskSlot, ShardIndex, TrajectoryReader, TrajRef, WebDatasetReader, Window,
                                     make_reader, mask_to, read_window)

# CACHE_ENV: the cache folder when --cache-dir is not given (shared by every run of the node), named where the record
# of verified shards (below this module's imports) reads it too
RUN_CACHE = "shard-cache"
INDEX_FETCHES = 2  # shards fetched at once while indexing a cold cache  # the folder under RUN_DIR used when neither --cache-dir nor DPOT_CACHE_DIR is set


def _entries(samples: Sequence[SampleIndex]) -> list[dict[str, Any]]:
    """A shard's member index as the cache's index file holds it."""
    return [{"index": s.index, "fields": s.fields.offset, "mask": s.mask.offset, "mask_size": s.mask.size}
            for s in samples]


def _build_index(local: Path, shard: Shard, given: ShardIndex | None) -> list[dict[str, Any]]:
    """The cache's index entries of a downloaded shard: from `given` (the dataset's recorded index, or what the
    launch's validator read) when it holds the shard, else from the local copy's tar headers."""
    try:
        samples = shard_samples(str(local), (given or {}).get(shard.url), where=shard.url)
    except FormatError as e:
        raise DataError(f"shard {e}") from None
    return _entries(samples)


def _known_index(ds: DatasetInfo, split: str, shards: Sequence[Shard], given: ShardIndex | None) -> ShardIndex:
    """The member index of each shard as the launch read it (`given`) or, for the shards it lacks, as the dataset's
    manifest records it (its index file, sha256-checked against the manifest; outputs written before index.json
    record none): what a cached index is checked against."""
    known = dict(given or {})
    if any(s.url not in known for s in shards) and ds.entry.get("shard_index"):
        known = {**recorded_index([ds], split), **known}
    return known


def uses_cache(manifests: list[str], backend: str) -> bool:
    """Whether a run on these manifests reads through the shard cache: WebDataset shards in object storage."""
    return backend == "webdataset" and any(not is_local(m) for m in manifests)


def cache_dir(given: str | None, run_dir: str | None = None) -> str:
    """--cache-dir, else $DPOT_CACHE_DIR, else RUN_DIR/shard-cache, else ~/.cache/dpot/shards (absolute)."""
    chosen = given or os.environ.get(CACHE_ENV) or (os.path.join(run_dir, RUN_CACHE) if run_dir else None)
    return os.path.abspath(os.path.expanduser(chosen or os.path.join("~", ".cache", "dpot", "shards")))


def cache_settings(given_dir: str | None, limit: str | int | None, run_dir: str | None = None) -> CacheSettings:
    """The cache a command uses, its limit parsed ("200GiB"; default 100 GiB)."""
    return CacheSettings(root=cache_dir(given_dir, run_dir),
                         limit=DEFAULT_LIMIT if limit in (None, "") else parse_size(limit))  # type: ignore[arg-type]


def with_cache(cfg: Any) -> Any:
    """A TrainConfig reading shards from object storage with its cache folder fixed (RUN_DIR/shard-cache unless
    --cache-dir or $DPOT_CACHE_DIR names one) and its limit checked; other configs unchanged."""
    from dataclasses import replace

    data = cfg.data
    if not uses_cache(list(data.manifests), data.backend):
        return cfg
    settings = cache_settings(data.cache_dir, data.cache_limit, str(cfg.out))
    return replace(cfg, data=replace(data, cache_dir=settings.root))


def reader_for(backend: str, manifests: list[str], settings: CacheSettings | None,
               datasets: Sequence[DatasetInfo] = ()) -> TrajectoryReader:
    """The cached reader for WebDataset shards in object storage, the plain reader otherwise. `datasets`: those whose
    trajectories come from elsewhere (a run's plan) rather than from the reader's `refs`: their remote shards are
    read through the cache too."""
    if uses_cache(manifests, backend):
        return CachedWebDatasetReader(settings or cache_settings(None, None),
                                      [s for d in datasets for s in d.shards if not is_local(s.url)])
    return make_reader(backend)


def _prefetch_pool() -> ThreadPoolExecutor:
    """One background thread for prefetches. When the process ends, queued prefetches are cancelled and the one in
    flight is waited for (before the interpreter stops scheduling the range GETs it needs): a download cut short at
    exit would have been sent for nothing and fetched again by the next process that reads the shard."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpot-prefetch")
    with contextlib.suppress(RuntimeError):  # already shutting down: nothing new is queued anyway
        shutdown = functools.partial(pool.shutdown, wait=True, cancel_futures=True)
        threading._register_atexit(shutdown)  # type: ignore[attr-defined]  # runs before concurrent.futures' own
    return pool


class CachedWebDatasetReader:
    """Reads trajectories of remote WebDataset shards from their copies in the node's shard cache."""

    def __init__(self, settings: CacheSettings, shards: Sequence[Shard] = ()) -> None:
        self.settings = settings
        self._shards: dict[str, Shard] = {s.url: s for s in shards}  # remote shards by url; local ones: `_plain`
        self._plain = WebDatasetReader()
        self._local: dict[str, Any] = {}
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "shards": self._shards}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"])  # type: ignore[misc]
        self._shards = dict(state["shards"])

    @property
    def cache(self) -> ShardCache:
        """This process's handle on the node's cache (rebuilt in a forked or spawned worker)."""
        if self._pid != os.getpid():
            self._local = {"cache": ShardCache(self.settings), "pool": None, "inflight": set(),
                           "lock": threading.Lock()}
            self._pid = os.getpid()
        return self._local["cache"]

    def refs(self, ds: DatasetInfo, split: str, index: ShardIndex | None = None) -> list[TrajRef]:
        """Every trajectory of `split` (sorted by index), from the node-shared member index of each shard (built from
        `index`, else the manifest's recorded index, when it holds the shard; the shard is downloaded and its sha256
        checked either way). A cached index that differs from that one is rebuilt (`ShardCache.index`)."""
        shards = [s for s in ds.shards_of(split) if not is_local(s.url)]
        if len(shards) < len(ds.shards_of(split)):
            return self._plain.refs(ds, split, index)
        check_limit(self.settings, shards)
        cache = self.cache
        known = _known_index(ds, split, shards, index)

        def indexed(s: Shard) -> list[dict[str, Any]]:
            expected = _entries(known[s.url]) if s.url in known else None
            return cache.index(s, lambda local: _build_index(local, s, known), expected)

        with ThreadPoolExecutor(max_workers=INDEX_FETCHES) as pool:  # one shard checked while the next downloads
            indexes = list(pool.map(indexed, shards))
        out: list[TrajRef] = []
        for shard, samples in zip(shards, indexes):
            self._shards[shard.url] = shard
            if len(samples) != shard.samples:
                raise DataError(f"shard {shard.url}: holds {len(samples)} trajectories, "
                                f"the manifest says {shard.samples}")
            out += [TrajRef(ds.name, int(s["index"]), shard.url, int(s["fields"]), int(s["mask"]),
                            int(s["mask_size"]), -1) for s in samples]
        out.sort(key=lambda r: r.index)
        return out

    def read(self, ref: TrajRef, t0: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """Frames [t0, t0 + length) and the mask of `ref`, read from the cached copy of its shard."""
        if ref.url not in self._shards:
            return self._plain.read(ref, t0, length)
        with self.cache.open(self._shards[ref.url]) as local, open(local, "rb") as f:
            return read_window(f, ref, t0, length)

    def read_into(self, ref: TrajRef, t0: int, length: int, into: Window, mask_into: MaskSlot | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
        """`read`, with the frames read straight into `into(shape)` (a slot of the caller's batch buffer) and, with
        `mask_into`, the mask copied into `mask_into(shape)` (`WebDatasetReader.read_into`)."""
        if ref.url not in self._shards:
            return self._plain.read_into(ref, t0, length, into, mask_into)
        with self.cache.open(self._shards[ref.url]) as local, open(local, "rb") as f:
            fields, mask = read_window(f, ref, t0, length, into)
        return fields, mask_to(mask, mask_into)

    def prefetch(self, urls: list[str]) -> None:
        """Start downloading (in the background) the first shards of `urls` (stream order) that are not cached."""
        cache = self.cache
        state = self._local
        ahead = [self._shards[u] for u in dict.fromkeys(urls) if u in self._shards][:self.settings.prefetch]
        with state["lock"]:
            for shard in ahead:
                if shard.sha256 in state["inflight"] or cache.entry(shard).exists():
                    continue
                if state["pool"] is None:
                    state["pool"] = _prefetch_pool()
                state["inflight"].add(shard.sha256)
                state["pool"].submit(self._prefetch_one, shard)

    def _prefetch_one(self, shard: Shard) -> None:
        try:
            self.cache.ensure(shard, wait=False)  # best effort: a read fetches it anyway, and reports failures
        except Exception:  # noqa: BLE001 - a failed prefetch is retried by the read that needs the shard
            pass
        finally:
            with self._local["lock"]:
                self._local["inflight"].discard(shard.sha256)
