"""The first pass over a compressed tar of tars (ImageNet's train tar, compressed): the inner tars
and each member's first bytes are read from the stream the scan decodes, never by going back in
it, so every frame is decoded once."""

from __future__ import annotations

import io
import random
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.compression.framed import SCAN_STREAM_MIN, FramedReader, FrameTable
from ratarmountcore.io.readers import ReaderStream
from ratarmountcore.options import IndexOptions, OpenOptions


def _tar_of_tars(classes: int, members: int, seed: int) -> Tuple[bytes, Dict[str, bytes]]:
    """An uncompressed tar of ``classes`` class tars of ``members`` incompressible files (1-6
    KiB), and every file by its path in a recursive mount."""
    rng = random.Random(seed)
    expected: Dict[str, bytes] = {}
    outer = io.BytesIO()
    with tarfile.open(fileobj=outer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for c in range(classes):
            files = {f"n{c:03}_{i}.JPEG": rng.randbytes(rng.randint(1024, 6 * 1024)) for i in range(members)}
            inner = tar_bytes(files)
            info = tarfile.TarInfo(f"train/n{c:03}.tar")
            info.size = len(inner)
            tar.addfile(info, io.BytesIO(inner))
            expected.update({f"/train/n{c:03}.tar/{name}": data for name, data in files.items()})
    return outer.getvalue(), expected


@pytest.mark.parametrize("codec", ["xz", "zst"])
def test_a_recursive_first_pass_decodes_each_frame_once(
    codec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look at a member's first bytes (is it an archive?) went back to the reader: behind the
    decoder when the header had come at the end of the scan's window, and the frame was decoded
    again from its start. A 68 MB .tar.xz of 200 class tars (24 MiB blocks) decoded twice over,
    its first open 5.5 s instead of 1.9 s. Counted by the streams opened per frame."""
    # Frames the first pass streams (at least SCAN_STREAM_MIN): one zstd frame (of a file, so
    # that its size is in its header), xz blocks of 9 MiB.
    tool = {"xz": ["xz", "-c", "-0", "--block-size=9MiB"], "zst": ["zstd", "-c", "-q", "-1"]}[codec]
    if shutil.which(tool[0]) is None:
        pytest.skip(f"{tool[0]} missing")
    data, expected = _tar_of_tars(30, 100, 3)  # ~11 MB: many 1 MiB windows of the scan
    (tmp_path / "train.tar").write_bytes(data)
    archive = tmp_path / f"train.tar.{codec}"
    with open(archive, "wb") as out:
        subprocess.run([*tool, str(tmp_path / "train.tar")], stdout=out, check=True)

    from ratarmountcore.compression.xz import XzReader
    from ratarmountcore.compression.zstd import ZstdReader

    decoded: List[int] = []  # frames whose decoding began, by a stream or whole
    reader_class = XzReader if codec == "xz" else ZstdReader
    open_stream, decode_whole = reader_class._open_stream, FramedReader._decode_checked
    tables: List[FrameTable] = []

    def streamed(self: FramedReader, frame: int, table: FrameTable):  # type: ignore[no-untyped-def]
        decoded.append(frame)
        tables.append(table)
        return open_stream(self, frame, table)

    def whole(self: FramedReader, frame: int, table: FrameTable):  # type: ignore[no-untyped-def]
        decoded.append(frame)
        tables.append(table)
        return decode_whole(self, frame, table)

    monkeypatch.setattr(reader_class, "_open_stream", streamed)
    monkeypatch.setattr(FramedReader, "_decode_checked", whole)
    with ratarmountcore.open(str(archive), OpenOptions(recursive=True, index=IndexOptions(progress=False))) as src:
        assert sorted(decoded) == list(range(len(tables[0]))), f"frames decoded in the first pass: {decoded}"
        assert max(tables[0].decomp_sizes) >= SCAN_STREAM_MIN
        for path, content in expected.items():
            assert src.read(path) == content, path


def test_reader_stream_pread_serves_both_windows_and_goes_on_from_their_end() -> None:
    """``ReaderStream.pread`` takes what its current and previous read-ahead windows hold and
    asks the reader only for the rest, which lies after them."""
    data = bytes(range(256)) * 64  # 16 KiB
    asked: List[Tuple[int, int]] = []

    class Reader:
        def pread(self, offset: int, size: int) -> bytes:
            asked.append((offset, size))
            return data[offset : offset + size]

        def close(self) -> None:
            pass

    stream = ReaderStream(Reader(), len(data), read_ahead=4096)
    assert stream.read(100) == data[:100]
    stream.seek(4000)
    assert stream.read(200) == data[4000:4200]  # straddles: windows [0, 4096) and [4096, 8192)
    assert asked == [(0, 4096), (4096, 4096)]
    asked.clear()
    assert stream.pread(4050, 100) == data[4050:4150]  # the previous window, then the current
    assert stream.pread(100, 50) == data[100:150]
    assert asked == []
    assert stream.pread(8000, 500) == data[8000:8500]  # the current window's end, then the reader
    assert asked == [(8192, 308)]
    assert stream.pread(12000, 10) == data[12000:12010]  # in neither
    assert asked[-1] == (12000, 10)
    assert stream.tell() == 4200  # (the position stays)
    # A window shorter than asked for ended at the end of the data: nothing more is asked.
    stream.seek(15000)
    assert stream.read(100) == data[15000:15100]
    asked.clear()
    assert stream.pread(16000, 1000) == data[16000:]
    assert asked == []
