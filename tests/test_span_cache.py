"""The decoded-span cache of seekable compressed readers (``compression/spans.py``)."""

from __future__ import annotations

import bz2
import contextlib
import dataclasses
import gzip
import io
import random
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from conftest import Mounter
from test_deflate_resume import indexed_tar_gz

import ratarmountcore
from ratarmountcore.compression import deflate_resume
from ratarmountcore.compression.pooled import PooledReader
from ratarmountcore.compression.spans import SpanCache
from ratarmountcore.cores import default_decoder_threads
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

DATA = bytes(random.Random(7).getrandbits(8) for _ in range(10_000))


class CountingDecoder:
    """Decodes whole spans, or with ``partial`` only up to what the read needs."""

    def __init__(self, data: bytes, delay: float = 0.0, partial: bool = False) -> None:
        self.data = data
        self.delay = delay
        self.partial = partial
        self.calls: List[Tuple[int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, start: int, end: int, need: int) -> bytes:
        assert start < need <= end
        if self.partial:
            end = need
        with self.lock:
            self.calls.append((start, end))
        time.sleep(self.delay)
        return self.data[start:end]


def test_reads_within_and_across_spans_decode_each_span_once() -> None:
    starts = list(range(0, len(DATA), 1000))
    decode = CountingDecoder(DATA)
    cache = SpanCache(starts, len(DATA), capacity=len(DATA))
    rng = random.Random(1)
    for _ in range(500):
        offset = rng.randrange(len(DATA))
        size = rng.randrange(1, 3000)
        assert cache.read(offset, size, decode) == DATA[offset : offset + size]
        view = memoryview(bytearray(size))
        count = cache.readinto(offset, view, decode)
        assert bytes(view[:count]) == DATA[offset : offset + size]
    assert sorted(decode.calls) == sorted(set(decode.calls))  # no span decoded twice
    assert len(decode.calls) == len(starts)
    assert cache.hits > 0 and cache.misses == len(starts)
    assert cache.read(len(DATA), 10, decode) == b""


def test_parts_of_spans_are_decoded_further_when_a_read_needs_more() -> None:
    """A decoder that stops where the read ends: the part is cached, a read within it is a hit,
    one further into the span decodes it whole (a reader going through the span in order must
    not decode it from its start once per read), a whole span offered replaces a part, and a
    span that ends before the read (the end of the data) is not decoded again."""
    decode = CountingDecoder(DATA, partial=True)
    cache = SpanCache([0, 5000], len(DATA), capacity=len(DATA))
    assert cache.read(100, 50, decode) == DATA[100:150]
    assert decode.calls == [(0, 150)] and cache.cached_bytes == 150
    view = memoryview(bytearray(40))
    assert cache.readinto(20, view, decode) == 40 and bytes(view) == DATA[20:60]
    assert decode.calls == [(0, 150)] and cache.hits == 1
    assert cache.read(150, 10, decode) == DATA[150:160]  # just past the part: the whole span
    assert decode.calls == [(0, 150), (0, 5000)]
    assert cache.cached_bytes == 5000  # (the span replaced the part)
    assert cache.read(4000, 1500, decode) == DATA[4000:5500]  # across into the second span
    assert decode.calls == [(0, 150), (0, 5000), (5000, 5500)]
    for offset in range(5500, 6000, 100):  # in order through a span: one more decode in all
        assert cache.read(offset, 100, decode) == DATA[offset : offset + 100]
    assert decode.calls[3:] == [(5000, 10_000)]
    assert cache.read(4999, 1, decode) == DATA[4999:5000] and len(decode.calls) == 4
    offered = SpanCache([0, 5000], len(DATA), capacity=len(DATA))
    assert offered.read(5000, 10, decode) == DATA[5000:5010]
    assert offered.wanted(5000) and offered.wanted(0)  # (a part: the background decoding may offer it)
    assert offered.offer(5000, DATA[5000:]) and not offered.wanted(5000)
    calls = len(decode.calls)
    assert offered.read(9000, 1000, decode) == DATA[9000:] and len(decode.calls) == calls
    assert offered.cached_bytes == len(DATA) - 5000

    short = SpanCache([0], 10_000, capacity=20_000)  # the data ends at 7,000, the index says 10,000
    ends_early = CountingDecoder(DATA[:7000], partial=True)
    assert short.read(6000, 2000, ends_early) == DATA[6000:7000]
    assert short.read(6500, 3000, ends_early) == DATA[6500:7000]
    assert ends_early.calls == [(0, 8000)]  # (short: all there is, never decoded again)


def test_capacity_bounds_the_cached_bytes() -> None:
    data = DATA * 2  # (more than three times the capacity: not kept whole)
    starts = list(range(0, len(data), 1000))
    decode = CountingDecoder(data)
    cache = SpanCache(starts, len(data), capacity=4000)
    for offset in range(0, len(data), 500):
        assert cache.read(offset, 10, decode) == data[offset : offset + 10]
        assert cache.cached_bytes <= 4000
    # Least recently used spans went first: the first span must be decoded again.
    calls = len(decode.calls)
    cache.read(0, 1, decode)
    assert len(decode.calls) == calls + 1
    # Spans larger than a quarter of the capacity are left to the caller.
    assert cache.covers(0, 10) and not SpanCache([0], len(DATA), capacity=4000).covers(0, 10)


def test_concurrent_misses_of_one_span_decode_it_once() -> None:
    decode = CountingDecoder(DATA, delay=0.05)
    cache = SpanCache([0, 5000], len(DATA), capacity=len(DATA))
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: cache.read(100 + i, 50, decode), range(16)))
    assert results == [DATA[100 + i : 150 + i] for i in range(16)]
    assert decode.calls == [(0, 5000)]


def test_a_read_beyond_a_cached_part_waits_for_the_span_being_decoded() -> None:
    """A part of a span is cached; one thread decodes the span further for a read past the part,
    and a second read past it comes meanwhile: it waits for that decoding. (It was answered with
    the part, too short: an empty read, which the gzip reader reported as damaged data.)"""
    started = threading.Event()
    release = threading.Event()

    def decode(start: int, stop: int, need: int) -> bytes:
        if need == stop:  # the decoding of the whole span: held until the second read came
            started.set()
            assert release.wait(5)
        return DATA[start:need]

    cache = SpanCache([0, 5000], len(DATA), capacity=len(DATA))
    assert cache.read(0, 10, decode) == DATA[:10]  # the part [0, 10) is cached
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(cache.read, 500, 10, decode)
        assert started.wait(5)
        second = pool.submit(cache.read, 600, 10, decode)
        time.sleep(0.2)  # (the second read finds the span being decoded)
        release.set()
        assert first.result(5) == DATA[500:510]
        assert second.result(5) == DATA[600:610]
    assert cache.misses == 2 and cache.hits == 1


def test_failed_decodes_are_not_cached() -> None:
    attempts = []

    def flaky(start: int, end: int, _need: int) -> bytes:
        attempts.append(start)
        if len(attempts) == 1:
            raise OSError("corrupt block")
        return DATA[start:end]

    cache = SpanCache([0], len(DATA), capacity=len(DATA) * 4)
    with pytest.raises(OSError):
        cache.read(10, 10, flaky)
    assert cache.read(10, 10, flaky) == DATA[10:20]
    assert attempts == [0, 0]


def make_tar_gz(path: Path, count: int) -> Dict[str, bytes]:
    rng = random.Random(3)
    members: Dict[str, bytes] = {}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(count):
            # Half random, half repetitive: about 2:1 compression, like image folders.
            data = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 3000))) + b"x" * 2000
            name = f"d{i % 20}/f{i}.bin"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            members[name] = data
    path.write_bytes(gzip.compress(buffer.getvalue(), compresslevel=1))
    return members


def test_threads_reading_a_tar_gz_larger_than_the_cache_get_the_right_bytes(tmp_path: Path) -> None:
    """Parts of spans (a stream at least twice the cache) read by several threads at once: one
    thread's read past a cached part while another decoded the span further came back short,
    as damage (EIO through a mount), in a few of every thousand reads."""
    archive, members, opts = indexed_tar_gz(tmp_path)
    names = list(members)
    with ratarmountcore.open(str(archive), opts) as src:

        def reads(seed: int) -> int:
            rng = random.Random(seed)
            for _ in range(1500):
                name = rng.choice(names)
                offset = rng.randrange(len(members[name]))
                size = rng.choice((100, 4096, 65536))
                with src.open("/" + name) as f:
                    f.seek(offset)
                    got = f.read(size)
                assert got == members[name][offset : offset + size], (name, offset, size)
            return seed

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(reads, range(4)))
        spans = src._reader._spans  # type: ignore[attr-defined]
        assert spans.size >= 2 * spans.capacity  # (reads decode parts of spans)


@pytest.mark.parametrize(("cache_kib", "whole"), [(2560, True), (1536, False)])
def test_one_tar_gz_of_at_most_three_caches_is_kept_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache_kib: int, whole: bool
) -> None:
    """A .tar.gz (5.8 MB decoded) read at random with a cache of 2.5 MiB: all of it is kept and
    each span decoded once, whole. With 1.5 MiB (more than three times: not kept whole), misses
    decode parts and some spans again. (A 68 MB .tar.bz2, 1,000 random reads: 19 s -> 2.7 s.)"""
    from ratarmountcore.compression import spans as spans_module

    monkeypatch.setattr(spans_module, "_PROCESS", spans_module._ProcessBudget())
    archive, members, opts = indexed_tar_gz(tmp_path)
    opts = dataclasses.replace(opts, compression=dataclasses.replace(opts.compression, cache_size=cache_kib << 10))
    names = list(members)
    with ratarmountcore.open(str(archive), opts) as src:
        for seed in range(2):
            random.Random(seed).shuffle(names)
            for name in names:
                assert src.read(name) == members[name], name
        spans = src._reader._spans  # type: ignore[attr-defined]
        assert spans is not None and (spans.size <= 3 * spans.capacity) is whole
        assert spans_module.kept_whole(spans) is whole
        assert (spans.decoded_bytes == spans.size) is whole, (spans.decoded_bytes, spans.size)
        assert (spans.cached_bytes == spans.size) is whole


@pytest.mark.parametrize("backend", ["rapidgzip", "indexed_gzip"])
def test_random_member_reads_decode_each_span_once(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratarmountcore.compression import spans as spans_module

    # (the cache alone: without the background decoding of a stream that fits, tested below)
    monkeypatch.setattr(PooledReader, "_start_warm", lambda self: setattr(self, "_warm", False))
    # The stream alone in the process: the caches of sources of earlier tests not yet collected
    # would count as streams sharing the bound, and misses would decode parts (spans.py).
    monkeypatch.setattr(spans_module, "_PROCESS", spans_module._ProcessBudget())
    archive = tmp_path / "a.tar.gz"
    members = make_tar_gz(archive, 1500)
    compression = CompressionOptions(gzip_backend=backend, seek_point_spacing=64 * 1024, parallelization=1)
    opts = OpenOptions(index=IndexOptions(progress=False), compression=compression)
    with ratarmountcore.open(str(archive), opts):
        pass  # build the index with its seek points
    with ratarmountcore.open(str(archive), opts) as src:
        reader = src._reader  # type: ignore[attr-defined]
        names = list(members)
        random.Random(5).shuffle(names)
        for name in names:
            assert src.read(name) == members[name], name
        spans = reader._spans
        assert spans is not None, "seek points known, but no span cache"
        assert spans.misses > 3  # the data spans several seek points
        # Every span decoded at most once (the cache holds the whole 8 MB): no re-decoding.
        assert spans.decoded_bytes <= reader.size
        assert spans.hits > len(members) // 2


def test_cache_size_zero_disables_the_cache(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    members = make_tar_gz(archive, 300)
    opts = OpenOptions(
        index=IndexOptions(progress=False), compression=CompressionOptions(cache_size=0, parallelization=1)
    )
    with ratarmountcore.open(str(archive), opts) as src:
        for name, data in members.items():
            assert src.read(name) == data
        assert src._reader._spans is None  # type: ignore[attr-defined]


def test_all_caches_of_the_process_share_one_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """A union of many compressed archives keeps at most one cache's capacity of decoded data."""
    from ratarmountcore.compression import spans

    monkeypatch.setattr(spans, "_PROCESS", spans._ProcessBudget())
    starts = list(range(0, len(DATA), 1000))
    caches = [SpanCache(starts, len(DATA), capacity=4000) for _ in range(5)]
    decode = CountingDecoder(DATA)
    for round_ in range(2):
        for cache in caches:
            for offset in range(0, 4000, 1000):
                assert cache.read(offset + round_, 10, decode) == DATA[offset + round_ : offset + round_ + 10]
            assert sum(c.cached_bytes for c in caches) <= 4000
    assert spans._PROCESS.bytes == sum(c.cached_bytes for c in caches) <= 4000
    # The most recently used spans are the ones kept: the last cache still hits.
    calls = len(decode.calls)
    caches[-1].read(3500, 10, decode)
    assert len(decode.calls) == calls
    for cache in caches:
        cache.clear()
    assert spans._PROCESS.bytes == 0


@pytest.mark.parametrize(
    ("count", "capacity", "whole"),
    [(1, 3000, False), (1, 4000, True), (2, 10_000, True), (3, 10_000, True), (4, 10_000, False)],
)
def test_several_streams_up_to_three_times_the_bound_are_kept_whole(
    monkeypatch: pytest.MonkeyPatch, count: int, capacity: int, whole: bool
) -> None:
    """A folder or union of small archives, or one archive, whose data is at most ``GROWTH``
    (3) times the bound is all kept (read again, no span is decoded twice); more than that
    keeps the bound."""
    from ratarmountcore.compression import spans

    monkeypatch.setattr(spans, "_PROCESS", spans._ProcessBudget())
    starts = list(range(0, len(DATA), 1000))
    caches = [SpanCache(starts, len(DATA), capacity=capacity) for _ in range(count)]
    total = len(DATA) * count
    decode = CountingDecoder(DATA)
    for _ in range(2):
        for cache in caches:
            for offset in range(0, len(DATA), 1000):
                assert cache.read(offset, 10, decode) == DATA[offset : offset + 10]
    assert spans.shares_beyond_budget(caches[0]) is (count > 1 and not whole)
    assert spans.kept_whole(caches[0]) is whole
    if whole:
        assert len(decode.calls) == total // 1000 and spans._PROCESS.bytes == total
    else:
        assert len(decode.calls) == 2 * total // 1000 and spans._PROCESS.bytes <= capacity
    for cache in caches:
        cache.clear()


def test_a_closed_cache_no_longer_counts_among_the_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing a cache takes its stream out of the sum at once (not when it is collected): the
    archives of a closed union must not make the next ones seem to share the bound."""
    from ratarmountcore.compression import spans

    monkeypatch.setattr(spans, "_PROCESS", spans._ProcessBudget())
    starts = list(range(0, len(DATA), 1000))
    caches = [SpanCache(starts, len(DATA), capacity=len(DATA)) for _ in range(2)]
    assert (spans._PROCESS.streams, spans._PROCESS.count) == (2 * len(DATA), 2)
    caches[0].read(0, 10, CountingDecoder(DATA))
    caches[0].close()
    assert (spans._PROCESS.streams, spans._PROCESS.count, spans._PROCESS.bytes) == (len(DATA), 1, 0)
    caches[0].close()  # (twice: counted out once)
    del caches[0]
    assert (spans._PROCESS.streams, spans._PROCESS.count) == (len(DATA), 1)


def one_member_tar_gz(path: Path, data: bytes) -> Path:
    """``path``: a .tar.gz holding ``data`` as ``big.bin``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("big.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buffer.getvalue(), compresslevel=1))
    return path


@contextlib.contextmanager
def _indexed_big_member(tmp_path: Path, big: bytes, compression: CompressionOptions) -> Iterator[Tuple[Any, Any, Any]]:
    """(source, member, compressed reader) of a .tar.gz holding ``big`` as big.bin, opened again
    after its index was built."""
    archive = one_member_tar_gz(tmp_path / "a.tar.gz", big)
    opts = OpenOptions(index=IndexOptions(progress=False), compression=compression)
    ratarmountcore.open(str(archive), opts).close()
    with ratarmountcore.open(str(archive), opts) as src:
        yield src, src.open_info(src.info("/big.bin")), src._reader  # type: ignore[attr-defined]


@pytest.mark.parametrize("backend", ["rapidgzip", "indexed_gzip"])
def test_large_reads_in_order_bypass_the_cache_and_decode_into_the_buffer(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads of DIRECT_READ_MIN bytes or more that go on where the last one ended (a large member
    through the kernel's read-ahead, members read in order) decode straight into the caller's
    buffer: right bytes, nothing added to the span cache. With indexed_gzip every large read
    does; with rapidgzip a large read that continues none (the first here) goes through the
    span cache, decoding only up to its end. (Without the background decoding of a stream that
    fits the cache, which a span-cache miss starts.)"""
    monkeypatch.setattr(PooledReader, "_start_warm", lambda self: setattr(self, "_warm", False))
    from ratarmountcore.compression.pooled import DIRECT_READ_MIN

    rng = random.Random(9)
    big = bytes(rng.getrandbits(8) for _ in range(300_000)) + b"y" * 700_000
    compression = CompressionOptions(gzip_backend=backend, seek_point_spacing=64 * 1024, parallelization=1)
    with _indexed_big_member(tmp_path, big, compression) as (src, member, reader):
        decoded_after = []
        for offset in range(0, len(big) - DIRECT_READ_MIN, DIRECT_READ_MIN):  # (whole large reads)
            view = memoryview(bytearray(DIRECT_READ_MIN))
            count = member.preadinto(offset, view)
            assert bytes(view[:count]) == big[offset : offset + DIRECT_READ_MIN]
            decoded_after.append(reader._spans.decoded_bytes)
        assert decoded_after[-1] == decoded_after[0], "reads in order went through the span cache"
        assert (decoded_after[0] > 0) == (backend == "rapidgzip")
        # The Python API's readinto takes the same path (a file object read in large pieces).
        end = len(big) - DIRECT_READ_MIN
        with src.open("/big.bin") as f:
            f.seek(end)
            piece = bytearray(DIRECT_READ_MIN + 10)
            assert f.readinto(piece) == DIRECT_READ_MIN and bytes(piece[:DIRECT_READ_MIN]) == big[end:]
            assert f.readinto(piece) == 0
        misses = reader._spans.misses
        small = memoryview(bytearray(1000))
        assert member.preadinto(5000, small) == 1000 and bytes(small) == big[5000:6000]
        assert reader._spans.misses == misses + (backend == "indexed_gzip")  # (rapidgzip: cached by the first read)


def test_a_random_large_read_goes_through_the_span_cache_and_one_in_order_in_parallel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rapidgzip's parallel decoders start at a coarse seek point and decode whole chunks ahead of
    the read; a large read that continues no recent one goes through the span cache (which in a
    stream larger than it decodes from the seek point before the read only up to its end), and
    the next read in order goes on in parallel. (Without the background decoding of a stream
    that fits the cache, which a span-cache miss starts.)"""
    monkeypatch.setattr(PooledReader, "_start_warm", lambda self: setattr(self, "_warm", False))
    from ratarmountcore.compression.pooled import DIRECT_READ_MIN

    rng = random.Random(10)
    big = bytes(rng.getrandbits(8) for _ in range(2_000_000))
    compression = CompressionOptions(gzip_backend="rapidgzip", seek_point_spacing=1 << 20, parallelization=2)
    with _indexed_big_member(tmp_path, big, compression) as (_src, member, reader):
        offset = 1_100_000
        view = memoryview(bytearray(DIRECT_READ_MIN))
        assert member.preadinto(offset, view) == DIRECT_READ_MIN
        assert bytes(view) == big[offset : offset + DIRECT_READ_MIN]
        decoded = reader._spans.decoded_bytes
        assert reader._spans.misses >= 1 and decoded > 0
        assert reader.stats.decoders_created == 0, "a parallel decoder was made for a random read"
        following = offset + DIRECT_READ_MIN + 512
        assert member.preadinto(following, view) == DIRECT_READ_MIN
        assert bytes(view) == big[following : following + DIRECT_READ_MIN]
        assert reader.stats.decoders_created == 1
        assert reader._spans.decoded_bytes == decoded  # (in order: the parallel decoders)


def test_a_read_that_goes_on_from_one_still_being_served_is_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel's read-ahead asks for the next piece of a file while the last one is being
    decoded: that piece goes on from the end the last one asked for, not from where a finished
    read ended (a `cat` of a 440 MB member through the mount: 2.3 s instead of 1.6 s when such
    pieces went through the span cache)."""
    monkeypatch.setattr(PooledReader, "_start_warm", lambda self: setattr(self, "_warm", False))
    from ratarmountcore.compression.gzip import RapidgzipReader
    from ratarmountcore.compression.pooled import DIRECT_READ_MIN

    big = random.Random(11).randbytes(1_500_000)
    compression = CompressionOptions(gzip_backend="rapidgzip", seek_point_spacing=256 * 1024, parallelization=2)
    with _indexed_big_member(tmp_path, big, compression) as (_src, member, reader):
        asked: List[bool] = []
        serve = RapidgzipReader.pread

        def pread_asking_on(self: RapidgzipReader, offset: int, size: int) -> bytes:
            if not asked:  # (while the first read is served, the next piece comes in)
                asked.append(self._parallel(offset + size + 512, DIRECT_READ_MIN))
            return serve(self, offset, size)

        monkeypatch.setattr(RapidgzipReader, "pread", pread_asking_on)
        view = memoryview(bytearray(DIRECT_READ_MIN))
        assert (
            member.preadinto(300_000, view) == DIRECT_READ_MIN
            and bytes(view) == big[300_000 : 300_000 + DIRECT_READ_MIN]
        )
        assert asked == [True]


def test_a_member_streamed_in_small_pieces_goes_to_the_parallel_decoders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small reads each going on exactly from the last (``shutil.copyfileobj`` through the Python
    API) are taken over by the parallel decoders after ``STREAM_RUN`` of them; small reads of
    members one after the other (a header between them) are not."""
    monkeypatch.setattr(PooledReader, "_start_warm", lambda self: setattr(self, "_warm", False))
    from ratarmountcore.compression.gzip import STREAM_RUN

    big = random.Random(12).randbytes(3_000_000)
    compression = CompressionOptions(gzip_backend="rapidgzip", seek_point_spacing=256 * 1024, parallelization=2)
    with _indexed_big_member(tmp_path, big, compression) as (src, member, reader):
        piece = 64 * 1024
        with src.open("/big.bin") as f:
            for i in range(STREAM_RUN - 1):
                assert f.read(piece) == big[i * piece : (i + 1) * piece]
            assert reader.stats.decoders_created == 0  # (the span cache so far)
            copied = f.read(piece)
            rest = b"".join(iter(lambda: f.read(piece), b""))
        assert copied + rest == big[(STREAM_RUN - 1) * piece :]
        assert reader.stats.decoders_created == 1
        gaps = memoryview(bytearray(1000))
        for i in range(2 * STREAM_RUN):
            assert member.preadinto(1_500_000 + 1512 * i, gaps) == 1000
        assert reader.stats.decoders_created == 1


@pytest.mark.parametrize("isal", [True, False])
def test_span_misses_use_single_threaded_decoders_and_large_reads_parallel_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isal: bool
) -> None:
    """rapidgzip: a span-cache miss is decoded by ISA-L from the stored seek points (no rapidgzip
    decoder, whose own chunk cache would hold what the span cache holds), or without python-isal
    by a decoder with one thread (no speculative work on the following chunks); a large read by
    one with all the configured threads. (Without the background decoding of a stream that fits
    the cache.)"""
    monkeypatch.setattr(PooledReader, "_start_warm", lambda self: setattr(self, "_warm", False))
    if not isal:
        monkeypatch.setattr(deflate_resume, "_isal_zlib", lambda: None)
    from ratarmountcore.compression.gzip import RapidgzipReader
    from ratarmountcore.compression.pooled import DIRECT_READ_MIN

    rng = random.Random(3)
    big = bytes(rng.getrandbits(8) for _ in range(400_000))
    archive = one_member_tar_gz(tmp_path / "a.tar.gz", big)
    compression = CompressionOptions(gzip_backend="rapidgzip", seek_point_spacing=64 * 1024, parallelization=2)
    opts = OpenOptions(index=IndexOptions(progress=False), compression=compression)
    with ratarmountcore.open(str(archive), opts):
        pass
    made: List[int] = []
    original = RapidgzipReader._open_decoder

    def recording(self: RapidgzipReader, raw, threads: int):  # type: ignore[no-untyped-def]
        made.append(threads)
        return original(self, raw, threads)

    monkeypatch.setattr(RapidgzipReader, "_open_decoder", recording)
    with ratarmountcore.open(str(archive), opts) as src:
        member = src.open_info(src.info("/big.bin"))
        small = memoryview(bytearray(1000))
        for offset in (300_000, 5_000, 150_000):
            assert member.preadinto(offset, small) == 1000 and bytes(small) == big[offset : offset + 1000]
        assert made == [] if isal else (made and set(made) == {1}), made
        large = memoryview(bytearray(DIRECT_READ_MIN))  # (in order, after the read that ended at 6,000)
        assert member.preadinto(6000, large) == DIRECT_READ_MIN and bytes(large) == big[6000 : 6000 + DIRECT_READ_MIN]
        assert made[-1] == 2

    # With -P left at its default, rapidgzip's parallel decoders run two threads per core.
    default = OpenOptions(index=IndexOptions(progress=False), compression=CompressionOptions(gzip_backend="rapidgzip"))
    made.clear()
    with ratarmountcore.open(str(archive), default) as src:
        member = src.open_info(src.info("/big.bin"))
        assert member.preadinto(0, small) == 1000
        assert member.preadinto(1000, large) == DIRECT_READ_MIN and bytes(large) == big[1000 : 1000 + DIRECT_READ_MIN]
    assert made[-1] == min(2 * default_decoder_threads(), max(default_decoder_threads(), 16))


def _warm_thread(reader: object) -> threading.Thread:
    with reader._warm_lock:  # type: ignore[attr-defined]  # (under which the thread is started)
        warm = reader._warm  # type: ignore[attr-defined]
    assert isinstance(warm, threading.Thread), f"no background decoding ({warm!r})"
    return warm


def _indexed(archive: Path) -> OpenOptions:
    """Options with seek points every 64 KiB, and ``archive``'s index built with them."""
    opts = OpenOptions(
        index=IndexOptions(progress=False),
        compression=CompressionOptions(seek_point_spacing=64 * 1024, parallelization=2),
    )
    with ratarmountcore.open(str(archive), opts):
        pass
    return opts


def test_a_stream_that_fits_the_cache_is_decoded_whole_after_the_first_miss(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    members = make_tar_gz(archive, 1500)
    opts = _indexed(archive)
    with ratarmountcore.open(str(archive), opts) as src:
        reader = src._reader  # type: ignore[attr-defined]
        names = list(members)
        assert src.read(names[0]) == members[names[0]]  # (learns the spans)
        assert src.read(names[-1]) == members[names[-1]]  # the first miss starts it
        _warm_thread(reader).join(30)
        spans = reader._spans
        assert spans.cached_bytes == reader.size  # every span, decoded once
        misses = spans.misses
        random.Random(5).shuffle(names)
        for name in names:
            assert src.read(name) == members[name], name
        assert spans.misses == misses  # nothing decoded any more
        assert spans.decoded_bytes == reader.size


def _two_archives_and_a_small_cache(tmp_path: Path) -> Tuple[Path, Path, Dict[str, bytes], OpenOptions]:
    """Two .tar.gz of 600 members, the first's members, and options whose cache (512 KiB)
    cannot hold either stream."""
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    members = make_tar_gz(first, 600)
    make_tar_gz(second, 600)
    small = OpenOptions(
        index=IndexOptions(progress=False),
        compression=CompressionOptions(seek_point_spacing=64 * 1024, parallelization=1, cache_size=512 * 1024),
    )
    return first, second, members, small


def _finished_job(reader: Any) -> Any:
    """The reader's job in the queue of several readers, once it has run."""
    from ratarmountcore.compression.pooled import _WarmJob

    job = reader._warm
    assert isinstance(job, _WarmJob), job
    assert job._done.wait(30)
    return job


def test_no_background_decoding_when_the_stream_is_beyond_three_caches(tmp_path: Path) -> None:
    """A stream of more than three caches is not decoded ahead (its misses decode what they
    need); several small streams that the process keeps whole are, by the queue's one thread,
    from each one's first miss on (a union of two: the one read is decoded whole)."""
    first, second, members, small = _two_archives_and_a_small_cache(tmp_path)
    with ratarmountcore.open(str(first), small) as src:
        names = list(members)
        assert src.read(names[0]) == members[names[0]] and src.read(names[-1]) == members[names[-1]]
        assert src._reader._warm is False  # type: ignore[attr-defined]
    union = OpenOptions(
        index=IndexOptions(progress=False),
        compression=CompressionOptions(seek_point_spacing=64 * 1024, parallelization=1),
    )
    with ratarmountcore.open([str(first), str(second)], union) as both:
        assert both.read(names[0]) == members[names[0]] and both.read(names[-1]) == members[names[-1]]
        unread, read = [s._reader for s in both.sources]  # type: ignore[attr-defined]
        assert unread._warm is None  # (b.tar.gz serves the names)
        _finished_job(read)
        assert read._spans.cached_bytes == read.size


def _make_tar_bz2(path: Path, count: int) -> Dict[str, bytes]:
    members = make_tar_gz(path, count)
    path.write_bytes(bz2.compress(gzip.decompress(path.read_bytes()), 1))  # (100 KB blocks)
    return members


@pytest.mark.parametrize("make", [make_tar_gz, _make_tar_bz2], ids=["tar.gz", "tar.bz2"])
def test_expect_reads_decodes_a_stream_that_fits_before_any_read(tmp_path: Path, make: Any) -> None:
    """A mount that is up says so (``expect_reads``): the whole stream is decoded into the cache
    then, not from the first read's miss on. For bzip2 the span starts come from a decoder."""
    archive = tmp_path / "a.tar"
    members = make(archive, 1500)
    opts = _indexed(archive)
    with ratarmountcore.open(str(archive), opts) as src:
        reader = src._reader  # type: ignore[attr-defined]
        assert reader._warm is None and reader._spans is None  # (opening decodes nothing)
        src.expect_reads()
        deadline = time.monotonic() + 30
        while not isinstance(reader._warm, threading.Thread) and time.monotonic() < deadline:
            time.sleep(0.01)
        _warm_thread(reader).join(30)
        spans = reader._spans
        assert spans.cached_bytes == reader.size  # every span, before any read
        names = list(members)
        random.Random(5).shuffle(names)
        for name in names:
            assert src.read(name) == members[name], name
        assert spans.misses == 0


def test_expect_reads_decodes_nothing_beyond_three_caches_and_several_that_fit_in_the_queue(
    tmp_path: Path,
) -> None:
    """``expect_reads`` decodes nothing of a stream beyond three caches; the streams of a union
    that the process keeps whole are decoded, one after another, before any read."""
    first, second, members, small = _two_archives_and_a_small_cache(tmp_path)
    with ratarmountcore.open(str(first), small):
        pass
    with ratarmountcore.open(str(first), small) as src:
        src.expect_reads()
        reader = src._reader  # type: ignore[attr-defined]
        _finished_job(reader)
        assert reader.stats.compressed_bytes_read == 0 and reader._spans.cached_bytes == 0
        names = list(members)
        assert src.read(names[-1]) == members[names[-1]]
    both = OpenOptions(
        index=IndexOptions(progress=False),
        compression=CompressionOptions(seek_point_spacing=64 * 1024, parallelization=1),
    )
    with ratarmountcore.open([str(first), str(second)], both) as union:
        union.expect_reads()
        readers = [s._reader for s in union.sources]  # type: ignore[attr-defined]
        for reader in readers:
            _finished_job(reader)
            assert reader._spans.cached_bytes == reader.size
        misses = [r._spans.misses for r in readers]
        assert union.read(names[0]) == members[names[0]]
        assert [r._spans.misses for r in readers] == misses  # (served from what was decoded ahead)


def test_a_mount_decodes_a_small_tar_gz_before_it_is_read(mounter: Mounter, tmp_path: Path) -> None:
    """The FUSE front-end gives the hint once the mount is up (``expect_reads``); the debug log
    tells when the whole-stream decoding starts. Nothing in the mount is touched before."""
    archive = tmp_path / "a.tar.gz"
    members = make_tar_gz(archive, 600)
    mounter.unmount(mounter.mount(archive))  # (builds the index)
    log = tmp_path / "mount.log"
    mountpoint = mounter.mount(archive, extra=["-d", "--log-file", str(log)])
    wanted = "into the span cache in the background"
    deadline = time.monotonic() + 30
    while wanted not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wanted in log.read_text(), log.read_text()[-2000:]
    name = sorted(members)[-1]
    assert (mountpoint / name).read_bytes() == members[name]


def test_closing_right_after_expect_reads_waits_for_the_thread_that_starts_the_decoding(tmp_path: Path) -> None:
    """A bzip2 reader's starting thread makes a rapidgzip decoder and reads with it; closed under
    it, a process that then exits is aborted by rapidgzip (1 in 8 mounts unmounted at once)."""
    archive = tmp_path / "a.tar.bz2"
    members = _make_tar_bz2(archive, 1500)
    opts = OpenOptions(index=IndexOptions(progress=False), compression=CompressionOptions(parallelization=2))
    with ratarmountcore.open(str(archive), opts):
        pass
    for _ in range(3):
        src = ratarmountcore.open(str(archive), opts)
        reader = src._reader  # type: ignore[attr-defined]
        src.expect_reads()
        src.close()
        alive = [t.name for t in threading.enumerate() if t.name.startswith("ratarmount-warm")]
        assert alive == [], alive
        assert reader._closing
    with ratarmountcore.open(str(archive), opts) as src:
        name = sorted(members)[-1]
        assert src.read(name) == members[name]


def test_a_folder_of_small_archives_is_decoded_ahead_by_one_thread(tmp_path: Path) -> None:
    """A folder of small .tar.gz mounted with -r: ``expect_reads`` has every archive decoded
    ahead (together they fit three caches), one after another by the queue's one thread -- not
    a thread each, which a folder of thousands of small archives would make."""
    folder = tmp_path / "train"
    folder.mkdir()
    expected: Dict[str, bytes] = {}
    for k in range(12):
        archive = folder / f"c{k:02}.tar.gz"
        members = make_tar_gz(archive, 120)
        expected.update({f"/c{k:02}.tar.gz/{name}": data for name, data in members.items()})
        _indexed(archive)
    opts = OpenOptions(recursive=True, index=IndexOptions(progress=False))
    with ratarmountcore.open(str(folder), opts) as src:
        archives = [known.source for known in src._archives.values() if known.source is not None]  # type: ignore[attr-defined]
        readers = [archive._reader for archive in archives]
        assert len(readers) == 12
        src.expect_reads()
        most = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            warming = [t for t in threading.enumerate() if t.name.startswith("ratarmount-warm")]
            most = max(most, len(warming))
            if not warming:
                break
            time.sleep(0.002)
        assert most <= 1
        for reader in readers:
            _finished_job(reader)
            assert reader._spans.cached_bytes == reader.size
        for path, data in expected.items():
            assert src.read(path) == data, path
        assert all(reader._spans.misses == 0 for reader in readers)


def test_closing_readers_whose_jobs_wait_in_the_queue(tmp_path: Path) -> None:
    """A job still queued when its reader closes is cancelled and never decodes; a union closed
    while the queue works returns at once (a running job stops after its span)."""
    paths = []
    for k in range(6):
        archive = tmp_path / f"p{k}.tar.gz"
        make_tar_gz(archive, 1500)  # (~6 MB decoded: tens of ms each to decode ahead)
        _indexed(archive)
        paths.append(str(archive))
    opts = OpenOptions(index=IndexOptions(progress=False))
    union = ratarmountcore.open(paths, opts)
    readers = [s._reader for s in union.sources]  # type: ignore[attr-defined]
    union.expect_reads()
    jobs = [reader._warm for reader in readers]
    last = jobs[-1]
    last.cancel_or_wait(10)  # (what the last reader's close does: its job waits behind five)
    assert last._state == "cancelled"
    for job in jobs[:2]:
        assert job._done.wait(30)
    assert readers[0]._spans.cached_bytes == readers[0].size
    started = time.monotonic()
    union.close()
    assert time.monotonic() - started < 5
    assert [job._state for job in jobs][-1] == "cancelled" and readers[-1].stats.compressed_bytes_read == 0
    assert all(job._state in ("cancelled", "done") for job in jobs)


def test_the_queue_goes_on_after_a_job_that_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that raises (say, an index closed under it) ends that job, not the queue's thread."""
    from ratarmountcore.compression import pooled

    ran: List[str] = []

    class Failing:
        def run(self) -> None:
            ran.append("failing")
            raise RuntimeError("index closed")

    class Fine:
        def __init__(self) -> None:
            self.done = threading.Event()

        def run(self) -> None:
            ran.append("fine")
            self.done.set()

    queue = pooled._WarmQueue()
    queue.add(Failing())  # type: ignore[arg-type]
    fine = Fine()
    queue.add(fine)  # type: ignore[arg-type]
    assert fine.done.wait(10)
    later = Fine()
    queue.add(later)  # type: ignore[arg-type]
    assert later.done.wait(10) and ran == ["failing", "fine", "fine"]
