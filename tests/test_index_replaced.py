"""An index file replaced while in use: connections opened later must not read the new file.

Another node mounting a new version of an archive (renamed over the old one) rebuilds the index
beside it and renames it into place; a mount that still serves the old version opens more
connections as more threads read at once (see ratarmountcore/index/pool.py).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import List

import pytest
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.index.pool import ConnectionPool


def database(path: Path, value: str) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (value TEXT)")
    conn.execute("INSERT INTO t VALUES (?)", (value,))
    conn.commit()
    conn.close()
    return path


#: A query that keeps its connection busy for a while (SQLite lets other threads run meanwhile),
#: so that queries started together overlap and need connections of their own.
SLOW = (
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 200000)"
    " SELECT (SELECT value FROM t), count(*) FROM c"
)


def query_in_threads(pool: ConnectionPool, threads: int) -> List[str]:
    """``threads`` slow queries started at once."""
    barrier = threading.Barrier(threads, timeout=10)
    results: List[str] = []
    lock = threading.Lock()

    def work() -> None:
        (value, _count) = pool.query(SLOW, one=True)
        with lock:
            results.append(value)

    def run() -> None:
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        work()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    return results


def test_connections_after_a_replacement_read_the_file_first_opened(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = database(tmp_path / "index.sqlite", "old")
    pool = ConnectionPool(str(path))
    assert pool.query("SELECT value FROM t", one=True) == ("old",)
    os.replace(database(tmp_path / "new.sqlite", "new"), path)
    with caplog.at_level(logging.WARNING, logger="ratarmountcore.index.pool"):
        results = query_in_threads(pool, 8)
    assert results == ["old"] * 8
    assert pool.connection_count == 1  # no connection to the new file was kept
    warnings = [r for r in caplog.records if "was replaced by another file" in r.getMessage()]
    assert len(warnings) == 1
    pool.close()


def test_connections_after_the_file_was_removed_go_on(tmp_path: Path) -> None:
    path = database(tmp_path / "index.sqlite", "old")
    pool = ConnectionPool(str(path))
    pool.query("SELECT value FROM t")
    path.unlink()
    assert query_in_threads(pool, 4) == ["old"] * 4
    pool.close()


def test_unchanged_file_gets_a_connection_per_concurrent_query(tmp_path: Path) -> None:
    path = database(tmp_path / "index.sqlite", "same")
    pool = ConnectionPool(str(path))
    assert query_in_threads(pool, 4) == ["same"] * 4
    assert pool.connection_count >= 2  # (the threads overlap: more than one was opened)
    pool.close()


def test_archive_and_index_replaced_by_a_new_version_keep_serving_the_old_bytes(tmp_path: Path) -> None:
    old = {f"d/f{i:02d}": bytes([i]) * (1000 + 100 * i) for i in range(40)}
    new = {f"d/f{i:02d}": bytes([200 - i]) * (1000 + 101 * (40 - i)) for i in range(40)}  # other offsets
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(old))
    with ratarmountcore.open(str(archive)) as source:
        index = Path(source.index_path)  # type: ignore[attr-defined]
        first = sorted(old)[0]
        with source.open("/" + first) as f:
            assert f.read() == old[first]
        # Another node: the new version renamed over the archive, its index built and renamed
        # into place beside it.
        fresh = tmp_path / "fresh.tar"
        fresh.write_bytes(tar_bytes(new))
        os.replace(fresh, archive)
        with ratarmountcore.open(str(archive)) as other:
            assert Path(other.index_path) == index  # type: ignore[attr-defined]
        errors: List[str] = []
        barrier = threading.Barrier(8, timeout=10)

        def reader(names: List[str]) -> None:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass
            for name in names:
                info = source.lookup("/" + name)
                with source.open("/" + name) as f:
                    data = f.read()
                if info is None or info.size != len(old[name]) or data != old[name]:
                    errors.append(name)

        names = sorted(old)
        threads = [threading.Thread(target=reader, args=(names[k::8],)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
