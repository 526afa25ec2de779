"""Sparse members stay sparse: their ``st_blocks`` are their stored extents', and ``lseek`` with
``SEEK_DATA``/``SEEK_HOLE`` finds their holes, so ``cp`` and ``du`` see what ``tar -x`` would have
written -- through the Python API, a mount, a union and a folder source."""

from __future__ import annotations

import errno
import gzip
import os
import subprocess
import tarfile
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest
from conftest import Mounter
from hypothesis import given, settings
from hypothesis import strategies as st

import ratarmountcore
from ratarmountcore.io.holes import seek_data

SIZE = 8 << 20
#: Where the test file holds data (offset, bytes): the rest is holes.
REGIONS = [(1 << 20, b"data" * 1024), (5 << 20, b"more" * 2048), (SIZE - 4096, b"end!" * 1024)]


def _model(size: int, extents: Sequence[Tuple[int, int]], offset: int, whence: int) -> Optional[int]:
    """``lseek``'s answer, byte by byte (None: ENXIO)."""
    data = bytearray(size)
    for start, length in extents:
        data[start : min(start + length, size)] = b"\1" * max(0, min(length, size - start))
    if offset >= size:
        return None
    for position in range(offset, size):
        if bool(data[position]) == (whence == os.SEEK_DATA):
            return position
    return None if whence == os.SEEK_DATA else size


@st.composite
def _extents(draw: st.DrawFn) -> Tuple[int, List[Tuple[int, int]]]:
    size = draw(st.integers(1, 200))
    extents: List[Tuple[int, int]] = []
    position = 0
    for _ in range(draw(st.integers(0, 6))):
        start = position + draw(st.integers(0, 30))
        length = draw(st.integers(0, 30))
        extents.append((start, length))
        position = start + length
    return size, extents


@settings(max_examples=300, deadline=None)
@given(_extents(), st.integers(0, 220), st.sampled_from([os.SEEK_DATA, os.SEEK_HOLE]))
def test_seek_data_agrees_with_a_byte_model(case: Tuple[int, List[Tuple[int, int]]], offset: int, whence: int) -> None:
    """Adjoining, empty and trailing extents, extents past the end, offsets in and past the file."""
    size, extents = case
    expected = _model(size, extents, offset, whence)
    if expected is None:
        with pytest.raises(OSError) as caught:
            seek_data(size, extents, offset, whence)
        assert caught.value.errno == errno.ENXIO
    else:
        assert seek_data(size, extents, offset, whence) == expected
    if offset < size:  # no map: all data
        assert seek_data(size, None, offset, whence) == (offset if whence == os.SEEK_DATA else size)


def _sparse_file(path: Path) -> bytes:
    with open(path, "wb") as f:
        f.truncate(SIZE)
        for offset, data in REGIONS:
            f.seek(offset)
            f.write(data)
    return path.read_bytes()


@pytest.fixture(scope="module", params=["gnu", "posix"])
def sparse_tar(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, bytes]:
    """An archive of ``s.bin`` (sparse), ``dense.bin`` and a folder, written by GNU tar --sparse
    in the GNU format and in pax (sparse format 1.0)."""
    folder = tmp_path_factory.mktemp("sparse-src")
    data = _sparse_file(folder / "s.bin")
    (folder / "dense.bin").write_bytes(b"x" * 10000)
    (folder / "d").mkdir()
    _sparse_file(folder / "d" / "t.bin")
    archive = tmp_path_factory.mktemp("sparse") / f"{request.param}.tar"
    extra = ["--format=posix", "--sparse-version=1.0"] if request.param == "posix" else ["--format=gnu"]
    subprocess.run(
        ["tar", "--sparse", *extra, "-cf", str(archive), "-C", str(folder), "s.bin", "dense.bin", "d"], check=True
    )
    return archive, data


def _tarfile_map(archive: Path, name: str) -> List[Tuple[int, int]]:
    """The member's extents as Python's tarfile reads them (another parser than ours)."""
    with tarfile.open(archive) as tar:
        member = tar.getmember(name)
        assert member.sparse, f"{name} was stored without a sparse map"
        return [(offset, length) for offset, length in member.sparse]


def _blocks(extents: Sequence[Tuple[int, int]]) -> int:
    return (sum(length for _, length in extents) + 511) // 512


@pytest.mark.parametrize("compressed", [False, True])
def test_sparse_members_show_their_stored_blocks_and_holes(
    sparse_tar: Tuple[Path, bytes], compressed: bool, tmp_path: Path
) -> None:
    """Also in a compressed archive (the map is the index's, whatever holds the tar)."""
    archive, data = sparse_tar
    extents = _tarfile_map(archive, "s.bin")
    opened = archive
    if compressed:
        opened = tmp_path / (archive.name + ".gz")
        opened.write_bytes(gzip.compress(archive.read_bytes()))
    with ratarmountcore.open(str(opened)) as src:
        for path in ("/s.bin", "/d/t.bin"):
            info = src.info(path)
            assert info.size == SIZE
            assert src.stat(path).st_blocks == _blocks(extents) < SIZE // 512 // 100
            for offset in (0, (1 << 20) + 1, 2 << 20, (5 << 20) + 8191, SIZE - 4096, SIZE - 1):
                for whence in (os.SEEK_DATA, os.SEEK_HOLE):
                    assert src.seek_data(info, offset, whence) == _model(SIZE, extents, offset, whence)
            with pytest.raises(OSError, match="No such device or address"):
                src.seek_data(info, SIZE, os.SEEK_HOLE)
            with src.open(path) as f:
                assert f.read() == data
                # The file object finds the holes too (Python users without FUSE).
                for offset in (0, (1 << 20) + 1, 2 << 20, SIZE - 1):
                    for whence in (os.SEEK_DATA, os.SEEK_HOLE):
                        assert f.seek(offset, whence) == _model(SIZE, extents, offset, whence) == f.tell()
                with pytest.raises(OSError, match="No such device or address"):
                    f.seek(SIZE, os.SEEK_DATA)
        assert src.stat("/dense.bin").st_blocks == 20  # (not sparse: from the size)
        with src.open("/dense.bin") as f:
            assert f.seek(5, os.SEEK_DATA) == 5 and f.seek(5, os.SEEK_HOLE) == 10000
        rows = {row[0]: row for row in src.list_stat_rows("/") or []}
        assert rows[b"s.bin"][9] == _blocks(extents) and rows[b"dense.bin"][9] == 20
        assert [row[9] for row in src.list_stat_rows_after("/d", None, 5) or []] == [_blocks(extents)]


@pytest.mark.parametrize("api", ["low", "high"])
def test_a_sparse_member_copied_out_of_a_mount_stays_sparse(
    sparse_tar: Tuple[Path, bytes], mounter: Mounter, tmp_path: Path, api: str
) -> None:
    """``stat`` (LOOKUP), a listing's attributes (READDIRPLUS), ``du``, ``lseek`` and ``cp``,
    through both front-ends (the high-level one answers ``lseek`` since session 41)."""
    archive, data = sparse_tar
    extents = _tarfile_map(archive, "s.bin")
    mountpoint = mounter.mount(archive, extra=["--fuse-api", api])
    assert os.stat(mountpoint / "s.bin").st_blocks == _blocks(extents)
    listed = {entry.name: entry.stat(follow_symlinks=False).st_blocks for entry in os.scandir(mountpoint / "d")}
    assert listed == {"t.bin": _blocks(extents)}
    du = subprocess.run(["du", "-k", str(mountpoint / "s.bin")], capture_output=True, text=True, check=True)
    assert int(du.stdout.split()[0]) < 64, du.stdout
    fd = os.open(mountpoint / "s.bin", os.O_RDONLY)
    try:
        for offset in (0, (1 << 20) + 100, 3 << 20, SIZE - 1):
            for whence in (os.SEEK_DATA, os.SEEK_HOLE):
                assert os.lseek(fd, offset, whence) == _model(SIZE, extents, offset, whence)
        with pytest.raises(OSError) as caught:
            os.lseek(fd, SIZE, os.SEEK_DATA)
        assert caught.value.errno == errno.ENXIO
    finally:
        os.close(fd)
    fd = os.open(mountpoint / "dense.bin", os.O_RDONLY)
    try:
        assert os.lseek(fd, 5, os.SEEK_DATA) == 5 and os.lseek(fd, 5, os.SEEK_HOLE) == 10000
    finally:
        os.close(fd)
    copy = tmp_path / "copy.bin"
    subprocess.run(["cp", "--sparse=auto", str(mountpoint / "s.bin"), str(copy)], check=True)
    assert copy.read_bytes() == data
    assert copy.stat().st_blocks * 512 < SIZE // 8, "cp wrote the holes as zeros"


def test_a_union_and_a_folder_source_show_sparse_files_as_they_are(
    sparse_tar: Tuple[Path, bytes], mounter: Mounter, tmp_path: Path
) -> None:
    """A union lists from its own table (the blocks come through it); a folder source shows a
    sparse file on disk with the file system's own block count and holes."""
    archive, data = sparse_tar
    extents = _tarfile_map(archive, "s.bin")
    other = tmp_path / "other.tar"
    with tarfile.open(other, "w") as tar:
        tar.add(__file__, arcname="other.py")
    with ratarmountcore.open([str(archive), str(other)]) as union:
        rows = {row[0]: row for row in union.list_stat_rows("/") or []}
        assert rows[b"s.bin"][9] == _blocks(extents) == union.stat("/s.bin").st_blocks
        info = union.info("/s.bin")
        for whence in (os.SEEK_DATA, os.SEEK_HOLE):
            assert union.seek_data(info, 3 << 20, whence) == _model(SIZE, extents, 3 << 20, whence)
    mountpoint = mounter.mount(archive, other)
    assert {e.name: e.stat().st_blocks for e in os.scandir(mountpoint) if e.name.endswith(".bin")} == {
        "s.bin": _blocks(extents),
        "dense.bin": 20,
    }
    folder = tmp_path / "folder"
    folder.mkdir()
    on_disk = folder / "hole.bin"
    _sparse_file(on_disk)
    with ratarmountcore.open(str(folder)) as src:
        assert src.stat("/hole.bin").st_blocks == on_disk.stat().st_blocks
        info = src.info("/hole.bin")
        fd = os.open(on_disk, os.O_RDONLY)
        try:
            for offset in (0, 2 << 20, (5 << 20) + 1):
                for whence in (os.SEEK_DATA, os.SEEK_HOLE):
                    assert src.seek_data(info, offset, whence) == os.lseek(fd, offset, whence)
        finally:
            os.close(fd)
    mountpoint = mounter.mount(folder)
    assert os.stat(mountpoint / "hole.bin").st_blocks == on_disk.stat().st_blocks
    copy = tmp_path / "copy.bin"
    subprocess.run(["cp", "--sparse=auto", str(mountpoint / "hole.bin"), str(copy)], check=True)
    assert copy.read_bytes() == data and copy.stat().st_blocks * 512 < SIZE // 8
