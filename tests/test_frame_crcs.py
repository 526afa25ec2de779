"""Block checksums of zstd frames and xz blocks that nothing else checks (no checksum of their
own, or too large to decode whole): damage after the index was built fails the reads it touches
and never returns wrong bytes; frames that check themselves need no table."""

from __future__ import annotations

import errno
import lzma
import os
import random
import sqlite3
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import Dict, List

import pytest
import zstandard
from conftest import Mounter, tar_bytes
from hypothesis import given, settings
from hypothesis import strategies as st
from test_gzip_block_crcs import eio_after_damage, flip_unsampled_bit, make_members, read_all

import ratarmountcore
from ratarmountcore.compression import framed
from ratarmountcore.compression.frame_crcs import FrameCrcs
from ratarmountcore.compression.xz import XzReader
from ratarmountcore.compression.zstd import ZstdReader
from ratarmountcore.convert import convert_to_seekable_zstd
from ratarmountcore.errors import InvalidIndexError
from ratarmountcore.index.fingerprint import SAMPLE, SAMPLES
from ratarmountcore.options import IndexOptions, OpenOptions

#: Frames above this are streamed in these tests (a stand-in for 32 MiB and more).
LARGE = 256 * 1024


def options() -> OpenOptions:
    return OpenOptions(index=IndexOptions(index_folders=("",), progress=False))


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def zstd_frames(plain: bytes, frame_size: int, checksum: bool) -> bytes:
    compressor = zstandard.ZstdCompressor(level=3, write_checksum=checksum, write_content_size=True)
    return b"".join(compressor.compress(plain[i : i + frame_size]) for i in range(0, len(plain), frame_size))


def xz_blocks(plain: bytes, check: int) -> bytes:
    """One block (Python's lzma module)."""
    return lzma.compress(plain, format=lzma.FORMAT_XZ, check=check, preset=1)


def xz_cli_blocks(plain: bytes, check: str) -> bytes:
    command = ["xz", "-1", f"--check={check}", "--block-size=128KiB", "-c"]
    return subprocess.run(command, input=plain, capture_output=True, check=True).stdout


def test_a_frame_whose_checksum_flag_was_cleared_is_damaged(tmp_path: Path) -> None:
    """A frame recorded as checking itself gets no block checksums of ours; the decoder checks
    what the frame's header says. Its checksum flag cleared (and a data bit flipped) after the
    index was built: the frame's bytes were served wrong without an error (found by fuzzing)."""
    rng = random.Random(3)
    members = {f"m{i:03}": rng.randbytes(3000).hex().encode() for i in range(200)}  # (1.2 MB)
    plain = tar_bytes(members)
    archive = tmp_path / "f.tar.zst"
    archive.write_bytes(zstd_frames(plain, 64 * 1024, checksum=True))
    with ratarmountcore.open(str(archive), options()) as source:
        assert all(source.read("/" + name) == data for name, data in members.items())
    index = Path(f"{archive}.index.sqlite")
    built = index.stat().st_mtime_ns
    raw = bytearray(archive.read_bytes())
    step = (len(raw) - SAMPLE) // (SAMPLES - 1)
    frame = next(  # the first frame but one whose changes leave the index in use (not sampled)
        offset
        for offset in (len(zstd_frames(plain[: k * 64 * 1024], 64 * 1024, True)) for k in range(1, 18))
        if all(position % step >= SAMPLE for position in (offset + 4, offset + 200))
    )
    raw[frame + 4] &= ~0x04  # its Frame_Header_Descriptor: no Content_Checksum
    raw[frame + 200] ^= 0x10  # and a bit of its data
    mtime = archive.stat().st_mtime_ns
    archive.write_bytes(bytes(raw))
    os.utime(archive, ns=(mtime, mtime))
    failed = 0
    with ratarmountcore.open(str(archive), options()) as source:
        for name, data in members.items():
            try:
                assert source.read("/" + name) == data, f"{name}: wrong bytes"
            except OSError as exc:
                assert exc.errno == errno.EIO
                failed += 1
    assert failed and index.stat().st_mtime_ns == built


def stored_table(archive: Path, backend: str, frame_sizes: List[int]) -> FrameCrcs:
    with sqlite3.connect(f"{archive}.index.sqlite") as db:
        rows = db.execute("SELECT data FROM seek_points WHERE backend = ? ORDER BY part", (backend,)).fetchall()
    table = FrameCrcs.from_parts([row[0] for row in rows], frame_sizes)
    assert table is not None
    return table


def frame_sizes(archive: Path) -> List[int]:
    with ratarmountcore.open(str(archive), options()) as source:
        reader = source._reader  # type: ignore[attr-defined]
        return list(reader.frames.decomp_sizes)


KINDS = {
    # (file content from the tar, backend name, whether every frame must get block checksums)
    "zst-frames-without-checksum": (lambda tar: zstd_frames(tar, 128 * 1024, False), "zstandard", True),
    "zst-one-large-frame-with-checksum": (lambda tar: zstd_frames(tar, 1 << 30, True), "zstandard", True),
    "xz-blocks-without-check": (lambda tar: xz_cli_blocks(tar, "none"), "python_xz", True),
    "xz-large-block-with-crc64": (lambda tar: xz_blocks(tar, lzma.CHECK_CRC64), "python_xz", True),
    # Checked by their own checksums: blocks are recorded for the frames the first pass decoded
    # (not those of the large member, which the scan skips).
    "zst-small-frames-with-checksum": (lambda tar: zstd_frames(tar, 128 * 1024, True), "zstandard", False),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_bit_rot_after_indexing_is_never_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    compress, backend, every_frame = KINDS[kind]
    if "large" in kind:
        monkeypatch.setattr(framed.FramedReader, "whole_frame_limit", LARGE)
    rng = random.Random(17)
    members = make_members(rng, 500)
    original = tmp_path / ("original.tar.zst" if backend == "zstandard" else "original.tar.xz")
    original.write_bytes(compress(tar_bytes(members)))
    failures = 0
    for trial in range(4):
        archive = tmp_path / f"t{trial}{original.suffix}"
        archive.write_bytes(original.read_bytes())
        assert read_all(archive, members, options()) == (len(members), 0)  # builds the index
        sizes = frame_sizes(archive)
        table = stored_table(archive, f"{backend}-crc32c", sizes)
        covered = sorted(table.by_frame)
        assert covered == list(range(len(sizes))) if every_frame else 0 < len(covered) < len(sizes)
        flip_unsampled_bit(archive, rng)
        good, failed = read_all(archive, members, options())
        assert good > 0
        failures += failed
    assert failures > 0


def test_checked_large_frame_is_streamed_once_by_a_sequential_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads widened to whole blocks start up to a block before where the last one stopped:
    the cursor keeps that block, so reading a large frame front to back in odd-sized pieces
    decodes it once (and random reads in it stay right)."""
    monkeypatch.setattr(framed.FramedReader, "whole_frame_limit", LARGE)
    rng = random.Random(3)
    plain = rng.randbytes(1_500_000).hex().encode()
    archive = tmp_path / "data.bin.zst"
    archive.write_bytes(zstd_frames(plain, 1 << 30, True))
    opened: List[int] = []
    original = ZstdReader._open_stream

    def counting(self: ZstdReader, frame: int, table: framed.FrameTable) -> framed.FrameStream:
        opened.append(frame)
        return original(self, frame, table)

    with ratarmountcore.open(str(archive), options()) as source:  # builds the index
        assert source.read("/data.bin") == plain
    monkeypatch.setattr(ZstdReader, "_open_stream", counting)
    with ratarmountcore.open(str(archive), options()) as source:
        with source.open("/data.bin") as f:
            pieces = []
            while True:
                piece = f.read(7001)
                if not piece:
                    break
                pieces.append(piece)
        assert b"".join(pieces) == plain
        assert opened == [0]
        with source.open("/data.bin") as f:
            for offset in sorted(rng.randrange(len(plain)) for _ in range(20)):
                f.seek(offset)
                assert f.read(5000) == plain[offset : offset + 5000]


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("kind", ["large frames", "partial reads"])
def test_reads_in_order_that_end_a_frame_do_not_decode_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, ahead: bool
) -> None:
    """A read widened to whole blocks that reaches a frame's end ends its cursor's stream. The
    cursor keeps its last block: the next members, which lie in that same block, are served from
    it. Dropping the cursor there made each of them decode the frame again from its start (24
    MiB xz blocks read in archive order: 4-5 reads of 0.8 s at every block's end, 30,000 files
    10.1 s -> 3.0 s in-process). With read-ahead, the next frame is streamed ahead and taken over
    by the cursor that restarts in it: still one stream per frame, none decoded whole."""
    monkeypatch.setattr(framed, "SCAN_STREAM_MIN", 256 * 1024)
    if kind == "large frames":
        monkeypatch.setattr(framed.FramedReader, "whole_frame_limit", LARGE)
    else:  # frames cached whole, but the file counts as too large for the cache
        monkeypatch.setattr(framed, "KEPT_WHOLE_FACTOR", 0)
    # (a tar: its first pass decodes every frame and records the block checksums partial reads need)
    plain = tar_bytes({"data.bin": random.Random(12).randbytes(590_000).hex().encode()})
    frame = 400_000  # > LARGE; three frames
    archive = tmp_path / "three.tar.zst"
    archive.write_bytes(zstd_frames(plain, frame, True))
    opened: List[int] = []
    original = ZstdReader._open_stream

    def counting(self: ZstdReader, frame: int, table: framed.FrameTable) -> framed.FrameStream:
        opened.append(frame)
        return original(self, frame, table)

    ratarmountcore.open(str(archive), options()).close()  # builds the index
    monkeypatch.setattr(ZstdReader, "_open_stream", counting)
    with ratarmountcore.open(str(archive), options()) as source:
        reader = source._reader  # type: ignore[attr-defined]
        if not ahead:
            reader._ahead_depth = 0
        elif not reader._ahead_depth:
            pytest.skip("one core: no read-ahead")
        for offset in range(0, len(plain), 3000 + 512):  # members of 3,000 bytes, a header between
            assert reader.pread(offset, 3000) == plain[offset : offset + 3000]
        assert sorted(opened) == [0, 1, 2], opened  # each frame decoded once (ahead: the next one first)
        assert reader.stats.frames_decoded == 0
        for offset in (frame - 5000, 2 * frame - 100, len(plain) - 10):  # back into ended frames
            assert reader.pread(offset, 4000) == plain[offset : offset + 4000]


@pytest.mark.parametrize("frames", ["read whole", "too large to read whole"])
def test_frames_the_scan_skipped_get_their_checksums_at_the_first_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, frames: str
) -> None:
    """The data of a large member is skipped by the tar scan: its frames are decoded for their
    checksums before the index is written (whole, or streamed through a cursor), and damage in
    them is caught later."""
    if frames != "read whole":
        monkeypatch.setattr(framed.FramedReader, "whole_frame_limit", 32 * 1024)  # the frames hold 64 KiB
    rng = random.Random(9)
    members: Dict[str, bytes] = {"small.txt": b"s" * 100, "large.bin": rng.randbytes(1_200_000), "z.txt": b"z"}
    archive = tmp_path / "skip.tar.zst"
    archive.write_bytes(zstd_frames(tar_bytes(members), 64 * 1024, False))
    with ratarmountcore.open(str(archive), options()) as source:
        assert source.read("/small.txt") == members["small.txt"]
    sizes = frame_sizes(archive)
    assert sorted(stored_table(archive, "zstandard-crc32c", sizes).by_frame) == list(range(len(sizes)))
    size = archive.stat().st_size
    flip_unsampled_bit(archive, rng, size // 4, size * 3 // 4)  # inside the large member's frames
    with ratarmountcore.open(str(archive), options()) as source, pytest.raises(OSError):
        assert source.read("/large.bin") == members["large.bin"], "wrong bytes served"


def test_an_index_without_frame_checksums_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.zst"
    archive.write_bytes(zstd_frames(tar_bytes(make_members(random.Random(2), 40)), 64 * 1024, False))
    ratarmountcore.open(str(archive), options()).close()
    with sqlite3.connect(f"{archive}.index.sqlite") as db:
        db.execute("DELETE FROM seek_points WHERE backend = ?", (ZstdReader.crc_table_name(),))
    with pytest.raises(InvalidIndexError) as caught:
        ratarmountcore.open(str(archive), options())
    assert str(archive) in str(caught.value) and "--recreate-index" in str(caught.value)


def test_converter_records_checksums_of_every_frame(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Those of frames too large to be read whole check every read of them; with those of the
    others, a random read in a file the cache cannot hold decodes its frame only up to the
    blocks it needs, as with the index of a mount's scan (the converter's index had them for
    the large frames only, and its random reads decoded whole frames)."""
    monkeypatch.setattr(framed.FramedReader, "whole_frame_limit", LARGE)
    rng = random.Random(23)
    members = make_members(rng, 300)
    plain = tmp_path / "plain.tar"
    plain.write_bytes(tar_bytes(members))
    out = tmp_path / "out.tar.zst"
    convert_to_seekable_zstd(str(plain), str(out), frame_size=3 * LARGE, options=options())
    sizes = frame_sizes(out)
    table = stored_table(out, "zstandard-crc32c", sizes)
    assert sorted(table.by_frame) == list(range(len(sizes)))
    assert any(size > LARGE for size in sizes) and any(size <= LARGE for size in sizes)
    flip_unsampled_bit(out, rng, 0, out.stat().st_size // 2)  # inside a large frame
    good, failed = read_all(out, members, options())
    assert good > 0 and failed > 0


def test_damaged_frame_is_eio_through_the_mount(mounter: Mounter, tmp_path: Path) -> None:
    rng = random.Random(31)
    members = make_members(rng, 300)
    archive = tmp_path / "m.tar.zst"
    archive.write_bytes(zstd_frames(tar_bytes(members), 64 * 1024, False))
    assert eio_after_damage(mounter, archive, members, rng, tmp_path) > 0


def test_reads_that_miss_the_cache_of_a_large_file_decode_only_up_to_their_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a file the frame cache holds little of, a random read decodes its frame from the start
    to the end of the blocks it needs (checked against the block checksums the first pass
    recorded for every frame it decoded, checksummed frames included), not the whole frame."""
    monkeypatch.setattr(framed, "KEPT_WHOLE_FACTOR", 0)
    rng = random.Random(41)
    members = make_members(rng, 400)
    archive = tmp_path / "p.tar.zst"
    archive.write_bytes(zstd_frames(tar_bytes(members), 256 * 1024, True))
    ratarmountcore.open(str(archive), options()).close()
    sizes = frame_sizes(archive)
    assert sorted(stored_table(archive, "zstandard-crc32c", sizes).by_frame) == list(range(len(sizes)))
    names = list(members)
    rng.shuffle(names)
    with ratarmountcore.open(str(archive), options()) as source:
        reader = source._reader  # type: ignore[attr-defined]
        reader._ahead_depth = 0  # (reads that happen to continue into the next frame decode it ahead)
        for name in names[:60]:
            assert source.read("/" + name) == members[name]
        assert reader.stats.frames_decoded == 0  # no frame decoded whole
    flip_unsampled_bit(archive, rng)
    good, failed = read_all(archive, members, options())
    assert good > 0 and failed > 0


def test_first_pass_streams_a_large_first_frame_instead_of_waiting_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan parses a large frame as a thread decodes it (the frame is never decoded whole),
    the next large frame is streamed ahead by another thread and taken over when the scan gets
    there (decoded once), and both frames get their block checksums on the way."""
    monkeypatch.setattr(framed, "SCAN_STREAM_MIN", 256 * 1024)
    members = make_members(random.Random(43), 500)
    tar = tar_bytes(members)
    archive = tmp_path / "s.tar.xz"
    command = ["xz", "-1", "--check=crc64", f"--block-size={len(tar) * 3 // 5}", "-c"]
    archive.write_bytes(subprocess.run(command, input=tar, capture_output=True, check=True).stdout)
    opened: List[int] = []
    original = XzReader._open_stream

    def counting(self: XzReader, frame: int, table: framed.FrameTable) -> framed.FrameStream:
        opened.append(frame)
        return original(self, frame, table)

    monkeypatch.setattr(XzReader, "_open_stream", counting)
    with ratarmountcore.open(str(archive), options()) as source:
        reader = source._reader  # type: ignore[attr-defined]
        assert len(reader.frames) == 2 and min(reader.frames.decomp_sizes) >= 256 * 1024
        assert reader.stats.frames_decoded == 0  # no frame decoded whole
        assert sorted(opened) == ([0, 1] if reader._ahead_depth else [0, 1, 1]), opened  # (1: verified at the end)
        for name in list(members)[::37]:
            assert source.read("/" + name) == members[name]
    assert sorted(stored_table(archive, "python_xz-crc32c", frame_sizes(archive)).by_frame) == [0, 1]


@pytest.mark.parametrize("kind", ["zst-frames", "xz-blocks"])
def test_partial_frame_reads_from_8_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Partial-frame reads share a small cursor pool: 8 threads reading members in random order
    (frames entered anywhere, cursors taken over between frames) all get the right bytes."""
    monkeypatch.setattr(framed, "KEPT_WHOLE_FACTOR", 0)
    members = make_members(random.Random(47), 600)
    tar = tar_bytes(members)
    archive = tmp_path / ("c.tar.zst" if kind.startswith("zst") else "c.tar.xz")
    archive.write_bytes(zstd_frames(tar, 128 * 1024, True) if kind.startswith("zst") else xz_cli_blocks(tar, "crc32"))
    ratarmountcore.open(str(archive), options()).close()
    names = list(members)
    errors: List[str] = []

    def worker(seed: int) -> None:
        order = names[:]
        random.Random(seed).shuffle(order)
        for name in order[:150]:
            if source.read("/" + name) != members[name]:
                errors.append(name)

    with ratarmountcore.open(str(archive), options()) as source:
        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert source._reader._partial_cursors is not None  # type: ignore[attr-defined]
    assert errors == []


def test_cursor_keeps_only_bytes_that_end_where_it_stands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that skips forward leaves no bytes from before the skip to be handed to the next
    read that starts a little before the cursor (the first pass reads a frame unchecked)."""
    monkeypatch.setattr(framed.FramedReader, "whole_frame_limit", LARGE)
    plain = random.Random(5).randbytes(600_000)
    archive = tmp_path / "t.bin.zst"
    archive.write_bytes(zstd_frames(plain, 1 << 30, True))
    with ratarmountcore.open(str(archive), options()) as source:
        reader = source._reader  # type: ignore[attr-defined]
        table = reader.frames
        for position, size in ((100, 100), (50_000, 10), (49_990, 20), (49_995, 30)):
            assert reader._stream_read_raw(0, position, size, table) == plain[position : position + size]


_PLAIN = random.Random(77).randbytes(300_000).hex().encode()  # 600 kB, compresses ~2:1


@pytest.mark.parametrize("mode", ["large-frame", "partial", "raw-cursor"])
def test_any_read_sequence_returns_the_plain_bytes(tmp_path_factory: pytest.TempPathFactory, mode: str) -> None:
    """Property: whatever reads come in whatever order (overlapping, backwards, across frame
    ends, past the end), streamed and checked reads return exactly the plain bytes."""
    folder = tmp_path_factory.mktemp(mode)
    archive = folder / "p.bin.zst"
    archive.write_bytes(zstd_frames(_PLAIN, 96 * 1024 if mode == "partial" else 1 << 30, True))
    saved = (framed.FramedReader.whole_frame_limit, framed.KEPT_WHOLE_FACTOR)
    framed.FramedReader.whole_frame_limit = saved[0] if mode == "partial" else LARGE
    framed.KEPT_WHOLE_FACTOR = 0
    try:
        ratarmountcore.open(str(archive), options()).close()  # the index
        reads = st.lists(st.tuples(st.integers(0, len(_PLAIN) + 100), st.integers(0, 70_000)), min_size=1, max_size=12)

        @settings(max_examples=60, deadline=None)
        @given(reads)
        def check(sequence: List[tuple]) -> None:
            with ratarmountcore.open(str(archive), options()) as source:
                reader = source._reader  # type: ignore[attr-defined]
                for offset, size in sequence:
                    if mode == "raw-cursor":  # the unchecked cursor itself (the first pass reads so)
                        offset, size = min(offset, len(_PLAIN)), min(size, max(0, len(_PLAIN) - offset))
                        got = reader._stream_read_raw(0, offset, size, reader.frames)
                    else:
                        got = reader.pread(offset, size)
                    assert got == _PLAIN[offset : offset + size]

        check()
    finally:
        framed.FramedReader.whole_frame_limit, framed.KEPT_WHOLE_FACTOR = saved


def test_random_reads_in_one_large_frame_keep_the_cursors_spread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random reads in a frame too large to decode whole continue the cursor closest behind
    them; which cursor is rewound when none is behind decides how far the next reads decode.
    Rewinding the one that had come least far (the earlier rule) left all 8 bunched at the frame's
    end: a third of the frame decoded per read (1,000 random reads from a single-frame .tar.zst of
    100,000 files: 105 s through the mount); spread, an eighth."""
    monkeypatch.setattr(framed.FramedReader, "whole_frame_limit", LARGE)
    plain = random.Random(9).randbytes(1_000_000).hex().encode()  # 2 MB, one frame
    archive = tmp_path / "one.bin.zst"
    archive.write_bytes(zstd_frames(plain, 1 << 30, True))
    decoded = [0]

    class Counting:
        def __init__(self, stream: framed.FrameStream) -> None:
            self.stream = stream

        def read(self, size: int) -> bytes:
            data = self.stream.read(size)
            decoded[0] += len(data)
            return data

        def skip(self, size: int) -> int:
            count = self.stream.skip(size)
            decoded[0] += count
            return count

        def close(self) -> None:
            self.stream.close()

    with ratarmountcore.open(str(archive), options()) as source:
        reader = source._reader  # type: ignore[attr-defined]
        opened = reader._open_stream
        monkeypatch.setattr(reader, "_open_stream", lambda frame, table: Counting(opened(frame, table)))
        rng = random.Random(4)
        reads = 400
        for _ in range(reads):
            offset = rng.randrange(len(plain) - 100)
            assert reader.pread(offset, 100) == plain[offset : offset + 100]
    assert reader.max_cursors == 8
    assert decoded[0] / reads < 0.16 * len(plain), decoded[0] / reads / len(plain)  # 0.125 now, 0.31 the earlier way


def test_reading_in_order_after_random_reads_keeps_one_read_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random reads leave cursors spread over a large frame. A reader that then goes through
    the frame in order (small reads, a gap between them) passes them one by one; it must keep
    the cursor that decodes ahead for it instead of switching to each idle cursor it reaches,
    which turned on one read-ahead thread after another, each holding up to 16 MiB
    (single-frame 100,000-file .tar.zst: 17 threads, peak RSS 65 -> 224 MiB)."""
    from ratarmountcore.compression import stream_ahead

    monkeypatch.setattr(framed.FramedReader, "whole_frame_limit", LARGE)
    plain = random.Random(10).randbytes(1_500_000).hex().encode()  # 3 MB, one frame
    archive = tmp_path / "one.bin.zst"
    archive.write_bytes(zstd_frames(plain, 1 << 30, True))
    started: List[int] = []
    original = stream_ahead.ReadAheadStream.__init__

    def counting(self: stream_ahead.ReadAheadStream, *args: object, **kwargs: object) -> None:
        started.append(1)
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(stream_ahead.ReadAheadStream, "__init__", counting)
    with ratarmountcore.open(str(archive), options()) as source:
        reader = source._reader  # type: ignore[attr-defined]
        if not reader._ahead_depth:
            pytest.skip("one core: no read-ahead threads")
        rng = random.Random(5)
        for _ in range(100):
            offset = rng.randrange(len(plain) - 100)
            assert reader.pread(offset, 100) == plain[offset : offset + 100]
        assert len(reader._cursors.idle_positions()) == reader.max_cursors
        started.clear()
        for offset in range(0, len(plain), 3000 + 512):  # members of 3,000 bytes, a header between
            assert reader.pread(offset, 3000) == plain[offset : offset + 3000]
    assert 1 <= len(started) <= 2, len(started)


_PARK_PLAIN = random.Random(78).randbytes(350_000).hex().encode()  # 700 kB, compresses ~2:1
#: Runs of reads in order: where the run starts, how many reads, how long each, the gap between.
_RUNS = st.lists(
    st.tuples(
        st.integers(0, len(_PARK_PLAIN) + 100),
        st.integers(1, 40),
        st.one_of(st.integers(1, 5000), st.integers(5000, 90_000)),
        st.sampled_from([0, 0, 512, 4096]),
    ),
    min_size=1,
    max_size=5,
)


def _reads_of(runs: List[tuple]) -> List[tuple]:
    reads = []
    for start, count, size, gap in runs:
        for i in range(count):
            reads.append((start + i * (size + gap), size))
    return reads


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("kind", ["zst-cursor-frames", "zst-partial-frames", "xz-cursor-blocks"])
def test_runs_in_order_through_parked_streams_return_the_plain_bytes(
    tmp_path_factory: pytest.TempPathFactory, kind: str, threads: int
) -> None:
    """Property: reads in order through frames read by cursors, where the frame after the
    current one is streamed ahead (parked) and taken over by the cursor that gets to it, return
    exactly the plain bytes, for runs that start anywhere, skip gaps, jump back and overlap,
    from several threads at once. (The first pass's parking is
    ``test_first_pass_streams_a_large_first_frame_instead_of_waiting_for_it``.)"""
    folder = tmp_path_factory.mktemp(f"{kind}-{threads}")
    if kind.startswith("xz"):
        archive = folder / "p.bin.xz"
        archive.write_bytes(xz_cli_blocks(_PARK_PLAIN, "crc32"))  # 128 KiB blocks
    else:
        archive = folder / "p.bin.zst"
        # Frames without a checksum of their own get block checksums, which partial reads need.
        archive.write_bytes(zstd_frames(_PARK_PLAIN, 96 * 1024, kind != "zst-partial-frames"))
    saved = (framed.FramedReader.whole_frame_limit, framed.KEPT_WHOLE_FACTOR, framed.SCAN_STREAM_MIN)
    framed.FramedReader.whole_frame_limit = saved[0] if kind == "zst-partial-frames" else 64 * 1024
    framed.KEPT_WHOLE_FACTOR = 0
    framed.SCAN_STREAM_MIN = 0  # every frame read through a cursor is parked ahead
    parked: List[int] = []
    original_park = framed.FramedReader._park

    def counting_park(self: framed.FramedReader, frame: int, table: framed.FrameTable) -> None:
        parked.append(frame)
        original_park(self, frame, table)

    framed.FramedReader._park = counting_park  # type: ignore[method-assign]
    try:
        ratarmountcore.open(str(archive), options()).close()  # the index, by a first pass in order

        @settings(max_examples=int(os.environ.get("READ_SEQUENCE_EXAMPLES", "25")), deadline=None)
        @given(st.lists(_RUNS, min_size=threads, max_size=threads))
        def check(per_thread: List[List[tuple]]) -> None:
            wrong: List[tuple] = []
            with ratarmountcore.open(str(archive), options()) as source:
                reader = source._reader  # type: ignore[attr-defined]

                def work(runs: List[tuple]) -> None:
                    for offset, size in _reads_of(runs):
                        try:
                            if reader.pread(offset, size) != _PARK_PLAIN[offset : offset + size]:
                                wrong.append((offset, size))
                        except Exception as exc:  # a read that fails is as wrong as wrong bytes
                            wrong.append((offset, size, repr(exc)))

                workers = [threading.Thread(target=work, args=(runs,)) for runs in per_thread]
                for worker in workers:
                    worker.start()
                for worker in workers:
                    worker.join()
            assert not wrong

        check()
    finally:
        framed.FramedReader._park = original_park  # type: ignore[method-assign]
        framed.FramedReader.whole_frame_limit, framed.KEPT_WHOLE_FACTOR, framed.SCAN_STREAM_MIN = saved
    if reader_has_ahead():
        assert parked, "no frame was parked: the test does not reach the path it is about"


def reader_has_ahead() -> bool:
    """Whether readers decode ahead at all (not on one core)."""
    return (os.cpu_count() or 1) > 1


def test_streams_parked_ahead_stay_few_whatever_the_order_of_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run of reads in order that moves into a new frame parks a stream at the frame
    after it (a decoder plus its read-ahead pieces: ~12 MiB for an xz block of 24 MiB). Runs
    that go backwards through the file left every one of them parked until the file was
    closed; at most one per decoding thread is kept, the oldest closed first."""
    monkeypatch.setattr(framed.FramedReader, "whole_frame_limit", 32 * 1024)
    monkeypatch.setattr(framed, "SCAN_STREAM_MIN", 0)
    archive = tmp_path / "p.bin.zst"
    archive.write_bytes(zstd_frames(_PARK_PLAIN, 48 * 1024, True))
    with ratarmountcore.open(str(archive), options()) as source:
        reader = source._reader  # type: ignore[attr-defined]
        if not reader._ahead_depth:
            pytest.skip("one core: nothing is decoded ahead")
        table = reader.frames
        assert len(table) >= 12
        most = 0
        for frame in range(len(table) - 3, 0, -2):  # runs from the end towards the start
            start, length = table.decomp_offsets[frame], table.decomp_sizes[frame]
            for offset, size in ((start + 10, 100), (start + length - 50, 100)):  # into frame + 1
                assert reader.pread(offset, size) == _PARK_PLAIN[offset : offset + size]
            most = max(most, len(reader._parked))
        assert 1 <= most <= reader._ahead_depth, most


def test_a_damaged_bzip2_block_fails_only_the_reads_that_touch_it(tmp_path: Path) -> None:
    """rapidgzip's parallel bzip2 decoder decodes ahead and reported a damaged block's CRC error
    on reads of the intact blocks before it (found by fuzzing): such a read is redone block by
    block, each block decoded alone and checked."""
    import bz2
    import io as _io

    import rapidgzip

    rng = random.Random(9)
    members = {f"m{i:03}": rng.randbytes(4000).hex().encode() for i in range(120)}  # ~1 MB: 10 blocks
    plain = tar_bytes(members)
    archive = tmp_path / "b.tar.bz2"
    archive.write_bytes(bz2.compress(plain, 1))
    with ratarmountcore.open(str(archive), options()) as source:
        assert all(source.read("/" + name) == data for name, data in members.items())
    decoder = rapidgzip.IndexedBzip2File(str(archive), parallelization=2)
    decoder.seek(0, _io.SEEK_END)
    blocks = sorted(decoder.block_offsets().items())
    decoder.close()
    raw = bytearray(archive.read_bytes())
    step = (len(raw) - SAMPLE) // (SAMPLES - 1)
    victim = next(  # a byte in the middle of the sixth block, not sampled (the index stays in use)
        position for position in range(blocks[5][0] // 8 + 5000, blocks[6][0] // 8) if position % step >= SAMPLE
    )
    raw[victim] ^= 0x08
    mtime = archive.stat().st_mtime_ns
    archive.write_bytes(bytes(raw))
    os.utime(archive, ns=(mtime, mtime))
    damaged_from, damaged_to = blocks[5][1], blocks[6][1]
    offsets = {info.name: info.offset_data for info in tarfile.open(fileobj=_io.BytesIO(plain))}
    failed = 0
    for name, data in list(members.items())[::3]:
        with ratarmountcore.open(str(archive), options()) as source:  # (fresh: nothing cached)
            try:
                assert source.read("/" + name) == data, f"{name}: wrong bytes"
            except OSError as exc:
                assert exc.errno == errno.EIO
                touches = offsets[name] < damaged_to and offsets[name] + len(data) > damaged_from
                assert touches, f"{name}: intact, but its read failed"
                failed += 1
    assert failed


def test_frames_without_checksums_are_told_at_the_first_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Damage before the first mount of a file whose frames carry no checksum is read as data
    (found by fuzzing: a flipped byte in a stored block came back wrong, with no error); the
    user is told so once, when the index is built, and a few such files are named each."""
    import logging

    monkeypatch.setattr(framed, "_unchecked_reported", 0)
    data = tar_bytes({f"f{i}": random.Random(i).randbytes(50_000) for i in range(40)})
    paths = []
    for number, checked in enumerate((False, True, False, False, False, False)):
        path = tmp_path / f"a{number}.tar.zst"
        cctx = zstandard.ZstdCompressor(write_checksum=checked)
        path.write_bytes(b"".join(cctx.compress(data[i : i + 500_000]) for i in range(0, len(data), 500_000)))
        paths.append(path)
    xz = tmp_path / "b.tar.xz"
    xz.write_bytes(lzma.compress(data, check=lzma.CHECK_NONE))
    with caplog.at_level(logging.WARNING, logger="ratarmountcore"):
        for path in (xz, *paths):
            with ratarmountcore.open(str(path)) as source:
                assert source.read("/f3") == random.Random(3).randbytes(50_000)
        with ratarmountcore.open(str(paths[0])):  # (the index is there: nothing to say)
            pass
    assert [r.getMessage() for r in caplog.records] == [
        f"{xz}: its xz frame carries no checksum: damage from before this first mount cannot be detected "
        "(later damage is, by the checksums its index records now)",
        f"{paths[0]}: none of its 5 zstd frames carries a checksum: damage from before this first mount cannot "
        "be detected (later damage is, by the checksums its index records now)",
        f"{paths[2]}: none of its 5 zstd frames carries a checksum: damage from before this first mount cannot "
        "be detected (later damage is, by the checksums its index records now)",
        "More compressed files without checksums; they are not named each",
    ]
