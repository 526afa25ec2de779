"""Large folders listed a part at a time (ratarmount/paged_listing.py), alone and through a mount."""

from __future__ import annotations

import os
import tarfile
import threading
from pathlib import Path
from typing import List, Optional, Tuple

from conftest import Mounter

from ratarmount.paged_listing import CHUNK, PagedListing

Entry = Tuple[bytes, int]
NAMES = [b"n%03d" % i for i in range(10)]


def make(chunk: int = 3) -> Tuple[PagedListing[Entry], List[Tuple[Optional[bytes], int]]]:
    calls: List[Tuple[Optional[bytes], int]] = []

    def fetch(after: Optional[bytes], index: int) -> List[Entry]:
        calls.append((after, index))
        rest = [n for n in NAMES if after is None or n > after][:chunk]
        return [(n, index + k) for k, n in enumerate(rest)]

    return PagedListing([(b".", 0), (b"..", 1)], fetch, chunk=chunk), calls


def read_in_order(listing: PagedListing[Entry]) -> List[Entry]:
    out: List[Entry] = []
    while True:
        part = listing.entries_from(len(out))
        if not part:
            return out
        out += part


def test_read_in_order_fetches_each_part_once_and_holds_one() -> None:
    listing, calls = make()
    entries = read_in_order(listing)
    assert [name for name, _ in entries] == [b".", b".."] + NAMES
    assert [index for _, index in entries] == list(range(12))  # positions continue across parts
    assert calls == [(None, 2), (b"n002", 5), (b"n005", 8), (b"n008", 11)]
    assert len(listing._chunk) <= 3  # only the part being read is kept


def test_any_offset_gives_the_entries_from_there() -> None:
    listing, _calls = make()
    every = read_in_order(make()[0])
    for offset in (11, 0, 7, 2, 1, 5, 12, 3, 9, 13):
        part = listing.entries_from(offset)
        assert part == every[offset : offset + len(part)]
        assert part or offset >= len(every)


def test_two_readers_of_one_shared_listing() -> None:
    listing, _calls = make(chunk=2)
    results: List[List[Entry]] = []
    workers = [threading.Thread(target=lambda: results.append(read_in_order(listing))) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(10)
    assert len(results) == 4 and all(r == results[0] for r in results)
    assert [name for name, _ in results[0]] == [b".", b".."] + NAMES


def test_mounted_folder_larger_than_a_part(mounter: Mounter, tmp_path: Path) -> None:
    count = 2 * CHUNK + 123
    archive = tmp_path / "flat.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(count):
            info = tarfile.TarInfo(f"flat/f{(i * 7919) % count:06d}")  # not in name order
            info.size = 0
            info.mtime = 1_600_000_000 + i
            tar.addfile(info)
        sub = tarfile.TarInfo("flat/zz-folder")
        sub.type = tarfile.DIRTYPE
        tar.addfile(sub)
    mountpoint = mounter.mount(archive)
    expected = {f"f{i:06d}" for i in range(count)} | {"zz-folder"}
    results: List[List[str]] = []
    readers = [threading.Thread(target=lambda: results.append(os.listdir(mountpoint / "flat"))) for _ in range(3)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(60)
    assert len(results) == 3
    for names in results:
        assert len(names) == len(expected) and set(names) == expected
    with os.scandir(mountpoint / "flat") as it:
        kinds = {entry.name: entry.is_dir() for entry in it}
    assert kinds["zz-folder"] and not kinds["f000000"] and sum(kinds.values()) == 1
    name = f"f{(5 * 7919) % count:06d}"  # the 6th member written
    with tarfile.open(archive) as tar:
        member = tar.getmember(f"flat/{name}")
    assert member.mtime == 1_600_000_000 + 5
    assert os.stat(mountpoint / "flat" / name).st_mtime == member.mtime
