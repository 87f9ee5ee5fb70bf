"""The sha256 of a download computed while its bytes stream into the cache's part file (remote_fetch.StreamHasher):
it equals hashlib over the file, a range cut after part of it arrived resumes after its written bytes with the hash
still right, and bytes corrupted in transit, an answer cut on every try or an object of another size are refused
and never enter the cache's data/ folder. Against an S3-compatible server in this process (benchmarks/s3_local.py)."""

from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("moto")
import s3_local  # noqa: E402

from dpot_train.data import remote_fetch  # noqa: E402
from dpot_train.data.cache import CacheSettings, ShardCache  # noqa: E402
from dpot_train.data.datasets import Shard  # noqa: E402
from dpot_train.data.remote_fetch import (CHUNK, FetchError, FetchPlan, RetryPolicy, StreamHasher,  # noqa: E402
                                          fetch_into)

BUCKET = "streamhash"
MIB = 1 << 20
FAST = RetryPolicy(attempts=3, base_s=0.001, max_s=0.002)
RANGES = FetchPlan(part=MIB, range_from=2 * MIB, concurrency=3, policy=FAST)  # 5 ranges of a 4.5 MiB object
WHOLE = FetchPlan(range_from=64 * MIB, policy=FAST)


@pytest.fixture(scope="module")
def s3():
    server = s3_local.start(bucket=BUCKET)
    yield server
    server.stop()
    s3_local.unconfigure_this_process(server)


@pytest.fixture
def obj(s3, request) -> tuple[str, bytes]:
    """A fresh 4.5 MiB object at s3://streamhash/<test name>.tar (random bytes) and its content."""
    import fsspec

    data = random.Random(request.node.name).randbytes(4 * MIB + MIB // 2)
    url = f"s3://{BUCKET}/{request.node.name.replace('[', '-').replace(']', '')}.tar"
    fsspec.filesystem("s3").pipe_file(url, data)
    s3.set_faults(s3_local.Faults())
    s3.reset_counts()
    yield url, data
    s3.set_faults(s3_local.Faults())


def _key(url: str) -> str:
    return url.split(f"{BUCKET}/", 1)[1]


def _shard(url: str, data: bytes) -> Shard:
    return Shard(url, "train", hashlib.sha256(data).hexdigest(), len(data), 1)


def _fetch(tmp_path: Path, url: str, size: int, plan: FetchPlan) -> tuple[str, bytes]:
    out = tmp_path / "obj"
    fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        digest = fetch_into(url, fd, size, plan)
    finally:
        os.close(fd)
    return digest, out.read_bytes()


def _nothing_cached(root: Path) -> bool:
    return list((root / "data").iterdir()) == [] and list((root / "part").iterdir()) == []


@pytest.mark.parametrize("plan", [WHOLE, RANGES, FetchPlan(part=MIB, range_from=0, concurrency=1, policy=FAST)],
                         ids=["whole", "ranges-3-at-a-time", "ranges-one-at-a-time"])
def test_the_streamed_sha256_equals_hashlib_over_the_file(tmp_path: Path, obj, plan: FetchPlan) -> None:
    url, data = obj
    digest, got = _fetch(tmp_path, url, len(data), plan)
    assert got == data and digest == hashlib.sha256(got).hexdigest()


def test_the_hasher_follows_ranges_written_out_of_order_in_pieces(tmp_path: Path) -> None:
    """Ranges written concurrently, each in pieces of random sizes, one of them by a try that a later try of the
    same range superseded (its bytes are dropped): the digest is hashlib's over the bytes, and the file holds them."""
    rng = random.Random(7)
    data = rng.randbytes(3 * MIB + 12345)
    ranges = [(a, min(a + 400_000, len(data))) for a in range(0, len(data), 400_000)]
    path = tmp_path / "file"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.ftruncate(fd, len(data))
        with StreamHasher("s3://b/x.tar", fd, ranges) as hasher:
            stale_start, stale = hasher.resume(len(ranges) - 1)

            def fill(i: int) -> None:
                at, write = hasher.resume(i)
                pieces = random.Random(i)
                while at < ranges[i][1]:
                    n = min(pieces.randint(1, 70_000), ranges[i][1] - at)
                    write(at, data[at:at + n])
                    at += n

            threads = [threading.Thread(target=fill, args=(i,)) for i in reversed(range(len(ranges)))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            with pytest.raises(remote_fetch._Superseded):
                stale(stale_start, b"\0" * 10)
            assert hasher.hexdigest() == hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)
    assert path.read_bytes() == data


def test_received_bytes_go_to_the_file_as_they_stream(tmp_path: Path, obj, monkeypatch: pytest.MonkeyPatch) -> None:
    """No range is held in memory whole before it is written: every write is at most one received chunk."""
    url, data = obj
    writes: list[int] = []
    real = os.pwrite

    def pwrite(fd: int, buf, offset: int) -> int:
        writes.append(len(buf))
        return real(fd, buf, offset)

    monkeypatch.setattr(remote_fetch.os, "pwrite", pwrite)
    digest, got = _fetch(tmp_path, url, len(data), FetchPlan(part=4 * MIB, range_from=0, concurrency=2, policy=FAST))
    assert got == data and digest == hashlib.sha256(data).hexdigest()
    assert writes and max(writes) <= CHUNK < 4 * MIB


def test_a_range_cut_after_part_of_it_arrived_resumes_there_with_the_hash_right(s3, obj, tmp_path: Path) -> None:
    url, data = obj
    cut = 2 * MIB + 300_000  # inside the third range, [2 MiB, 3 MiB)
    s3.set_faults(s3_local.Faults(cut_on={_key(url)}, cut_at=cut, cut_times=1))
    cache = ShardCache(CacheSettings(str(tmp_path / "cache"), limit=1 << 30, plan=RANGES))
    shard = _shard(url, data)
    assert cache.ensure(shard)
    assert cache.entry(shard).read_bytes() == data and list((tmp_path / "cache" / "part").iterdir()) == []
    asked = s3.ranges[f"/{BUCKET}/{_key(url)}"]
    assert asked.count(f"bytes={2 * MIB}-{3 * MIB - 1}") == 1  # the range, once: cut at `cut`
    assert asked.count(f"bytes={cut}-{3 * MIB - 1}") == 1  # its retry: only the bytes not written yet
    assert len(asked) == 6


def test_a_whole_object_get_cut_midway_resumes_with_a_range(s3, obj, tmp_path: Path) -> None:
    url, data = obj
    s3.set_faults(s3_local.Faults(cut_on={_key(url)}, cut_at=MIB + 5, cut_times=1))
    digest, got = _fetch(tmp_path, url, len(data), WHOLE)
    assert got == data and digest == hashlib.sha256(data).hexdigest()
    assert s3.ranges[f"/{BUCKET}/{_key(url)}"] == [None, f"bytes={MIB + 5}-{len(data) - 1}"]


@pytest.mark.parametrize("plan", [WHOLE, RANGES], ids=["whole", "ranges"])
def test_an_answer_cut_on_every_try_is_refused_and_never_enters_data(s3, obj, tmp_path: Path,
                                                                      plan: FetchPlan) -> None:
    url, data = obj
    s3.set_faults(s3_local.Faults(cut_on={_key(url)}, cut_at=3 * MIB + 10))
    cache = ShardCache(CacheSettings(str(tmp_path / "cache"), limit=1 << 30, plan=plan))
    with pytest.raises(FetchError) as err:
        cache.ensure(_shard(url, data))
    msg = str(err.value)
    assert msg.startswith(f"{url}: download failed after 3 attempts (last: ") and "\n" not in msg
    assert _nothing_cached(tmp_path / "cache")


@pytest.mark.parametrize("plan", [WHOLE, RANGES], ids=["whole", "ranges"])
def test_bytes_corrupted_in_transit_are_refused_and_never_enter_data(s3, obj, tmp_path: Path,
                                                                      plan: FetchPlan) -> None:
    url, data = obj
    s3.set_faults(s3_local.Faults(flip_on={_key(url)}, flip_at=len(data) // 2 + 17))
    cache = ShardCache(CacheSettings(str(tmp_path / "cache"), limit=1 << 30, plan=plan))
    with pytest.raises(FetchError, match=rf"^{url}: downloaded sha256 [0-9a-f]{{64}}, the manifest says "
                                         rf"{hashlib.sha256(data).hexdigest()}; the object changed"):
        cache.ensure(_shard(url, data))
    assert _nothing_cached(tmp_path / "cache")


@pytest.mark.parametrize("plan", [WHOLE, RANGES], ids=["whole", "ranges"])
@pytest.mark.parametrize("delta", [-1000, 1000], ids=["truncated", "longer"])
def test_an_object_of_another_size_than_the_manifest_says_is_refused(s3, obj, tmp_path: Path, plan: FetchPlan,
                                                                     delta: int) -> None:
    import fsspec

    url, data = obj
    stored = data[:delta] if delta < 0 else data + b"x" * delta
    fsspec.filesystem("s3").pipe_file(url, stored)
    cache = ShardCache(CacheSettings(str(tmp_path / "cache"), limit=1 << 30, plan=plan))
    with pytest.raises(FetchError, match=rf"^{url}: holds {len(stored)} bytes, the manifest says {len(data)}$"):
        cache.ensure(_shard(url, data))
    assert _nothing_cached(tmp_path / "cache")
    assert len(s3.gets) >= 1 and s3.failed == 0


def test_a_range_answered_without_content_range_is_refused() -> None:
    """A store that ignores Range sends the object from its first byte: written at the range's offset, those bytes
    would be wrong, so the answer is refused on one line."""
    url = "s3://b/x.tar"
    assert remote_fetch._object_size(url, {"ContentRange": "bytes 5-9/20", "ContentLength": 5},
                                     {"Range": "bytes=5-9"}) == 20
    assert remote_fetch._object_size(url, {"ContentLength": 20}, {}) == 20
    with pytest.raises(FetchError, match=r"^s3://b/x.tar: the store answered the range request bytes=5-9 without a "
                                         r"Content-Range; it needs a store that serves byte ranges$"):
        remote_fetch._object_size(url, {"ContentLength": 20}, {"Range": "bytes=5-9"})
