"""The folder of cached union tables: tables that no mount can use any more are removed when a new
one is built, nothing else is."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List

import pytest
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.sources import union_cache

DAY = 24 * 3600


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def cache(tmp_path: Path) -> Path:
    return tmp_path / "home" / ".cache" / "ratarmount"


def tables(tmp_path: Path) -> List[str]:
    """The union tables in the cache folder (named ``union-`` + 24 hex digits + ``.sqlite``)."""
    return sorted(p.name for p in cache(tmp_path).glob("union-" + "[0-9a-f]" * 24 + ".sqlite"))


def age(path: Path, days: float) -> None:
    when = time.time() - days * DAY
    os.utime(path, (when, when))


def mount(*paths: Path) -> List[str]:
    with ratarmountcore.open([str(p) for p in paths]) as src:
        return src.listdir("/")


def rewrite(path: Path, members: dict, mtime_ns: int) -> None:  # type: ignore[type-arg]
    path.write_bytes(tar_bytes(members))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_table_of_sources_that_changed_is_removed_once_unused_for_a_day(tmp_path: Path) -> None:
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    a.write_bytes(tar_bytes({"x": b"1"}))
    rewrite(b, {"y": b"2"}, 10**18)
    assert mount(a, b) == ["x", "y"]
    [first] = tables(tmp_path)
    rewrite(b, {"z": b"3"}, 2 * 10**18)  # re-indexed at the next mount: a new table
    assert mount(a, b) == ["x", "z"]
    [second] = set(tables(tmp_path)) - {first}
    assert first in tables(tmp_path)  # stale, but opened less than a day ago: kept
    age(cache(tmp_path) / first, 2)
    rewrite(b, {"w": b"4"}, 3 * 10**18)
    assert mount(a, b) == ["w", "x"]
    left = tables(tmp_path)
    assert first not in left  # stale and unused for two days
    assert second in left and len(left) == 2  # stale but recent; and the new one


def test_a_table_in_use_is_kept_however_old_its_file_and_reopening_marks_it_used(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.tar", tmp_path / "b.tar", tmp_path / "c.tar"
    for path, name in ((a, "x"), (b, "y"), (c, "z")):
        path.write_bytes(tar_bytes({name: b"."}))
    mount(a, b)
    [table] = tables(tmp_path)
    path = cache(tmp_path) / table
    inode = path.stat().st_ino
    age(path, 60)
    mount(a, b)  # reused (the same file), and marked as used
    assert path.stat().st_ino == inode
    assert time.time() - path.stat().st_mtime < 3600
    age(path, 60)
    mount(a, c)  # a build sweeps: a table of sources that did not change stays for 90 days
    assert table in tables(tmp_path)
    age(path, 91)
    mount(b, c)
    assert table not in tables(tmp_path) and len(tables(tmp_path)) == 2


def test_other_files_of_the_cache_folder_are_left_alone(tmp_path: Path) -> None:
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    a.write_bytes(tar_bytes({"x": b"1"}))
    b.write_bytes(tar_bytes({"y": b"2"}))
    folder = cache(tmp_path)
    folder.mkdir(parents=True)
    # An archive's index in the cache folder whose archive is named "union-...", a file of the
    # user's, an interrupted build of a day ago and one of a minute ago, and a table written
    # by a version that did not record its sources.
    keep = ["union-data.tar.0123456789abcdef.index.sqlite", "union-notes.sqlite"]
    recent_build = "union-" + "1" * 24 + ".sqlite.tmp-" + "a" * 12
    old_build = "union-" + "2" * 24 + ".sqlite.tmp-" + "b" * 12
    old_table = "union-" + "3" * 24 + ".sqlite"
    for name in [*keep, recent_build, old_build, old_table]:
        (folder / name).write_bytes(b"SQLite format 3\0" + bytes(100))
        age(folder / name, 400)
    age(folder / recent_build, 1 / 24 / 60)
    mount(a, b)
    left = sorted(p.name for p in folder.iterdir())
    assert set(keep) <= set(left) and recent_build in left
    assert old_build not in left and old_table not in left
    assert len(tables(tmp_path)) == 1


def test_sweep_of_a_folder_it_may_not_change_removes_nothing_and_fails_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    old = folder / ("union-" + "4" * 24 + ".sqlite")
    old.write_bytes(b"not a table")
    age(old, 400)
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):  # (root may write anyway: then it is removed)
            assert union_cache.sweep(str(folder), "", "4") == [old.name]
        else:
            assert union_cache.sweep(str(folder), "", "4") == [] and old.exists()
    finally:
        folder.chmod(0o755)
    assert union_cache.sweep(str(tmp_path / "missing"), "", "4") == []


@pytest.mark.parametrize("sources", ['["index:no-size-or-mtime"]', "[1]", "not json", '["object:1"]'])
def test_a_table_whose_record_cannot_be_read_counts_as_stale(tmp_path: Path, sources: str) -> None:
    import sqlite3

    path = tmp_path / ("union-" + "5" * 24 + ".sqlite")
    conn = sqlite3.connect(path)
    union_cache.record(conn, "4", [])
    conn.execute("UPDATE metadata SET value = ? WHERE key = 'sources'", (sources,))
    conn.commit()
    conn.close()
    age(path, 2)
    assert union_cache.sweep(str(tmp_path), "", "4") == [path.name]


def test_the_table_goes_to_the_first_index_folder_named(tmp_path: Path) -> None:
    from ratarmountcore.options import IndexOptions, OpenOptions

    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    a.write_bytes(tar_bytes({"x": b"1"}))
    b.write_bytes(tar_bytes({"y": b"2"}))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    options = OpenOptions(index=IndexOptions(index_folders=("", str(scratch))))
    with ratarmountcore.open([str(a), str(b)], options) as src:
        assert src.listdir("/") == ["x", "y"]
    assert len(list(scratch.glob("union-*.sqlite"))) == 1
    assert tables(tmp_path) == []  # (nothing in ~/.cache/ratarmount)
    only_beside = OpenOptions(index=IndexOptions(index_folders=("",)))
    with ratarmountcore.open([str(a), str(b)], only_beside) as src:  # the default folder then
        assert src.listdir("/") == ["x", "y"]
    assert len(tables(tmp_path)) == 1


def test_a_table_that_fills_its_disk_is_kept_in_memory(
    tmp_path: Path, small_disk: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite's "database or disk is full" failed the mount with a traceback (an OSError was
    expected there, found in session 25); the folder made for the table is removed again."""
    import logging

    from conftest import fill_disk

    from ratarmountcore.options import IndexOptions, OpenOptions

    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    a.write_bytes(tar_bytes({f"a/{i}/file-with-a-long-name-{i}": b"1" for i in range(3000)}))
    b.write_bytes(tar_bytes({f"b/{i}": b"2" for i in range(3000)}))
    # (The default cache folder: the only one made when missing; a folder named must exist.)
    (small_disk / "home").mkdir()
    monkeypatch.setenv("HOME", str(small_disk / "home"))
    options = OpenOptions(index=IndexOptions(index_folders=("",)))
    with ratarmountcore.open(str(a)), ratarmountcore.open(str(b)):
        pass  # (their indexes beside them)
    fill_disk(small_disk, 64 * 1024)
    with caplog.at_level(logging.WARNING), ratarmountcore.open([str(a), str(b)], options) as src:
        assert src.listdir("/") == ["a", "b"] and src.read("/a/7/file-with-a-long-name-7") == b"1"
    assert [r.getMessage() for r in caplog.records] == [
        f"Cannot cache the union table in {small_disk}/home/.cache/ratarmount (database or disk is full); "
        "keeping it in memory"
    ]
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "home"]
    assert not list((small_disk / "home").iterdir())  # (the folders made for it too)
