"""A small file's data is in the kernel's page cache once a process opened it and asked whether it
is a terminal (Python's ``open()`` does): its READ is answered by the kernel, one round trip less.

Observed with ``mincore`` on a mapping of the mounted file: a mapping reads nothing by itself, and
``mincore`` tells which pages the kernel holds.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest
from conftest import Mounter, rot_between_samples, tar_bytes
from test_will_read import PageCache

from ratarmount.lowlevel import STORE_MAX
from ratarmountcore.convert import convert_to_seekable_zstd

PAGE = mmap.PAGESIZE


def _files() -> Dict[str, bytes]:
    rng = random.Random(7)
    return {
        "d/small": rng.randbytes(3 * PAGE + 123),
        "d/page": rng.randbytes(PAGE),
        "d/largest": rng.randbytes(STORE_MAX),
        "d/too-large": rng.randbytes(STORE_MAX + 1),
        "d/plain-open": rng.randbytes(5000),
        "d/empty": b"",
    }


def _cached(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        pages = PageCache(fd)
        try:
            return pages.cached(0, pages.size)
        finally:
            pages.close()
    finally:
        os.close(fd)


def test_asking_isatty_puts_a_small_file_into_the_page_cache(mounter: Mounter, tmp_path: Path) -> None:
    files = _files()
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes(files))
    root = mounter.mount(archive)
    for name in ("d/small", "d/page", "d/largest"):
        fd = os.open(root / name, os.O_RDONLY)
        try:
            assert not os.isatty(fd)  # (the answer stays: not a terminal)
            assert _cached(root / name), f"{name}: not in the page cache after isatty"
            assert os.pread(fd, len(files[name]) + 1, 0) == files[name]
        finally:
            os.close(fd)
    fd = os.open(root / "d/too-large", os.O_RDONLY)
    try:
        os.isatty(fd)
        assert not _cached(root / "d/too-large"), "a file larger than STORE_MAX was stored"
        assert os.pread(fd, STORE_MAX + 2, 0) == files["d/too-large"]
    finally:
        os.close(fd)
    # An open that does not ask (C programs' reads, ``cat``) is left to its READ.
    fd = os.open(root / "d/plain-open", os.O_RDONLY)
    try:
        assert not _cached(root / "d/plain-open")
        assert os.read(fd, 10000) == files["d/plain-open"]
    finally:
        os.close(fd)
    with open(root / "d/empty", "rb") as f:
        assert f.read() == b""


def test_a_folder_source_stores_archive_members_but_not_its_own_files(mounter: Mounter, tmp_path: Path) -> None:
    """A folder may change, its archives' members cannot: a member is stored on isatty as in
    an archive mounted alone, a file of the folder itself is left to its READ (stored pages
    of a file that then changes would be served stale)."""
    files = _files()
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.tar").write_bytes(tar_bytes(files))
    (folder / "plain.bin").write_bytes(files["d/small"])
    root = mounter.mount(folder, extra=["-r"])
    for name, stored in (("a.tar/d/small", True), ("plain.bin", False)):
        fd = os.open(root / name, os.O_RDONLY)
        try:
            assert not os.isatty(fd)
            assert _cached(root / name) is stored, name
            assert os.pread(fd, len(files["d/small"]) + 1, 0) == files["d/small"]
        finally:
            os.close(fd)
    (folder / "plain.bin").write_bytes(files["d/page"])  # what a changed file reads
    with open(root / "plain.bin", "rb") as f:
        assert f.read() == files["d/page"]


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="this Python's open() may not call isatty")
def test_python_open_gets_the_data_without_a_read(mounter: Mounter, tmp_path: Path) -> None:
    files = _files()
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes(files))
    root = mounter.mount(archive)
    with open(root / "d/small", "rb") as f:
        assert _cached(root / "d/small")
        assert f.read() == files["d/small"]


def test_damaged_data_is_not_stored_and_reads_fail(mounter: Mounter, tmp_path: Path) -> None:
    """Bit rot after indexing in a multi-frame .tar.zst: the files of the damaged frame fail
    with EIO whether or not their open asked isatty; every other file reads correctly."""
    rng = random.Random(11)
    files = {f"d/f{i:03d}": rng.randbytes(rng.randrange(1000, 9000)) for i in range(200)}
    plain = tmp_path / "a.tar"
    plain.write_bytes(tar_bytes(files))
    archive = tmp_path / "a.tar.zst"
    convert_to_seekable_zstd(str(plain), str(archive), frame_size=64 * 1024)
    rot_between_samples(archive)
    root = mounter.mount(archive)
    failed = 0
    for name, data in files.items():
        fd = os.open(root / name, os.O_RDONLY)
        try:
            os.isatty(fd)
            try:
                got = os.pread(fd, len(data) + 1, 0)
            except OSError as exc:
                assert exc.errno == errno.EIO, exc
                failed += 1
                continue
            assert got == data, f"{name}: wrong bytes"
        finally:
            os.close(fd)
    assert 0 < failed < len(files)


@pytest.mark.parametrize("threads", [None, 8])
def test_stores_and_reads_of_the_same_files_at_once(mounter: Mounter, tmp_path: Path, threads: Optional[int]) -> None:
    """Threads open the same files at once, some asking isatty (a store) and some not (a READ):
    a store waits for the page locks of a READ of the same file in flight, which another worker
    answers (with 8 workers, up to 7 stores run at once). Every byte must be right and nothing
    may hang (the threads are joined with a deadline)."""
    import threading

    rng = random.Random(5)
    files = {f"d/f{i:03d}": rng.randbytes(rng.choice((100, 5000, 70000, 300000))) for i in range(150)}
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes(files))
    root = mounter.mount(archive, extra=None if threads is None else ["-o", f"max_threads={threads}"])
    names = sorted(files)
    errors: list = []

    def reader(seed: int) -> None:
        order = random.Random(seed)
        try:
            for name in names:  # (all threads in the same order: at each file at about once)
                fd = os.open(root / name, os.O_RDONLY)
                try:
                    if order.random() < 0.5:
                        os.isatty(fd)
                    got = os.pread(fd, len(files[name]) + 1, 0)
                finally:
                    os.close(fd)
                if got != files[name]:
                    errors.append(f"{name}: wrong bytes")
                    return
        except OSError as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=reader, args=(seed,), daemon=True) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "readers hung"
    assert not errors, errors[:3]
