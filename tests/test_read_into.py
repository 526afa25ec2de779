"""``MountSource.read_into``: one read of a file without a file object (FUSE reads of files the
kernel opened without a message) gives the bytes an opened file gives, in every kind of source."""

from __future__ import annotations

import gzip
import io
import os
import random
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.options import OpenOptions


def _members(rng: random.Random) -> Dict[str, bytes]:
    sizes = [0, 1, 511, 512, 513, 4096, 70_000]
    return {f"d{i % 3}/f{i}": rng.randbytes(size) for i, size in enumerate(sizes)}


def _sparse_tar(tmp_path: Path) -> Tuple[Path, bytes]:
    """A GNU tar (``tar --sparse``) of a file with holes; the file's bytes."""
    folder = tmp_path / "sparse-src"
    folder.mkdir()
    path = folder / "s.bin"
    with open(path, "wb") as f:
        f.truncate(3 << 20)
        f.seek(1 << 20)
        f.write(b"data" * 1000)
        f.seek((3 << 20) - 100)
        f.write(b"end" * 30)
    archive = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "-cf", str(archive), "-C", str(folder), "s.bin"], check=True)
    return archive, path.read_bytes()


def _windows(size: int) -> List[Tuple[int, int]]:
    """(offset, length) pairs around the edges of a file of ``size`` bytes, and past its end."""
    return [(0, 1), (0, size + 10), (1, 4096), (max(0, size - 3), 8), (size, 5), (size + 100, 5), (size // 2, 131072)]


def _check(source: ratarmountcore.MountSource, files: Dict[str, bytes]) -> None:
    for path, data in files.items():
        info = source.info(path)
        for offset, length in _windows(len(data)):
            view = memoryview(bytearray(length))
            count = source.read_into(info, offset, view)
            assert bytes(view[:count]) == data[offset : offset + length], (path, offset, length)
            with source.open(path) as f:
                f.seek(offset)
                assert f.read(length) == bytes(view[:count])


def test_read_into_gives_the_bytes_of_plain_compressed_and_nested_members(tmp_path: Path) -> None:
    rng = random.Random(7)
    files = _members(rng)
    plain = tmp_path / "plain.tar"
    plain.write_bytes(tar_bytes(files))
    packed = tmp_path / "packed.tar.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    with ratarmountcore.open(str(plain)) as source:
        _check(source, {"/" + name: data for name, data in files.items()})
    with ratarmountcore.open(str(packed)) as source:
        _check(source, {"/" + name: data for name, data in files.items()})

    # A .tar.gz inside a tar (-r): its members are read through the nested decoder.
    outer = tmp_path / "outer.tar"
    with tarfile.open(outer, "w") as tar:
        info = tarfile.TarInfo("inner.tar.gz")
        info.size = packed.stat().st_size
        tar.addfile(info, io.BytesIO(packed.read_bytes()))
    with ratarmountcore.open(str(outer), OpenOptions(recursive=True)) as source:
        _check(source, {"/inner.tar.gz/" + name: data for name, data in files.items()})


def test_read_into_gives_the_bytes_of_sparse_members_and_union_members(tmp_path: Path) -> None:
    archive, data = _sparse_tar(tmp_path)
    with ratarmountcore.open(str(archive)) as source:
        assert source.info("/s.bin").locator.sparse is not None  # (the path for sparse members)
        _check(source, {"/s.bin": data})
    other = tmp_path / "other.tar"
    other.write_bytes(tar_bytes({"s.bin": b"hidden", "x": b"from the second"}))
    with ratarmountcore.open([str(other), str(archive)]) as union:  # the later source wins
        _check(union, {"/s.bin": data, "/x": b"from the second"})


def test_read_into_a_folder_source(tmp_path: Path) -> None:
    folder = tmp_path / "tree"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "f").write_bytes(os.urandom(10_000))
    with ratarmountcore.open(str(folder)) as source:
        _check(source, {"/sub/f": (folder / "sub" / "f").read_bytes()})


def test_read_into_a_member_cut_off_by_a_shrunk_archive_is_an_error(tmp_path: Path) -> None:
    """Bytes the archive no longer holds are an error, never zeros or the bytes of another file."""
    archive = tmp_path / "cut.tar"
    archive.write_bytes(tar_bytes({"a": b"a" * 5000, "b": b"b" * 5000}))
    with ratarmountcore.open(str(archive)) as source:
        info = source.info("/b")
        os.truncate(archive, info.locator.offset + 100)
        with pytest.raises(OSError):
            source.read_into(info, 0, memoryview(bytearray(5000)))
