"""An archive that changes while mounted: never a wrong byte (see ratarmountcore/sources/watch.py).

The archives are rewritten in place (same file, as ``tar -cf`` to the same name does), touched,
appended to with GNU tar, and replaced by a rename; through the Python API (with the look-again
interval set to 0) and through a real mount (with the real interval).
"""

from __future__ import annotations

import errno
import gzip
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from conftest import Mounter, tar_bytes

import ratarmountcore
from ratarmountcore.errors import ArchiveChangedError
from ratarmountcore.index.fingerprint import archive_stats
from ratarmountcore.sources import watch
from ratarmountcore.sources.watch import ArchiveWatch

# Large enough that the fingerprint samples blocks all over it (16 samples of 16 KiB).
FILES = {f"d{i % 4}/f{i:03d}.bin": bytes([i % 251]) * (3000 + 37 * i) for i in range(160)}
OTHER = {name: bytes([(i + 7) % 251]) * len(data) for i, (name, data) in enumerate(FILES.items())}


def rewrite_in_place(path: Path, data: bytes) -> None:
    """Truncate and write the same file (same inode), as ``tar -cf`` to an existing name does."""
    inode = path.stat().st_ino
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)
    assert path.stat().st_ino == inode


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Look at the archive on every open and read."""
    monkeypatch.setattr(watch, "CHECK_INTERVAL", 0.0)


def read(source: ratarmountcore.MountSource, name: str) -> bytes:
    with source.open("/" + name) as f:
        return f.read()  # type: ignore[no-any-return]


@pytest.mark.parametrize("compress", [False, True], ids=["tar", "tar.gz"])
def test_rewritten_in_place_fails_with_eio_naming_the_archive(
    tmp_path: Path, now: None, compress: bool, caplog: pytest.LogCaptureFixture
) -> None:
    archive = tmp_path / ("data.tar.gz" if compress else "data.tar")
    image = tar_bytes(FILES)
    archive.write_bytes(gzip.compress(image, mtime=0) if compress else image)
    with ratarmountcore.open(str(archive)) as source:
        first = sorted(FILES)[0]
        assert read(source, first) == FILES[first]
        handle = source.open("/" + sorted(FILES)[1])
        other = tar_bytes(OTHER)
        rewrite_in_place(archive, gzip.compress(other, mtime=0) if compress else other)
        os.utime(archive, ns=(time.time_ns(), time.time_ns()))
        for name in sorted(FILES)[2:5]:
            with pytest.raises(ArchiveChangedError) as caught:
                read(source, name)
            assert caught.value.errno == errno.EIO
            assert str(archive) in str(caught.value) and "changed since it was mounted" in str(caught.value)
        with pytest.raises(OSError) as also:  # a handle opened before the change
            handle.read()
        assert also.value.errno == errno.EIO
        handle.close()
    changed = [r for r in caplog.records if "changed since it was mounted" in r.getMessage()]
    assert len(changed) == 1, "logged once, not for every read"


def test_touched_archive_keeps_serving(tmp_path: Path, now: None) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    with ratarmountcore.open(str(archive)) as source:
        os.utime(archive, ns=(1, 1))
        for name in sorted(FILES)[:10]:
            assert read(source, name) == FILES[name]


def test_same_size_other_bytes_is_a_change(tmp_path: Path, now: None) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    with ratarmountcore.open(str(archive)) as source:
        image = bytearray(tar_bytes(FILES))
        image[:16] = b"X" * 16  # the first sampled block; size and inode stay the same
        rewrite_in_place(archive, bytes(image))
        os.utime(archive, ns=(1, 1))
        with pytest.raises(ArchiveChangedError, match="content differs"):
            read(source, sorted(FILES)[0])


def test_shrunk_archive_is_a_change(tmp_path: Path, now: None) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    with ratarmountcore.open(str(archive)) as source:
        with open(archive, "r+b") as f:
            f.truncate(archive.stat().st_size // 2)
        with pytest.raises(ArchiveChangedError, match="shrank"):
            read(source, sorted(FILES)[0])


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_appended_with_gnu_tar_keeps_serving_the_old_members(tmp_path: Path, now: None) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    extra = tmp_path / "new.txt"
    extra.write_bytes(b"appended\n" * 5000)
    with ratarmountcore.open(str(archive)) as source:
        size = archive.stat().st_size
        subprocess.run(["tar", "-rf", str(archive), "-C", str(tmp_path), "new.txt"], check=True)
        assert archive.stat().st_size > size
        for name in sorted(FILES):
            assert read(source, name) == FILES[name]
        assert not source.exists("/new.txt")  # shows after mounting again
    with ratarmountcore.open(str(archive)) as again:
        assert read(again, "new.txt") == extra.read_bytes()


def test_replaced_by_rename_keeps_serving_what_was_opened(tmp_path: Path, now: None) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    with ratarmountcore.open(str(archive)) as source:
        fresh = tmp_path / "fresh.tar"
        fresh.write_bytes(tar_bytes(OTHER))
        os.replace(fresh, archive)
        for name in sorted(FILES)[:10]:
            assert read(source, name) == FILES[name]


def test_looks_at_most_once_per_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    calls = []
    real_fstat = os.fstat

    def counting_fstat(fd: int) -> os.stat_result:
        calls.append(fd)
        return real_fstat(fd)

    monkeypatch.setattr(watch, "CHECK_INTERVAL", 3600.0)
    with ratarmountcore.open(str(archive)) as source:
        monkeypatch.setattr(watch.os, "fstat", counting_fstat)
        for name in sorted(FILES):
            read(source, name)
        assert calls == []  # not yet due
        monkeypatch.setattr(watch, "CHECK_INTERVAL", 0.0)
        source._guard.__self__._next = 0.0  # type: ignore[attr-defined]  # due now
        read(source, sorted(FILES)[0])
        assert len(calls) == 2  # the open and the read


@pytest.mark.parametrize("api", ["low", "high"])
def test_mount_of_a_rewritten_archive_answers_eio(mounter: Mounter, tmp_path: Path, api: str) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    mountpoint = mounter.mount(archive, extra=["--fuse-api", api])
    names = sorted(FILES)
    assert (mountpoint / names[0]).read_bytes() == FILES[names[0]]
    rewrite_in_place(archive, tar_bytes(OTHER))
    os.utime(archive, ns=(time.time_ns(), time.time_ns()))
    time.sleep(watch.CHECK_INTERVAL + 0.2)
    for name in names[1:4]:  # not read before: not in the kernel's page cache
        with pytest.raises(OSError) as caught:
            (mountpoint / name).read_bytes()
        assert caught.value.errno == errno.EIO
    assert (mountpoint / names[0]).read_bytes() == FILES[names[0]]  # cached before: the old bytes


def test_a_closed_watch_fails_every_check_without_looking_at_its_descriptor(tmp_path: Path) -> None:
    """A source closed while its members are still open (a -r folder's archive rewritten in
    place): the number of the descriptor it closed may name another file by now, so the watch no
    longer looks at it and fails every check."""
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes({"x": b"x" * 5000}))
    fd = os.open(archive, os.O_RDONLY)
    watch = ArchiveWatch(str(archive), fd, archive_stats(fd))
    watch.check()
    watch.close()
    os.close(fd)
    reused = os.open(archive, os.O_RDONLY)  # (most likely the same number again)
    try:
        with pytest.raises(ArchiveChangedError, match="no longer open"):
            watch.check()
    finally:
        os.close(reused)


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs GNU tar")
def test_a_member_appended_into_the_last_records_padding_keeps_the_old_members_served(
    tmp_path: Path, now: None, caplog: pytest.LogCaptureFixture
) -> None:
    """``tar -r`` of a small file fills the padding of the last 10 KiB record: the size stays,
    the last sampled block changes. Every file of the mount failed with EIO (found in session 25)."""
    archive = tmp_path / "data.tar"
    files = {}
    for blocks in range(20):  # a last member that leaves room in the last record
        files = {**FILES, "pad.bin": b"p" * 512 * blocks}
        image = tar_bytes(files)
        if len(image.rstrip(b"\0")) + 4096 < len(image):
            break
    archive.write_bytes(image)
    (tmp_path / "small.txt").write_bytes(b"appended\n")
    with ratarmountcore.open(str(archive)) as source:
        size = archive.stat().st_size
        subprocess.run(["tar", "-rf", str(archive), "-C", str(tmp_path), "small.txt"], check=True)
        assert archive.stat().st_size == size  # (into the padding)
        for name in sorted(files):
            assert read(source, name) == files[name]
    warned = [r.getMessage() for r in caplog.records if "appended to since it was mounted" in r.getMessage()]
    assert len(warned) == 1, warned
    with ratarmountcore.open(str(archive)) as again:
        assert read(again, "small.txt") == b"appended\n"


def test_an_edit_of_the_last_members_data_at_the_same_size_is_a_change(tmp_path: Path, now: None) -> None:
    """Not taken for an append: nothing was written where the end-of-archive blocks are."""
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    last = sorted(FILES)[-1]
    with ratarmountcore.open(str(archive)) as source:
        image = bytearray(archive.read_bytes())
        start = image.rfind(FILES[last])  # (its bytes are one value repeated: the last place they are)
        assert start > len(image) - 16 * 1024 - len(FILES[last])
        image[start + len(FILES[last]) - 4 : start + len(FILES[last])] = b"YYYY"
        rewrite_in_place(archive, bytes(image))
        os.utime(archive, ns=(1, 1))
        with pytest.raises(ArchiveChangedError, match="content differs"):
            read(source, sorted(FILES)[0])
