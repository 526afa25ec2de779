"""Which compressed streams compete for the caches of decoded data (``spans.kept_whole``,
``FrameCache.files``): those that will be read, not every archive opened. A folder's archives and
a union's archives that show files compete from the open on; in a union whose reads are all
served by one archive (the others shadowed by it), that archive alone decides whether it is kept
whole, on the first mount (after the first passes) and on later ones."""

from __future__ import annotations

import bz2
import gzip
import lzma
import random
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict

import pytest
import zstandard
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.compression import framed, spans
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

CAPACITY = 64 * 1024

COMPRESS: Dict[str, Callable[[bytes], bytes]] = {
    "gz": gzip.compress,
    "bz2": bz2.compress,
    "xz": lzma.compress,
    "zst": zstandard.ZstdCompressor().compress,
}


@pytest.fixture
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts of this test's own (other tests' sources may still be open)."""
    monkeypatch.setattr(spans, "_PROCESS", spans._ProcessBudget())
    monkeypatch.setattr(framed, "FRAME_CACHE", framed.FrameCache(framed.FRAME_CACHE_BYTES))


def _competing() -> int:
    return spans._PROCESS.competing() + framed.FRAME_CACHE.files()


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_only_the_archive_read_in_a_union_competes(codec: str, tmp_path: Path, fresh_caches: None) -> None:
    rng = random.Random(11)
    files = {f"img/{i:02}.JPEG": rng.randbytes(rng.randint(4096, 6144)) for i in range(30)}
    data = tar_bytes(files)
    assert CAPACITY < len(data) <= 3 * CAPACITY < 3 * len(data)  # one is kept whole, three are not
    paths = []
    for name in ("a", "b", "c"):
        path = tmp_path / f"{name}.tar.{codec}"
        path.write_bytes(COMPRESS[codec](data))
        paths.append(str(path))
    options = OpenOptions(index=IndexOptions(progress=False), compression=CompressionOptions(cache_size=CAPACITY))
    for mount in ("first", "second"):
        with ratarmountcore.open(paths, options) as union:
            # c shows every file: it competes from the open on; a and b, shadowed, never (nor
            # for their first passes).
            assert _competing() == len(data), mount
            for name in sorted(files)[:5]:
                assert union.read(f"/{name}") == files[name]  # (from c: the later source wins)
            assert _competing() == len(data), mount
            if codec in ("xz", "zst"):
                assert framed.FRAME_CACHE.keeps_whole(framed.FRAME_CACHE.files())
            else:
                assert spans._PROCESS.bound() == len(data)
        assert _competing() == 0


@pytest.mark.parametrize("codec", sorted(COMPRESS))
def test_every_archive_of_a_folder_competes_from_the_open(codec: str, tmp_path: Path, fresh_caches: None) -> None:
    """A folder's archives are all shown (none shadows another): each competes from the mount on.
    While only some had been read, the caches kept everything read (a folder of 1,000 class
    .tar.gz: peak RSS 241 MiB through the mount, 171 MiB with the bound)."""
    rng = random.Random(12)
    folder = tmp_path / "train"
    folder.mkdir()
    sizes = []
    members = {}
    for c in range(6):
        files = {f"n{c}_{i:02}.JPEG": rng.randbytes(rng.randint(4096, 6144)) for i in range(10)}
        data = tar_bytes(files)
        sizes.append(len(data))
        (folder / f"n{c}.tar.{codec}").write_bytes(COMPRESS[codec](data))
        members[c] = next(iter(files.items()))
    assert 3 * CAPACITY < sum(sizes)  # all together beyond three caches; one or two within them
    options = OpenOptions(
        recursive=True, index=IndexOptions(progress=False), compression=CompressionOptions(cache_size=CAPACITY)
    )
    for mount in ("first", "second"):
        with ratarmountcore.open(str(folder), options) as src:
            src.open_archives()  # type: ignore[attr-defined]  # (as the mount does, unless --lazy)
            assert _competing() == sum(sizes), mount
            name, data = members[0]
            assert src.read(f"/n0.tar.{codec}/{name}") == data
            assert _competing() == sum(sizes), mount  # (counted by its cache now, no more twice)
            if codec in ("xz", "zst"):
                assert not framed.FRAME_CACHE.keeps_whole(framed.FRAME_CACHE.files())
            else:
                assert spans._PROCESS.bound() == CAPACITY
        assert _competing() == 0


def test_every_archive_of_a_union_that_shows_files_competes_from_the_open(tmp_path: Path, fresh_caches: None) -> None:
    rng = random.Random(13)
    paths, sizes = [], []
    for name in ("a", "b", "c", "d"):
        data = tar_bytes({f"{name}/{i:02}.JPEG": rng.randbytes(rng.randint(4096, 6144)) for i in range(10)})
        sizes.append(len(data))
        path = tmp_path / f"{name}.tar.gz"
        path.write_bytes(gzip.compress(data))
        paths.append(str(path))
    options = OpenOptions(index=IndexOptions(progress=False), compression=CompressionOptions(cache_size=CAPACITY))
    for mount in ("first", "second"):
        with ratarmountcore.open(paths, options):
            assert _competing() == sum(sizes), mount
            assert spans._PROCESS.bound() == CAPACITY
        assert _competing() == 0


_CHILD_SCRIPT = """
import os, sys
import ratarmountcore
from ratarmountcore.compression import framed, spans
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

folder, member, capacity = sys.argv[1], sys.argv[2], int(sys.argv[3])
options = OpenOptions(
    recursive=True, index=IndexOptions(progress=False), compression=CompressionOptions(cache_size=capacity)
)
source = ratarmountcore.open(folder, options)
source.open_archives()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    data = source.read(member)  # the child opens that archive's stream anew
    os.write(write, f"{len(data)} {spans._PROCESS.competing()} {framed.FRAME_CACHE.files()}".encode())
    os._exit(0)
os.close(write)
answer = os.read(read, 200).decode()
os.waitpid(pid, 0)
print(answer)
"""


@pytest.mark.parametrize("codec", ["gz", "zst"])
def test_a_forked_child_counts_what_the_parent_counted(codec: str, tmp_path: Path) -> None:
    """A DataLoader's workers read the parent's archives, each opening the streams anew: what
    competed in the parent competes in the child from the start (each of two workers reading a
    folder of 1,000 class .tar.gz grew by 145 MiB, then by 94)."""
    rng = random.Random(14)
    folder = tmp_path / "train"
    folder.mkdir()
    total = 0
    for c in range(6):
        files = {f"n{c}_{i:02}.JPEG": rng.randbytes(rng.randint(4096, 6144)) for i in range(10)}
        data = tar_bytes(files)
        total += len(data)
        (folder / f"n{c}.tar.{codec}").write_bytes(COMPRESS[codec](data))
    member = f"/n0.tar.{codec}/n0_00.JPEG"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD_SCRIPT, str(folder), member, str(CAPACITY)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    size, spans_total, frames_total = (int(word) for word in done.stdout.split())
    assert size >= 4096
    assert (spans_total if codec == "gz" else frames_total) == total


@pytest.mark.parametrize("outer", ["gz", "bz2"])
def test_a_stream_of_compressed_archives_leaves_the_bound_to_them(
    outer: str, tmp_path: Path, fresh_caches: None
) -> None:
    """A .tar.gz of class .tar.gz: the outer stream is read only by the class archives' own
    decoders, which keep what they decode. Counted too, it made the two streams together more
    than three caches: the bound held, and the classes were decoded again and again (1,000
    random reads of 100 classes of 0.5 MB: 1.08 s in-process, 0.54 s now). Now the classes,
    all that competes, are kept whole: each is decoded once, however often it is read."""
    capacity = 256 * 1024  # (a class, one span, is cached: at most a quarter of it)
    rng = random.Random(3)
    classes = {
        f"c{c:02}.tar.gz": {f"{i:02}.JPEG": rng.randbytes(rng.randint(1500, 2500)) for i in range(12)}
        for c in range(16)
    }
    members = {name: gzip.compress(tar_bytes(files)) for name, files in classes.items()}
    archive = tmp_path / f"outer.tar.{outer}"
    archive.write_bytes(COMPRESS[outer](tar_bytes(members)))
    inner_size = sum(len(tar_bytes(files)) for files in classes.values())
    assert inner_size <= 3 * capacity < inner_size + len(tar_bytes(members))  # together more than kept
    options = OpenOptions(
        index=IndexOptions(index_folders=("",), progress=False),
        compression=CompressionOptions(cache_size=capacity),
        recursive=True,
    )
    paths = [(name, file) for name, files in classes.items() for file in files]
    with ratarmountcore.open(str(archive), options):
        pass  # (the first mount: the index)
    with ratarmountcore.open(str(archive), options) as src:
        for _round in range(3):
            rng.shuffle(paths)
            for name, file in paths:
                assert src.read(f"/{name}/{file}") == classes[name][file]
        read = sum(reader.stats.compressed_bytes_read for reader in src._nested.values())
    assert read <= 1.05 * sum(len(member) for member in members.values()), read
