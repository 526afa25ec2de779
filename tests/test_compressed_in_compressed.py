"""Compressed archives inside compressed archives (``-r``): a .tar.bz2 inside a .tar.zst was
shown as a file, since its bytes are not on disk as they are. The first pass now indexes a
temporary copy of them (``tar/spool.py``) and reads go through the outer stream
(``io.readers.StreamWindow``), at any depth."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import random
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List

import pytest
from conftest import Mounter, read_tree, tar_bytes

import ratarmountcore
from ratarmountcore.errors import CorruptDataError
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions
from ratarmountcore.tar import spool

TOOLS = {"gz": "gzip", "bz2": "bzip2", "xz": "xz", "zst": "zstd"}
FRESH = OpenOptions(index=IndexOptions(index_folders=("",), recreate=True, progress=False), recursive=True)
AGAIN = OpenOptions(index=IndexOptions(index_folders=("",), progress=False), recursive=True)


def compress(data: bytes, suffix: str) -> bytes:
    command = [TOOLS[suffix], "-c"] + (["-q"] if suffix == "zst" else [])
    return subprocess.run(command, input=data, capture_output=True, check=True).stdout


def class_files(seed: int, count: int = 6) -> Dict[str, bytes]:
    rng = random.Random(seed)
    return {
        f"img{i}.JPEG": rng.randbytes(rng.randint(100, 9000)) + b"jpeg " * rng.randint(0, 500) for i in range(count)
    }


@pytest.mark.parametrize("outer", sorted(TOOLS))
def test_every_codec_inside_every_codec(tmp_path: Path, outer: str) -> None:
    """Outer .tar.<outer> holding a class archive in each codec and a compressed member that
    is no archive; the second open serves everything from the index (not rebuilt)."""
    classes = {suffix: class_files(n) for n, suffix in enumerate(sorted(TOOLS))}
    members = {
        f"train/c_{suffix}.tar.{suffix}": compress(tar_bytes(files), suffix) for suffix, files in classes.items()
    }
    members["train/notes.txt.gz"] = compress(b"not a tar " * 100, "gz")
    members["README"] = b"outer"
    archive = tmp_path / f"outer.tar.{outer}"
    archive.write_bytes(compress(tar_bytes(members), outer))
    expected = {"/README": b"outer", "/train/notes.txt.gz": members["train/notes.txt.gz"]}
    for suffix, files in classes.items():
        expected.update({f"/train/c_{suffix}.tar.{suffix}/{name}": data for name, data in files.items()})
    index = Path(f"{archive}.index.sqlite")
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert read_tree(src) == expected
        assert src.is_dir(f"/train/c_{outer}.tar.{outer}") and src.info("/train/notes.txt.gz").is_file
    built = index.stat().st_mtime_ns
    with ratarmountcore.open(str(archive), AGAIN) as src:
        # Backwards, so that each read goes to the outer stream at another place.
        for path in sorted(expected, reverse=True):
            assert src.read(path) == expected[path], path
    assert index.stat().st_mtime_ns == built
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name, index.name]  # no copy left


def test_three_levels_of_compression(tmp_path: Path) -> None:
    """A .tar.gz inside a .tar.bz2 inside a .tar.zst, next to an uncompressed tar in the middle
    one: rows at each level, reads through two decoded streams."""
    leaf = class_files(7, 4)
    middle = {"deep.tar.gz": compress(tar_bytes(leaf), "gz"), "plain.tar": tar_bytes({"p.txt": b"plain"})}
    archive = tmp_path / "top.tar.zst"
    archive.write_bytes(compress(tar_bytes({"mid.tar.bz2": compress(tar_bytes(middle), "bz2")}), "zst"))
    expected = {f"/mid.tar.bz2/deep.tar.gz/{name}": data for name, data in leaf.items()}
    expected["/mid.tar.bz2/plain.tar/p.txt"] = b"plain"
    for options in (FRESH, AGAIN):
        with ratarmountcore.open(str(archive), options) as src:
            assert read_tree(src) == expected


def test_through_fuse(mounter: Mounter, tmp_path: Path) -> None:
    files = class_files(3, 20)
    archive = tmp_path / "outer.tar.zst"
    archive.write_bytes(compress(tar_bytes({"cls.tar.bz2": compress(tar_bytes(files), "bz2")}), "zst"))
    for _mount in range(2):  # the second mount from the index
        mnt = mounter.mount(archive, extra=["-r"])
        assert sorted(os.listdir(mnt / "cls.tar.bz2")) == sorted(files)
        for name, data in files.items():
            assert (mnt / "cls.tar.bz2" / name).read_bytes() == data
        mounter.unmount(mnt)


def test_no_room_for_the_copy_shows_the_archive_as_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    inner = compress(tar_bytes(class_files(1)), "gz")
    archive = tmp_path / "outer.tar.xz"
    archive.write_bytes(compress(tar_bytes({"c.tar.gz": inner, "after.txt": b"after"}), "xz"))

    def full(*_args: object, **_kwargs: object) -> object:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(tempfile, "TemporaryFile", full)
    with caplog.at_level(logging.WARNING), ratarmountcore.open(str(archive), FRESH) as src:
        assert src.info("/c.tar.gz").is_file and src.read("/c.tar.gz") == inner
        assert src.read("/after.txt") == b"after"
    assert "c.tar.gz: no temporary copy" in caplog.text and "No space left on device" in caplog.text


def test_a_copy_that_fills_the_disk_halfway_shows_the_archive_as_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first piece fits, the rest does not: the member stays a file, nothing is left."""
    rng = random.Random(5)
    inner = compress(tar_bytes({"big.bin": rng.randbytes(3 * spool.PIECE)}), "gz")
    archive = tmp_path / "outer.tar.zst"
    archive.write_bytes(compress(tar_bytes({"c.tar.gz": inner, "after.txt": b"after"}), "zst"))
    real_copy = spool.Spool._copy

    def copy(self: spool.Spool, limit: object = None) -> bool:
        if limit is None:
            raise spool.SpoolError(OSError(errno.ENOSPC, "full"))
        return real_copy(self, limit)  # type: ignore[arg-type]

    monkeypatch.setattr(spool.Spool, "_copy", copy)
    with caplog.at_level(logging.WARNING), ratarmountcore.open(str(archive), FRESH) as src:
        assert src.info("/c.tar.gz").is_file and src.read("/c.tar.gz") == inner
        assert src.read("/after.txt") == b"after"
    assert "c.tar.gz: no temporary copy" in caplog.text and "No space left on device" in caplog.text


def test_damage_in_the_outer_stream_is_the_outer_archives(tmp_path: Path) -> None:
    """Bad data of the outer stream met while copying an inner archive fails the outer
    archive (it is not taken for the inner archive's damage, nor for a full disk)."""
    rng = random.Random(9)
    inner = compress(tar_bytes({"x.bin": rng.randbytes(200_000)}), "gz")
    plain = tar_bytes({"c.tar.gz": inner})
    data = bytearray(compress(plain, "bz2"))
    data[len(data) // 2] ^= 0x40
    archive = tmp_path / "outer.tar.bz2"
    archive.write_bytes(bytes(data))
    with pytest.raises(CorruptDataError, match="outer.tar.bz2"):
        with ratarmountcore.open(str(archive), FRESH):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name]  # no index, no copy


def test_a_damaged_inner_archive_in_a_compressed_one_is_the_file_it_is(tmp_path: Path) -> None:
    inner = bytearray(compress(tar_bytes({"m.txt": bytes(range(256)) * 400, "n.txt": os.urandom(5000)}), "bz2"))
    inner[len(inner) // 2] ^= 0x10
    archive = tmp_path / "outer.tar.gz"
    archive.write_bytes(compress(tar_bytes({"in.tar.bz2": bytes(inner), "after.txt": b"after"}), "gz"))
    for options in (FRESH, AGAIN):
        with ratarmountcore.open(str(archive), options) as src:
            assert src.info("/in.tar.bz2").is_file and src.read("/in.tar.bz2") == bytes(inner)
            assert src.read("/after.txt") == b"after"


def test_an_index_of_a_compressed_archive_by_older_rules_is_rebuilt(tmp_path: Path) -> None:
    """An index built before showed the inner .tar.gz as a file and counted no inner archive;
    it is rebuilt once (an uncompressed archive's index without inner archives is not)."""
    files = class_files(2)
    archive = tmp_path / "outer.tar.zst"
    archive.write_bytes(compress(tar_bytes({"c.tar.gz": compress(tar_bytes(files), "gz")}), "zst"))
    index = Path(f"{archive}.index.sqlite")
    with ratarmountcore.open(str(archive), AGAIN):
        pass
    with sqlite3.connect(index) as conn:  # as the rules before made it
        conn.execute("UPDATE metadata SET value = '2' WHERE key = 'inner_archive_rules'")
        conn.execute("UPDATE metadata SET value = '0' WHERE key = 'inner_archives'")
    conn.close()
    built = index.stat().st_mtime_ns
    with ratarmountcore.open(str(archive), AGAIN) as src:
        assert src.read("/c.tar.gz/img0.JPEG") == files["img0.JPEG"]
    assert index.stat().st_mtime_ns != built


def test_forked_workers_read_through_their_own_outer_stream(tmp_path: Path) -> None:
    """A DataLoader's workers: the parent read members of the inner archive (its decompressors
    exist), the children read others through decompressors of their own."""
    import hashlib
    import multiprocessing

    files = class_files(4, 16)
    archive = tmp_path / "outer.tar.xz"
    archive.write_bytes(compress(tar_bytes({"c.tar.gz": compress(tar_bytes(files), "gz")}), "xz"))
    names = sorted(files)
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert src.read(f"/c.tar.gz/{names[0]}") == files[names[0]]
        _FORKED["source"] = src
        try:
            with multiprocessing.get_context("fork").Pool(2) as pool:
                found = dict(pool.map_async(_digest, names, chunksize=4).get(timeout=120))
        finally:
            _FORKED.clear()
        assert found == {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
        assert src.read(f"/c.tar.gz/{names[-1]}") == files[names[-1]]  # the parent's still work


_FORKED: Dict[str, ratarmountcore.MountSource] = {}


def _digest(name: str) -> tuple:  # type: ignore[type-arg]
    import hashlib

    return name, hashlib.sha256(_FORKED["source"].read(f"/c.tar.gz/{name}")).hexdigest()


@pytest.mark.parametrize("outer", sorted(TOOLS))
def test_threads_read_all_codecs_inside_at_once(tmp_path: Path, outer: str) -> None:
    """FUSE's worker threads: decoders of inner archives of every codec read the outer stream
    at the same time (rapidgzip from threads of its own, through Python), with a cache small
    enough that spans are decoded again while others read."""
    import threading

    rng = random.Random(21)
    classes = {}
    members = {}
    for c, inner in enumerate(sorted(TOOLS) * 2):
        files = {f"{i}.bin": rng.randbytes(rng.randint(100, 40000)) for i in range(10)}
        classes[f"c{c}.tar.{inner}"] = files
        members[f"c{c}.tar.{inner}"] = compress(tar_bytes(files), inner)
    archive = tmp_path / f"o.tar.{outer}"
    archive.write_bytes(compress(tar_bytes(members), outer))
    options = dataclasses.replace(AGAIN, compression=CompressionOptions(cache_size=256 * 1024))
    with ratarmountcore.open(str(archive), options):
        pass
    wrong: List[str] = []
    with ratarmountcore.open(str(archive), options) as src:
        todo = [f"/{name}/{file}" for name, files in classes.items() for file in files] * 2
        rng.shuffle(todo)

        def work(paths: List[str]) -> None:
            for path in paths:
                _, name, file = path.split("/")
                if src.read(path) != classes[name][file]:
                    wrong.append(path)

        threads = [threading.Thread(target=work, args=(todo[i::4],)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
    assert not wrong


def test_inner_archives_larger_than_the_first_piece_copied(tmp_path: Path) -> None:
    """The copy is made in two steps (the first MiB to look into, then the rest): inner archives
    of 3 MB in every codec, their decoders made anew for the whole copy (xz's block index and
    zstd's frames are at and across all of it)."""
    rng = random.Random(13)
    files = {f"f{i}": rng.randbytes(200_000) for i in range(15)}
    members = {f"c.tar.{suffix}": compress(tar_bytes(files), suffix) for suffix in sorted(TOOLS)}
    assert min(len(data) for data in members.values()) > 2 * spool.PIECE
    archive = tmp_path / "big.tar.gz"
    archive.write_bytes(compress(tar_bytes(members), "gz"))
    for options in (FRESH, AGAIN):
        with ratarmountcore.open(str(archive), options) as src:
            for suffix in sorted(TOOLS):
                assert src.is_dir(f"/c.tar.{suffix}"), suffix
                for name, data in files.items():
                    assert src.read(f"/c.tar.{suffix}/{name}") == data, (suffix, name)


def test_a_decoder_reading_small_pieces_asks_the_outer_stream_once_per_window() -> None:
    """zlib's resumer reads 32 KiB at a time; each piece that went past what the outer stream's
    cache held made it decode the span from its seek point again (1,000 class .tar.gz in a
    .tar.gz: 628 MB of the outer stream decoded for 1,000 reads, 453 MB with the window)."""
    from ratarmountcore.io.readers import WINDOW_AHEAD, StreamWindow

    data = random.Random(8).randbytes(3 * WINDOW_AHEAD + 1000)
    asked = []

    class Outer:
        def pread(self, offset: int, size: int) -> bytes:
            asked.append((offset, size))
            return data[offset : offset + size]

        def close(self) -> None:
            pass

    window = StreamWindow(Outer(), 1000, len(data) - 1000)
    pieces = [window.pread(offset, 32 * 1024) for offset in range(0, window.size, 32 * 1024)]
    assert b"".join(pieces) == data[1000:]
    assert len(asked) == 3
    other = StreamWindow(Outer(), 0, 5000)  # another stream's window is its own
    assert other.pread(1000, 10) == data[1000:1010] and asked[-1] == (1000, 4000)
    assert window.pread(5, 10) == data[1005:1015]  # (behind its last window: asked again)
    assert window.pread(WINDOW_AHEAD, 10) == data[1000 + WINDOW_AHEAD : 1010 + WINDOW_AHEAD]
