"""``MountSource.will_read``: the kernel starts reading a member's data before the read."""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

import pytest
from conftest import tar_bytes

import ratarmountcore

SIZE = 256 * 1024
PAGE = mmap.PAGESIZE


class PageCache:
    """Which pages of a file are in the page cache: ``mincore`` on a mapping of it (asking
    with a read would start reading the pages itself)."""

    def __init__(self, fd: int) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        int_ = ctypes.c_int
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, int_, int_, int_, ctypes.c_long]
        self.libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.size = os.fstat(fd).st_size
        self.address = self.libc.mmap(None, self.size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert self.address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())

    def cached(self, offset: int, size: int) -> bool:
        """Whether every page of ``size`` bytes at ``offset`` is resident."""
        pages = (self.size + PAGE - 1) // PAGE
        vector = ctypes.create_string_buffer(pages)
        assert self.libc.mincore(self.address, self.size, vector) == 0, os.strerror(ctypes.get_errno())
        return all(vector.raw[page] & 1 for page in range(offset // PAGE, (offset + size + PAGE - 1) // PAGE))

    def close(self) -> None:
        self.libc.munmap(self.address, self.size)


def _evict(fd: int) -> None:
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
def test_will_read_fetches_the_member_into_the_page_cache(tmp_path: Path) -> None:
    archive = tmp_path / "hint.tar"
    payload = {f"d/f{i}": bytes([i]) * SIZE for i in range(4)}
    archive.write_bytes(tar_bytes(payload))
    with ratarmountcore.open(str(archive)) as source:
        infos = {path: source.lookup("/" + path) for path in payload}
        fd = os.open(archive, os.O_RDONLY)
        pages = PageCache(fd)
        try:
            _evict(fd)
            third = infos["d/f2"]
            offset = third.locator.offset
            if pages.cached(offset, SIZE):
                pytest.skip("this file system keeps file data in memory (eviction has no effect)")
            source.will_read(third)
            deadline = time.monotonic() + 10
            while not pages.cached(offset, SIZE):
                assert time.monotonic() < deadline, "the hinted member never reached the page cache"
                time.sleep(0.01)
            # Only that member: the first one stays on disk (nothing like a whole-archive read).
            assert not pages.cached(infos["d/f0"].locator.offset, SIZE), "a member that was not hinted was read too"
            with source.open("/d/f2") as f:
                assert f.read() == payload["d/f2"]
        finally:
            pages.close()
            os.close(fd)


def test_will_read_ignores_what_it_cannot_fetch(tmp_path: Path) -> None:
    """Compressed archives, folders and empty files take the hint without effect or error."""
    archive = tmp_path / "hint.tar"
    archive.write_bytes(tar_bytes({"d/empty": b"", "d/x": b"x" * 100}))
    gz = tmp_path / "hint.tar.gz"
    import gzip

    gz.write_bytes(gzip.compress(archive.read_bytes()))
    for path in (archive, gz):
        with ratarmountcore.open(str(path)) as source:
            for member in ("/d", "/d/empty", "/d/x"):
                info = source.lookup(member)
                assert info is not None
                source.will_read(info)
            with source.open("/d/x") as f:
                assert f.read() == b"x" * 100
