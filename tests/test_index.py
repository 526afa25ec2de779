"""The SQLite index itself: schema, query plans, atomic build, staleness, connection reuse."""

from __future__ import annotations

import io
import itertools
import logging
import os
import sqlite3
import struct
import tarfile
import threading
from pathlib import Path
from typing import List

import pytest
from conftest import fill_disk, tar_bytes

import ratarmountcore
from ratarmountcore.errors import IndexNotWritableError, TruncatedArchiveError
from ratarmountcore.index.folder_rows import RUN_GAP
from ratarmountcore.index.sqlite_index import (
    APPLICATION_ID,
    FORMAT_VERSION,
    LIST_STATS_SQL,
    PAGE_SIZE,
    ROW_COLUMNS,
    IndexReader,
    written_by_us,
)
from ratarmountcore.options import IndexOptions, OpenOptions


def make_tar(path: Path, count: int) -> Path:
    with tarfile.open(path, "w") as tar:
        for i in range(count):
            data = f"{i}".encode()
            info = tarfile.TarInfo(f"d{i % 10}/f{i}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_lookups_and_listings_use_the_path_index(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar", 200)
    with ratarmountcore.open(str(archive)) as src:
        index_path = src.index_path  # type: ignore[attr-defined]
    conn = sqlite3.connect(index_path)
    for sql, params in (
        (
            f"SELECT {ROW_COLUMNS} FROM files WHERE parent = ? AND name = ? AND latest = 1 ORDER BY id DESC LIMIT 1",
            (b"/d1", b"f1"),
        ),
        (
            f"SELECT {ROW_COLUMNS} FROM files WHERE parent = ? AND latest = 1 ORDER BY name, id LIMIT ?",
            (b"/d1", 100),
        ),
        (LIST_STATS_SQL, (b"/d1",)),
    ):
        plan = " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
        # Covering: the answer comes from the index alone (a cold lookup reads one B-tree).
        assert "USING COVERING INDEX files_by_path" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # listings come out of the index in order
    meta = dict(conn.execute("SELECT key, value FROM metadata"))
    assert meta["format_version"] == FORMAT_VERSION
    assert int(meta["entries"]) == 210


def test_connections_are_reused_across_short_lived_threads(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar", 50)
    with ratarmountcore.open(str(archive)) as src:
        for _ in range(30):
            thread = threading.Thread(target=lambda: src.stat("/d3/f3"))
            thread.start()
            thread.join()
        assert src._index.connection_count <= 2  # type: ignore[attr-defined]


def test_interrupted_build_leaves_nothing(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar", 100)
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(TruncatedArchiveError):
        ratarmountcore.open(str(archive))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar"]


def _peer_like_index(path: Path) -> bytes:
    """An SQLite file with the PyPI ratarmount release's kind of tables (not ours)."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE metadata (key VARCHAR(65535), value VARCHAR(65535))")
    conn.execute("INSERT INTO metadata VALUES ('tarstats', '{}')")
    conn.execute("CREATE TABLE files (path VARCHAR(65535), name VARCHAR(65535), offset INTEGER)")
    conn.commit()
    conn.close()
    return path.read_bytes()


@pytest.mark.parametrize("kind", ["garbage", "peer", "empty", "folder"])
def test_another_programs_file_at_the_index_path_is_left_alone(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A file under our index name that is not our index (the PyPI release writes the same
    name; or not SQLite at all) is never overwritten: the index goes to the cache folder, with
    one warning naming the file, and later opens use it without a word."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    archive = make_tar(tmp_path / "a.tar", 10)
    beside = tmp_path / "a.tar.index.sqlite"
    original = b""
    if kind == "garbage":
        beside.write_bytes(b"garbage" * 100)
        original = beside.read_bytes()
    elif kind == "peer":
        original = _peer_like_index(beside)
    elif kind == "empty":
        beside.touch()
    else:
        beside.mkdir()
    with caplog.at_level(logging.INFO, logger="ratarmountcore"):
        with ratarmountcore.open(str(archive)) as src:
            assert src.read("/d0/f0") == b"0"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    # What the file is, said as such (an empty file or a folder was "another program's?").
    why = {"empty": "an empty file", "folder": "a folder"}.get(kind, "not a ratarmount index; another program's?")
    assert len(warnings) == 1 and warnings[0].startswith(f"Leaving {beside} ({why}) alone; writing the index to ")
    assert beside.is_dir() if kind == "folder" else beside.read_bytes() == original
    cached = list((tmp_path / "home" / ".cache" / "ratarmount").glob("a.tar.*.index.sqlite"))
    assert len(cached) == 1 and written_by_us(str(cached[0])) and not written_by_us(str(beside))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ratarmountcore"):
        with ratarmountcore.open(str(archive)) as src:
            assert src.read("/d9/f9") == b"9"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or "Creating index" in r.getMessage()]
    assert beside.is_dir() if kind == "folder" else beside.read_bytes() == original


def test_an_explicit_index_file_of_another_program_is_refused(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar", 10)
    foreign = tmp_path / "theirs.sqlite"
    original = _peer_like_index(foreign)
    options = OpenOptions(index=IndexOptions(index_file=str(foreign), progress=False))
    with pytest.raises(IndexNotWritableError, match="another program"):
        ratarmountcore.open(str(archive), options)
    assert foreign.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "theirs.sqlite"]


def test_a_damaged_index_of_ours_is_rebuilt_not_left_alone(tmp_path: Path) -> None:
    """An index of ours cut in half (a full disk, a copy that failed) is still ours: rebuilt in
    place, not taken for another program's file and left beside a second index."""
    archive = make_tar(tmp_path / "a.tar", 300)
    ratarmountcore.open(str(archive)).close()
    index = tmp_path / "a.tar.index.sqlite"
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    assert written_by_us(str(index))
    with ratarmountcore.open(str(archive)) as src:
        assert src.read("/d9/f9") == b"9"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "a.tar.index.sqlite"]
    with ratarmountcore.open(str(archive)) as src:  # (the rebuilt index is valid)
        assert src.read("/d9/f299") == b"299"


def test_a_folder_named_as_the_index_file_is_called_a_folder(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar", 3)
    folder = tmp_path / "idx"
    folder.mkdir()
    options = OpenOptions(index=IndexOptions(index_file=str(folder), progress=False))
    with pytest.raises(IndexNotWritableError, match=f"{folder}: a folder"):
        ratarmountcore.open(str(archive), options)


def test_our_indexes_carry_our_application_id(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar", 3)
    ratarmountcore.open(str(archive)).close()
    conn = sqlite3.connect(tmp_path / "a.tar.index.sqlite")
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    conn.close()


def test_old_format_version_is_rebuilt(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "a.tar", 10)
    ratarmountcore.open(str(archive)).close()
    index = tmp_path / "a.tar.index.sqlite"
    conn = sqlite3.connect(index)
    conn.execute("UPDATE metadata SET value = '0' WHERE key = 'format_version'")
    conn.execute("DELETE FROM files")
    conn.commit()
    conn.close()
    with ratarmountcore.open(str(archive)) as src:
        assert src.read("/d5/f5") == b"5"


def test_indexes_with_other_page_sizes_are_used_as_they_are(tmp_path: Path) -> None:
    """New indexes use ``PAGE_SIZE``; one written with 4 KiB pages (before session 13) is still
    opened without a rebuild (its mtime, its page size and its answers stay)."""
    archive = make_tar(tmp_path / "a.tar", 50)
    ratarmountcore.open(str(archive)).close()
    index = tmp_path / "a.tar.index.sqlite"
    conn = sqlite3.connect(index)
    assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE != 4096
    conn.execute("PRAGMA page_size=4096")
    conn.execute("VACUUM")
    conn.close()
    written = index.stat().st_mtime_ns
    with ratarmountcore.open(str(archive)) as src:
        assert src.read("/d7/f27") == b"27" and sorted(src.listdir("/d3")) == [f"f{i}" for i in (13, 23, 3, 33, 43)]
    assert index.stat().st_mtime_ns == written
    assert sqlite3.connect(index).execute("PRAGMA page_size").fetchone()[0] == 4096


def test_lookups_in_one_folder_load_it_once_and_agree_with_the_index(tmp_path: Path) -> None:
    """The folder-rows cache: same answers as single queries (appended duplicates: the newest
    wins), one folder query after the second lookup, and large folders are not cached."""
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        for i in range(300):
            for version in range(2 if i % 50 == 0 else 1):  # some names appear twice
                data = f"{i}-{version}".encode()
                info = tarfile.TarInfo(f"small/f{i % 100}" if i < 100 else f"big/f{i}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with ratarmountcore.open(str(archive)) as src:
        index: IndexReader = src._index  # type: ignore[attr-defined]
        folders = src._folder_rows  # type: ignore[attr-defined]
        folders.max_entries = 150  # "big" (200 entries) is too large to cache
        single = []
        original = index.lookup

        def counting_lookup(parent: bytes, name: bytes):  # type: ignore[no-untyped-def]
            single.append((parent, name))
            return original(parent, name)

        index.lookup = counting_lookup  # type: ignore[method-assign]
        for i in range(100):
            info = src.lookup(f"/small/f{i}")
            assert info is not None and info.locator.offset == original(b"/small", f"f{i}".encode())[12]
            assert src.read(f"/small/f{i}") == (f"{i}-1" if i % 50 == 0 else f"{i}-0").encode()
        assert src.lookup("/small/missing") is None
        assert sum(1 for parent, _ in single if parent == b"/small") == 1  # then one folder load
        for i in range(100, 300):
            assert src.read(f"/big/f{i}") == (f"{i}-1" if i % 50 == 0 else f"{i}-0").encode()
        assert sum(1 for parent, _ in single if parent == b"/big") >= 199  # not cached
        assert folders.loads == 2


def test_only_runs_of_lookups_in_a_folder_load_it(tmp_path: Path) -> None:
    """Opens all over the tree (a shuffling loader: d/f looks up d, then f in d) query one row
    each; a run of lookups in one folder loads it once, also when they alternate with lookups
    in its parent."""
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w") as tar:
        for d in range(20):
            for f in range(10):
                data = f"{d}/{f}".encode()
                info = tarfile.TarInfo(f"d{d}/f{f}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    with ratarmountcore.open(str(archive)) as src:
        folders = src._folder_rows  # type: ignore[attr-defined]
        for f in (1, 2):  # twice around the tree, one file per folder at a time, as the kernel
            for d in range(20):  # asks: the folder, then the file in it
                assert src.lookup(f"/d{d}") is not None
                assert src.read(f"/d{d}/f{f}") == f"{d}/{f}".encode()
        assert folders.loads == 1  # the root only (every other lookup is there)
        for f in range(10):  # a run in one folder, alternating with its parent
            assert src.lookup("/d3") is not None
            assert src.read(f"/d3/f{f}") == f"3/{f}".encode()
        assert folders.loads == 2


def test_lookups_far_apart_in_one_archive_are_no_run(tmp_path: Path) -> None:
    """Random opens over a folder of single-folder archives (ImageNet's class tars, ``-r``):
    two lookups in one archive with many lookups elsewhere between them query one row each;
    lookups close together (a walk over one class, a few readers interleaved) load the folder."""
    sources = []
    for k in range(3):
        archive = tmp_path / f"c{k}.tar"
        with tarfile.open(archive, "w") as tar:
            for f in range(10):
                info = tarfile.TarInfo(f"f{f}")
                info.size = 2
                tar.addfile(info, io.BytesIO(f"{k}{f}".encode()))
        sources.append(ratarmountcore.open(str(archive)))
    try:
        first, second, third = sources
        for f in range(5):
            assert first.read(f"/f{f}") == f"0{f}".encode()
            for _ in range(RUN_GAP):  # lookups in other archives between them
                assert second.lookup("/f1") is not None
        assert first._folder_rows.loads == 0  # type: ignore[attr-defined]
        assert second._folder_rows.loads == 1  # type: ignore[attr-defined]
        for f in range(10):  # two walks interleaved closely
            assert first.read(f"/f{f}") == f"0{f}".encode()
            assert third.read(f"/f{f}") == f"2{f}".encode()
        assert first._folder_rows.loads == 1 and third._folder_rows.loads == 1  # type: ignore[attr-defined]
    finally:
        for source in sources:
            source.close()


@pytest.mark.parametrize("name", ["plain", "with space", "100%", "a?b#c", "grüße", "ü&=;+,", "\udcff-not-utf8"])
def test_index_in_a_folder_whose_name_needs_percent_encoding(tmp_path: Path, name: str) -> None:
    """The index is opened through a file URI: characters that mean something in a URI, non-ASCII
    names and names that are not UTF-8 at all must reach SQLite as the same file."""
    from urllib.parse import quote

    from ratarmountcore.index.pool import percent_encoded

    if "\udcff" not in name:
        assert percent_encoded("/x/" + name) == quote("/x/" + name, safe="/")
    folder = tmp_path / name
    folder.mkdir()
    archive = make_tar(folder / "a.tar", 5)
    options = OpenOptions(index=IndexOptions(index_folders=("",), progress=False))
    with ratarmountcore.open(str(archive), options) as source:  # builds the index
        built = sorted(source.listdir("/"))
    assert (folder / "a.tar.index.sqlite").exists()
    with ratarmountcore.open(str(archive), options) as source:  # opens it read-only by URI
        assert sorted(source.listdir("/")) == built
        assert source._index.path == str(folder / "a.tar.index.sqlite")  # type: ignore[attr-defined]


def test_folders_of_files_are_stored_as_packed_listings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index keeps each folder of files as its listing's directory records (index/dirents.py):
    one per entry, in listing order, with inode number, position, name and type; a folder with
    a subfolder, or with more than MAX_ENTRIES entries, is not packed."""
    from ratarmountcore.index import dirents

    monkeypatch.setattr(dirents, "MAX_ENTRIES", 5)
    members = {**{f"files/f{i}": b"x" for i in range(5)}, **{f"many/m{i}": b"y" for i in range(6)}, "mixed/a": b""}
    archive = tmp_path / "packed.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        sym = tarfile.TarInfo("files/link")  # the sixth entry of "files"
        sym.type, sym.linkname = tarfile.SYMTYPE, "f0"
        tar.addfile(sym)
        sub = tarfile.TarInfo("mixed/sub")
        sub.type = tarfile.DIRTYPE
        tar.addfile(sub)
        again = tarfile.TarInfo("links/l")
        again.type, again.linkname = tarfile.SYMTYPE, "../files/f1"
        tar.addfile(again)
    with ratarmountcore.open(str(archive)) as source:
        assert source.list_dirents("/files") is None  # 6 entries
        assert source.list_dirents("/many") is None and source.list_dirents("/mixed") is None
        assert source.list_dirents("/") is None and source.list_dirents("/files/f0") is None
        block = source.list_dirents("/links")
        assert block is not None and len(block.ends) == 1
        ino, position, length, kind = struct.unpack_from("=QQII", block.records)
        assert (ino, position, block.records[24 : 24 + length], kind) == (source.info("/links/l").ino, 3, b"l", 10)
    monkeypatch.setattr(dirents, "MAX_ENTRIES", 4096)
    (tmp_path / "packed.tar.index.sqlite").unlink()
    with ratarmountcore.open(str(archive)) as source:
        for folder in ("/files", "/many"):
            block = source.list_dirents(folder)
            rows = source.list_name_rows_after(folder, None, 100) or []
            assert block is not None and len(block.ends) == len(rows) > 0
            expected = [dirents.record(ino, i, name, mode) for i, (name, mode, ino) in enumerate(rows, 3)]
            assert block.records == b"".join(expected)
            assert list(block.ends) == list(itertools.accumulate(map(len, expected)))


def test_stat_rows_of_a_listing_agree_with_its_entries(tmp_path: Path) -> None:
    """``list_stat_rows`` (one narrow query, what the low-level front-end packs its listings
    from) gives every folder's entries with the same fields as ``list_entries``: files, a
    symlink, a hard link, a device, a name that is not UTF-8, an mtime beyond 64-bit
    nanoseconds, and the ``.versions`` folders of a member stored twice. Not a folder: None."""
    archive = tmp_path / "kinds.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mtime in (("d/a", b"1", 1_600_000_000.5), ("d/late", b"22", 10**10), ("d/a", b"333", 7)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.uid, info.gid = len(data), mtime, 1000, 2000
            tar.addfile(info, io.BytesIO(data))
        for name, kind, target in (("d/sym", tarfile.SYMTYPE, "a"), ("d/hard", tarfile.LNKTYPE, "d/late")):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = kind, target
            tar.addfile(link)
        device = tarfile.TarInfo("d/tty")
        device.type, device.devmajor, device.devminor = tarfile.CHRTYPE, 4, 5
        tar.addfile(device)
        odd = tarfile.TarInfo("d/caf\udce9")  # written as the byte 0xE9
        tar.addfile(odd, io.BytesIO(b""))
    with ratarmountcore.open(str(archive)) as source:
        folders = ["/", "/d", "/d/a.versions"]
        for path in folders:
            entries = source.list_entries(path)
            assert entries is not None
            expected = [
                (n.encode("utf-8", "surrogateescape"), i.mode, i.size, i.mtime_ns, i.uid, i.gid)
                + (i.nlink, i.ino, i.rdev, i.st_blocks)
                for n, i in entries
            ]
            assert source.list_stat_rows(path) == expected, path
        rows = {row[0]: row for row in source.list_stat_rows("/d") or []}
        assert set(rows) == {b"a", b"late", b"sym", b"hard", b"tty", b"caf\xe9"}
        assert rows[b"late"][3] == 10**19 and rows[b"late"][6] == 2 == rows[b"hard"][6]
        assert rows[b"late"][7] == rows[b"hard"][7] > 1
        assert source.list_stat_rows("/d/a") is None and source.list_stat_rows("/missing") is None
        # The same rows a part at a time (large folders are listed so), in name order.
        for path in folders:
            whole = sorted(source.list_stat_rows(path) or [], key=lambda row: row[0])
            for limit in (1, 2, 3, 100):
                parts, after = [], None
                while True:
                    part = source.list_stat_rows_after(path, after, limit)
                    assert part is not None and len(part) <= limit
                    parts += part
                    if len(part) < limit:
                        break
                    after = part[-1][0]
                assert parts == whole, (path, limit)
                # name, mode and inode number only (listings without attributes): the same
                names = source.list_name_rows_after(path, None if limit == 100 else whole[0][0], limit)
                assert names == [(r[0], r[1], r[7]) for r in whole[0 if limit == 100 else 1 :][:limit]], (path, limit)
        assert source.list_stat_rows_after("/d/a", None, 5) is None
        assert source.list_name_rows_after("/d/a", None, 5) is None


def test_a_page_of_the_index_damaged_after_it_was_written_gives_eio(tmp_path: Path) -> None:
    """SQLite's "database disk image is malformed" came out of the API as a bare
    ``sqlite3.DatabaseError`` (found by fuzzing): it is an OSError with EIO naming the index and
    what to do, and nothing is read from the damaged page."""
    from ratarmountcore.errors import CorruptIndexError

    archive = make_tar(tmp_path / "a.tar", 3000)
    ratarmountcore.open(str(archive)).close()
    index = tmp_path / "a.tar.index.sqlite"
    data = bytearray(index.read_bytes())
    page = struct.unpack(">H", data[16:18])[0]
    pages = len(data) // page
    damaged = 0
    for number in range(pages // 3, pages, max(1, pages // 12)):  # (a few pages after the metadata)
        data[number * page : (number + 1) * page] = bytes(page)
        damaged += 1
    index.write_bytes(bytes(data))
    errors = []
    with ratarmountcore.open(str(archive)) as src:
        for i in range(3000):
            try:
                assert src.read(f"/d{i % 10}/f{i}") == str(i).encode()
            except OSError as exc:
                errors.append(exc)
    assert errors and all(isinstance(e, CorruptIndexError) and e.errno == 5 for e in errors)
    assert "a.tar.index.sqlite: the index is damaged" in str(errors[0]) and "--recreate-index" in str(errors[0])


def test_an_archive_with_a_name_of_255_bytes_is_indexed(tmp_path: Path) -> None:
    """NAME_MAX allows it; "<name>.index.sqlite.tmp-<hex>" did not fit: two tracebacks, then an
    error that blamed writability (found by fuzzing). The index name keeps what fits."""
    for length in (225, 240, 255):
        archive = make_tar(tmp_path / ("a" * (length - 4) + ".tar"), 3)
        for _mount in range(2):
            with ratarmountcore.open(str(archive), OpenOptions(index=IndexOptions(progress=False))) as src:
                assert len(src.listdir("/")) == 3
        indexes = [p.name for p in tmp_path.iterdir() if p.name.endswith(".index.sqlite") and "a" * 100 in p.name]
        assert len(indexes) == 1 and len(indexes[0].encode()) <= 255 - 17
        assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
        for path in tmp_path.iterdir():
            path.unlink()


def test_a_stale_index_before_a_valid_one_is_not_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Beside the archive a stale index (the folder was read-only when the archive changed), in
    the cache a valid one: every mount said "it will be rebuilt", and it never was (found by
    fuzzing)."""
    import os

    archive = make_tar(tmp_path / "a.tar", 3)
    cache = tmp_path / "cache"
    cache.mkdir()
    with ratarmountcore.open(str(archive), OpenOptions(index=IndexOptions(index_folders=("",), progress=False))):
        pass
    make_tar(archive, 5)
    os.utime(archive, ns=(1_000_000_000, 1_000_000_000))
    cached = OpenOptions(index=IndexOptions(index_folders=(str(cache),), progress=False))
    with ratarmountcore.open(str(archive), cached):
        pass
    both = OpenOptions(index=IndexOptions(index_folders=("", str(cache)), progress=False))
    with caplog.at_level(logging.WARNING):
        with ratarmountcore.open(str(archive), both) as src:
            assert len(src.listdir("/")) == 5
    assert not [r for r in caplog.records if "does not match" in r.getMessage()]
    (cache / os.listdir(cache)[0]).unlink()  # (no valid one left: the stale one is reported, rebuilt)
    with caplog.at_level(logging.WARNING):
        with ratarmountcore.open(str(archive), both) as src:
            assert len(src.listdir("/")) == 5
    assert [r for r in caplog.records if "does not match" in r.getMessage()]


def test_the_error_says_why_no_index_could_be_written(tmp_path: Path) -> None:
    """(A file named as a folder is refused before anything is opened since session 47:
    ``test_a_file_named_as_the_index_folder_is_said_not_to_be_one``; a folder that cannot be
    written is in ``test_an_index_that_cannot_be_made_on_a_full_disk_fails_the_conversion``.)"""
    archive = make_tar(tmp_path / "a.tar", 3)
    deep = tmp_path / ("d" * 200) / ("e" * 200)
    deep.mkdir(parents=True)
    options = IndexOptions(index_folders=(str(deep),), progress=False)
    with pytest.raises(IndexNotWritableError) as caught:
        ratarmountcore.open(str(archive), OpenOptions(index=options))
    assert f"cannot write an index to any of {deep}/a.tar" in str(caught.value)
    assert "(its path is longer than SQLite opens" in str(caught.value)


def test_a_path_with_dotdot_after_a_symlink_is_the_archive_the_kernel_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lnk/../x.tar`` with ``lnk`` a link to ``d1/sub``: the kernel opens ``d1/x.tar``; the
    index went beside ``./x.tar`` (another archive, whose index it replaced), and a copy of the
    source made by pickling (a DataLoader worker's) opened that other archive (found by fuzzing)."""
    import os
    import pickle

    (tmp_path / "d1" / "sub").mkdir(parents=True)
    make_tar(tmp_path / "d1" / "x.tar", 3)
    make_tar(tmp_path / "x.tar", 5)
    (tmp_path / "lnk").symlink_to("d1/sub")
    monkeypatch.chdir(tmp_path)
    with ratarmountcore.open("lnk/../x.tar", OpenOptions(index=IndexOptions(progress=False))) as src:
        assert len(src.listdir("/")) == 3
        copy = pickle.loads(pickle.dumps(src))
        try:
            assert len(copy.listdir("/")) == 3
        finally:
            copy.close()
    assert os.path.exists(tmp_path / "d1" / "x.tar.index.sqlite")
    assert not os.path.exists(tmp_path / "x.tar.index.sqlite")


@pytest.mark.parametrize("other", ["same archive and options", "another version of the archive"])
def test_an_index_replaced_right_after_its_rename_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other: str
) -> None:
    """Two first mounts at once: another process renames its index over this one's between this
    one's rename and its open. It was used unchecked: an archive's old version read through the
    new version's rows, wrong bytes without an error (found by fuzzing)."""
    import os
    import shutil

    from ratarmountcore.errors import InvalidIndexError
    from ratarmountcore.index.sqlite_index import IndexWriter

    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes({f"f{i}": b"old %d" % i for i in range(5)}))
    substitute = tmp_path / "other.index.sqlite"
    source = tmp_path / "other" / "a.tar"
    source.parent.mkdir()
    if other == "same archive and options":
        shutil.copy2(archive, source)
    else:
        source.write_bytes(tar_bytes({f"f{i}": b"the new version %d" % i for i in range(7)}))
    with ratarmountcore.open(str(source), OpenOptions(index=IndexOptions(index_file=str(substitute)))):
        pass
    commit = IndexWriter.commit

    def commit_then_lose_the_race(self: IndexWriter, *args: int) -> None:
        commit(self, *args)
        shutil.copy(substitute, self.final_path + ".other")
        os.replace(self.final_path + ".other", self.final_path)

    monkeypatch.setattr(IndexWriter, "commit", commit_then_lose_the_race)
    options = OpenOptions(index=IndexOptions(progress=False))
    if other == "same archive and options":
        with ratarmountcore.open(str(archive), options) as src:
            assert [src.read(f"/f{i}") for i in range(5)] == [b"old %d" % i for i in range(5)]
    else:
        with pytest.raises(InvalidIndexError, match="was replaced while it was written"):
            ratarmountcore.open(str(archive), options)


def test_folders_made_for_the_index_of_a_bad_archive_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They were made before the archive was read, and left behind empty (found by fuzzing).
    Only the default cache folder is made at all now."""
    from ratarmountcore.errors import ArchiveError
    from ratarmountcore.options import DEFAULT_CACHE_FOLDER

    archive = tmp_path / "random.tar"
    archive.write_bytes(bytes(range(256)) * 8)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(ArchiveError):
        ratarmountcore.open(str(archive), OpenOptions(index=IndexOptions(index_folders=(DEFAULT_CACHE_FOLDER,))))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "random.tar"]
    assert not list((tmp_path / "home").iterdir())


@pytest.mark.parametrize("named", ["index_folders", "index_file", "index_folders after ''"])
def test_a_missing_folder_named_for_the_index_is_an_error_and_not_made(tmp_path: Path, named: str) -> None:
    """``--index-folders /nonexistent`` made the folder (and built the index there, a valid one
    beside the archive notwithstanding); ``--index-file nodir/x.sqlite`` made ``nodir``."""
    from ratarmountcore.errors import IndexFolderNotFoundError

    archive = make_tar(tmp_path / "a.tar", 3)
    with ratarmountcore.open(str(archive)):  # (a valid index beside it)
        pass
    before = sorted(p.name for p in tmp_path.iterdir())
    missing = tmp_path / "nonexistent"
    if named == "index_file":
        options = IndexOptions(index_file=str(missing / "x.sqlite"))
    else:
        options = IndexOptions(index_folders=(("",) if "after" in named else ()) + (str(missing / "sub"),))
    with pytest.raises(IndexFolderNotFoundError, match=str(missing)) as caught:
        ratarmountcore.open(str(archive), OpenOptions(index=options))
    assert isinstance(caught.value, FileNotFoundError) and "does not exist" in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("named", ["index_file", "index_folders"])
def test_a_file_named_as_the_index_folder_is_said_not_to_be_one(tmp_path: Path, named: str) -> None:
    """It was "its folder cannot be written" (found by a review of bad input)."""
    archive = make_tar(tmp_path / "a.tar", 3)
    plain = tmp_path / "plain"
    plain.write_bytes(b"not a folder")
    if named == "index_file":
        options = IndexOptions(index_file=str(plain / "x.sqlite"))
    else:
        options = IndexOptions(index_folders=(str(plain),))
    with pytest.raises(
        NotADirectoryError, match=f"^{plain}: the (index folder|folder of the index file .*) is not a folder$"
    ):
        ratarmountcore.open(str(archive), OpenOptions(index=options))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "plain"]


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_an_index_that_fills_its_disk_is_built_at_the_next_location(
    small_disk: Path, tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk beside the archive fills up during the build (a quota on a project folder runs
    out): the index goes to the next folder, from a fresh pass over the archive. The mount
    failed, with a cache folder to spare."""
    archive = small_disk / ("a.tar" + (".gz" if mode.endswith("gz") else ""))
    with tarfile.open(archive, mode) as tar:
        for i in range(6000):
            info = tarfile.TarInfo(f"d{i % 30}/a_longer_file_name_{i}.jpg")
            info.size = len(str(i))
            tar.addfile(info, io.BytesIO(str(i).encode()))
    fill_disk(small_disk, 300 * 1024)  # (an empty index fits; the 6,000 members' rows do not)
    cache = tmp_path / "cache"
    cache.mkdir()
    options = IndexOptions(index_folders=("", str(cache)), progress=False)
    with caplog.at_level(logging.WARNING), ratarmountcore.open(str(archive), OpenOptions(index=options)) as src:
        assert Path(src.index_path).parent == cache  # type: ignore[attr-defined]
        assert len(src.listdir("/")) == 30
        with src.open("/d7/a_longer_file_name_5977.jpg") as member:
            assert member.read() == b"5977"
    assert sorted(p.name for p in small_disk.iterdir()) == [archive.name, "filler"]  # (no temporary file)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"{archive}: cannot write its index {archive}.index.sqlite (its disk is full); building it at the next location"
    ]
    with ratarmountcore.open(str(archive), OpenOptions(index=options)) as again:  # (found there next time)
        assert Path(again.index_path).parent == cache  # type: ignore[attr-defined]


@pytest.mark.parametrize("leave", [300 * 1024, 8 * 1024], ids=["during the build", "at its creation"])
def test_the_archives_of_a_full_folder_go_to_the_next_location_with_one_warning(
    small_disk: Path, tmp_path: Path, leave: int, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder of archives on a full disk: each archive filled it, failed, freed the room again
    by removing its file, and was read a second time, with a warning each; with no room for an
    empty index there was no word at all (found by fuzzing)."""
    from ratarmountcore.index import builder

    archives = [make_tar(small_disk / f"class{i}.tar", 1500) for i in range(4)]
    fill_disk(small_disk, leave)
    created: List[str] = []
    writer = builder.IndexWriter

    def counted(target: str, *args: object) -> object:
        created.append(target)
        return writer(target, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(builder, "IndexWriter", counted)
    cache = tmp_path / "cache"
    cache.mkdir()
    options = OpenOptions(index=IndexOptions(index_folders=("", str(cache)), progress=False))
    with caplog.at_level(logging.WARNING):
        for archive in archives:
            with ratarmountcore.open(str(archive), options) as src:
                assert Path(src.index_path).parent == cache  # type: ignore[attr-defined]
                assert src.read("/d3/f1453") == b"1453"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "building it at the next location" in warnings[0], warnings
    assert created == [f"{archives[0]}.index.sqlite"] + [str(cache / Path(c).name) for c in created[1:]]
    assert len(created) == 5  # (the folder tried once)
    assert sorted(p.name for p in small_disk.iterdir()) == sorted([a.name for a in archives] + ["filler"])


def test_a_full_temporary_folder_is_named_and_the_archive_read_once(tmp_path: Path, small_disk: Path) -> None:
    """SQLite's sort of a large index spills to TMPDIR: a full one was blamed on the index's
    folder, and the archive was indexed again in the next location, to fail the same way."""
    import os
    import subprocess
    import sys

    archive = tmp_path / "large.tar"
    with tarfile.open(archive, "w") as tar:
        for i in range(60000):
            tar.addfile(tarfile.TarInfo(f"folder{i % 100}/a_somewhat_longer_file_name_{i:08d}.jpg"))
    fill_disk(small_disk, 64 * 1024)
    env = {**os.environ, "TMPDIR": str(small_disk), "HOME": str(tmp_path / "home")}
    code = f"import ratarmountcore; ratarmountcore.open({str(archive)!r}).close()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert f"SQLite's temporary folder {small_disk} is full" in result.stderr.splitlines()[-1]
    assert "next location" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk", "large.tar"]  # (no index, no home cache)


def test_an_index_that_fills_its_only_location_is_a_clear_error(small_disk: Path) -> None:
    from ratarmountcore.errors import IndexWriteError

    archive = make_tar(small_disk / "a.tar", 6000)
    fill_disk(small_disk, 300 * 1024)
    options = IndexOptions(index_file=str(small_disk / "a.sqlite"), progress=False)
    with pytest.raises(IndexWriteError) as caught:
        ratarmountcore.open(str(archive), OpenOptions(index=options))
    assert str(caught.value) == f"{archive}: cannot write its index {small_disk}/a.sqlite (database or disk is full)"
    assert sorted(p.name for p in small_disk.iterdir()) == ["a.tar", "filler"]


def _stored_fingerprint(index: Path, value: "str | None" = None) -> str:
    with sqlite3.connect(index) as conn:
        if value is not None:
            conn.execute("UPDATE metadata SET value = ? WHERE key = 'archive_fingerprint'", (value,))
        return str(conn.execute("SELECT value FROM metadata WHERE key = 'archive_fingerprint'").fetchone()[0])


def _flip_sampled_byte(archive: Path) -> None:
    """Change a byte of the first sampled block, keeping the size and the mtime."""
    st = archive.stat()
    data = bytearray(archive.read_bytes())
    data[600] ^= 0xFF  # (the padding after the first member's data, in the first sampled block)
    archive.write_bytes(bytes(data))
    os.utime(archive, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("kind", ["crc32", "sha256 (indexes built before)"])
def test_indexes_of_either_fingerprint_are_used_until_a_sampled_block_changes(tmp_path: Path, kind: str) -> None:
    """Fingerprints are made from the samples' CRC-32s (hashing the samples themselves took a third
    of opening a folder of 1,000 archives); indexes that carry the SHA-256 of the samples, as
    those built before do, are used as they are, and are rebuilt when a sampled block changes."""
    from ratarmountcore.index.fingerprint import CRC_PREFIX, archive_stats

    archive = make_tar(tmp_path / "a.tar", 10)
    index = tmp_path / "a.tar.index.sqlite"
    ratarmountcore.open(str(archive)).close()
    assert _stored_fingerprint(index).startswith(CRC_PREFIX)
    if kind != "crc32":
        fd = os.open(archive, os.O_RDONLY)
        try:
            stats = archive_stats(fd)
            assert stats.legacy is not None
            legacy = stats.legacy()
        finally:
            os.close(fd)
        assert len(legacy) == 32 and not legacy.startswith(CRC_PREFIX)
        _stored_fingerprint(index, legacy)
    built = index.stat().st_mtime_ns, _stored_fingerprint(index)
    with ratarmountcore.open(str(archive)) as src:
        assert src.read("/d5/f5") == b"5"
    assert (index.stat().st_mtime_ns, _stored_fingerprint(index)) == built  # used, not rebuilt
    _flip_sampled_byte(archive)
    with ratarmountcore.open(str(archive)) as src:
        assert src.read("/d0/f0") == b"0"  # (a byte of padding: the tar reads the same)
    assert _stored_fingerprint(index) != built[1] and _stored_fingerprint(index).startswith(CRC_PREFIX)
