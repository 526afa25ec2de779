"""Many readers at once: one real FUSE mount of a ~2,000-member tar read by 16 threads and 4
processes simultaneously (whole files, partial reads with os.pread at random offsets, interleaved
handles), and one ``ratarmountcore`` source shared by 16 threads. Every byte must be right."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tarfile
import threading
import traceback
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Tuple

import pytest
from conftest import Mounter, fuse_available, lazy_unmount, run_ratarmount, tar_bytes
from tarcompare import FRESH

import ratarmountcore

FILES = 2000
THREADS = 16
PROCESSES = 4
OPS_PER_WORKER = 150


def member_name(i: int) -> str:
    return f"dir{i % 37:02d}/sub{i % 5}/file-{i:05d}.bin"


def member_size(i: int) -> int:
    r = random.Random(i * 7919)
    choice = r.random()
    if choice < 0.05:
        return 0
    if choice < 0.6:
        return r.randint(1, 4096)
    if choice < 0.97:
        return r.randint(4097, 96 * 1024)
    return r.randint(512 * 1024, 1536 * 1024)  # a few large members: reads of many FUSE requests


def member_content(i: int) -> bytes:
    return random.Random(i).randbytes(member_size(i))


def build_archive(path: Path) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(FILES):
            data = member_content(i)
            info = tarfile.TarInfo(member_name(i))
            info.size = len(data)
            info.mtime = 1_600_000_000 + i
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("concurrency") / "many.tar"
    build_archive(path)
    return path


@pytest.fixture(scope="module")
def mountpoint(archive: Path) -> Iterator[Path]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount")
    mnt = archive.parent / "mnt"
    mnt.mkdir()
    result = run_ratarmount(str(archive), str(mnt))
    assert result.returncode == 0, result.stderr
    try:
        yield mnt
    finally:
        lazy_unmount(mnt)


# --- one worker's random reads (used by threads and by processes) ---------------------------------


def read_randomly(root: str, seed: int, ops: int) -> int:
    """Random reads below the mount point ``root``; raises on the first wrong byte. Returns
    the number of bytes checked."""
    rng = random.Random(seed)
    checked = 0
    held: List[Tuple[int, int]] = []  # (fd, member) kept open across operations
    try:
        for _ in range(ops):
            i = rng.randrange(FILES)
            path = os.path.join(root, member_name(i))
            expected = member_content(i)
            op = rng.random()
            if op < 0.25:  # whole file through a buffered file object
                with open(path, "rb") as f:
                    data = f.read()
                assert data == expected, f"{path}: whole-file read differs"
                checked += len(data)
            elif op < 0.7:  # partial reads at random offsets (also past the end)
                fd = os.open(path, os.O_RDONLY)
                try:
                    for _ in range(4):
                        offset = rng.randrange(len(expected) + 100) if expected else rng.randrange(100)
                        length = rng.choice([1, 7, 511, 4096, 65536, 200_000])
                        data = os.pread(fd, length, offset)
                        assert data == expected[offset : offset + length], f"{path}: pread({length}, {offset}) differs"
                        checked += len(data)
                finally:
                    os.close(fd)
            elif op < 0.9:  # keep handles open and read them interleaved with others
                fd = os.open(path, os.O_RDONLY)
                held.append((fd, i))
                if len(held) > 12:
                    for fd2, j in held:
                        want = member_content(j)
                        offset = rng.randrange(len(want) + 1)
                        data = os.pread(fd2, 100_000, offset)
                        assert data == want[offset : offset + 100_000], f"held {member_name(j)} differs"
                        checked += len(data)
                        os.close(fd2)
                    held.clear()
            else:  # metadata
                st = os.stat(path)
                assert st.st_size == len(expected) and st.st_mtime_ns == (1_600_000_000 + i) * 10**9
                assert member_name(i).rsplit("/", 1)[1] in os.listdir(os.path.dirname(path))
    finally:
        for fd, _ in held:
            os.close(fd)
    return checked


def _process_main(root: str, seed: int, ops: int, queue: "multiprocessing.Queue[str]") -> None:
    try:
        # Two threads per process as well: contention inside and across processes.
        errors: List[str] = []

        def run(s: int) -> None:
            try:
                read_randomly(root, s, ops)
            except BaseException:
                errors.append(traceback.format_exc())

        threads = [threading.Thread(target=run, args=(seed * 100 + k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        queue.put("\n".join(errors) or "ok")
    except BaseException:
        queue.put(traceback.format_exc())


def run_threads(count: int, target: Callable[[int], object]) -> List[str]:
    errors: List[str] = []
    start = threading.Barrier(count)

    def wrapper(seed: int) -> None:
        try:
            start.wait()
            target(seed)
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=wrapper, args=(seed,)) for seed in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
        assert not t.is_alive(), "a reader thread hangs"
    return errors


def test_fuse_threads_and_processes(mountpoint: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    processes = [
        ctx.Process(target=_process_main, args=(str(mountpoint), 1000 + p, OPS_PER_WORKER, queue))
        for p in range(PROCESSES)
    ]
    for p in processes:
        p.start()
    checked: List[int] = []
    errors = run_threads(THREADS, lambda seed: checked.append(read_randomly(str(mountpoint), seed, OPS_PER_WORKER)))
    results = [queue.get(timeout=240) for _ in processes]
    for p in processes:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert not errors, errors[0]
    assert all(r == "ok" for r in results), [r for r in results if r != "ok"][0]
    assert len(checked) == THREADS and sum(checked) > 10 * 1024 * 1024
    assert os.path.ismount(mountpoint)


def test_fuse_same_large_file_from_many_threads(mountpoint: Path) -> None:
    """All threads hammer the same (large) member through separate descriptors."""
    big = max(range(FILES), key=member_size)
    expected = member_content(big)
    path = os.path.join(mountpoint, member_name(big))
    assert len(expected) > 512 * 1024

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        fd = os.open(path, os.O_RDONLY)
        try:
            for _ in range(60):
                offset = rng.randrange(len(expected))
                length = rng.choice([1, 4096, 131072, 300_000])
                assert os.pread(fd, length, offset) == expected[offset : offset + length]
        finally:
            os.close(fd)

    errors = run_threads(THREADS, reader)
    assert not errors, errors[0]


def test_api_shared_source_from_16_threads(archive: Path) -> None:
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert len(src.listdir("/")) == 37

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(OPS_PER_WORKER):
                i = rng.randrange(FILES)
                path = "/" + member_name(i)
                expected = member_content(i)
                op = rng.random()
                if op < 0.3:
                    assert src.read(path) == expected
                elif op < 0.8:
                    with src.open(path) as f:
                        for _ in range(3):
                            offset = rng.randrange(len(expected) + 10)
                            length = rng.choice([1, 100, 4096, 70_000])
                            f.seek(offset)
                            assert f.read(length) == expected[offset : offset + length]
                else:
                    info = src.info(path)
                    assert info.size == len(expected) and info.mtime_ns == (1_600_000_000 + i) * 10**9
                    assert member_name(i).rsplit("/", 1)[1] in src.listdir(os.path.dirname(path))

        errors = run_threads(THREADS, reader)
        assert not errors, errors[0]


def test_api_same_member_many_handles(archive: Path) -> None:
    """16 threads, each with its own handle on the same large member, reading at once through
    one source (one shared archive descriptor)."""
    with ratarmountcore.open(str(archive), FRESH) as src:
        big = max(range(FILES), key=member_size)
        expected = member_content(big)

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            with src.open("/" + member_name(big)) as f:
                for _ in range(80):
                    offset = rng.randrange(len(expected))
                    f.seek(offset)
                    length = rng.choice([1, 5000, 100_000])
                    assert f.read(length) == expected[offset : offset + length]

        errors = run_threads(THREADS, reader)
        assert not errors, errors[0]


def test_fuse_walks_in_several_processes_after_a_find(mounter: Mounter, tmp_path: Path) -> None:
    """A ``find``, then three processes at once each stat every file of their own part of the
    tree, folder after folder (``du`` in parallel, several loaders building their file lists):
    the folders listed ahead of one walk, the lookups waiting for listings and the runs of the
    others must give every process the attributes of every file, and none may hang."""
    folders, per_folder = 24, 40
    files = {f"part{f % 3}/c{f:03d}/i{i:03d}": bytes([f]) * (f + i) for f in range(folders) for i in range(per_folder)}
    archive = tmp_path / "walks.tar"
    archive.write_bytes(tar_bytes(files))
    mnt = mounter.mount(archive)
    assert sum(len(names) for _top, _dirs, names in os.walk(mnt)) == len(files)
    script = (
        "import json, os, sys\n"
        "root, part = sys.argv[1], sys.argv[2]\n"
        "paths = sorted(p for p in json.loads(sys.stdin.read()) if p.startswith(part + '/'))\n"
        "print(json.dumps({p: os.stat(os.path.join(root, p)).st_size for p in paths}))\n"
    )
    listing = json.dumps(sorted(files))
    walkers = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(mnt), f"part{part}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for part in range(3)
    ]
    seen: Dict[str, int] = {}
    for walker in walkers:
        out, _ = walker.communicate(listing, timeout=120)  # (a hang fails here)
        assert walker.returncode == 0
        seen.update(json.loads(out))
    assert seen == {name: len(data) for name, data in files.items()}
