"""bzip2 span-cache misses of a stream larger than the cache: each block decoded alone by the
standard library (no parallel decoder), the next blocks decoded ahead for a reader going in order
(see ``Bzip2Reader._decode_span_start``)."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import tarfile
import threading
from pathlib import Path
from typing import Dict, List, Tuple
from unittest import mock

import pytest
from conftest import Mounter, tar_bytes
from test_compression import options, read_everything, zero_16_bytes_unsampled

import ratarmountcore
from ratarmountcore.compression.bzip2 import Bzip2Reader
from ratarmountcore.options import CompressionOptions

#: Larger than 4 blocks of ``bzip2 -1`` (the spans it caches are at most a quarter of it),
#: smaller than the stream.
CACHE = 1 << 20


def make_archive(tmp_path: Path) -> Tuple[Path, Dict[str, bytes]]:
    """A .tar.bz2 of ~1,000 small members in ~14 blocks of ~250 KB, its index built."""
    rng = random.Random(11)
    files = {
        f"d{i % 10}/f{i:04d}.bin": rng.randbytes(rng.randrange(1, 2500)) + b"y" * rng.randrange(0, 2500)
        for i in range(1000)
    }
    tar = tmp_path / "many.tar"
    tar.write_bytes(tar_bytes(files))
    archive = tmp_path / "many.tar.bz2"
    with open(tar, "rb") as src, open(archive, "wb") as dst:
        subprocess.run(["bzip2", "-1", "-c"], stdin=src, stdout=dst, check=True)
    os.utime(archive, ns=(10**18, 10**18))
    with tarfile.open(tar) as t:
        order = {"/" + m.name: files[m.name] for m in t.getmembers() if m.isfile()}  # archive order
    with ratarmountcore.open(str(archive), small_cache()) as source:
        assert source.read("/d0/f0000.bin") == files["d0/f0000.bin"]  # (the index)
    return archive, order


def small_cache() -> ratarmountcore.OpenOptions:
    return dataclasses.replace(options(), compression=CompressionOptions(cache_size=CACHE))


def counting_decodes() -> Tuple[List[Tuple[int, str]], object]:
    decodes: List[Tuple[int, str]] = []
    original = Bzip2Reader._decode_block

    def counted(self: Bzip2Reader, bit: int, next_bit: int, size: int) -> bytes:
        decodes.append((bit, threading.current_thread().name))
        return original(self, bit, next_bit, size)

    return decodes, mock.patch.object(Bzip2Reader, "_decode_block", counted)


def test_random_reads_decode_single_blocks_without_a_parallel_decoder(tmp_path: Path) -> None:
    archive, members = make_archive(tmp_path)
    names = list(members)
    decodes, patch = counting_decodes()
    with patch, ratarmountcore.open(str(archive), small_cache()) as source:
        reader = source._reader  # type: ignore[attr-defined]
        assert reader.size > CACHE
        for name in random.Random(5).sample(names, 80):
            assert source.read(name) == members[name]
        assert reader.stats.decoders_created == 0
    assert decodes  # (the standard library's, one block at a time)


def test_reading_in_order_decodes_each_block_once_and_ahead(tmp_path: Path) -> None:
    archive, members = make_archive(tmp_path)
    decodes, patch = counting_decodes()
    with patch, ratarmountcore.open(str(archive), small_cache()) as source:
        for name, data in members.items():
            assert source.read(name) == data
        assert source._reader.stats.decoders_created == 0  # type: ignore[attr-defined]
    bits = [bit for bit, _thread in decodes]
    assert len(bits) == len(set(bits)) >= 10, f"{len(bits)} decodes of {len(set(bits))} blocks"
    ahead = sum(thread == "ratarmount-bzip2-ahead" for _bit, thread in decodes)
    assert ahead >= len(bits) - 3  # all but the first blocks, before the reader asked for them


def test_a_damaged_block_fails_only_its_reads(tmp_path: Path) -> None:
    """Damage after indexing, in one block: the members in it fail (also when the block was
    decoded ahead), every other member is read right, in order and at random."""
    archive, members = make_archive(tmp_path)
    zero_16_bytes_unsampled(archive)
    good, errors = read_everything(archive, members, small_cache())
    assert errors > 0 and good > 0 and errors < 2 * len(members) // 10  # (one block of ~14)
    shuffled = dict(random.Random(2).sample(list(members.items()), len(members)))
    assert read_everything(archive, shuffled, small_cache()) == (good, errors)


def test_closing_while_blocks_are_decoded_ahead(tmp_path: Path) -> None:
    archive, members = make_archive(tmp_path)
    names = list(members)
    for stop in (60, 150, 300):
        with ratarmountcore.open(str(archive), small_cache()) as source:
            for name in names[:stop]:
                assert source.read(name) == members[name]
            reader = source._reader  # type: ignore[attr-defined]
        assert not reader._ahead
    assert not [t for t in threading.enumerate() if t.name == "ratarmount-bzip2-ahead"]


@pytest.mark.parametrize("order", ["in order", "random"])
def test_through_a_mount(mounter: Mounter, tmp_path: Path, order: str) -> None:
    archive, members = make_archive(tmp_path)
    names = list(members)
    if order == "random":
        random.Random(3).shuffle(names)
    mnt = mounter.mount(archive, extra=["--cache-size", str(CACHE / (1 << 20))])
    for name in names:
        with open(f"{mnt}{name}", "rb") as f:
            assert f.read() == members[name], name
    mounter.unmount(mnt)
