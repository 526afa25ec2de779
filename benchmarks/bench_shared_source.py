"""Latency of small reads from one source shared by threads that read whole large members.

A training job often opens one archive through the Python API and reads from it in several
threads. This measures how long a 1-byte read of a small member waits while other threads read
whole 7-12 MiB members of the same ``.tar.bz2`` (each such read holds one decoder for all of its
member). Prints the number of reads of each kind and the small reads' latency percentiles.

    python benchmarks/bench_shared_source.py [--seconds 40] [--big-readers 4] [--work DIR]
"""

from __future__ import annotations

import argparse
import io
import os
import random
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ratarmountcore  # noqa: E402

BIG = 8
SMALL = 2000


def make_archive(path: Path) -> None:
    """8 members of 7-12 MiB (half random, half repeated text) and 2,000 small ones, as bzip2."""
    if path.exists():
        return
    rng = random.Random(1)
    plain = path.with_suffix("")
    with tarfile.open(plain, "w", format=tarfile.GNU_FORMAT) as tar:
        for number in range(BIG):
            size = rng.randint(7, 12) << 20
            half = size // 2
            text = b"the quick brown fox %d\n" % number
            data = rng.randbytes(half) + text * ((size - half) // len(text) + 1)
            info = tarfile.TarInfo(f"big/{number:02d}.bin")
            info.size = size
            tar.addfile(info, io.BytesIO(data[:size]))
        for number in range(SMALL):
            data = rng.randbytes(rng.randint(1, 4096))
            info = tarfile.TarInfo(f"small/{number // 100:02d}/{number:05d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    subprocess.run(["bzip2", "-9", "-f", str(plain)], check=True)
    os.replace(str(plain) + ".bz2", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--big-readers", type=int, default=4)
    parser.add_argument("--work", type=Path, default=Path("benchmarks/work/shared-source"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    archive = args.work / "big.tar.bz2"
    make_archive(archive)

    stop = threading.Event()
    big_reads: List[float] = []
    small_waits: List[float] = []
    with ratarmountcore.open(str(archive)) as source:
        bigs = [f"/big/{name}" for name in sorted(source.listdir("/big"))]
        smalls = [
            f"/small/{folder}/{name}"
            for folder in sorted(source.listdir("/small"))
            for name in source.listdir(f"/small/{folder}")
        ]

        def big_reader(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                with source.open(rng.choice(bigs)) as file:
                    started = time.perf_counter()
                    file.read()
                    big_reads.append(time.perf_counter() - started)

        def small_reader() -> None:
            rng = random.Random(99)
            while not stop.is_set():
                with source.open(rng.choice(smalls)) as file:
                    started = time.perf_counter()
                    file.read(1)
                    small_waits.append(time.perf_counter() - started)
                time.sleep(0.005)

        threads = [threading.Thread(target=big_reader, args=(seed,)) for seed in range(args.big_readers)]
        threads.append(threading.Thread(target=small_reader))
        for thread in threads:
            thread.start()
        time.sleep(args.seconds)
        stop.set()
        for thread in threads:
            thread.join()

    waits = sorted(small_waits)

    def percentile(share: float) -> float:
        return waits[min(len(waits) - 1, int(share * len(waits)))]

    print(f"{len(big_reads)} whole-member reads, {len(waits)} small reads in {args.seconds:.0f} s")
    if waits:
        print(
            f"small reads: median {statistics.median(waits) * 1e3:.1f} ms, p90 {percentile(0.9) * 1e3:.1f} ms,"
            f" p99 {percentile(0.99) * 1e3:.1f} ms, max {waits[-1] * 1e3:.0f} ms"
        )


if __name__ == "__main__":
    main()
