"""Memory of index connections in unions of many archives (index/pool.py): the page cache is a
budget of the process, idle connections beyond a process-wide bound are closed."""

from __future__ import annotations

import sqlite3
import weakref
from pathlib import Path
from typing import List

import pytest
from conftest import no_descriptor_left, tar_bytes

import ratarmountcore
from ratarmountcore.errors import ClosedSourceError
from ratarmountcore.index import pool as pool_module
from ratarmountcore.index.pool import ConnectionPool


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def database(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (value INTEGER)")
    conn.execute("INSERT INTO t VALUES (7)")
    conn.commit()
    conn.close()
    return path


def cache_size(pool: ConnectionPool) -> int:
    return int(pool.query("PRAGMA cache_size", one=True)[0])


def test_page_cache_is_shared_out_among_the_pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "PAGE_CACHE_BUDGET", 4 << 20)
    monkeypatch.setattr(pool_module, "_LIVE", weakref.WeakSet())  # (pools other tests left open)
    pools: List[ConnectionPool] = []
    try:
        pools.append(ConnectionPool(str(database(tmp_path / "first.sqlite"))))
        assert cache_size(pools[0]) == -160  # alone, a small index: the floor
        for i in range(40):
            pools.append(ConnectionPool(str(database(tmp_path / f"db{i}.sqlite"))))
        # 41 pools: 4 MiB / 41 is below the 160 KiB SQLite would keep anyway: no cache of its own.
        assert cache_size(pools[-1]) == 0
        assert pools[-1].query("SELECT value FROM t", one=True) == (7,)
    finally:
        for p in pools:
            p.close()
    # Closed pools no longer count.
    alone = ConnectionPool(str(tmp_path / "first.sqlite"))
    try:
        assert cache_size(alone) == -160
    finally:
        alone.close()


def test_page_cache_follows_the_size_of_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """A share of the index (its interior pages with room to spare), between the floor and the
    maximum, never beyond the process's budget."""
    monkeypatch.setattr(pool_module, "_LIVE", weakref.WeakSet())
    assert pool_module.cache_size_pragma(16 << 20) == "PRAGMA cache_size=-256"
    assert pool_module.cache_size_pragma(1 << 30) == "PRAGMA cache_size=-1024"
    assert pool_module.cache_size_pragma(4096) == "PRAGMA cache_size=-160"
    monkeypatch.setattr(pool_module, "PAGE_CACHE_BUDGET", 200 << 10)
    assert pool_module.cache_size_pragma(1 << 30) == "PRAGMA cache_size=-200"


def test_idle_connections_beyond_the_bound_are_closed_and_reopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "MAX_IDLE", 2)
    monkeypatch.setattr(pool_module, "_IDLE", pool_module._IdleConnections())
    monkeypatch.setattr(pool_module, "_LIVE", weakref.WeakSet())  # (pools other tests left open)
    pools = [ConnectionPool(str(database(tmp_path / f"db{i}.sqlite"))) for i in range(3)]
    try:
        for p in pools:
            assert p.query("SELECT value FROM t", one=True) == (7,)
        # The least recently used idle connection was closed; its pool opens another when asked.
        assert [p.connection_count for p in pools] == [0, 1, 1]
        assert pools[0].query("SELECT value FROM t", one=True) == (7,)
        assert [p.connection_count for p in pools] == [1, 0, 1]
    finally:
        for p in pools:
            p.close()


def test_idle_connections_make_room_when_descriptors_run_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below the bound, idle connections are closed only when the process is short of
    descriptors: then half of them, least recently used first, by a new connection or by
    ``make_room`` (called before an archive is opened)."""
    monkeypatch.setattr(pool_module, "_IDLE", pool_module._IdleConnections())
    monkeypatch.setattr(pool_module, "_LIVE", weakref.WeakSet())
    short = [False]
    monkeypatch.setattr(pool_module, "_few_descriptors_left", lambda: short[0])
    pools = [ConnectionPool(str(database(tmp_path / f"db{i}.sqlite"))) for i in range(6)]
    try:
        for p in pools[:4]:
            assert p.query("SELECT value FROM t", one=True) == (7,)
        assert [p.connection_count for p in pools] == [1, 1, 1, 1, 0, 0]
        pool_module.make_room()
        assert [p.connection_count for p in pools] == [1, 1, 1, 1, 0, 0]  # (enough left)
        short[0] = True
        pool_module.make_room()
        assert [p.connection_count for p in pools] == [0, 0, 1, 1, 0, 0]
        assert pools[4].query("SELECT value FROM t", one=True) == (7,)  # 3 open: one closed
        assert [p.connection_count for p in pools] == [0, 0, 0, 1, 1, 0]
        assert pools[0].query("SELECT value FROM t", one=True) == (7,)  # reopened when asked
    finally:
        for p in pools:
            p.close()


def test_union_of_many_archives_reads_with_connections_closed_under_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_module, "MAX_IDLE", 3)
    monkeypatch.setattr(pool_module, "PAGE_CACHE_BUDGET", 1 << 20)
    monkeypatch.setattr(pool_module, "_IDLE", pool_module._IdleConnections())
    monkeypatch.setattr(pool_module, "_LIVE", weakref.WeakSet())
    paths = []
    for i in range(12):
        path = tmp_path / f"part{i:02d}.tar"
        path.write_bytes(tar_bytes({f"d{i}/f.txt": f"file {i}".encode(), "shared.txt": str(i).encode()}))
        paths.append(str(path))
    with ratarmountcore.open(paths) as src:
        for _round in range(2):
            for i in range(12):
                assert src.read(f"/d{i}/f.txt") == f"file {i}".encode()
        assert src.read("/shared.txt") == b"11"
        assert sorted(src.listdir("/")) == sorted([f"d{i}" for i in range(12)] + ["shared.txt"])


def test_closing_a_pool_leaves_a_query_in_flight_to_finish(tmp_path: Path) -> None:
    """A source's reader threads query its index while the source closes (closing a .tar.gz
    just after a read crashed the process in libsqlite3, found by fuzzing): the pool closes the
    idle connections at once, the one in use when its query ends, and opens no new one."""
    import threading
    import time

    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    pool = ConnectionPool(str(path))
    pool.query("SELECT 1")  # (one idle connection)
    slow = "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 3000000) SELECT count(*) FROM c"
    started, results = threading.Event(), []

    def query() -> None:
        started.set()
        results.append(pool.query(slow, one=True))

    thread = threading.Thread(target=query)
    thread.start()
    started.wait()
    while pool._idle:  # (the slow query borrowed the connection)  # noqa: SLF001
        time.sleep(0.001)
    pool.close()
    assert pool.connection_count == 1  # the one in use is left to finish
    thread.join()
    assert results == [(3000000,)]
    assert pool.connection_count == 0
    with pytest.raises(ClosedSourceError):  # (a ValueError, as a closed file's; was sqlite3's own)
        pool.query("SELECT 1")
    assert pool.connection_count == 0


def test_out_of_descriptors_a_pool_waits_for_its_connection_and_opens_more_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A query that needs a new connection while the process has no descriptor left waits for
    a connection of the pool to come back; the pool does not take the failed open for its file
    gone (until session 41 it said so in a warning and never opened another connection)."""
    import threading

    pool = ConnectionPool(str(database(tmp_path / "t.sqlite")))
    assert pool.query("SELECT value FROM t", one=True) == (7,)
    held = pool._borrow()  # (the pool's only connection, busy)  # noqa: SLF001
    results: List[object] = []
    try:
        with no_descriptor_left():
            thread = threading.Thread(target=lambda: results.append(pool.query("SELECT value FROM t", one=True)))
            thread.start()
            thread.join(0.3)
            assert thread.is_alive() and not results  # waiting, not failed
    finally:
        with pool._lock:  # (give the busy connection back)  # noqa: SLF001
            pool._idle.append(held)  # noqa: SLF001
            pool._returned.notify()  # noqa: SLF001
    thread.join(5)
    assert results == [(7,)]
    assert not pool._replaced and "while in use" not in caplog.text  # noqa: SLF001
    # With descriptors again, two queries at once get two connections.
    second = pool._borrow()  # noqa: SLF001
    assert pool.query("SELECT value FROM t", one=True) == (7,)
    assert pool.connection_count == 2
    with pool._lock:  # noqa: SLF001
        pool._idle.append(second)  # noqa: SLF001
    pool.close()


def test_out_of_descriptors_a_pool_without_a_connection_says_so(tmp_path: Path) -> None:
    from ratarmountcore.errors import TooManyOpenFilesError

    pool = ConnectionPool(str(database(tmp_path / "t.sqlite")))
    assert pool.query("SELECT value FROM t", one=True) == (7,)
    pool._close_idle(1)  # (idle connections closed: the pool has none left)  # noqa: SLF001
    assert pool.connection_count == 0
    with no_descriptor_left(), pytest.raises(TooManyOpenFilesError, match="t.sqlite: too many open files"):
        pool.query("SELECT value FROM t", one=True)
    assert pool.query("SELECT value FROM t", one=True) == (7,)
    pool.close()
