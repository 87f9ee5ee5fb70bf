"""The node's shard cache on its own (dpot_train/data/cache.py), with a scripted download in place of object storage:
the bytes counted against the limit while downloads are moved into place, damaged entries and indexes repaired, and
a cache folder that breaks under a run reported on one line naming it."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from dpot_train.data import cache as cache_module
from dpot_train.data.cache import CacheError, CacheSettings, ShardCache
from dpot_train.data.datasets import Shard

SIZE = 64 << 10


def _shard(name: str, data: bytes) -> Shard:
    return Shard(f"s3://bucket/{name}.tar", "train", hashlib.sha256(data).hexdigest(), len(data), 1)


class Store:
    """Objects by URL, fetched into the cache's part file as `fetch_into` does; `gate` pauses one URL's download."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects, self.fetches = objects, []
        self.gate: dict[str, tuple[threading.Event, threading.Event]] = {}

    def __call__(self, url: str, fd: int, size: int, plan: object) -> str:
        self.fetches.append(url)
        if url in self.gate:
            started, go = self.gate[url]
            started.set()
            assert go.wait(30), "the test never let the download finish"
        data = self.objects[url]
        os.pwrite(fd, data, 0)
        return hashlib.sha256(data).hexdigest()


@pytest.fixture
def objects() -> dict[str, bytes]:
    return {f"s3://bucket/{n}.tar": bytes([i]) * 1000 + os.urandom(SIZE - 1000) for i, n in enumerate("abcd")}


def _shards(objects: dict[str, bytes]) -> list[Shard]:
    return [_shard(url.rsplit("/", 1)[1][:-4], data) for url, data in objects.items()]


def test_a_download_moved_into_place_is_counted_by_a_reservation_at_that_moment(
        tmp_path: Path, objects: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    """Process X moves its finished download into data/ while process Y counts the bytes to make room for another
    shard. Y must see the shard in part/ or in data/, never in neither: else it keeps an entry it had to evict and
    the cache holds three shards under a limit of two."""
    a, b, c = _shards(objects)[:3]
    store = Store(objects)
    settings = CacheSettings(str(tmp_path / "cache"), limit=2 * SIZE)
    x, y = ShardCache(settings, fetch=store), ShardCache(settings, fetch=store)
    assert x.ensure(c)  # an idle entry: the one to evict
    started, go, moved = threading.Event(), threading.Event(), threading.Event()
    store.gate[a.url] = (started, go)
    real_files, real_rename = cache_module._files, os.rename
    listed: dict[int, str] = {}

    def files(folder: Path) -> list[Path]:
        """Y's count of data/ then part/: X is let go between the two (and waits no longer than 2 s for its move,
        which the cache lock Y holds may forbid)."""
        me = threading.get_ident()
        if folder.name == "part" and listed.get(me) == "data" and threading.current_thread().name == "Y":
            go.set()
            moved.wait(2)
        listed[me] = folder.name
        return real_files(folder)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        real_rename(src, dst)
        moved.set()

    monkeypatch.setattr(cache_module, "_files", files)
    monkeypatch.setattr(cache_module.os, "rename", rename)
    tx = threading.Thread(target=x.ensure, args=(a,), name="X")
    tx.start()
    assert started.wait(30)
    ty = threading.Thread(target=y.ensure, args=(b,), name="Y")
    ty.start()
    ty.join(60)
    go.set()
    tx.join(60)
    assert not tx.is_alive() and not ty.is_alive()
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "cache" / "data").iterdir()) == sorted(f"{s.sha256}.tar"
                                                                                    for s in (a, b))
    assert x.usage() <= settings.limit and y.stats.evicted == 1


def test_usage_is_measured_under_the_cache_lock(tmp_path: Path, objects: dict[str, bytes]) -> None:
    """An eviction and the reservation it made room for are one step for a reader of usage(): it waits for them."""
    a = _shards(objects)[0]
    cache = ShardCache(CacheSettings(str(tmp_path / "cache"), limit=2 * SIZE), fetch=Store(objects))
    cache.ensure(a)
    got: list[int] = []
    with cache_module._flock(tmp_path / "cache" / "lock" / "cache", cache_module.fcntl.LOCK_EX):
        reader = threading.Thread(target=lambda: got.append(cache.usage()))
        reader.start()
        reader.join(0.5)
        assert got == []  # blocked behind the lock holder
        (tmp_path / "cache" / "data" / f"{a.sha256}.tar").unlink()  # what an eviction does under the lock
    reader.join(30)
    assert got == [0]


def flip_middle_byte(path: Path) -> None:
    """One byte in the middle of the file inverted, its size kept (what a bad disk or a stray write does)."""
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_damaged_entry_is_fetched_again_with_one_warning(tmp_path: Path, objects: dict[str, bytes],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    shards = _shards(objects)
    store = Store(objects)
    settings = CacheSettings(str(tmp_path / "cache"), limit=8 * SIZE)
    for s in shards:
        ShardCache(settings, fetch=store).ensure(s)
    flip_middle_byte(tmp_path / "cache" / "data" / f"{shards[0].sha256}.tar")
    with open(tmp_path / "cache" / "data" / f"{shards[1].sha256}.tar", "r+b") as f:
        f.write(b"\0" * SIZE)  # zeroed, same size
    capsys.readouterr()
    store.fetches.clear()
    later = ShardCache(settings, fetch=store)  # the next run's process
    for s in shards:
        with later.open(s) as path:
            assert path.read_bytes() == objects[s.url]
        with later.open(s) as path:  # hashed once per process
            assert path.read_bytes() == objects[s.url]
    assert store.fetches == [shards[0].url, shards[1].url] and later.stats.repaired == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"warning: cached shard {tmp_path / 'cache' / 'data' / f'{s.sha256}.tar'} does not match the "
                     f"sha256 of {s.url} (damaged on disk); fetching it again" for s in shards[:2]]
    store.fetches.clear()
    again = ShardCache(settings, fetch=store)
    for s in shards:
        with again.open(s) as path:
            assert path.read_bytes() == objects[s.url]
    assert store.fetches == [] and again.stats.repaired == 0


def test_threads_finding_one_damaged_entry_fetch_it_once(tmp_path: Path, objects: dict[str, bytes],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    shard = _shards(objects)[0]
    store = Store(objects)
    settings = CacheSettings(str(tmp_path / "cache"), limit=8 * SIZE)
    ShardCache(settings, fetch=store).ensure(shard)
    flip_middle_byte(tmp_path / "cache" / "data" / f"{shard.sha256}.tar")
    store.fetches.clear()
    cache, errors = ShardCache(settings, fetch=store), []

    def read() -> None:
        try:
            with cache.open(shard) as path:
                if path.read_bytes() != objects[shard.url]:
                    errors.append("damaged bytes served")
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(repr(exc))

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and store.fetches == [shard.url]
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("damage", [b"{not json", b"\xff\xfe", b'[{"index": 0}]', b"", b'{"index": 1}'])
def test_a_damaged_index_is_rebuilt_with_a_warning_naming_it(tmp_path: Path, objects: dict[str, bytes],
                                                             capsys: pytest.CaptureFixture[str],
                                                             damage: bytes) -> None:
    shard = _shards(objects)[0]
    want = [{"index": 3, "fields": 512, "mask": 4096, "mask_size": 200}]
    built: list[Path] = []

    def build(local: Path) -> list[dict]:
        built.append(local)
        return want

    settings = CacheSettings(str(tmp_path / "cache"), limit=8 * SIZE)
    assert ShardCache(settings, fetch=Store(objects)).index(shard, build) == want
    path = tmp_path / "cache" / "index" / f"{shard.sha256}.json"
    path.write_bytes(damage)
    capsys.readouterr()
    assert ShardCache(settings, fetch=Store(objects)).index(shard, build) == want
    assert len(built) == 2
    assert capsys.readouterr().err == (f"warning: cached index {path} of {shard.url} is damaged; rebuilt from the "
                                       "cached shard\n")
    assert ShardCache(settings, fetch=Store(objects)).index(shard, build) == want and len(built) == 2


@pytest.mark.parametrize("cached, expected, why", [
    ([], None, "lists 0 trajectories where the manifest says 1"),
    ([{"index": 3, "fields": 512, "mask": 100, "mask_size": 200}], None, "holds entry"),
    ([{"index": 3, "fields": 1024, "mask": 4608, "mask_size": 200}], True,
     "does not match the member index its manifest records (entry 0: "),
])
def test_an_index_that_is_not_the_shards_is_rebuilt_with_one_warning(
        tmp_path: Path, objects: dict[str, bytes], capsys: pytest.CaptureFixture[str], cached: list,
        expected: bool | None, why: str) -> None:
    """A cached index that parses is still checked before it is trusted: against the entries of the index the
    manifest records when given, else for entries that could describe the shard (one per trajectory, inside it)."""
    shard = _shards(objects)[0]
    want = [{"index": 3, "fields": 512, "mask": 4096, "mask_size": 200}]
    path = tmp_path / "cache" / "index" / f"{shard.sha256}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(cached))
    built: list[Path] = []
    settings = CacheSettings(str(tmp_path / "cache"), limit=8 * SIZE)
    assert ShardCache(settings, fetch=Store(objects)).index(
        shard, lambda local: built.append(local) or want, want if expected else None) == want
    err = capsys.readouterr().err
    assert len(built) == 1 and err.count("\n") == 1 and err.startswith(f"warning: cached index {path} of {shard.url} ")
    assert why in err and err.endswith("; rebuilt from the cached shard\n")
    assert json.loads(path.read_text()) == want


def _one_line(err: pytest.ExceptionInfo[CacheError], root: Path) -> str:
    msg = str(err.value)
    assert msg.startswith(f"--cache-dir {root}: ") and "\n" not in msg
    return msg


def test_a_full_disk_names_the_cache_folder_and_the_limit(tmp_path: Path, objects: dict[str, bytes],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    shard = _shards(objects)[0]
    root = tmp_path / "cache"

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    cache = ShardCache(CacheSettings(str(root), limit=8 * SIZE), fetch=Store(objects))
    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(CacheError) as err:
        cache.ensure(shard)
    monkeypatch.undo()
    msg = _one_line(err, root)
    assert f"the disk is full while caching {shard.url} (No space left on device)" in msg
    assert f"lower --cache-limit (now {8 * SIZE} bytes)" in msg
    assert list((root / "part").iterdir()) == [] and not cache.entry(shard).exists()


def test_a_cache_folder_removed_during_the_run_is_named(tmp_path: Path, objects: dict[str, bytes]) -> None:
    import shutil

    a, b = _shards(objects)[:2]
    root = tmp_path / "cache"
    cache = ShardCache(CacheSettings(str(root), limit=8 * SIZE), fetch=Store(objects))
    with cache.open(a):
        pass
    shutil.rmtree(root)
    for call in (lambda: cache.open(b).__enter__(), lambda: cache.ensure(b), cache.usage):
        with pytest.raises(CacheError) as err:
            call()
        assert "was removed during the run" in _one_line(err, root)


def test_a_read_only_cache_folder_is_named(tmp_path: Path, objects: dict[str, bytes],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    a = _shards(objects)[0]
    root = tmp_path / "cache"
    cache = ShardCache(CacheSettings(str(root), limit=8 * SIZE), fetch=Store(objects))
    real_open = os.open

    def read_only(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        """The file system mounted read-only under the run (chmod does not stop root, who runs some tests)."""
        if str(path).startswith(str(root)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(CacheError) as err:
        with cache.open(a):
            pass
    monkeypatch.undo()
    assert f"not writable while caching {a.url} (Read-only file system: {root / 'lock'}" in _one_line(err, root)
