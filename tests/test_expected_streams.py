"""A tar of compressed tars mounted with -r counts its inner streams in the caches' totals from the
start (``compression/expected.py``), not one by one as reads open them: the caches then keep
their bound instead of keeping everything until three caches' worth of streams are open."""

from __future__ import annotations

import gzip
import io
import json
import random
import sqlite3
import tarfile
from pathlib import Path
from typing import Dict, Tuple

import pytest
import zstandard
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.compression import expected, framed, spans
from ratarmountcore.formats import FormatId
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

CAPACITY = 64 * 1024


def _outer_tar(path: Path, classes: int) -> Dict[str, Tuple[int, int]]:
    """A tar of ``classes`` class .tar.gz and as many .tar.zst (10 incompressible files of 4-6
    KiB each, ~50 KB decoded), plus a .csv.gz that is no archive; the compressed and decoded
    bytes of the inner archives by format."""
    rng = random.Random(7)
    sizes: Dict[str, Tuple[int, int]] = {"gzip": (0, 0), "zstd": (0, 0)}
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        for c in range(classes):
            for fmt, suffix, compress in (
                ("gzip", "tar.gz", gzip.compress),
                ("zstd", "tar.zst", zstandard.ZstdCompressor().compress),
            ):
                inner = tar_bytes({f"{fmt}{c}_{i}.JPEG": rng.randbytes(rng.randint(4096, 6144)) for i in range(10)})
                packed = compress(inner)
                add(f"train/{fmt}{c:02}.{suffix}", packed)
                sizes[fmt] = (sizes[fmt][0] + len(packed), sizes[fmt][1] + len(inner))
        add("labels.csv.gz", gzip.compress(b"a,b\n" * 1000))
    return sizes


@pytest.fixture
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts of this test's own (other tests' sources may still be open)."""
    monkeypatch.setattr(spans, "_PROCESS", spans._ProcessBudget())
    monkeypatch.setattr(framed, "FRAME_CACHE", framed.FrameCache(framed.FRAME_CACHE_BYTES))


def _open(path: Path) -> ratarmountcore.MountSource:
    options = OpenOptions(
        recursive=True, index=IndexOptions(progress=False), compression=CompressionOptions(cache_size=CAPACITY)
    )
    return ratarmountcore.open(str(path), options)


def test_the_index_records_what_the_inner_archives_decode_to(tmp_path: Path) -> None:
    archive = tmp_path / "train.tar"
    sizes = _outer_tar(archive, 3)
    with _open(archive) as src:
        index_path = src.index_path  # type: ignore[attr-defined]
    with sqlite3.connect(index_path) as conn:
        (value,) = conn.execute("SELECT value FROM metadata WHERE key = ?", (expected.METADATA_KEY,)).fetchone()
    assert {fmt: tuple(pair) for fmt, pair in json.loads(value).items()} == sizes  # (not the .csv.gz)
    assert expected.parse_sizes(value) == {FormatId(fmt): pair for fmt, pair in sizes.items()}


@pytest.mark.parametrize("value", [None, "", "[]", "{", '{"gzip": 5}', '{"nope": [1, 2]}', '{"gzip": [0, 9]}'])
def test_sizes_not_understood_announce_nothing(value: str) -> None:
    assert expected.parse_sizes(value) == {}


def test_inner_streams_count_from_the_open_and_the_caches_keep_their_bound(tmp_path: Path, fresh_caches: None) -> None:
    archive = tmp_path / "train.tar"
    sizes = _outer_tar(archive, 20)  # 20 x ~50 KB of each format: far beyond three caches
    gz_total, zst_total = sizes["gzip"][1], sizes["zstd"][1]
    assert gz_total > 3 * CAPACITY and zst_total > 3 * CAPACITY
    with _open(archive) as src:
        process, frames = spans._PROCESS, framed.FRAME_CACHE
        assert (process.streams, process.expected) == (0, gz_total)
        assert (frames.files(), frames.expected) == (zst_total, zst_total)
        # Read from two class archives of each format: ~100 KB, within three caches of 64 KiB,
        # which the caches used to keep whole (bound = the open streams) until more were open.
        for c in (0, 1):
            for fmt, suffix in (("gzip", "tar.gz"), ("zstd", "tar.zst")):
                folder = f"/train/{fmt}{c:02}.{suffix}"
                names = [name for name, _ in src.list_entries(folder)]
                assert len(src.read(f"{folder}/{names[0]}")) >= 4096
        assert CAPACITY < process.streams <= 3 * CAPACITY  # the two opened gzip streams
        assert process.competing() == pytest.approx(gz_total, rel=0.02)
        assert process.bound() == CAPACITY
        assert frames.files() == pytest.approx(zst_total, rel=0.02)
        assert not frames.keeps_whole(frames.files())
    # Closed: nothing is expected any more.
    assert (process.expected, frames.expected) == (0, 0)


def test_the_announcement_shrinks_as_streams_open_and_is_withdrawn(fresh_caches: None) -> None:
    announced = expected.ExpectedStreams({FormatId.GZIP: (1000, 4000), FormatId.XZ: (500, 1000)})
    assert (spans._PROCESS.expected, framed.FRAME_CACHE.expected) == (4000, 1000)
    announced.opened(FormatId.GZIP, 250)
    assert spans._PROCESS.expected == 3000
    announced.opened(FormatId.GZIP, 5000)  # never below nothing
    assert spans._PROCESS.expected == 0
    announced.opened(FormatId.BZIP2, 100)  # not announced: nothing to take
    assert announced.left == 1000
    announced.withdraw()
    announced.withdraw()
    assert (spans._PROCESS.expected, framed.FRAME_CACHE.expected, announced.left) == (0, 0, 0)
