"""The read-ahead wrapper of large-frame streams: same bytes, same errors, clean shutdown."""

from __future__ import annotations

import random
import threading
import time
from typing import List

import pytest

from ratarmountcore.compression.framed import FrameStream
from ratarmountcore.compression.stream_ahead import ReadAheadStream


class Source(FrameStream):
    """Hands out ``data`` in reads of at most ``step`` bytes; raises ``error`` at ``fail_at``."""

    def __init__(self, data: bytes, step: int = 1000, fail_at: int = -1) -> None:
        self.data = data
        self.step = step
        self.position = 0
        self.fail_at = fail_at
        self.closed = False
        self.reads = 0

    def read(self, size: int) -> bytes:
        assert not self.closed
        self.reads += 1
        if 0 <= self.fail_at <= self.position:
            raise ValueError(f"corrupt at {self.position}")
        piece = self.data[self.position : self.position + min(size, self.step)]
        self.position += len(piece)
        return piece

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("piece", [1, 700, 4096, 1 << 20])
def test_same_bytes_for_any_read_sizes(piece: int) -> None:
    rng = random.Random(piece)
    data = rng.randbytes(50_000)
    stream = ReadAheadStream(Source(data, step=999), piece=piece, depth=3)
    got: List[bytes] = []
    while True:
        chunk = stream.read(rng.choice([1, 10, 999, 5000, 70_000]))
        if not chunk:
            break
        got.append(chunk)
    stream.close()
    assert b"".join(got) == data
    assert stream.read(10) == b""  # stays at the end


def test_the_error_is_raised_where_it_happened() -> None:
    data = bytes(range(256)) * 100
    source = Source(data, step=1000, fail_at=5000)
    stream = ReadAheadStream(source, piece=1000, depth=2)
    assert stream.read(5000) == data[:5000]  # everything before the fault is served
    with pytest.raises(ValueError, match="corrupt at 5000"):
        stream.read(1)
    stream.close()
    assert source.closed


def test_close_stops_a_thread_blocked_on_a_full_queue() -> None:
    source = Source(bytes(10_000_000), step=1000)
    before = threading.active_count()
    stream = ReadAheadStream(source, piece=1000, depth=2)
    assert stream.read(10) == bytes(10)
    time.sleep(0.1)  # the thread fills the queue and waits
    stream.close()
    assert source.closed and threading.active_count() == before
    assert source.reads < 10  # it stopped after a few pieces, not at the end of 10 MB


def test_skip_drops_exactly_what_it_says() -> None:
    rng = random.Random(5)
    data = rng.randbytes(40_000)
    stream = ReadAheadStream(Source(data, step=777), piece=1000, depth=2)
    position = 0
    while position < len(data):
        skipped = stream.skip(rng.choice([0, 1, 999, 3000]))
        position += skipped
        chunk = stream.read(rng.choice([1, 500, 2000]))
        assert chunk == data[position : position + len(chunk)]
        position += len(chunk)
        if not skipped and not chunk:
            break
    assert position == len(data) and stream.skip(10) == 0
    stream.close()
