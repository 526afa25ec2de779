"""Partial indexes of killed builds: the next build removes them, a live build's file stays.

A batch job that hits its time limit, or the out-of-memory killer, kills the first mount of a
large archive in the middle of its index build; its ``<index>.tmp-<hex>`` file, as large as the
index would have become, used to stay beside the archive for good.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.convert import convert_to_seekable_zstd
from ratarmountcore.index import stale
from ratarmountcore.index.fingerprint import ArchiveStats
from ratarmountcore.index.sqlite_index import IndexWriter
from ratarmountcore.options import OpenOptions

#: A child that starts writing an index (its first rows are written, so SQLite holds its lock),
#: says where, and waits to be killed.
WRITER = textwrap.dedent(
    """
    import sys, time
    from ratarmountcore.index.fingerprint import ArchiveStats
    from ratarmountcore.index.sqlite_index import IndexWriter
    from ratarmountcore.tar.scanner import KIND_FILE, MemberRecord
    writer = IndexWriter(sys.argv[1], ArchiveStats(1, 1, "x"), sys.argv[2], {})
    for i in range(20000):
        writer.add(MemberRecord(f"/d/f{i}", KIND_FILE, 0o100644, 1, 0, 0, 0, "", 512 * i, 512 * i + 512))
    print(writer.temp_path, flush=True)
    time.sleep(600)
    """
)


def age(path: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def writer_process(tmp_path: Path) -> Iterator[subprocess.Popen]:
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes({"f": b"x"}))
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "a.tar.index.sqlite"), str(archive)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_killed_build_leaves_a_file_that_the_next_build_removes(writer_process, tmp_path: Path) -> None:
    index = str(tmp_path / "a.tar.index.sqlite")
    temp = writer_process.stdout.readline().strip()
    assert temp.startswith(index + ".tmp-") and os.path.getsize(temp) > 0
    journal = temp + "-journal"  # (SQLite locks the database, not its journal)
    Path(journal).write_bytes(b"journal")
    for path in (temp, journal):
        age(path, 2 * stale.MIN_AGE)
    # Alive (its lock held), however old its file: kept.
    assert stale.remove_abandoned(index) == []
    assert os.path.exists(temp) and os.path.exists(journal)

    writer_process.send_signal(signal.SIGKILL)
    writer_process.wait()
    assert os.path.exists(temp), "a killed build cannot clean up after itself"
    assert sorted(stale.partial_files(index)) == [temp, journal]
    assert sorted(stale.remove_abandoned(index)) == [temp, journal]
    assert not os.path.exists(temp) and not os.path.exists(journal)


def test_a_file_changed_lately_is_kept_even_without_a_lock(writer_process, tmp_path: Path) -> None:
    index = str(tmp_path / "a.tar.index.sqlite")
    temp = writer_process.stdout.readline().strip()
    writer_process.send_signal(signal.SIGKILL)
    writer_process.wait()
    age(temp, stale.MIN_AGE / 2)
    assert stale.remove_abandoned(index) == []
    assert os.path.exists(temp)
    age(temp, stale.MIN_AGE + 1)
    assert stale.remove_abandoned(index) == [temp]


def test_a_build_of_this_process_is_kept_and_other_names_are_not_touched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = str(tmp_path / "a.tar.index.sqlite")
    others = [
        tmp_path / "b.tar.index.sqlite.tmp-00aa11bb22cc",  # another archive's
        tmp_path / "a.tar.index.sqlite.tmp-notours",  # not a name we write
        tmp_path / "a.tar.index.sqlite.tmp-00aa11bb22cc.bak",
    ]
    for other in others:
        other.write_bytes(b"partial")
        age(str(other), 2 * stale.MIN_AGE)
    folder = tmp_path / "a.tar.index.sqlite.tmp-0a0b0c0d0e0f"  # a name we write, but a folder
    folder.mkdir()
    age(str(folder), 2 * stale.MIN_AGE)
    others.append(folder)
    with IndexWriter(index, ArchiveStats(1, 1, "x"), str(tmp_path / "a.tar"), {}) as writer:
        age(writer.temp_path, 2 * stale.MIN_AGE)
        assert stale.remove_abandoned(index) == []
        assert os.path.exists(writer.temp_path)
    assert not os.path.exists(writer.temp_path), "an aborted build removes its own file"
    assert all(other.exists() for other in others)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "nothing to warn about"


def test_a_mount_removes_what_a_killed_first_mount_left(writer_process, mounter, tmp_path: Path) -> None:
    temp = writer_process.stdout.readline().strip()
    writer_process.send_signal(signal.SIGKILL)
    writer_process.wait()
    age(temp, 2 * stale.MIN_AGE)
    mountpoint = mounter.mount(tmp_path / "a.tar")
    assert (mountpoint / "f").read_bytes() == b"x"
    assert not os.path.exists(temp)
    assert os.path.exists(tmp_path / "a.tar.index.sqlite")


#: A child that writes a partial converted archive as the converter does and waits to be killed.
CONVERTER = textwrap.dedent(
    """
    import sys, time
    from ratarmountcore.index import stale
    out = open(sys.argv[1], "wb")
    stale.hold_lock(out.fileno())
    out.write(b"frames" * 1000)
    out.flush()
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_a_killed_conversion_leaves_files_that_the_next_conversion_removes(tmp_path: Path) -> None:
    """A conversion killed outright left its partial output (as large as the converted archive)
    and its index's partial file; converting to the same name again removes both once their
    writer is gone, and not while it runs."""
    source = tmp_path / "in.tar"
    source.write_bytes(tar_bytes({"a/b": b"data" * 100}))
    out = tmp_path / "out.tar.zst"
    partial_out = f"{out}.tmp-0123456789ab"
    process = subprocess.Popen([sys.executable, "-c", CONVERTER, partial_out], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        partial_index = f"{out}.index.sqlite.tmp-ba9876543210"
        Path(partial_index).write_bytes(b"partial index")  # (its writer gone: no lock)
        for path in (partial_out, partial_index):
            age(path, 2 * stale.MIN_AGE)

        convert_to_seekable_zstd(str(source), str(out), options=OpenOptions())
        assert os.path.exists(partial_out), "the partial output of a conversion still running was removed"
        assert not os.path.exists(partial_index)

        process.send_signal(signal.SIGKILL)
        process.wait()
        convert_to_seekable_zstd(str(source), str(out), options=OpenOptions(), overwrite=True)
        assert not os.path.exists(partial_out)
    finally:
        process.kill()
        process.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tar", "out.tar.zst", "out.tar.zst.index.sqlite"]
    with ratarmountcore.open(str(out), OpenOptions()) as src:
        assert src.read("/a/b") == b"data" * 100
