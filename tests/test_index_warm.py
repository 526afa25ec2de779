"""An index whose pages left the page cache is read back into it in one pass (index/warm.py).

Pages are evicted with ``posix_fadvise(DONTNEED)`` (clean pages of a file nobody maps) and found
missing with ``preadv(RWF_NOWAIT)``, the same probe the warmer uses; where the file system keeps
no page cache of its own (tmpfs), there is nothing to test and the tests skip.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Iterator, Tuple

import pytest
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.index import warm
from ratarmountcore.index.pool import ConnectionPool
from ratarmountcore.index.warm import IndexWarmer

pytestmark = pytest.mark.skipif(not hasattr(os, "RWF_NOWAIT"), reason="needs preadv(RWF_NOWAIT)")


@pytest.fixture(autouse=True)
def small_indexes_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test archive's index is smaller than warm.MIN_SIZE: read it ahead all the same. The
    tests evict on purpose right after read-aheads (no pause for that, unless a test asks), and
    read-aheads of other tests' pools do not count against theirs."""
    monkeypatch.setattr(warm, "MIN_SIZE", 0)
    monkeypatch.setattr(warm, "UNRELIABLE_WITHIN", 0.0)
    monkeypatch.setattr(warm, "_RUNNING", threading.BoundedSemaphore(warm.MAX_RUNNING))


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_pages(path: Path) -> int:
    """How many of the file's 4 KiB pages are in the page cache, by mincore(2): a read with
    RWF_NOWAIT of a page that is not cached starts the kernel's read-ahead around it, so counting
    that way would fill the cache it counts."""
    size = path.stat().st_size
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        anchor = ctypes.c_char.from_buffer(mapped)
        vector = ctypes.create_string_buffer((size + 4095) // 4096)
        failed = libc.mincore(ctypes.addressof(anchor), size, vector) != 0
        del anchor  # (the mapping cannot be closed while exported)
        if failed:
            raise OSError(ctypes.get_errno(), "mincore")
        count = sum(byte & 1 for byte in vector.raw)
    return count


def pages(path: Path) -> int:
    return (path.stat().st_size + 4095) // 4096


def wait_until_idle(warmer: IndexWarmer, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while warmer._thread is not None:
        assert time.monotonic() < deadline, "the read-ahead did not finish"
        time.sleep(0.005)


QUERY = "SELECT 1 FROM metadata LIMIT 1"


@contextlib.contextmanager
def warmed_pool(index: Path) -> Iterator[Tuple[ConnectionPool, IndexWarmer]]:
    """A pool of ``index`` with its first connection (and so its warmer) made."""
    pool = ConnectionPool(str(index))
    try:
        pool.query(QUERY)
        assert pool._warmer is not None
        yield pool, pool._warmer
    finally:
        pool.close()


def query_after_eviction(pool: ConnectionPool, index: Path) -> None:
    """Evict the index and query at once, with a probe due."""
    assert pool._warmer is not None
    evict(index)
    next_probe(pool._warmer)
    pool.query(QUERY)


def next_probe(warmer: IndexWarmer) -> None:
    """Make the next ``poke`` probe (without waiting PROBE_INTERVAL)."""
    warmer._next_probe = 0.0


@pytest.fixture()
def archive(tmp_path: Path) -> Iterator[Path]:
    """A tar whose index spans a few hundred pages, indexed once."""
    path = tmp_path / "many.tar"
    members = {f"folder{i % 50}/file-with-a-longer-name-{i:05d}.bin": b"x" * (i % 7) for i in range(4000)}
    path.write_bytes(tar_bytes(members))
    with ratarmountcore.open(str(path)):
        pass
    index = Path(str(path) + ".index.sqlite")
    assert index.exists()
    evict(index)
    if cached_pages(index) == pages(index):
        pytest.skip("this file system keeps its files in memory (tmpfs): nothing leaves the page cache")
    yield path


def index_of(archive: Path) -> Path:
    return Path(str(archive) + ".index.sqlite")


def test_lookups_on_an_evicted_index_read_it_back_whole(archive: Path) -> None:
    index = index_of(archive)
    with ratarmountcore.open(str(archive)) as source:
        warmer = source._index._pool._warmer
        assert warmer is not None
        wait_until_idle(warmer)
        evict(index)
        assert cached_pages(index) < pages(index) // 2
        count = warmer.warm_count
        # A probe samples six pages: it finds the eviction at the first lookup, unless the few
        # pages the eviction left happen to be the ones sampled; then at one of the next.
        for i in range(5):
            next_probe(warmer)
            assert source.stat(f"folder{i}/file-with-a-longer-name-{i:05d}.bin").st_size == i % 7
            if warmer.warm_count > count:
                break
        assert warmer.warm_count == count + 1, f"{cached_pages(index)} of {pages(index)} pages cached"
        wait_until_idle(warmer)
        assert cached_pages(index) == pages(index)
        # Everything cached: the next probe reads nothing.
        next_probe(warmer)
        source.stat("folder8/file-with-a-longer-name-00008.bin")
        assert warmer.warm_count == count + 1


def test_probes_are_rate_limited(archive: Path) -> None:
    index = index_of(archive)
    with ratarmountcore.open(str(archive)) as source:
        warmer = source._index._pool._warmer
        wait_until_idle(warmer)
        count = warmer.warm_count
        evict(index)
        warmer._next_probe = time.monotonic() + 60  # a probe was just made
        for i in range(20):
            source.stat(f"folder{i}/file-with-a-longer-name-{i:05d}.bin")
        assert warmer.warm_count == count  # no probe, no read-ahead


def test_read_aheads_are_paid_from_a_budget(archive: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two read-aheads at once at most; then one only as the budget fills up again."""
    index = index_of(archive)
    monkeypatch.setattr(warm, "REWARM_RATE", 1)  # the budget fills up by a byte per second
    with warmed_pool(index) as (pool, warmer):
        started = []
        for _round in range(4):
            wait_until_idle(warmer)
            query_after_eviction(pool, index)
            started.append(warmer.warm_count)
        assert started[:2] == [1, 2] and started[2:] == [2, 2]
        wait_until_idle(warmer)
        assert cached_pages(index) < pages(index)  # the last eviction stays


def test_pages_missing_right_after_a_read_ahead_pause_the_probes(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system whose probe always says "not cached", or a machine that evicts as fast as
    the index is read: no read-ahead after read-ahead."""
    monkeypatch.setattr(warm, "UNRELIABLE_WITHIN", 5.0)
    index = index_of(archive)
    with warmed_pool(index) as (pool, warmer):
        query_after_eviction(pool, index)
        wait_until_idle(warmer)
        assert warmer.warm_count == 1
        for _ in range(5):  # gone again at once (a probe may sample only pages still cached)
            query_after_eviction(pool, index)
            if warmer._next_probe > time.monotonic() + warm.PAUSE / 2:
                break
        assert warmer.warm_count == 1 and warmer._next_probe > time.monotonic() + warm.PAUSE / 2


def test_no_read_ahead_of_an_index_larger_than_memory_allows(archive: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = index_of(archive)
    monkeypatch.setattr(warm, "available_memory", lambda: index.stat().st_size)  # 4x its size needed
    with warmed_pool(index) as (pool, warmer):
        wait_until_idle(warmer)
        query_after_eviction(pool, index)
        assert warmer.warm_count == 0


def test_a_replaced_index_is_not_read_ahead(archive: Path, tmp_path: Path) -> None:
    """The file now at the path is not the pool's: the warmer leaves it alone."""
    index = index_of(archive)
    with warmed_pool(index) as (pool, warmer):
        wait_until_idle(warmer)
        count = warmer.warm_count
        other = tmp_path / "other.sqlite"
        other.write_bytes(index.read_bytes())
        os.replace(other, index)
        query_after_eviction(pool, index)  # through the connection opened before
        wait_until_idle(warmer)
        assert warmer.warm_count == count
        assert cached_pages(index) < pages(index)


def test_closing_stops_the_warmer(archive: Path) -> None:
    index = index_of(archive)
    pool = ConnectionPool(str(index))
    pool.query("SELECT 1 FROM metadata LIMIT 1")
    warmer = pool._warmer
    pool.close()
    assert warmer is not None and warmer._thread is None
    evict(index)
    next_probe(warmer)
    warmer.poke()
    assert warmer._thread is None and cached_pages(index) < pages(index)


def test_small_indexes_are_not_read_ahead(archive: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup reads much of a small index anyway; a thread per small index (a folder of 1,000
    class tars read at random) cost more than it saved."""
    index = index_of(archive)
    monkeypatch.setattr(warm, "MIN_SIZE", index.stat().st_size + 1)
    with warmed_pool(index) as (pool, warmer):
        query_after_eviction(pool, index)
        assert warmer.warm_count == 0


def test_read_aheads_at_once_are_bounded(archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(warm, "_RUNNING", threading.BoundedSemaphore(1))
    index = index_of(archive)
    copy = tmp_path / "copy.sqlite"
    copy.write_bytes(index.read_bytes())
    pools = [ConnectionPool(str(index)), ConnectionPool(str(copy))]
    try:
        for p in pools:
            p.query("SELECT 1 FROM metadata LIMIT 1")
        warm._RUNNING.acquire()  # one read-ahead is under way somewhere
        for p in pools:
            evict(Path(p.path))
            next_probe(p._warmer)
            p.query("SELECT 1 FROM metadata LIMIT 1")
        assert [p._warmer.warm_count for p in pools] == [0, 0]
        warm._RUNNING.release()
        # A probe samples six pages: it may hit only pages the eviction left or the queries read
        # back (a CI run failed so once); then one of the next probes finds the eviction.
        for _ in range(5):
            evict(Path(pools[0].path))
            next_probe(pools[0]._warmer)
            pools[0].query("SELECT 1 FROM metadata LIMIT 1")
            if pools[0]._warmer.warm_count:
                break
        assert pools[0]._warmer.warm_count == 1
        wait_until_idle(pools[0]._warmer)
    finally:
        for p in pools:
            p.close()
