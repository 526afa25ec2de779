"""Compressed archives: every codec and backend against tarfile, seek points reused after a
remount, corruption and truncation, single compressed files, the zstd converter, and concurrent
reads. Archives are made with the real command-line tools and with Python, in temporary folders.
"""

from __future__ import annotations

import bz2
import collections
import dataclasses
import gzip
import io
import logging
import os
import random
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tarfile
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from unittest import mock

import pytest
from conftest import rot_between_samples, tar_bytes

import ratarmountcore
from ratarmountcore.compression.base import CompressedReader
from ratarmountcore.compression.framed import FrameTable
from ratarmountcore.compression.registry import BACKENDS, open_compressed, select_backend
from ratarmountcore.compression.zstd import ZstdReader
from ratarmountcore.convert import convert_to_seekable_zstd
from ratarmountcore.errors import ArchiveError, CorruptDataError, MissingBackendError, RatarmountError
from ratarmountcore.formats import FormatId
from ratarmountcore.index.sqlite_index import IndexReader
from ratarmountcore.io.readers import PlainFileReader, ReaderStream
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

SPACING = 256 * 1024


def options(**compression: object) -> OpenOptions:
    return OpenOptions(
        index=IndexOptions(index_folders=("",), progress=False),
        compression=CompressionOptions(seek_point_spacing=SPACING, **compression),  # type: ignore[arg-type]
    )


def bytes_read_by_process() -> int:
    """All bytes this process (every thread, libraries included) has read with read/pread:
    decoders may read the archive themselves, by path, where our counters cannot see it."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"needs the {tool} command")


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True)


# --- archives ----------------------------------------------------------------------------------
def make_tar(path: Path, rng: random.Random, members: int, max_size: int, random_share: float = 0.5) -> None:
    words = [bytes(rng.choice(b"abcdefghij") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("docs", "docs/deep", "bin"):
            info = tarfile.TarInfo(folder)
            info.type = tarfile.DIRTYPE
            info.mode = 0o750
            info.mtime = 1_500_000_000
            tar.addfile(info)
        for i in range(members):
            size = rng.randint(0, max_size)
            if rng.random() < random_share:
                data = rng.randbytes(size)
            else:
                data = b" ".join(rng.choice(words) for _ in range(size // 5 + 1))[:size]
            name = f"docs/deep/{'long-' * 25}{i}.txt" if i % 7 == 3 else f"{('docs', 'bin')[i % 2]}/file{i:03}.bin"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o640 if i % 3 else 0o755
            info.mtime = 1_600_000_000 + i * 3600
            info.uid, info.gid = 1000 + i % 3, 100
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("docs/link")
        link.type = tarfile.SYMTYPE
        link.linkname = "../bin/file001.bin"
        link.mtime = 1_600_000_000
        tar.addfile(link)
        hard = tarfile.TarInfo("bin/hardlink")
        hard.type = tarfile.LNKTYPE
        hard.linkname = "bin/file001.bin"
        tar.addfile(hard)
        empty = tarfile.TarInfo("empty")
        tar.addfile(empty, io.BytesIO(b""))


def compress(src: Path, kind: str) -> Path:
    """``kind`` is codec-tool[-variant]; returns the new file next to ``src``."""
    data = src.read_bytes()
    if kind == "gz-cli":
        need("gzip")
        dst = src.with_name(src.name + ".gz")
        run("gzip", "-k", "-f", str(src))
    elif kind == "gz-python-multimember":
        dst = src.with_name(src.name + ".mm.gz")
        step = len(data) // 3 + 1
        dst.write_bytes(b"".join(gzip.compress(data[i : i + step], 6) for i in range(0, len(data), step)))
    elif kind == "bz2-cli":
        need("bzip2")
        dst = src.with_name(src.name + ".bz2")
        run("bzip2", "-k", "-f", "-1", str(src))
    elif kind == "bz2-python":
        dst = src.with_name(src.name + ".py.bz2")
        dst.write_bytes(bz2.compress(data, 1))
    elif kind == "zst-cli":
        need("zstd")
        dst = src.with_name(src.name + ".zst")
        run("zstd", "-q", "-f", "-3", str(src), "-o", str(dst))
    elif kind == "zst-cli-pipe":  # like `tar -I zstd -cf`: zstd reads a pipe, no content size
        need("zstd")
        dst = src.with_name(src.name + ".pipe.zst")
        with open(src, "rb") as source, open(dst, "wb") as out:
            subprocess.run(["zstd", "-q", "-3", "-c"], stdin=source, stdout=out, check=True)
    elif kind == "zst-python-frames":
        import zstandard

        dst = src.with_name(src.name + ".frames.zst")
        compressor = zstandard.ZstdCompressor(level=1, write_checksum=True)
        dst.write_bytes(b"".join(compressor.compress(data[i : i + SPACING]) for i in range(0, len(data), SPACING)))
    elif kind == "xz-cli":
        need("xz")
        dst = src.with_name(src.name + ".xz")
        run("xz", "-k", "-f", "-0", "-T1", str(src))
    elif kind == "xz-cli-blocks":
        need("xz")
        dst = src.with_name(src.name + ".blocks.xz")
        with open(dst, "wb") as out:
            subprocess.run(["xz", "-c", "-0", "--block-size=256KiB", str(src)], stdout=out, check=True)
    else:
        raise AssertionError(kind)
    return dst


@pytest.fixture(scope="module")
def small_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("small") / "small.tar"
    make_tar(path, random.Random(1), members=40, max_size=150_000)
    return path


@pytest.fixture(scope="module")
def large_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~10 MB of mostly incompressible members: compressed size ~ decompressed size."""
    path = tmp_path_factory.mktemp("large") / "large.tar"
    make_tar(path, random.Random(2), members=40, max_size=500_000, random_share=0.9)
    return path


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def fresh_copy(path: Path, tmp_path: Path) -> Path:
    """A copy in this test's folder (so every test builds its own index)."""
    dst = tmp_path / path.name
    shutil.copyfile(path, dst)
    return dst


KINDS = [
    "gz-cli",
    "gz-python-multimember",
    "bz2-cli",
    "bz2-python",
    "zst-cli",
    "zst-cli-pipe",
    "zst-python-frames",
    "xz-cli",
    "xz-cli-blocks",
]


def compare_with_tarfile(src: ratarmountcore.MountSource, tar_path: Path) -> None:
    with tarfile.open(tar_path) as tar:
        members = tar.getmembers()
        for member in members:
            path = "/" + member.name
            info = src.info(path)
            if not member.islnk():  # hard links show their target's metadata
                assert info.mtime_ns // 10**9 == int(member.mtime), path
            if member.isdir():
                assert info.is_dir and stat.S_IMODE(info.mode) == member.mode, path
            elif member.issym():
                assert info.is_symlink and src.readlink(path) == member.linkname, path
            elif member.islnk():
                assert src.read(path) == tar.extractfile(member.linkname).read(), path  # type: ignore[union-attr]
            else:
                assert info.is_file and stat.S_IMODE(info.mode) == member.mode, path
                assert (info.size, info.uid, info.gid) == (member.size, member.uid, member.gid), path
                assert src.read(path) == tar.extractfile(member).read(), path  # type: ignore[union-attr]


def members_of(tar_path: Path) -> Dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        return {"/" + m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


# --- round trips -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_every_format(kind: str, small_tar: Path, tmp_path: Path) -> None:
    archive = compress(fresh_copy(small_tar, tmp_path), kind)
    for _ in range(2):  # build the index, then use it
        with ratarmountcore.open(str(archive), options()) as src:
            compare_with_tarfile(src, small_tar)
    assert os.path.exists(str(archive) + ".index.sqlite")


def test_indexed_gzip_backend_and_backend_switch_rebuilds(small_tar: Path, tmp_path: Path) -> None:
    archive = compress(fresh_copy(small_tar, tmp_path), "gz-cli")
    with ratarmountcore.open(str(archive), options(gzip_backend="indexed_gzip")) as src:
        assert src._reader.backend_name == "indexed_gzip"  # type: ignore[attr-defined]
        compare_with_tarfile(src, small_tar)
    index = IndexReader(str(archive) + ".index.sqlite")
    assert index.metadata["compression_backend"] == "indexed_gzip"
    index.close()
    with ratarmountcore.open(str(archive), options(gzip_backend="rapidgzip")) as src:  # rebuilt for rapidgzip
        compare_with_tarfile(src, small_tar)
    index = IndexReader(str(archive) + ".index.sqlite")
    assert index.metadata["compression_backend"] == "rapidgzip"
    assert index.seek_point_parts("rapidgzip")
    index.close()


def test_fallback_to_indexed_gzip_and_missing_backend_hint(
    small_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = compress(fresh_copy(small_tar, tmp_path), "gz-cli")
    monkeypatch.setitem(sys.modules, "rapidgzip", None)  # "import rapidgzip" now raises ImportError
    assert select_backend(FormatId.GZIP, CompressionOptions()).name == "indexed_gzip"
    with ratarmountcore.open(str(archive), options()) as src:
        compare_with_tarfile(src, small_tar)
    monkeypatch.setitem(sys.modules, "indexed_gzip", None)
    with pytest.raises(MissingBackendError, match="pip install rapidgzip") as caught:
        ratarmountcore.open(str(archive), options())
    assert str(archive) in str(caught.value)
    with pytest.raises(MissingBackendError, match="pip install rapidgzip"):
        select_backend(FormatId.BZIP2, CompressionOptions())
    assert list(BACKENDS)[0] == "rapidgzip"


# --- seek points -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kind, gzip_backend",
    [
        ("gz-cli", "rapidgzip"),
        ("gz-cli", "indexed_gzip"),
        ("bz2-cli", None),
        ("zst-python-frames", None),
        ("xz-cli-blocks", None),
    ],
)
def test_remount_reads_last_member_without_decompressing_from_start(
    kind: str, gzip_backend: str, large_tar: Path, tmp_path: Path
) -> None:
    archive = compress(fresh_copy(large_tar, tmp_path), kind)
    opts = options(gzip_backend=gzip_backend, parallelization=2)
    with ratarmountcore.open(str(archive), opts) as src:  # first mount: scan + store seek points
        backend = src._reader.backend_name  # type: ignore[attr-defined]
    index = IndexReader(str(archive) + ".index.sqlite")
    assert index.seek_point_parts(backend), "no seek points stored"
    index.close()

    expected = members_of(large_tar)
    last = max(expected, key=lambda name: int(name.rsplit("file", 1)[-1].split(".")[0]) if "file" in name else -1)
    with ratarmountcore.open(str(archive), opts) as src:
        reader: CompressedReader = src._reader  # type: ignore[attr-defined]
        reader.stats.reset()
        before = bytes_read_by_process()
        assert src.read(last) == expected[last]
        read = max(reader.stats.compressed_bytes_read, bytes_read_by_process() - before)
    size = archive.stat().st_size
    assert len(expected[last]) < size // 10
    # Decompressing from the start would read ~all of the file; from a seek point, a few chunks.
    assert read < size // 4, f"read {read} of {size} compressed bytes for the last member"


# --- corruption and truncation -----------------------------------------------------------------
def read_everything(archive: Path, expected: Dict[str, bytes], opts: Optional[OpenOptions] = None) -> Tuple[int, int]:
    """(members read correctly, errors); fails on wrong bytes. An open that fails counts as errors."""
    good = errors = 0
    try:
        src = ratarmountcore.open(str(archive), opts or options())
    except (OSError, ArchiveError) as exc:
        assert str(archive) in str(exc) and "\n" not in str(exc), str(exc)
        return 0, len(expected)
    with src:
        for name, data in expected.items():
            try:
                got = src.read(name)
            except OSError as exc:
                assert isinstance(exc, (CorruptDataError, ArchiveError)) or exc.errno is not None, repr(exc)
                errors += 1
                continue
            assert got == data, f"{name}: wrong bytes served from a corrupt archive"
            good += 1
    return good, errors


def split_kind(kind: str) -> Tuple[str, OpenOptions]:
    """ "gz-cli@indexed_gzip" -> ("gz-cli", options with that gzip backend)."""
    kind, _, backend = kind.partition("@")
    return kind, options(gzip_backend=backend or None)


DAMAGE_KINDS = [
    "gz-cli", "gz-cli@indexed_gzip", "gz-python-multimember@indexed_gzip",
    "bz2-cli", "zst-cli", "zst-cli-pipe", "xz-cli",
]  # fmt: skip


@pytest.mark.parametrize("kind", [*DAMAGE_KINDS, "zst-python-frames", "xz-cli-blocks"])
def test_corrupt_byte_gives_errors_never_wrong_bytes(kind: str, small_tar: Path, tmp_path: Path) -> None:
    kind, opts = split_kind(kind)
    archive = compress(fresh_copy(small_tar, tmp_path), kind)
    expected = members_of(small_tar)
    raw = bytearray(archive.read_bytes())
    raw[len(raw) // 2] ^= 0x55
    archive.write_bytes(bytes(raw))
    _good, errors = read_everything(archive, expected, opts)
    assert errors > 0


@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_damage_at_the_start_is_an_error_not_a_single_file(kind: str, tmp_path: Path) -> None:
    """A byte flipped near the start of a compressed tar: the archive fails to open with a
    one-line error naming it, or opens as the tar it is -- never as one file named ``x.tar``. A
    damaged first zstd block used to decode a wrong first tar header (zstd checks a frame at its
    end), and the archive was shown as one file whose every read failed."""
    from ratarmountcore.sources.single_file import SingleFileSource

    kind, opts = split_kind(kind)
    opts = dataclasses.replace(opts, index=dataclasses.replace(opts.index, recreate=True))
    tiny = tmp_path / "tiny.tar"
    with tarfile.open(tiny, "w", format=tarfile.GNU_FORMAT) as tar:
        for k in range(3):
            info = tarfile.TarInfo(f"member-{k}.txt")
            data = random.Random(k).randbytes(3000)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    archive = compress(tiny, kind)
    original = archive.read_bytes()
    outcomes = collections.Counter()
    for offset in range(4, min(len(original), 200), 5):
        raw = bytearray(original)
        raw[offset] ^= 0x55
        archive.write_bytes(bytes(raw))
        try:
            src = ratarmountcore.open(str(archive), opts)
        except (OSError, ArchiveError) as exc:
            assert str(archive) in str(exc) and "\n" not in str(exc), str(exc)
            outcomes["refused"] += 1
            continue
        with src:
            assert not isinstance(src, SingleFileSource), f"{kind}, byte {offset}: {src.listdir('/')}"
            outcomes["tar"] += 1
    assert outcomes["refused"] > 0, outcomes
    # The tar itself damaged, the compression intact: the same error as for a plain .tar.
    raw = bytearray(tiny.read_bytes())
    raw[5] ^= 0x55
    tiny.write_bytes(bytes(raw))
    archive = compress(tiny, kind)
    with pytest.raises(ArchiveError, match="no valid tar header"):
        ratarmountcore.open(str(archive), opts).close()


def test_bit_rot_after_indexing_fails_only_the_affected_members(small_tar: Path, tmp_path: Path) -> None:
    """A byte flipped after the index was written (same size and mtime, outside the sampled
    fingerprint blocks): the index stays in use, reads touching that frame fail, others work."""
    archive = tmp_path / "out.tar.zst"
    convert_to_seekable_zstd(str(small_tar), str(archive), frame_size=SPACING, options=options())
    expected = members_of(small_tar)
    rot_between_samples(archive)
    good, errors = read_everything(archive, expected)
    assert errors > 0 and good > 0


def test_bzip2_bit_rot_after_indexing_never_gives_wrong_bytes(small_tar: Path, tmp_path: Path) -> None:
    """rapidgzip's single-threaded bzip2 decoder hands out a block's bytes before it checks the
    block's CRC (at its end), so a read that stopped inside a damaged block got wrong bytes with
    ``-P 1`` (here: one of the bits flipped below): decoders always get two threads, whose reader
    checks every block it decodes before any of it is read."""
    from ratarmountcore.index.fingerprint import SAMPLE, SAMPLES

    original = compress(fresh_copy(small_tar, tmp_path), "bz2-cli").read_bytes()
    expected = members_of(small_tar)
    opts = options(parallelization=1)
    step = (len(original) - SAMPLE) // (SAMPLES - 1)
    errors = 0
    for k in range(12, 20):  # bits between the fingerprint's sampled blocks
        archive = tmp_path / f"rot{k}.tar.bz2"
        archive.write_bytes(original)
        os.utime(archive, ns=(10**18, 10**18))
        assert read_everything(archive, expected, opts) == (len(expected), 0)  # (the index, built intact)
        raw = bytearray(original)
        raw[step * (k % (SAMPLES - 1)) + SAMPLE + (step - SAMPLE) * (1 + k // (SAMPLES - 1)) // 4] ^= 0x01
        archive.write_bytes(bytes(raw))
        os.utime(archive, ns=(10**18, 10**18))
        errors += read_everything(archive, expected, opts)[1]  # (fails on a wrong byte)
    assert errors > 0


def zero_16_bytes_unsampled(archive: Path) -> None:
    """Damage after indexing that the archive's fingerprint does not see: 16 zero bytes in the
    middle of the file, between two of its sampled parts, with the size and mtime kept."""
    from ratarmountcore.index.fingerprint import SAMPLE, SAMPLES

    raw = bytearray(archive.read_bytes())
    step = (len(raw) - SAMPLE) // (SAMPLES - 1)
    middle = step * (SAMPLES // 2) + SAMPLE + (step - SAMPLE) // 2
    raw[middle : middle + 16] = bytes(16)
    mtime = archive.stat().st_mtime_ns
    archive.write_bytes(bytes(raw))
    os.utime(archive, ns=(mtime, mtime))


@pytest.mark.parametrize("cache_size", [0, 32])
def test_reads_beside_a_damaged_bzip2_block_decode_each_block_once(tmp_path: Path, cache_size: int) -> None:
    """After indexing, one bzip2 block of a large member is damaged. The parallel decoder failed
    every read whose look-ahead reached that block, and each such read was redone by decoding its
    blocks alone, none kept: a 3 MB file read in 8 KiB pieces decoded ~900 KB per piece, 2 minutes
    through a mount (found by fuzzing). Now, once damage is met, reads go block by block, each
    block is decoded once (kept in the span cache, or the last one without a cache) and a
    damaged one fails at once. Counted by the block decodes, not by time."""
    from ratarmountcore.compression.bzip2 import Bzip2Reader

    rng = random.Random(7)
    data = b"".join(
        rng.randbytes(30_000) if rng.random() < 0.5 else rng.randbytes(15_000).hex().encode() for _ in range(100)
    )
    tar = tmp_path / "big.tar"
    tar.write_bytes(tar_bytes({"big": data}))
    archive = tmp_path / "big.tar.bz2"
    with open(tar, "rb") as src, open(archive, "wb") as dst:
        subprocess.run(["bzip2", "-1", "-c"], stdin=src, stdout=dst, check=True)  # blocks of ~100 KB
    os.utime(archive, ns=(10**18, 10**18))
    opts = dataclasses.replace(options(), compression=CompressionOptions(cache_size=cache_size))
    with ratarmountcore.open(str(archive), opts) as source:
        assert source.read("/big") == data  # (the index, built intact)
    zero_16_bytes_unsampled(archive)

    decodes: List[int] = []
    original = Bzip2Reader._decode_block

    def counted(self: Bzip2Reader, bit: int, next_bit: int, size: int) -> bytes:
        decodes.append(bit)
        return original(self, bit, next_bit, size)

    with mock.patch.object(Bzip2Reader, "_decode_block", counted), ratarmountcore.open(str(archive), opts) as source:
        member = source.open_info(source.info("/big"))
        damaged = []
        for offset in range(0, len(data), 8192):
            try:
                assert member.pread(offset, 8192) == data[offset : offset + 8192], "wrong bytes"
            except CorruptDataError:
                damaged.append(offset)
    assert damaged and damaged[0] > 0 and damaged[-1] < len(data) - 8192  # (intact reads on both sides)
    assert len(damaged) * 8192 <= 2 * 110_000  # one block (or two pieces of the read at its edges)
    assert decodes and len(decodes) == len(set(decodes)), f"{len(decodes)} decodes of {len(set(decodes))} blocks"


@pytest.mark.parametrize("codec", ["xz", "zst"])
def test_a_damaged_frame_read_whole_is_decoded_once(tmp_path: Path, codec: str) -> None:
    """Every read of a member in an xz block or zstd frame damaged after indexing decoded the
    whole frame again before failing (a 12 MB xz block: ~1 s per member, 1-2 minutes to read
    them all through a mount; found by fuzzing). A frame that failed its checks now fails at
    once. Counted by the frame decodes, not by time."""
    from ratarmountcore.compression.framed import FramedReader

    rng = random.Random(11)
    members = {f"d/f{i:04}": rng.randbytes(rng.randint(500, 3000)).hex().encode() for i in range(800)}
    tar = tmp_path / "many.tar"
    tar.write_bytes(tar_bytes(members))
    archive = tmp_path / f"many.tar.{codec}"
    if codec == "xz":
        with open(tar, "rb") as src, open(archive, "wb") as dst:
            subprocess.run(["xz", "-c", "--block-size=1MiB"], stdin=src, stdout=dst, check=True)
    else:
        convert_to_seekable_zstd(str(tar), str(archive), frame_size=1 << 20, options=options())
        os.unlink(f"{archive}.index.sqlite")  # (indexed below, as the xz file is)
    os.utime(archive, ns=(10**18, 10**18))
    assert read_everything(archive, members) == (len(members), 0)  # (the index, built intact)
    zero_16_bytes_unsampled(archive)

    decodes: List[int] = []
    original = FramedReader._decode_checked

    def counted(self: FramedReader, frame: int, table: object) -> object:
        decodes.append(frame)
        return original(self, frame, table)  # type: ignore[arg-type]

    with mock.patch.object(FramedReader, "_decode_checked", counted):
        good, failed = read_everything(archive, members)
    assert good > 0 and failed > 1  # (several members in the damaged frame)
    assert len(decodes) == len(set(decodes)), f"{len(decodes)} decodes of {len(set(decodes))} frames"


@pytest.mark.parametrize("kind", DAMAGE_KINDS)
def test_truncated_archive_fails_with_one_line_naming_the_file(kind: str, small_tar: Path, tmp_path: Path) -> None:
    kind, opts = split_kind(kind)
    archive = compress(fresh_copy(small_tar, tmp_path), kind)
    raw = archive.read_bytes()
    archive.write_bytes(raw[: len(raw) * 6 // 10])
    with pytest.raises((ArchiveError, CorruptDataError)) as caught:
        with ratarmountcore.open(str(archive), opts) as src:
            for name in members_of(small_tar):
                src.read(name)
    message = str(caught.value)
    assert message.startswith(str(archive)) and "\n" not in message, message


@pytest.mark.parametrize("after", [b"", b"\x28\xb5\x2f\xfd"])
def test_truncated_skippable_zstd_frame_is_refused(after: bytes, small_tar: Path, tmp_path: Path) -> None:
    """A skippable frame (a seek table, say) that claims more bytes than the file holds: the
    file is truncated (``zstd -d``: "premature end"), not an empty or a shorter file."""
    frame = compress(fresh_copy(small_tar, tmp_path), "zst-cli").read_bytes()
    archive = tmp_path / "cut.tar.zst"
    archive.write_bytes(frame + b"\x5e\x2a\x4d\x18" + (100).to_bytes(4, "little") + b"s" * 40 + after)
    with pytest.raises(ArchiveError, match="truncated") as caught:
        ratarmountcore.open(str(archive), options()).close()
    assert str(caught.value).startswith(str(archive)) and "skippable frame" in str(caught.value)
    assert not list(tmp_path.glob("cut.tar.zst.index*"))


# --- single compressed files -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gz-cli", "bz2-cli", "zst-cli", "xz-cli", "zst-python-frames"])
def test_single_compressed_file_is_mounted_as_one_file(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(3)
    plain = tmp_path / "data.csv"
    rows = (b"%d,%d,%s\n" % (i, rng.randint(0, 10**9), rng.randbytes(8).hex().encode()) for i in range(60_000))
    content = b"".join(rows)
    plain.write_bytes(content)
    archive = compress(plain, kind)
    plain.unlink()
    name = os.path.splitext(archive.name)[0]  # data.csv.gz -> data.csv
    with ratarmountcore.open(str(archive), options()) as src:
        assert src.listdir("/") == [name]
        assert src.stat("/" + name).st_size == len(content)
        assert src.read("/" + name) == content
    # Second mount: valid index, no decompression to learn the size.
    import ratarmountcore.index.builder as builder

    monkeypatch.setattr(builder, "IndexWriter", _no_rebuild)
    with ratarmountcore.open(str(archive), options()) as src:
        reader: CompressedReader = src._reader  # type: ignore[attr-defined]
        reader.stats.reset()
        before = bytes_read_by_process()
        assert src.stat("/" + name).st_size == len(content)
        assert reader.stats.compressed_bytes_read == 0 and reader.stats.decoders_created == 0
        assert bytes_read_by_process() - before < 64 * 1024  # a few index pages at most
        with src.open("/" + name) as f:
            f.seek(len(content) // 2)
            assert f.read(1000) == content[len(content) // 2 : len(content) // 2 + 1000]


@pytest.mark.parametrize("kind", ["gz-cli", "bz2-cli", "zst-cli", "xz-cli"])
@pytest.mark.parametrize("layout", ["tar", "single file"])
def test_a_second_open_decodes_nothing_before_a_read(
    kind: str, layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the archive is a tar or a single file is in its index: a second open decoded the
    head to find out again (a .tar.bz2 a whole first block, 40 ms of a 0.15 s open)."""
    rng = random.Random(5)
    plain = tmp_path / ("data.tar" if layout == "tar" else "data.csv")
    if layout == "tar":
        make_tar(plain, rng, 60, 30_000)
    else:
        plain.write_bytes(b"".join(b"%d,%s\n" % (i, rng.randbytes(20).hex().encode()) for i in range(40_000)))
    content = plain.read_bytes()
    archive = compress(plain, kind)
    with ratarmountcore.open(str(archive), options()) as src:
        first = sorted(src.listdir("/"))
    import ratarmountcore.index.builder as builder

    monkeypatch.setattr(builder, "IndexWriter", _no_rebuild)
    with ratarmountcore.open(str(archive), options()) as src:
        reader: CompressedReader = src._reader  # type: ignore[attr-defined]
        assert reader.stats.compressed_bytes_read == 0 and reader.stats.decoders_created == 0
        assert sorted(src.listdir("/")) == first
        if layout == "tar":
            with tarfile.open(plain) as tar:
                member = next(m for m in tar.getmembers() if m.isfile() and m.size > 1000)
                assert src.read("/" + member.name) == tar.extractfile(member).read()  # type: ignore[union-attr]
        else:
            assert src.read("/data.csv") == content


def _pipe(command: List[str], data: bytes) -> bytes:
    return subprocess.run(command, input=data, capture_output=True, check=True).stdout


COMPRESSORS = {"gz": ["gzip", "-c"], "bz2": ["bzip2", "-c"], "xz": ["xz", "-c"], "zst": ["zstd", "-q", "-c"]}


def _gzip_member(data: bytes, comment: bytes = b"") -> bytes:
    flags = 16 if comment else 0  # FCOMMENT
    head = b"\x1f\x8b\x08" + bytes([flags]) + b"\0\0\0\0\0\x03" + (comment + b"\0" if comment else b"")
    deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
    body = deflate.compress(data) + deflate.flush()
    return head + body + (zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "little") + len(data).to_bytes(4, "little")


def _multi_stream_cases(tar: bytes) -> Dict[str, bytes]:
    """Files of several compressed streams whose first decodes to less than a tar header (found
    by fuzzing: xz stopped at the first stream's end; gzip at a member ending at byte 65536)."""
    xz = ["xz", "-c"]
    base = len(_gzip_member(tar[:100], b"c"))
    first = _gzip_member(tar[:100], b"c" * (65536 - base + 1))
    assert len(first) == 65536
    return {
        "xz, empty first stream": _pipe(xz, b"") + _pipe(xz, tar),
        "xz, first stream of 300 bytes": _pipe(xz, tar[:300]) + _pipe(xz, tar[300:]),
        "xz, first stream of 100 bytes and padding": _pipe(xz, tar[:100]) + bytes(8) + _pipe(xz, tar[100:]),
        "xz, 1 MiB of padding at the end": _pipe(xz, tar[:100]) + _pipe(xz, tar[100:]) + bytes((1 << 20) + 4),
        "gzip, first member ending at byte 65536": first + _gzip_member(tar[100:]),
    }


@pytest.mark.parametrize("case", list(_multi_stream_cases(b"x" * 1024)))
@pytest.mark.parametrize("backend", ["rapidgzip", "indexed_gzip"])
def test_a_short_first_stream_does_not_hide_the_tar(case: str, backend: str, tmp_path: Path) -> None:
    if backend != "rapidgzip" and not case.startswith("gzip"):
        pytest.skip("the gzip backend matters only for gzip")
    members = {"hello.txt": b"hello world\n" * 100, "b/c.bin": bytes(range(256)) * 30}
    tar = tar_bytes(members)
    path = tmp_path / ("x.tar.gz" if case.startswith("gzip") else "x.tar.xz")
    path.write_bytes(_multi_stream_cases(tar)[case])
    assert _pipe(["gzip" if case.startswith("gzip") else "xz", "-dc"], path.read_bytes()) == tar
    for _mount in range(2):
        with ratarmountcore.open(str(path), options(gzip_backend=backend)) as src:
            assert sorted(src.listdir("/")) == ["b", "hello.txt"]
            for name, data in members.items():
                assert src.read("/" + name) == data


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_compressed_data_starting_with_zeros_is_a_file_unless_all_zeros(suffix: str, tmp_path: Path) -> None:
    """A compressed disk image (an ext4 image starts with 1,024 zero bytes) is one file; it was an
    empty folder, its bytes hidden (found by fuzzing). All zeros, as an empty tar is, it is an
    empty archive, at the top and inside a tar (``-r``)."""
    rng = random.Random(5)
    image = bytearray(256 * 1024)
    image[1024:1124] = rng.randbytes(100)
    image[200_000:210_000] = rng.randbytes(10_000)
    empty_tar = tar_bytes({})
    assert not empty_tar.strip(b"\0")
    (tmp_path / f"disk.img.{suffix}").write_bytes(_pipe(COMPRESSORS[suffix], bytes(image)))
    (tmp_path / f"empty.tar.{suffix}").write_bytes(_pipe(COMPRESSORS[suffix], empty_tar))
    (tmp_path / "outer.tar").write_bytes(
        tar_bytes(
            {
                f"disk.img.{suffix}": (tmp_path / f"disk.img.{suffix}").read_bytes(),
                f"empty.tar.{suffix}": (tmp_path / f"empty.tar.{suffix}").read_bytes(),
            }
        )
    )
    for _mount in range(2):
        with ratarmountcore.open(str(tmp_path / f"disk.img.{suffix}"), options()) as src:
            assert src.listdir("/") == ["disk.img"]
            assert src.read("/disk.img") == bytes(image)
        with ratarmountcore.open(str(tmp_path / f"empty.tar.{suffix}"), options()) as src:
            assert src.listdir("/") == []
        with ratarmountcore.open(str(tmp_path / "outer.tar"), OpenOptions(recursive=True)) as src:
            assert src.info(f"/disk.img.{suffix}").is_file
            assert src.read(f"/disk.img.{suffix}") == (tmp_path / f"disk.img.{suffix}").read_bytes()
            assert src.info(f"/empty.tar.{suffix}").is_dir and src.listdir(f"/empty.tar.{suffix}") == []


def test_zstd_long_window_archive_is_read(tmp_path: Path) -> None:
    """``tar -I 'zstd --long=28'``: frames asking for a 256 MiB window, refused as corrupt
    ("Frame requires too much memory for decoding") though intact (found by fuzzing)."""
    members = {"a.bin": random.Random(4).randbytes(100_000), "b.txt": b"text\n" * 1000}
    tar = tar_bytes(members)
    path = tmp_path / "long.tar.zst"
    path.write_bytes(_pipe(["zstd", "--long=28", "-q", "-c", "-"], tar))  # (from a pipe: size unknown)
    assert subprocess.run(["zstd", "-d", "-c", str(path)], capture_output=True).returncode != 0  # (needs --long)
    for _mount in range(2):
        with ratarmountcore.open(str(path), options()) as src:
            for name, data in members.items():
                assert src.read("/" + name) == data


def _zip_bytes(data: bytes) -> bytes:
    import zipfile

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("x.txt", data)
    return out.getvalue()


@pytest.mark.parametrize(
    "name,make,said",
    [
        (
            "x.tar.lzma",
            lambda data: __import__("lzma").compress(data, format=__import__("lzma").FORMAT_ALONE),
            "LZMA-alone",
        ),
        ("x.tar.zz", zlib.compress, "zlib data"),
        ("x.zip", _zip_bytes, "a zip archive"),
    ],
)
def test_formats_we_do_not_read_are_named(name: str, make: object, said: str, tmp_path: Path) -> None:
    """Not "not a tar archive (112 bytes, shorter than one tar header)", which counted compressed
    bytes of a .tar.lzma (found by fuzzing)."""
    path = tmp_path / name
    path.write_bytes(make(tar_bytes({"a.txt": b"a" * 2000})))  # type: ignore[operator]
    with pytest.raises(ArchiveError) as caught:
        ratarmountcore.open(str(path), options())
    assert str(caught.value).startswith(f"{path}: not a tar archive: {said}")
    assert sorted(os.listdir(tmp_path)) == [name]  # (no index, no temporary file)


def test_bzip2_decoders_together_use_no_more_threads_than_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rapidgzip's parallel bzip2 decoder speculates on its other threads: two of them on two
    cores thrashed, so readers at once share one decoder of all cores."""
    import ratarmountcore.compression.pooled as pooled

    monkeypatch.setattr(pooled, "usable_cores", lambda: 2)
    rng = random.Random(7)
    content = b"".join(b"%d %s\n" % (i, rng.randbytes(20).hex().encode()) for i in range(40_000))
    path = tmp_path / "x.bz2"
    path.write_bytes(bz2.compress(content, 1))  # blocks of 100 kB: many seek points
    with open_compressed(
        str(path), PlainFileReader(str(path)), FormatId.BZIP2, CompressionOptions(parallelization=2)
    ) as reader:
        offsets = [rng.randrange(len(content) - 5000) for _ in range(64)]
        with ThreadPoolExecutor(4) as pool:
            found = list(pool.map(lambda o: reader.pread(o, 5000), offsets))
        assert found == [content[o : o + 5000] for o in offsets]
        assert reader.stats.decoders_created == 1


def test_reader_stream_learns_size_from_reader(tmp_path: Path) -> None:
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(b"abc" * 100_000))
    with open_compressed(str(path), PlainFileReader(str(path)), FormatId.GZIP, CompressionOptions()) as reader:
        stream = ReaderStream(reader, None)
        assert stream.seek(0, io.SEEK_END) == 300_000
        assert reader.size == 300_000


# --- converter ---------------------------------------------------------------------------------
def _no_rebuild(*args: object, **kwargs: object) -> None:
    raise AssertionError("the index was rebuilt")


@pytest.mark.parametrize("kind", ["gz-cli", "xz-cli", "plain"])
def test_converter_output_opens_without_rescan(
    kind: str, small_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = fresh_copy(small_tar, tmp_path)
    if kind != "plain":
        source = compress(source, kind)
    out = tmp_path / "converted.tar.zst"
    result = convert_to_seekable_zstd(str(source), str(out), frame_size=128 * 1024, level=3, options=options())
    assert result.layout == "tar"
    assert result.index_path == str(out) + ".index.sqlite"
    assert result.frames == -(-small_tar.stat().st_size // (128 * 1024))
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    if shutil.which("zstd"):
        assert subprocess.run(["zstd", "-d", "-c", str(out)], capture_output=True, check=True).stdout == (
            small_tar.read_bytes()
        )
    # Every frame decompresses on its own and carries a checksum.
    import zstandard

    raw = out.read_bytes()
    index = IndexReader(result.index_path)
    parts = index.seek_point_parts("zstandard")
    index.close()
    table = FrameTable.unpack(b"".join(parts[1:]))
    for offset, size in zip(table.comp_offsets, table.comp_sizes):
        assert zstandard.get_frame_parameters(raw[offset : offset + size]).has_checksum
        zstandard.ZstdDecompressor().decompress(raw[offset : offset + size])

    import ratarmountcore.index.builder as builder

    monkeypatch.setattr(builder, "IndexWriter", _no_rebuild)
    with ratarmountcore.open(str(out), options()) as src:
        compare_with_tarfile(src, small_tar)


@pytest.mark.parametrize("strip", [False, True])
def test_a_recursive_conversion_opens_recursively_without_rescan(
    strip: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ratarmount-convert -r`` recorded no inner-archive rules in its index, so the first
    recursive mount of its output rebuilt the index (found by fuzzing)."""
    inner = tar_bytes({"a": b"hello\n"})
    outer = tmp_path / "outer.tar"
    outer.write_bytes(tar_bytes({"inner.tar": inner, "b": b"x"}))
    out = tmp_path / "o.tar.zst"
    recursive = dataclasses.replace(options(), recursive=True, strip_tar_extension=strip)
    convert_to_seekable_zstd(str(outer), str(out), frame_size=128 * 1024, options=recursive)

    import ratarmountcore.index.builder as builder

    monkeypatch.setattr(builder, "IndexWriter", _no_rebuild)
    with ratarmountcore.open(str(out), recursive) as src:
        folder = "/inner" if strip else "/inner.tar"
        assert sorted(src.listdir("/")) == sorted([folder[1:], "b"])
        with src.open(folder + "/a") as f:
            assert f.read() == b"hello\n"


def test_a_recursive_conversion_keeps_compressed_inner_archives_as_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the converter's output (a .tar.zst) a .tar.gz or .tar.bz2 member is a compressed
    archive inside a compressed one: its index shows it as a folder, as a mount of the output
    does, and the first mount uses that index as it is."""
    files = {f"f{i}": os.urandom(3000) + b"text " * i for i in range(12)}
    members = {"c.tar.gz": gzip.compress(tar_bytes(files)), "d.tar.bz2": bz2.compress(tar_bytes(files)), "b": b"x"}
    outer = tmp_path / "outer.tar"
    outer.write_bytes(tar_bytes(members))
    out = tmp_path / "o.tar.zst"
    recursive = dataclasses.replace(options(), recursive=True)
    convert_to_seekable_zstd(str(outer), str(out), frame_size=16 * 1024, options=recursive)
    with open(out, "rb") as f:
        assert (
            subprocess.run(["zstd", "-d", "-c"], stdin=f, capture_output=True, check=True).stdout == outer.read_bytes()
        )

    import ratarmountcore.index.builder as builder

    monkeypatch.setattr(builder, "IndexWriter", _no_rebuild)
    with ratarmountcore.open(str(out), recursive) as src:
        for folder in ("/c.tar.gz", "/d.tar.bz2"):
            assert src.is_dir(folder) and src.listdir(folder) == sorted(files)
            for name, data in files.items():
                assert src.read(f"{folder}/{name}") == data
        assert src.read("/b") == b"x"


def test_converter_single_file_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ratarmount.convert_cli import main

    content = b"hello, world\n" * 100_000
    source = tmp_path / "log.txt.gz"
    source.write_bytes(gzip.compress(content))
    out = tmp_path / "log.txt.zst"
    assert main([str(source), str(out), "--frame-size", "0.25", "--no-progress"]) == 0
    # SIGTERM is back at its default (a handler left behind outlives its main(): forked workers
    # stuck where no Python code runs then survived Pool.terminate()).
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with ratarmountcore.open(str(out), options()) as src:
        assert src.listdir("/") == ["log.txt"]
        assert src.read("/log.txt") == content
    capsys.readouterr()
    assert main([str(source), str(out), "--no-progress"]) != 0  # exists, no --force
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "already exists" in error
    assert main([str(tmp_path / "missing.tar"), str(tmp_path / "x.tar.zst")]) != 0
    assert "missing.tar" in capsys.readouterr().err
    assert main([str(source), str(out), "--force", "--no-progress"]) == 0


# --- concurrency -------------------------------------------------------------------------------
def hammer(src: ratarmountcore.MountSource, expected: Dict[str, bytes], reads: int = 240) -> None:
    names = sorted(name for name, data in expected.items() if data)
    rng = random.Random(5)
    jobs: List[Tuple[str, int, int]] = []
    for _ in range(reads):
        name = rng.choice(names)
        size = len(expected[name])
        offset = rng.randrange(size)
        jobs.append((name, offset, rng.randint(1, 200_000)))

    def one(job: Tuple[str, int, int]) -> bool:
        name, offset, length = job
        with src.open(name) as f:
            f.seek(offset)
            return f.read(length) == expected[name][offset : offset + length]

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, jobs))


@pytest.mark.parametrize("kind", ["gz-cli", "bz2-cli", "zst-cli", "zst-python-frames", "xz-cli-blocks"])
def test_concurrent_reads_from_8_threads(kind: str, small_tar: Path, tmp_path: Path) -> None:
    archive = compress(fresh_copy(small_tar, tmp_path), kind)
    with ratarmountcore.open(str(archive), options(parallelization=2)):
        pass  # build the index
    with ratarmountcore.open(str(archive), options(parallelization=2)) as src:
        hammer(src, members_of(small_tar))


def test_single_frame_zstd_streams_warns_once_and_stays_correct(
    small_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Pretend frames above 256 KiB are too big to cache, so this single-frame file takes the
    # streaming path (one cursor per thread, restarted at the frame start when needed).
    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 256 * 1024)
    archive = compress(fresh_copy(small_tar, tmp_path), "zst-cli")
    with caplog.at_level(logging.WARNING, logger="ratarmountcore"):
        with ratarmountcore.open(str(archive), options(parallelization=2)) as src:
            hammer(src, members_of(small_tar), reads=120)
    warnings = [r for r in caplog.records if "frame" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "ratarmount-convert" in warnings[0].getMessage()


def test_close_releases_the_file_and_refuses_reads(small_tar: Path, tmp_path: Path) -> None:
    archive = compress(fresh_copy(small_tar, tmp_path), "gz-cli")
    src = ratarmountcore.open(str(archive), options(parallelization=2))
    reader: CompressedReader = src._reader  # type: ignore[attr-defined]
    hammer(src, members_of(small_tar), reads=16)
    src.close()
    assert reader._plain.fd == -1  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        reader.pread(0, 10)


def test_the_first_pass_leaves_no_decoder_behind(small_tar: Path, tmp_path: Path) -> None:
    """A .tar.gz small enough for its first pass in-process: once its index is built, no
    decoder of that pass is kept (each held the chunks it decoded last, up to the whole stream:
    a folder of 20 such archives of 8 MB held 322 MiB after its first mount, 31 MiB after a
    second). Reads afterwards make decoders from the stored seek points, and read right."""
    expected = members_of(small_tar)
    archive = compress(fresh_copy(small_tar, tmp_path), "gz-cli")
    with ratarmountcore.open(str(archive), options(parallelization=2)) as src:
        reader = src._reader  # type: ignore[attr-defined]
        assert reader._process_scan is None  # (the first pass ran here)  # noqa: SLF001
        assert sum(pool.live_instances for pool in reader._pools()) == 0  # noqa: SLF001
        for name, data in expected.items():
            assert src.read(name) == data, name


def test_idle_parallel_decoders_are_bounded_by_their_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle decoders count against a process-wide weight of threads as well as a count: a
    parallel decoder keeps the chunks its threads decoded (~10 MiB for rapidgzip with 4), so
    large reads across 20 .tar.gz kept 16 of them (157 MiB) where the count alone bounded it."""
    from ratarmountcore.compression import pool

    monkeypatch.setattr(pool, "IDLE_WEIGHT", 8, raising=False)
    rng = random.Random(11)
    sources = []
    try:
        for i in range(6):
            data = rng.randbytes(1 << 20)
            archive = tmp_path / f"{i}.tar.gz"
            archive.write_bytes(gzip.compress(tar_bytes({"big": data}), 1))
            # (No span cache: the read goes to a parallel decoder, not through the cache.)
            sources.append(ratarmountcore.open(str(archive), options(parallelization=4, cache_size=0)))
            assert sources[-1].read("big") == data
        live = [src._reader._pool.live_instances for src in sources]  # type: ignore[attr-defined]
        assert sum(live) * 4 <= 8, live  # two decoders of 4 threads at most
        assert all(src.read("big") for src in sources)  # evicted decoders come back
    finally:
        for src in sources:
            src.close()


def test_memory_bounds_across_readers(small_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle decoders are limited process-wide, decoded frames by one shared cache budget."""
    from ratarmountcore.compression import framed, pool

    monkeypatch.setattr(pool, "IDLE_LIMIT", 3)
    expected = members_of(small_tar)
    name, data = next((n, d) for n, d in expected.items() if d)
    sources = []
    try:
        for i in range(6):
            folder = tmp_path / str(i)
            folder.mkdir()
            archive = compress(fresh_copy(small_tar, folder), "gz-cli")
            sources.append(ratarmountcore.open(str(archive), options(parallelization=1)))
            assert sources[-1].read(name) == data
        assert sum(src._reader._pool.live_instances for src in sources) <= 3  # type: ignore[attr-defined]
        assert all(src.read(name) == data for src in sources)  # evicted decoders come back
    finally:
        for src in sources:
            src.close()

    # (A cache of the process's own: the largest size any reader gave is its budget.)
    monkeypatch.setattr(framed, "FRAME_CACHE", framed.FrameCache(framed.FRAME_CACHE_BYTES))
    archive = compress(fresh_copy(small_tar, tmp_path), "zst-python-frames")
    with ratarmountcore.open(str(archive), options(cache_size=3 * SPACING)) as src:
        for member, content in expected.items():
            assert src.read(member) == content
            assert framed.FRAME_CACHE.cached_bytes <= 4 * SPACING
    assert framed.FRAME_CACHE.cached_bytes == 0  # closing drops the reader's frames


@pytest.mark.parametrize("kind", ["zst-python-frames", "xz-cli-blocks"])
def test_sequential_reads_decode_following_frames_ahead(
    kind: str, large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratarmountcore.compression.framed import FramedReader

    archive = compress(fresh_copy(large_tar, tmp_path), kind)
    decoded_by: Dict[int, str] = {}
    plain = large_tar.read_bytes()
    fmt = FormatId.ZSTD if kind.startswith("zst") else FormatId.XZ
    opts = CompressionOptions(parallelization=2)
    with open_compressed(str(archive), PlainFileReader(str(archive)), fmt, opts) as reader:
        assert isinstance(reader, FramedReader)
        original = type(reader)._decode_frame

        def recording(self: FramedReader, frame: int, table: FrameTable) -> bytes:
            decoded_by[frame] = threading.current_thread().name
            return original(self, frame, table)  # type: ignore[arg-type, return-value]

        monkeypatch.setattr(type(reader), "_decode_frame", recording)
        assert isinstance(reader, FramedReader) and len(reader.frames) >= 4
        # Random reads of far-apart frames (members' data: never at offset 0, which a scan
        # starts at): nothing is decoded ahead.
        frames = reader.frames
        for frame in (len(frames) - 1, 0, len(frames) // 2):
            offset = frames.decomp_offsets[frame] + 512
            assert reader.pread(offset, 100) == plain[offset : offset + 100]
        # A member read in pieces inside one frame (the kernel's reads of one small file) either.
        mid = frames.decomp_offsets[len(frames) // 2]
        for piece in range(0, 8192, 1024):
            assert reader.pread(mid + piece, 1024) == plain[mid + piece : mid + piece + 1024]
        assert not any("ahead" in name for name in decoded_by.values())
        # A sequential pass: later frames come from the decode-ahead threads, bytes unchanged;
        # its first read (offset 0) already starts the threads on frame 1.
        data = b"".join(reader.pread(offset, 256 * 1024) for offset in range(0, len(plain), 256 * 1024))
        assert data == plain
        assert sum("ahead" in name for name in decoded_by.values()) >= len(frames) // 2
        assert "ahead" in decoded_by[1]


def test_reads_back_and_forth_across_a_frame_boundary_decode_each_frame_once(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members read in name order jump between two neighbouring frames (a folder straddling a
    boundary): once a frame has to be decoded a second time, the cache makes room for two of the
    largest frames, so neither is decoded again, even when its configured budget holds only one."""
    from ratarmountcore.compression import framed

    monkeypatch.setattr(framed, "FRAME_CACHE", framed.FrameCache(256 * 1024))  # one 256 KiB block
    archive = compress(fresh_copy(large_tar, tmp_path), "xz-cli-blocks")
    plain = large_tar.read_bytes()
    opts = CompressionOptions(parallelization=1, cache_size=256 * 1024)  # no decode-ahead: every decode is a miss
    with open_compressed(str(archive), PlainFileReader(str(archive)), FormatId.XZ, opts) as reader:
        assert isinstance(reader, framed.FramedReader)
        frames = reader.frames
        boundary = frames.decomp_offsets[len(frames) // 2]
        for _ in range(10):
            for offset in (boundary - 3000, boundary + 2000):
                assert reader.pread(offset, 1000) == plain[offset : offset + 1000]
        assert reader.stats.frames_decoded == 3  # both, then the first once more (the cache grows)
        assert framed.FRAME_CACHE.budget >= 2 * max(frames.decomp_sizes)


@pytest.mark.parametrize(("cache_mib", "files", "whole"), [(4, 1, True), (3, 1, False), (4, 2, False)])
def test_a_file_of_at_most_three_caches_is_kept_whole_once_read_at_random(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_mib: int, files: int, whole: bool
) -> None:
    """Random reads of an xz or zstd file of at most three times the cache (``KEPT_WHOLE_FACTOR``)
    grow the cache to hold it when a frame is decoded again: after that, each frame evicted
    before is decoded once more at most, and a third round decodes nothing. A larger file, or
    files read together that are larger (a union), keep the cache's size and decode frames again
    (up to the blocks a read needs; files open but not read do not count:
    test_competing_streams.py). A 68 MB .tar.xz of three 24 MiB blocks took 0.33 s for
    every random read before."""
    from ratarmountcore.compression import framed
    from ratarmountcore.compression.xz import XzReader

    monkeypatch.setattr(framed, "FRAME_CACHE", framed.FrameCache(framed.FRAME_CACHE_BYTES))
    archive = compress(fresh_copy(large_tar, tmp_path), "xz-cli-blocks")  # ~10 MB, 256 KiB blocks
    expected = members_of(large_tar)
    names = list(expected)
    opts = OpenOptions(index=IndexOptions(progress=False), compression=CompressionOptions(cache_size=cache_mib << 20))
    ratarmountcore.open(str(archive), opts).close()  # (the index, with the block checksums)
    decodes: List[int] = []
    open_stream, decode_whole = XzReader._open_stream, framed.FramedReader._decode_checked

    def streamed(self, frame, table):  # type: ignore[no-untyped-def]
        decodes.append(frame)
        return open_stream(self, frame, table)

    def decoded(self, frame, table):  # type: ignore[no-untyped-def]
        decodes.append(frame)
        return decode_whole(self, frame, table)

    monkeypatch.setattr(XzReader, "_open_stream", streamed)
    monkeypatch.setattr(framed.FramedReader, "_decode_checked", decoded)
    others = []
    for k in range(files - 1):  # the same file under other names, open and read beside it
        other = tmp_path / f"other{k}.tar.xz"
        shutil.copyfile(archive, other)
        others.append(ratarmountcore.open(str(other), opts))
        small = min((n for n in names if expected[n]), key=lambda n: len(expected[n]))  # (grows no cache)
        assert others[-1].read(small) == expected[small]
    with ratarmountcore.open(str(archive), opts) as src:
        size = src._reader.frames.size  # type: ignore[attr-defined]
        assert (files * size <= framed.KEPT_WHOLE_FACTOR * (cache_mib << 20)) is whole and size > cache_mib << 20
        for round_ in range(3):
            random.Random(round_).shuffle(names)
            decodes.clear()
            for name in names:
                assert src.read(name) == expected[name], name
        assert (not decodes) is whole, f"frames decoded in the third round: {len(decodes)}"
        assert (framed.FRAME_CACHE.budget >= size) is whole
    for other_source in others:
        other_source.close()
    assert framed.FRAME_CACHE.files() == 0  # (closed readers no longer count)


def test_large_blocks_of_a_file_kept_whole_are_not_reported(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A file of at most three caches is kept whole once read at random: its large blocks are
    decoded once or twice each, so random reads are not slow and nothing is said."""
    from ratarmountcore.compression import framed

    monkeypatch.setattr(framed, "SLOW_FRAME_BYTES", 200 * 1024)
    monkeypatch.setattr(framed, "FRAME_CACHE", framed.FrameCache(framed.FRAME_CACHE_BYTES))
    archive = compress(fresh_copy(large_tar, tmp_path), "xz-cli-blocks")
    with caplog.at_level(logging.WARNING, logger="ratarmountcore"):
        with ratarmountcore.open(str(archive), options(cache_size=4 << 20)) as src:  # (~10 MB: kept whole)
            for member in list(members_of(large_tar))[:5]:
                src.read(member)
    assert not [r for r in caplog.records if "random access will be slow" in r.getMessage()]


def test_large_xz_blocks_are_reported_once_with_the_remedy(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Blocks that are cached whole but large (``xz -T0`` writes 24 MiB) make every random miss
    decode a whole block: the user is told once, with the way out."""
    archive, warnings = slow_frame_warnings("xz-cli-blocks", large_tar, tmp_path, monkeypatch, caplog, reads=5)
    assert len(warnings) == 1
    assert str(archive) in warnings[0] and "ratarmount-convert" in warnings[0] and "0 MiB" in warnings[0]
    assert_miss_estimate(warnings[0], largest_mib=0.25, mib_per_second=30)


def slow_frame_warnings(
    kind: str, tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, reads: int
) -> Tuple[Path, List[str]]:
    """The warnings about slow random access from reading ``reads`` members of ``tar``
    compressed as ``kind``, with frames above 200 KiB taken for large."""
    from ratarmountcore.compression import framed

    monkeypatch.setattr(framed, "SLOW_FRAME_BYTES", 200 * 1024)  # (the xz test file's blocks: 256 KiB)
    # A cache too small to grow to the whole file (a file of at most three caches is kept whole
    # once read at random, and not said to be slow).
    monkeypatch.setattr(framed, "FRAME_CACHE", framed.FrameCache(framed.FRAME_CACHE_BYTES))
    archive = compress(fresh_copy(tar, tmp_path), kind)
    with caplog.at_level(logging.WARNING, logger="ratarmountcore"):
        with ratarmountcore.open(str(archive), options(cache_size=1 << 20)) as src:
            for member in list(members_of(tar))[:reads]:
                src.read(member)
    return archive, [r.getMessage() for r in caplog.records if "random access will be slow" in r.getMessage()]


def assert_miss_estimate(message: str, largest_mib: float, mib_per_second: float) -> None:
    """The warning's time for a miss that decodes the largest frame whole follows the format's
    decoding speed (a zstd frame decodes ~20 times as fast as an xz block of the same size)."""
    match = re.search(r"about ([0-9.e+-]+) s on one core", message)
    assert match, message
    assert float(match.group(1)) == pytest.approx(largest_mib / mib_per_second, rel=0.05)


def test_a_large_zstd_frame_is_reported_with_zstd_s_decoding_time(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _archive, warnings = slow_frame_warnings("zst-cli", large_tar, tmp_path, monkeypatch, caplog, reads=1)
    assert len(warnings) == 1, warnings
    largest = large_tar.stat().st_size / 2**20  # one frame
    assert_miss_estimate(warnings[0], largest_mib=largest, mib_per_second=500)


def test_frames_decoded_ahead_are_bounded_by_bytes(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However many threads decode, the frames held ahead of a sequential reader stay within
    ``AHEAD_BYTES`` (at least one frame): large xz blocks must not pile up in memory."""
    from ratarmountcore.compression import framed

    archive = compress(fresh_copy(large_tar, tmp_path), "xz-cli-blocks")
    monkeypatch.setattr(framed, "AHEAD_BYTES", 256 * 1024)  # one block (the last, shorter one too)
    plain = large_tar.read_bytes()
    most_held = 0
    with open_compressed(
        str(archive), PlainFileReader(str(archive)), FormatId.XZ, CompressionOptions(parallelization=4)
    ) as reader:
        assert isinstance(reader, framed.FramedReader)
        original = framed.FramedReader._decode_ahead

        def watching(self: framed.FramedReader, table: FrameTable, first: int) -> None:
            nonlocal most_held
            original(self, table, first)
            most_held = max(most_held, len(self._ahead))

        monkeypatch.setattr(framed.FramedReader, "_decode_ahead", watching)
        data = b"".join(reader.pread(offset, 64 * 1024) for offset in range(0, len(plain), 64 * 1024))
    assert data == plain
    assert most_held == 1


def test_reader_stream_never_rereads_what_it_already_read() -> None:
    """Reads straddling the read-ahead window continue at its end: a streaming decoder below
    sees forward reads only (an overlap made single-frame zstd restart its frame per window)."""
    data = bytes(random.Random(4).getrandbits(8) for _ in range(300_000))
    calls: List[Tuple[int, int]] = []

    class Recording:
        size = len(data)

        def pread(self, offset: int, size: int) -> bytes:
            calls.append((offset, size))
            return data[offset : offset + size]

    stream = ReaderStream(Recording(), len(data), read_ahead=16 * 1024)  # type: ignore[arg-type]
    rng = random.Random(5)
    while True:
        if rng.random() < 0.1:
            stream.seek(rng.randrange(0, 3000), io.SEEK_CUR)  # skip a member's data
        position = stream.tell()
        chunk = stream.read(rng.choice([512, 5000, 10_000]))
        assert chunk == data[position : position + len(chunk)]
        if not chunk:
            break
    ends = [offset + size for offset, size in calls]
    assert all(calls[i + 1][0] >= min(ends[i], len(data)) for i in range(len(calls) - 1)), calls


def test_single_frame_zstd_index_build_streams_the_frame_once(
    tmp_path: Path, large_tar: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratarmountcore.compression.zstd import ZstdReader

    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 1 << 20)  # stream the 10 MB frame
    archive = compress(fresh_copy(large_tar, tmp_path), "zst-cli")
    opened = []
    original = ZstdReader._open_stream

    def counting(self: ZstdReader, frame: int, table: FrameTable):  # type: ignore[no-untyped-def]
        opened.append(frame)
        return original(self, frame, table)

    ZstdReader._open_stream = counting  # type: ignore[method-assign]
    try:
        with ratarmountcore.open(str(archive), options()) as src:
            streams_for_index = len(opened)
            compare_with_tarfile(src, large_tar)
    finally:
        ZstdReader._open_stream = original  # type: ignore[method-assign]
    assert streams_for_index == 1  # building the index decodes the frame in one forward pass


def _zstd_without_content_size(plain: bytes, frame_size: int) -> bytes:
    """Frames whose headers leave out the decompressed size (like `zstd` reading a pipe)."""
    import zstandard

    compressor = zstandard.ZstdCompressor(level=1, write_content_size=False, write_checksum=True)
    return b"".join(compressor.compress(plain[i : i + frame_size]) for i in range(0, len(plain), frame_size))


@pytest.mark.parametrize("frame_size", [1 << 30, 3 << 20])
def test_zstd_frames_without_content_size_are_measured_and_the_first_one_kept(
    frame_size: int, large_tar: Path, tmp_path: Path
) -> None:
    """A frame without a content size is decoded once to measure it. The first frame, if small
    enough to cache, is kept from that pass, so the scan does not decode it again; later frames
    and a single large frame are measured only (and the bytes always come out right)."""
    from ratarmountcore.compression import framed

    plain = large_tar.read_bytes()
    archive = tmp_path / "piped.tar.zst"
    archive.write_bytes(_zstd_without_content_size(plain, frame_size))
    with open_compressed(str(archive), PlainFileReader(str(archive)), FormatId.ZSTD, CompressionOptions()) as reader:
        assert isinstance(reader, framed.FramedReader)
        table = reader.frames
        assert table.size == len(plain) and len(table) == -(-len(plain) // min(frame_size, len(plain)))
        assert reader.stats.frames_decoded == 0
        assert reader.pread(5000, 1000) == plain[5000:6000]
        assert reader.stats.frames_decoded == 0  # frame 0 came from the measuring pass
        last = len(plain) - 1000
        assert reader.pread(last, 1000) == plain[last:]
    with ratarmountcore.open(str(archive), options()) as src:
        for name, data in members_of(large_tar).items():
            assert src.read(name) == data


def test_zstd_first_frame_too_large_to_keep_is_only_measured(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratarmountcore.compression import framed

    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 1 << 20)  # the test frame is ~10 MB
    plain = large_tar.read_bytes()
    archive = tmp_path / "piped.tar.zst"
    archive.write_bytes(_zstd_without_content_size(plain, 1 << 30))
    with open_compressed(str(archive), PlainFileReader(str(archive)), FormatId.ZSTD, CompressionOptions()) as reader:
        assert isinstance(reader, framed.FramedReader)
        assert reader.size == len(plain) and len(reader.frames) == 1
        assert framed.FRAME_CACHE.get((reader._token, 0)) is None
        assert reader.pread(len(plain) - 3000, 2000) == plain[-3000:-1000]


def test_zstd_corrupt_frame_without_content_size_is_refused(large_tar: Path, tmp_path: Path) -> None:
    plain = large_tar.read_bytes()
    data = bytearray(_zstd_without_content_size(plain, 1 << 30))
    data[len(data) // 2] ^= 0xFF
    archive = tmp_path / "piped.tar.zst"
    archive.write_bytes(bytes(data))
    with pytest.raises((CorruptDataError, ArchiveError)):
        with ratarmountcore.open(str(archive), options()) as src:
            for name in members_of(large_tar):
                src.read(name)
    assert not list(tmp_path.glob("*.index.sqlite*"))


@pytest.mark.parametrize("kind", ["zst-cli", "xz-cli"])
def test_corrupt_large_frame_fails_the_index_build_through_the_read_ahead_thread(
    kind: str, large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame too large to cache is decoded ahead by a thread of its own; a corrupt byte near
    its end still fails the first mount with a data error and leaves no index behind."""
    from ratarmountcore.compression import xz

    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 1 << 20)
    monkeypatch.setattr(xz.XzReader, "whole_frame_limit", 1 << 20)
    archive = compress(fresh_copy(large_tar, tmp_path), kind)
    data = bytearray(archive.read_bytes())
    data[len(data) - 5000] ^= 0x55
    archive.write_bytes(bytes(data))
    before = threading.active_count()
    with pytest.raises((CorruptDataError, ArchiveError)):
        with ratarmountcore.open(str(archive), options(parallelization=2)):
            pass
    assert not list(tmp_path.glob("*.index.sqlite*"))
    assert threading.active_count() == before


def test_large_frames_are_decoded_ahead_for_sequential_readers_only(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread decodes a large frame ahead once reads move forward in small steps (a scan, a
    copy); reads that jump around get none (what it decoded past their target would be waste)."""
    from ratarmountcore.compression import framed, stream_ahead

    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 1 << 20)
    archive = compress(fresh_copy(large_tar, tmp_path), "zst-cli")
    plain = large_tar.read_bytes()
    made: List[int] = []
    original = stream_ahead.ReadAheadStream.__init__

    def counting(self, stream, *args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(1)
        original(self, stream, *args, **kwargs)

    monkeypatch.setattr(stream_ahead.ReadAheadStream, "__init__", counting)
    with open_compressed(str(archive), PlainFileReader(str(archive)), FormatId.ZSTD, CompressionOptions()) as reader:
        assert isinstance(reader, framed.FramedReader) and len(reader.frames) == 1
        rng = random.Random(4)
        for _ in range(12):  # far apart, back and forth
            offset = rng.randrange(len(plain) - 5000)
            assert reader.pread(offset, 5000) == plain[offset : offset + 5000]
        assert made == []
        for offset in range(0, 3_000_000, 300_000):  # forward in small steps
            assert reader.pread(offset, 1000) == plain[offset : offset + 1000]
        assert 1 <= len(made) <= 3  # (the cursors the random reads left behind may take turns)


def test_last_large_frame_without_content_size_is_decoded_once_at_the_first_mount(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tar -I zstd` writes one frame without a content size. When it is too large to cache it
    gets an upper bound instead of a measuring pass; the scan's stream settles the size at the
    frame's end, so the first mount decodes the frame once, and the stored table is exact."""
    from ratarmountcore.compression import framed

    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 1 << 20)
    plain = large_tar.read_bytes()
    archive = tmp_path / "piped.tar.zst"
    archive.write_bytes(_zstd_without_content_size(plain, 1 << 30))
    opened: List[int] = []
    original = ZstdReader._open_stream

    def counting(self: ZstdReader, frame: int, table: FrameTable):  # type: ignore[no-untyped-def]
        opened.append(frame)
        return original(self, frame, table)

    monkeypatch.setattr(ZstdReader, "_open_stream", counting)
    with ratarmountcore.open(str(archive), options()) as src:
        assert len(opened) == 1  # one pass: no measuring, no second stream to settle the size
        for name, data in members_of(large_tar).items():
            assert src.read(name) == data
    with open_compressed(str(archive), PlainFileReader(str(archive)), FormatId.ZSTD, CompressionOptions()) as reader:
        assert isinstance(reader, framed.FramedReader)
        assert reader.frames.open_end
        tail = reader.pread(len(plain) - 700, 5000)  # past the true end, inside the bound
        assert tail == plain[-700:] and not reader.frames.open_end and reader.size == len(plain)
        assert reader.pread(len(plain), 10) == b""
    with open_compressed(str(archive), PlainFileReader(str(archive)), FormatId.ZSTD, CompressionOptions()) as reader:
        assert reader.size == len(plain)  # asking for the size settles it (decodes to the end)


def test_single_compressed_file_without_content_size_has_its_exact_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 256 * 1024)
    data = random.Random(8).randbytes(900_000) + b"line\n" * 50_000
    archive = tmp_path / "data.bin.zst"
    archive.write_bytes(_zstd_without_content_size(data, 1 << 30))
    with ratarmountcore.open(str(archive), options()) as src:
        (name,) = [n for n, _ in src.list_entries("/")]
        assert src.stat("/" + name).st_size == len(data)
        assert src.read("/" + name) == data


def test_corrupt_open_ended_frame_fails_the_first_mount(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 1 << 20)
    data = bytearray(_zstd_without_content_size(large_tar.read_bytes(), 1 << 30))
    data[-3000] ^= 0x40
    archive = tmp_path / "piped.tar.zst"
    archive.write_bytes(bytes(data))
    with pytest.raises((CorruptDataError, ArchiveError)):
        ratarmountcore.open(str(archive), options()).close()
    assert not list(tmp_path.glob("*.index.sqlite*"))


def test_open_ended_frame_read_past_its_end_from_many_threads(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 1 << 20)
    plain = large_tar.read_bytes()
    archive = tmp_path / "piped.tar.zst"
    archive.write_bytes(_zstd_without_content_size(plain, 1 << 30))
    for _ in range(3):
        raw = PlainFileReader(str(archive))
        with open_compressed(str(archive), raw, FormatId.ZSTD, CompressionOptions()) as reader:
            assert reader.frames.open_end  # type: ignore[attr-defined]
            offsets = [len(plain) - 700 - 100 * i for i in range(6)]
            with ThreadPoolExecutor(6) as pool:
                results = list(pool.map(lambda o: reader.pread(o, 50_000), offsets))
            assert results == [plain[o:] for o in offsets]
            assert reader.size == len(plain)


def test_read_sized_by_the_open_end_after_another_thread_settled_it(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read whose bound came from the open end's upper bound, but which runs after the size
    was settled, returns what there is (nothing, past the end) instead of failing."""
    from ratarmountcore.compression import framed

    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 1 << 20)
    plain = large_tar.read_bytes()
    archive = tmp_path / "piped.tar.zst"
    archive.write_bytes(_zstd_without_content_size(plain, 1 << 30))
    raw = PlainFileReader(str(archive))
    with open_compressed(str(archive), raw, FormatId.ZSTD, CompressionOptions()) as reader:
        assert isinstance(reader, framed.FramedReader)
        bound = reader.frames.size
        assert reader.frames.open_end and bound > len(plain)
        assert reader.pread(len(plain) - 10, 100) == plain[-10:]  # settles it
        monkeypatch.setattr(framed.FrameTable, "size", property(lambda _self: bound))  # as seen before
        assert reader.pread(len(plain) + 100, 50) == b""
        assert reader.pread(len(plain) - 20, 50) == plain[-20:]


def test_converting_a_single_frame_zstd_does_not_advise_converting_it(
    large_tar: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The converter reads its source once, start to end: the warning about slow random access
    (which recommends the converter) is not shown; the same file opened for mounting shows it."""
    monkeypatch.setattr(ZstdReader, "whole_frame_limit", 1 << 20)
    source = tmp_path / "piped.tar.zst"
    source.write_bytes(_zstd_without_content_size(large_tar.read_bytes(), 1 << 30))
    with caplog.at_level(logging.WARNING, logger="ratarmountcore"):
        convert_to_seekable_zstd(str(source), str(tmp_path / "out.tar.zst"), frame_size=1 << 20, options=options())
    assert not [r for r in caplog.records if "random access" in r.getMessage()]
    with caplog.at_level(logging.WARNING, logger="ratarmountcore"):
        ratarmountcore.open(str(source), options()).close()
    assert [r for r in caplog.records if "random access" in r.getMessage()]


def test_gzip_padded_with_zero_bytes_is_decoded_by_indexed_gzip(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A .tar.gz padded with zero bytes to a block size (tape tools; gzip -d ignores them):
    rapidgzip refuses it, so without a backend named it goes to indexed_gzip, with one warning
    saying so, and serves every member as tar extracts it. Named, rapidgzip refuses it, and the
    error names the way out; nothing is left behind."""
    tar = tmp_path / "data.tar"
    make_tar(tar, random.Random(11), members=20, max_size=50_000)
    archive = compress(tar, "gz-cli")
    archive.write_bytes(archive.read_bytes() + bytes(10240 - archive.stat().st_size % 10240))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(CorruptDataError, match="zero bytes.*--gzip-backend indexed_gzip"):
        ratarmountcore.open(str(archive), options(gzip_backend="rapidgzip"))
    assert sorted(os.listdir(tmp_path)) == before
    with caplog.at_level(logging.WARNING), ratarmountcore.open(str(archive), options()) as source:
        assert source._reader.backend_name == "indexed_gzip"  # type: ignore[attr-defined]
        for name, data in members_of(tar).items():
            assert source.read(name) == data
    warned = [r.getMessage() for r in caplog.records if "zero bytes" in r.getMessage()]
    assert len(warned) == 1 and str(archive) in warned[0] and "indexed_gzip" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING), ratarmountcore.open(str(archive)) as again:  # from the index
        assert again._reader.backend_name == "indexed_gzip"  # type: ignore[attr-defined]
        for name, data in members_of(tar).items():
            assert again.read(name) == data
    assert not caplog.records


@pytest.mark.parametrize(
    "empty_member", [gzip.compress(b""), bytes.fromhex("1f8b0800000000000003010000ffff") + bytes(8)]
)
def test_gzip_ending_in_an_empty_member_stays_with_rapidgzip(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, empty_member: bytes
) -> None:
    """An empty last member (bgzip's end marker, gzip of nothing; zlib's fixed block or a stored
    one) ends in the eight zero bytes of its trailer: no padding, and rapidgzip reads it."""
    tar = tmp_path / "data.tar"
    make_tar(tar, random.Random(12), members=20, max_size=50_000)
    archive = tmp_path / "data.tar.gz"
    archive.write_bytes(gzip.compress(tar.read_bytes()) + empty_member)
    with caplog.at_level(logging.WARNING), ratarmountcore.open(str(archive), options()) as source:
        assert source._reader.backend_name == "rapidgzip"  # type: ignore[attr-defined]
        for name, data in members_of(tar).items():
            assert source.read(name) == data
    assert not caplog.records


def test_an_index_built_with_a_named_gzip_backend_serves_mounts_that_name_none(
    small_tar: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It was rebuilt with the default backend (and, for a padded .tar.gz, failed again)."""
    archive = compress(fresh_copy(small_tar, tmp_path), "gz-cli")
    with ratarmountcore.open(str(archive), options(gzip_backend="indexed_gzip")):
        pass
    index = Path(str(archive) + ".index.sqlite")
    built = index.stat().st_ino, index.stat().st_mtime_ns
    with caplog.at_level(logging.INFO), ratarmountcore.open(str(archive), options()) as src:
        assert src._reader.backend_name == "indexed_gzip"  # type: ignore[attr-defined]
        compare_with_tarfile(src, small_tar)
    assert (index.stat().st_ino, index.stat().st_mtime_ns) == built
    assert not [r for r in caplog.records if "rebuilt" in r.getMessage() or "Creating index" in r.getMessage()]


def test_a_zero_padded_inner_tar_gz_is_a_folder_or_logged_with_the_way_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As an inner archive (``-r``) it goes to indexed_gzip too, with one warning at its scan
    and none at reads or later opens; with rapidgzip named it is a file, logged with the way out
    (it was logged as "damaged" with rapidgzip's words alone)."""
    tar = tmp_path / "data.tar"
    make_tar(tar, random.Random(11), members=5, max_size=5_000)
    inner = compress(tar, "gz-cli").read_bytes()
    (tmp_path / "outer.tar").write_bytes(tar_bytes({"pad.tar.gz": inner + bytes(10240 - len(inner) % 10240)}))
    for attempt in range(2):
        with caplog.at_level(logging.WARNING):
            with ratarmountcore.open(str(tmp_path / "outer.tar"), OpenOptions(recursive=True)) as source:
                for name, data in members_of(tar).items():
                    assert source.read("/pad.tar.gz" + name) == data
        warned = [r.getMessage() for r in caplog.records if "indexed_gzip" in r.getMessage()]
        assert len(warned) == (1 - attempt), warned
        caplog.clear()
    named = OpenOptions(
        recursive=True,
        index=IndexOptions(recreate=True),
        compression=CompressionOptions(gzip_backend="rapidgzip"),
    )
    with caplog.at_level(logging.WARNING):
        with ratarmountcore.open(str(tmp_path / "outer.tar"), named) as source:
            assert source.info("/pad.tar.gz").is_file
    assert any("--gzip-backend indexed_gzip" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize(
    "payloads",
    [
        [b"abc", b"defg"],
        [b"x" * n for n in range(1, 60)],
        [b"", b"after an empty stream"],
        [os.urandom(300_000), b"tail"],
    ],
    ids=["two-tiny", "many-tiny", "empty-first", "large-then-tiny"],
)
def test_a_multi_stream_bzip2_file_of_small_streams_is_mounted_whole(tmp_path: Path, payloads: List[bytes]) -> None:
    """``cat a.bz2 b.bz2`` of small files is a valid .bz2 (``bzip2 -d`` gives both); its first
    bytes, read to recognise the file, used to call a finished decompressor and refuse it as
    corrupt when its streams ended within them (found by fuzzing)."""
    path = tmp_path / "joined.bin.bz2"
    path.write_bytes(b"".join(bz2.compress(p) for p in payloads))
    expected = b"".join(payloads)
    assert subprocess.run(["bzip2", "-dc", str(path)], capture_output=True, check=True).stdout == expected
    with ratarmountcore.open(str(path)) as src:
        assert src.listdir("/") == ["joined.bin"]
        assert src.read("/joined.bin") == expected


@pytest.mark.parametrize("stage", ["rows", "commit"])
def test_an_index_that_fills_the_disk_is_a_one_line_error_and_leaves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """The index's folder fills up while the index is written (SQLite: "database or disk is
    full"): the converter and a first mount say which index could not be written, in one line,
    and leave no output, index or temporary file (the converter printed a traceback and left
    the output in place without its index, found by fuzzing with a tiny tmpfs)."""
    from ratarmount.convert_cli import main
    from ratarmountcore.errors import IndexWriteError
    from ratarmountcore.index import full_folders
    from ratarmountcore.index.sqlite_index import IndexWriter

    method = "_flush" if stage == "rows" else "commit"
    original = getattr(IndexWriter, method)

    def full(self: IndexWriter, *args: object) -> None:
        if stage == "rows":  # (some rows written, then no room for more)
            original(self, *args)
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(IndexWriter, method, full)
    monkeypatch.setattr(full_folders, "FULL_BELOW", 1 << 62)  # (the disk counts as full, as it would be)
    source = tmp_path / "data.tar.gz"
    source.write_bytes(gzip.compress(tar_bytes({f"d/f{i}": b"x" * i for i in range(50)})))
    before = sorted(os.listdir(tmp_path))
    out = tmp_path / "out.tar.zst"
    assert main([str(source), str(out), "--no-progress"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert "cannot write its index" in error and "out.tar.zst.index.sqlite" in error and "disk is full" in error
    with pytest.raises(IndexWriteError, match="data.tar.gz.index.sqlite"):
        ratarmountcore.open(str(source), options())
    assert sorted(os.listdir(tmp_path)) == before


def test_a_conversion_onto_a_full_disk_names_the_output_and_leaves_nothing(
    tmp_path: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A write's ENOSPC names no file: the error said "No space left on device" alone."""
    from conftest import fill_disk

    from ratarmount.convert_cli import main

    source = tmp_path / "data.tar.gz"
    source.write_bytes(gzip.compress(tar_bytes({f"d/f{i}": os.urandom(2000) for i in range(1000)})))
    fill_disk(small_disk, 512 * 1024)
    out = small_disk / "out.tar.zst"
    assert main([str(source), str(out), "--no-progress"]) == 1
    assert capsys.readouterr().err == f"ratarmount-convert: error: {out}: No space left on device\n"
    assert sorted(os.listdir(small_disk)) == ["filler"]


def test_an_index_that_cannot_be_made_on_a_full_disk_fails_the_conversion(
    tmp_path: Path, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--index-file`` on a disk too full for SQLite to make the index: one line, status 1,
    nothing left. It was a warning, exit 0 and an output without its index, where a disk that
    filled up a moment later failed the conversion (found by fuzzing). A folder that cannot be
    written is refused the same way, as a first mount refuses it."""
    from conftest import fill_disk

    from ratarmount.convert_cli import main

    source = tmp_path / "data.tar"
    source.write_bytes(tar_bytes({f"d/f{i}": b"x" * i for i in range(50)}))
    fill_disk(small_disk, 0)
    index = small_disk / "x.sqlite"
    out = tmp_path / "out.tar.zst"
    assert main([str(source), str(out), "--no-progress", "--index-file", str(index)]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert f"{out}: cannot write an index to any of {index} (database or disk is full)" in error
    assert sorted(os.listdir(small_disk)) == ["filler"]
    assert sorted(os.listdir(tmp_path)) == ["data.tar", "disk"]

    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    index = small_disk / "y.sqlite"
    assert main([str(source), str(out), "--no-progress", "--index-file", str(index)]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert f"{out}: cannot write an index to any of {index} (its folder cannot be written)" in error
    assert sorted(os.listdir(tmp_path)) == ["data.tar", "disk"]


def test_an_index_file_named_as_the_output_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--index-file OUT`` with output OUT: the index was committed, then the output renamed
    over it; status 0 and no index anywhere (found by a review of bad input). Also with
    ``--force`` over an existing output, which stays as it was."""
    from ratarmount.convert_cli import main

    source = tmp_path / "data.tar"
    source.write_bytes(tar_bytes({f"d/f{i}": b"x" * i for i in range(50)}))
    out = tmp_path / "out.tar.zst"
    for spelling, extra in ((str(out), []), (str(tmp_path / "d" / ".." / "out.tar.zst"), ["--force"])):
        assert main([str(source), str(out), "--no-progress", "--index-file", spelling, *extra]) == 1
        assert capsys.readouterr().err == (
            f"ratarmount-convert: error: {out}: the index file would overwrite the output (name another --index-file)\n"
        )
        assert sorted(os.listdir(tmp_path)) == ["data.tar", *(["out.tar.zst"] if extra else [])]
        out.write_bytes(b"kept")
    assert out.read_bytes() == b"kept"


def test_the_converter_names_a_truncated_tar_in_its_error(tmp_path: Path) -> None:
    """As a mount names it (the converter said only "archive ends inside member data ...")."""
    whole = tar_bytes({f"f{i}": os.urandom(100_000) for i in range(3)})
    source = tmp_path / "cut.tar"
    source.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ArchiveError, match=f"^{source}: "):
        convert_to_seekable_zstd(str(source), str(tmp_path / "out.tar.zst"), options=options())
    assert sorted(os.listdir(tmp_path)) == ["cut.tar"]


def test_an_output_that_cannot_be_written_is_named_as_given(tmp_path: Path) -> None:
    """Not by the temporary name the converter writes first (found by fuzzing; as root, a
    folder of sysfs is one that refuses new files)."""
    source = tmp_path / "a.tar"
    source.write_bytes(tar_bytes({"f": b"abc"}))
    with pytest.raises(RatarmountError) as caught:
        convert_to_seekable_zstd(str(source), "/sys/out.tar.zst", options=options())
    assert str(caught.value).startswith("/sys/out.tar.zst: cannot write (") and "tmp" not in str(caught.value)
