"""Block checksums of gzip data: damage after the index was built (bit rot; same size and mtime,
outside the sampled fingerprint) fails the reads it touches and never returns wrong bytes, for
both backends, the child-process first pass, single .gz files and .tar.gz inside a tar."""

from __future__ import annotations

import array
import errno
import gzip
import os
import random
import sqlite3
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from conftest import Mounter, tar_bytes

import ratarmountcore
from ratarmountcore.compression import checked_blocks
from ratarmountcore.compression import gzip as gzip_backend
from ratarmountcore.compression.block_crcs import TABLE_NAME, BlockCrcs, CrcCollector, CrcScan
from ratarmountcore.errors import ArchiveError, CorruptDataError, InvalidIndexError
from ratarmountcore.index.fingerprint import SAMPLE, SAMPLES
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions


def options(backend: str = "rapidgzip") -> OpenOptions:
    return OpenOptions(
        index=IndexOptions(index_folders=("",), progress=False),
        compression=CompressionOptions(gzip_backend=backend, seek_point_spacing=128 * 1024),
    )


def make_members(rng: random.Random, count: int) -> Dict[str, bytes]:
    """Hex text: compresses about 2:1, so a flipped bit lands in deflate data of many members."""
    members = {f"d{i % 7}/f{i:04d}.txt": rng.randbytes(rng.randint(200, 3000)).hex().encode() for i in range(count)}
    members["big/large.bin"] = rng.randbytes(600_000).hex().encode()  # read with large reads
    return members


def tar_gz(path: Path, members: Dict[str, bytes]) -> Path:
    path.write_bytes(gzip.compress(tar_bytes(members), compresslevel=6, mtime=0))
    return path


def flip_unsampled_bit(path: Path, rng: random.Random, low: int = 0, high: int = -1) -> int:
    """Flip one bit between the blocks the fingerprint samples (so the index stays in use),
    within ``[low, high)``; size and mtime are kept."""
    raw = bytearray(path.read_bytes())
    high = len(raw) if high < 0 else high
    step = (len(raw) - SAMPLE) // (SAMPLES - 1)
    while True:
        position = rng.randrange(max(low, 64), high - 64)
        if position % step >= SAMPLE and (len(raw) - position) > SAMPLE:
            break
    raw[position] ^= 1 << rng.randrange(8)
    mtime = path.stat().st_mtime_ns
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(mtime, mtime))
    return position


def read_all(path: Path, members: Dict[str, bytes], opts: OpenOptions, prefix: str = "") -> Tuple[int, int]:
    """(members read right, members that failed); wrong bytes fail the test."""
    good = failed = 0
    with ratarmountcore.open(str(path), opts) as source:
        for name, data in members.items():
            try:
                got = source.read("/" + prefix + name)
            except CorruptDataError as exc:
                assert str(path) in str(exc) and "\n" not in str(exc), str(exc)
                failed += 1
                continue
            assert got == data, f"{name}: wrong bytes served"
            good += 1
        big = source.open_info(source.info("/" + prefix + "big/large.bin"))
        view = memoryview(bytearray(len(members["big/large.bin"])))
        try:  # one large read (parallel decoders, no span cache)
            count = big.preadinto(1000, view[:400_000])
            assert bytes(view[:count]) == members["big/large.bin"][1000 : 1000 + count]
        except CorruptDataError:
            failed += 1
    return good, failed


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("first_pass", ["rapidgzip", "rapidgzip-child", "indexed_gzip"])
def test_bit_rot_after_indexing_is_never_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_pass: str
) -> None:
    if first_pass == "rapidgzip-child":
        monkeypatch.setattr(gzip_backend.RapidgzipReader, "scan_process_min", 0)
    backend = first_pass.split("-")[0]
    rng = random.Random(7)
    members = make_members(rng, 600)
    original = tar_gz(tmp_path / "original.tar.gz", members)
    failures = 0
    for trial in range(4):
        archive = tmp_path / f"t{trial}.tar.gz"
        archive.write_bytes(original.read_bytes())
        assert read_all(archive, members, options(backend)) == (len(members), 0)  # builds the index
        with sqlite3.connect(f"{archive}.index.sqlite") as db:
            assert db.execute("SELECT COUNT(*) FROM seek_points WHERE backend = ?", (TABLE_NAME,)).fetchone()[0] > 0
        flip_unsampled_bit(archive, rng)
        good, failed = read_all(archive, members, options(backend))
        assert good > 0
        failures += failed
    assert failures > 0


def test_single_gz_file_and_tar_gz_inside_a_tar(tmp_path: Path) -> None:
    rng = random.Random(11)
    content = rng.randbytes(400_000).hex().encode()
    single = tmp_path / "data.csv.gz"
    single.write_bytes(gzip.compress(content, mtime=0))
    with ratarmountcore.open(str(single), options()) as source:
        assert source.read("/data.csv") == content
    flip_unsampled_bit(single, rng)
    with ratarmountcore.open(str(single), options()) as source, pytest.raises(CorruptDataError):
        source.read("/data.csv")

    members = make_members(rng, 300)
    inner = tar_gz(tmp_path / "inner.tar.gz", members)
    outer = tmp_path / "outer.tar"
    with tarfile.open(outer, "w") as tar:
        tar.add(inner, arcname="inner.tar.gz")
    opts = OpenOptions(index=IndexOptions(index_folders=("",), progress=False), recursive=True)
    assert read_all(outer, members, opts, prefix="inner.tar.gz/") == (len(members), 0)
    with sqlite3.connect(f"{outer}.index.sqlite") as db:
        names = [row[0] for row in db.execute("SELECT DISTINCT backend FROM seek_points")]
    assert any(name.startswith(TABLE_NAME + "@") for name in names), names
    failures = 0
    for _ in range(3):  # within the inner archive's bytes
        flip_unsampled_bit(outer, rng, 2048, 512 + inner.stat().st_size)
        good, failed = read_all(outer, members, opts, prefix="inner.tar.gz/")
        failures += failed
    assert failures > 0


def test_damage_fails_only_the_large_reads_that_touch_it(tmp_path: Path) -> None:
    """A large read (the parallel decoders, from coarse seek points) of intact bytes failed when
    its decoder met damage before or after them, or the member's CRC-32 at its end that the
    damage broke (found by fuzzing): such a read is redone block by block, each block checked."""
    rng = random.Random(5)
    data = b"".join(
        rng.randbytes(20_000) if rng.random() < 0.4 else rng.randbytes(10_000).hex().encode() for _ in range(100)
    )
    archive = tmp_path / "s.gz"
    archive.write_bytes(gzip.compress(data, mtime=0))
    opts = OpenOptions(
        index=IndexOptions(index_folders=("",), progress=False),
        compression=CompressionOptions(gzip_backend="rapidgzip", seek_point_spacing=64 * 1024),
    )
    with ratarmountcore.open(str(archive), opts) as source:
        assert source.read("/s") == data
    flip_unsampled_bit(archive, rng, archive.stat().st_size // 2, archive.stat().st_size * 2 // 3)
    with ratarmountcore.open(str(archive), opts) as source:
        member = source.open_info(source.info("/s"))
        damaged = []
        for offset in range(0, len(data), 16384):
            try:
                assert member.pread(offset, 16384) == data[offset : offset + 16384], "wrong bytes"
            except CorruptDataError:
                damaged.append(offset)
    assert damaged
    low, high = damaged[0], damaged[-1] + 16384
    read = 256 * 1024
    starts = [start for start in range(0, len(data), 128 * 1024) if start >= high or start + read <= low]
    assert any(start < low for start in starts) and any(start >= high for start in starts)
    for start in starts:
        with ratarmountcore.open(str(archive), opts) as source:  # (nothing cached)
            member = source.open_info(source.info("/s"))
            view = memoryview(bytearray(read))
            count = member.preadinto(start, view)
            assert bytes(view[:count]) == data[start : start + read]
        with ratarmountcore.open(str(archive), opts) as source, pytest.raises(CorruptDataError):
            source.open_info(source.info("/s")).preadinto(low, memoryview(bytearray(read)))


@pytest.mark.parametrize("cache_size", [0, None])
@pytest.mark.parametrize("damage", ["zeros inside", "zeros to the end"])
def test_a_damaged_inner_tar_gz_is_shown_as_the_file_it_is(tmp_path: Path, cache_size: int, damage: str) -> None:
    """A .tar.gz inside a tar whose deflate data was damaged before the first mount: its members
    were served with the damage (found by fuzzing). Its first pass decodes it through several
    decoders and the span cache, none of which checks the member's CRC-32 from its start, so
    the pass computes it; a damaged tail the tar parser trips over first is no "what could be
    read" either: nothing of it was checked. Either way it is the file it is."""
    rng = random.Random(3)
    words = [rng.randbytes(rng.randint(1, 5)).hex().encode() for _ in range(500)]

    def text(size: int) -> bytes:
        return b" ".join(rng.choice(words) for _ in range(size // 5 + 1))[:size]

    members = {f"small/f{i:03}": (text if i % 3 else rng.randbytes)(rng.randint(1, 6000)) for i in range(40)}
    members["big/random"] = rng.randbytes(500_000)
    members["big/text"] = text(1_000_000)
    members["big/mixed"] = b"".join(rng.randbytes(30_000) if i % 3 else text(50_000) for i in range(40))
    inner = bytearray(gzip.compress(tar_bytes(members), compresslevel=6, mtime=0))
    cut = 400_000 if damage == "zeros inside" else len(inner) // 2  # (inside the random member's data)
    if damage == "zeros inside":
        inner[cut : cut + 4096] = bytes(4096)
    else:
        inner[cut:] = bytes(len(inner) - cut)
    outer = tmp_path / "outer.tar"
    outer.write_bytes(tar_bytes({"inner.tar.gz": bytes(inner), "after.txt": b"after"}))
    compression = CompressionOptions() if cache_size is None else CompressionOptions(cache_size=cache_size)
    opts = OpenOptions(index=IndexOptions(index_folders=("",), progress=False), recursive=True, compression=compression)
    for _mount in range(2):
        with ratarmountcore.open(str(outer), opts) as source:
            assert source.info("/inner.tar.gz").is_file and source.read("/inner.tar.gz") == bytes(inner)
            assert source.read("/after.txt") == b"after"


@pytest.mark.parametrize("first_pass", ["rapidgzip", "rapidgzip-child", "indexed_gzip"])
def test_a_tar_cut_short_inside_whole_gzip_data_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_pass: str
) -> None:
    """The gzip stream is complete, the tar in it ends inside a member: the scan asks the first
    pass's reader for the stream's size, which it learns by reading on."""
    if first_pass == "rapidgzip-child":
        monkeypatch.setattr(gzip_backend.RapidgzipReader, "scan_process_min", 0)
    tar = tar_bytes(make_members(random.Random(4), 200))
    archive = tmp_path / "cut.tar.gz"
    archive.write_bytes(gzip.compress(tar[: len(tar) * 2 // 3], mtime=0))
    with pytest.raises(ArchiveError) as caught:
        ratarmountcore.open(str(archive), options(first_pass.split("-")[0]))
    message = str(caught.value)
    assert message.startswith(str(archive)) and "\n" not in message and "ends inside" in message, message
    assert not list(tmp_path.glob("cut.tar.gz.index*"))


def test_an_index_without_block_checksums_is_refused(tmp_path: Path) -> None:
    archive = tar_gz(tmp_path / "a.tar.gz", make_members(random.Random(3), 50))
    ratarmountcore.open(str(archive), options()).close()
    with sqlite3.connect(f"{archive}.index.sqlite") as db:
        db.execute("DELETE FROM seek_points WHERE backend = ?", (TABLE_NAME,))
    with pytest.raises(InvalidIndexError) as caught:
        ratarmountcore.open(str(archive), options())
    assert str(archive) in str(caught.value) and "--recreate-index" in str(caught.value)


def test_damaged_member_is_eio_through_the_mount(mounter: Mounter, tmp_path: Path) -> None:
    rng = random.Random(5)
    members = make_members(rng, 400)
    archive = tar_gz(tmp_path / "m.tar.gz", members)
    assert eio_after_damage(mounter, archive, members, rng, tmp_path) > 0


def eio_after_damage(
    mounter: Mounter, archive: Path, members: Dict[str, bytes], rng: random.Random, tmp_path: Path
) -> int:
    """Mount (building the index) and read every member; flip a bit; mount again and read every
    member: wrong bytes fail the test, damaged ones must be EIO. Returns how many were."""
    mnt = mounter.mount(archive)
    for name, data in members.items():
        assert (mnt / name).read_bytes() == data
    mounter.unmount(mnt)
    flip_unsampled_bit(archive, rng)
    (tmp_path / "again").mkdir()
    mnt = mounter.mount(archive, mountpoint=tmp_path / "again")
    errors = 0
    for name, data in members.items():
        try:
            assert (mnt / name).read_bytes() == data, f"{name}: wrong bytes through the mount"
        except OSError as exc:
            assert exc.errno == errno.EIO
            errors += 1
    mounter.unmount(mnt)
    return errors


# --- the table itself ----------------------------------------------------------------------------
def _crc32c_table() -> List[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c_reference(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit from its definition: independent of the library."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_reference_checksum_matches_the_standard_check_value() -> None:
    assert crc32c_reference(b"123456789") == 0xE3069283


def test_collector_matches_direct_checksums_whatever_the_pieces() -> None:
    rng = random.Random(1)
    data = rng.randbytes(5 * 1000 + 17)
    collector = CrcCollector(block=1000)
    position = 0
    while position < len(data):
        step = rng.randint(1, 2500)
        collector.feed(data[position : position + step])
        position += step
    table = collector.table()
    assert list(table.crcs) == [crc32c_reference(data[i : i + 1000]) for i in range(0, len(data), 1000)]
    assert table.size == len(data) and table.span(1500, 10) == (1000, 2000) and table.span(4990, 100) == (4000, 5017)
    again = BlockCrcs.from_parts(table.parts())
    assert again is not None and list(again.crcs) == list(table.crcs) and again.size == table.size
    table.verify("x", 1000, data[1000:3000])
    broken = bytearray(data[1000:3000])
    broken[1500] ^= 4
    with pytest.raises(CorruptDataError, match="x: decompressed data at offset 2000"):
        table.verify("x", 1000, bytes(broken))
    with pytest.raises(ValueError):
        BlockCrcs(array.array("I", [1, 2]), 5000, 1000)


class _Recording:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads: List[Tuple[int, int]] = []

    def pread(self, offset: int, size: int) -> bytes:
        self.reads.append((offset, size))
        return self.data[offset : offset + size]

    def close(self) -> None:
        pass


def test_scan_reads_what_it_would_skip_and_the_rest_at_the_end() -> None:
    data = random.Random(2).randbytes(300_000)
    inner = _Recording(data)
    scan = CrcScan(inner, CrcCollector())
    assert scan.pread(0, 512) == data[:512]
    assert scan.pread(250_000, 100) == data[250_000:250_100]  # a skip: read, not jumped
    assert scan.pread(100, 50) == data[100:150]  # backwards: passed through, not counted twice
    table = scan.read_to_end()
    assert table.size == len(data)
    assert list(table.crcs) == [crc32c_reference(data[i : i + table.block]) for i in range(0, len(data), table.block)]


def test_gzip_cli_archive_made_elsewhere(tmp_path: Path) -> None:
    """An archive from GNU gzip (not Python's module), checked the same way."""
    members = make_members(random.Random(9), 100)
    plain = tmp_path / "cli.tar"
    plain.write_bytes(tar_bytes(members))
    subprocess.run(["gzip", "-f", str(plain)], check=True)
    archive = tmp_path / "cli.tar.gz"
    assert read_all(archive, members, options()) == (len(members), 0)
    assert read_all(archive, members, options()) == (len(members), 0)  # from the index


def test_crc32c_is_loaded_without_the_packages_init() -> None:
    """The C function straight from the extension module: the same values as the package's,
    without importing importlib.metadata (the package's __init__ does, 14-24 ms)."""
    import sys

    script = (
        "import os, sys\n"
        "from ratarmountcore.compression.block_crcs import crc32c_function\n"
        "data = os.urandom(100000)\n"
        "ours = [crc32c_function()(data[:n], 0) for n in (0, 1, 9, 4096, 100000)]\n"
        "print('importlib.metadata' in sys.modules)\n"
        "import crc32c\n"
        "print(ours == [crc32c.crc32c(data[:n], 0) for n in (0, 1, 9, 4096, 100000)])\n"
        "print(crc32c_function()(b'123456789') == 0xE3069283)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True", "True"]


@pytest.mark.parametrize("members_in_file", [1, 2])
def test_the_first_pass_checks_the_trailer_with_its_own_crc32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, members_in_file: int
) -> None:
    """A first pass decoded in this process computes the stream's CRC-32 on the way (ISA-L's
    when installed) and compares it with the trailer: a single-member file needs no second
    pass with zlib; a file of two members does (one trailer cannot tell)."""
    rng = random.Random(23)
    data = tar_bytes(make_members(rng, 200))
    path = tmp_path / "a.tar.gz"
    if members_in_file == 1:
        path.write_bytes(gzip.compress(data, mtime=0))
    else:
        half = len(data) // 2
        path.write_bytes(gzip.compress(data[:half], mtime=0) + gzip.compress(data[half:], mtime=0))
    passes: List[str] = []
    original = gzip_backend._GzipReader._verify_with_zlib

    def counting(self: gzip_backend._GzipReader) -> None:
        passes.append(self.path)
        original(self)

    monkeypatch.setattr(gzip_backend._GzipReader, "_verify_with_zlib", counting)
    monkeypatch.setattr(gzip_backend.RapidgzipReader, "scan_process_min", 1 << 40)  # (decoded here)
    with ratarmountcore.open(str(path), options()) as src:
        assert src.read("/big/large.bin") == make_members(random.Random(23), 200)["big/large.bin"]
    assert len(passes) == members_in_file - 1


def test_checked_blocks_are_kept_for_the_process_not_per_archive(tmp_path: Path) -> None:
    """Small reads keep the blocks they checked; 40 archives read all over keep no more of them
    than one process-wide bound (8 per archive before: 40 x 128 KiB), the blocks a sequential
    reader is in are still found again, and a closed archive leaves none behind."""
    rng = random.Random(5)
    paths, contents = [], []
    for i in range(40):
        members = {f"c{i:02d}/f{k:03d}.txt": rng.randbytes(rng.randint(300, 2000)).hex().encode() for k in range(60)}
        paths.append(str(tar_gz(tmp_path / f"c{i:02d}.tar.gz", members)))
        contents.append(members)
    with ratarmountcore.open(paths, options()) as source:
        for members in contents:
            for name, data in members.items():
                assert source.read("/" + name) == data
        assert 0 < len(checked_blocks.BLOCKS) <= checked_blocks.PROCESS_BLOCKS
        # The first archive's members in order again (its blocks are long gone): one block holds
        # several of them, and each block is decoded for the first of them only.
        blocks = checked_blocks.BLOCKS
        misses, hits = blocks.misses, blocks.hits
        for name, data in contents[0].items():
            assert source.read("/" + name) == data
        assert blocks.hits - hits > 2 * (blocks.misses - misses) > 0
    assert len(checked_blocks.BLOCKS) == 0
