"""READs handed off libfuse's workers once all but one of them are reading (read_handoff.py)."""

from __future__ import annotations

import bz2
import io
import os
import random
import tarfile
import threading
import time
from pathlib import Path
from typing import Dict, List

from conftest import Mounter, requires_fuse

from ratarmount.read_handoff import ReadHandOff


def test_a_read_that_would_take_the_last_free_worker_is_answered_by_the_pool() -> None:
    reads = ReadHandOff(workers=2, threads=2)
    release = threading.Event()
    answered: List[str] = []

    def answer(name: str) -> None:
        release.wait(30)
        answered.append(name)

    first = threading.Thread(target=reads.run, args=(lambda: answer("first"),))
    first.start()  # (runs on this "worker" and waits there)
    deadline = time.monotonic() + 30
    while not reads._inline and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.001)
    assert reads._inline == 1  # type: ignore[attr-defined]
    # The second and third calls come while one of the two workers is reading: they return at
    # once (the worker is free for the next request), their answers wait in the pool.
    reads.run(lambda: answer("second"))
    reads.run(lambda: answer("third"))
    assert reads.handed_off == 2
    assert answered == []
    release.set()
    first.join(30)
    reads.close()  # (waits for the pool's answers)
    assert sorted(answered) == ["first", "second", "third"]
    # With the worker free again, a read is answered on the calling worker.
    reads.run(lambda: answered.append("fourth"))
    assert answered[-1] == "fourth" and reads.handed_off == 2


def test_a_single_worker_hands_every_read_off() -> None:
    reads = ReadHandOff(workers=1, threads=1)
    done = threading.Event()
    reads.run(done.set)
    reads.close()
    assert done.is_set() and reads.handed_off == 1


def _big_tar_bz2(path: Path) -> Dict[str, bytes]:
    rng = random.Random(7)
    members = {f"big{i}.bin": rng.randbytes(3 * 1024 * 1024) for i in range(4)}
    members.update({f"small/{i}.txt": f"file {i}\n".encode() * (i + 1) for i in range(50)})
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(bz2.compress(buffer.getvalue(), 1))
    return members


@requires_fuse
def test_reads_through_a_mount_whose_workers_are_all_reading_are_right(mounter: Mounter, tmp_path: Path) -> None:
    """Six threads read large bzip2 members (slow to decode) through a mount of two workers,
    dropping the page cache so that every read reaches the daemon, while another lists and
    stats: every byte is right, and the log says reads were handed to the pool."""
    archive = tmp_path / "a.tar.bz2"
    members = _big_tar_bz2(archive)
    log = tmp_path / "mount.log"
    mountpoint = mounter.mount(archive, extra=["-d", "--log-file", str(log), "-o", "max_threads=2"])
    errors: List[str] = []
    stop = threading.Event()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(6):
            name = f"big{rng.randrange(4)}.bin"
            offset = rng.randrange(len(members[name]))
            length = rng.randrange(1, 512 * 1024)
            with open(mountpoint / name, "rb", buffering=0) as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                data = os.pread(f.fileno(), length, offset)
            if data != members[name][offset : offset + length]:
                errors.append(f"{name} at {offset}+{length}: wrong bytes")

    def walker() -> None:
        while not stop.is_set():
            for i in range(50):
                if (mountpoint / "small" / f"{i}.txt").stat().st_size != len(members[f"small/{i}.txt"]):
                    errors.append(f"small/{i}.txt: wrong size")
            if len(os.listdir(mountpoint / "small")) != 50:
                errors.append("small: wrong listing")

    threads = [threading.Thread(target=reader, args=(seed,)) for seed in range(6)]
    walk = threading.Thread(target=walker)
    walk.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    stop.set()
    walk.join(60)
    assert errors == []
    assert "further reads go to 2 threads of their own" in log.read_text()
    mounter.unmount(mountpoint)
