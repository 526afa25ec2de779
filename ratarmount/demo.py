"""The main job on a built-in example: ``python -m ratarmount.demo``.

Makes a small ImageNet-style archive (class folders of JPEG-sized files), mounts it with the real
CLI, lists and reads everything through the mount, checks every byte, prints timings, unmounts.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Dict


def make_archive(path: str, classes: int, per_class: int, seed: int = 0) -> Dict[str, str]:
    rng = random.Random(seed)
    digests: Dict[str, str] = {}
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for c in range(classes):
            synset = f"n{1440764 + c * 7919:08d}"
            for i in range(per_class):
                name = f"train/{synset}/{synset}_{i}.JPEG"
                data = b"\xff\xd8\xff\xe0" + rng.randbytes(rng.randint(2_000, 30_000))
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = 1_262_304_000 + i
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
                digests["/" + name] = hashlib.sha256(data).hexdigest()
    return digests


def run(cmd: list) -> float:
    start = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"demo: {' '.join(cmd)} failed: {result.stderr.strip()}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=50)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="ratarmount-demo-")
    archive = os.path.join(work, "imagenet-mini.tar")
    mountpoint = os.path.join(work, "mnt")
    os.mkdir(mountpoint)
    ratarmount = [sys.executable, "-m", "ratarmount"]
    try:
        start = time.perf_counter()
        digests = make_archive(archive, args.classes, args.per_class)
        size = os.path.getsize(archive)
        print(
            f"archive: {archive} ({len(digests):,} files, {size / 2**20:.1f} MiB) "
            f"made in {time.perf_counter() - start:.2f} s"
        )

        first = run([*ratarmount, archive, mountpoint])
        print(f"first mount (builds the index):  {first:.3f} s")
        run([*ratarmount, "-u", mountpoint])
        second = run([*ratarmount, archive, mountpoint])
        print(f"second mount (reuses the index): {second:.3f} s")

        start = time.perf_counter()
        found = []
        for root, _dirs, files in os.walk(mountpoint):
            found += [os.path.join(root, f) for f in files]
        listing = time.perf_counter() - start
        print(f"list all {len(found):,} files:          {listing:.3f} s")
        classes = sorted(os.listdir(os.path.join(mountpoint, "train")))
        print(f"classes: {len(classes)} ({', '.join(classes[:3])}, ...)")

        start = time.perf_counter()
        total = 0
        for path in found:
            with open(path, "rb") as f:
                data = f.read()
            total += len(data)
            if hashlib.sha256(data).hexdigest() != digests[path[len(mountpoint) :]]:
                raise SystemExit(f"demo: wrong bytes in {path}")
        reading = time.perf_counter() - start
        print(f"read and verify all files:       {reading:.3f} s ({total / 2**20 / reading:.0f} MiB/s)")
        if len(found) != len(digests):
            raise SystemExit(f"demo: expected {len(digests)} files, found {len(found)}")
        run([*ratarmount, "-u", mountpoint])
        print("unmounted; all bytes verified")
        return 0
    finally:
        if os.path.ismount(mountpoint):
            subprocess.run([*ratarmount, "-u", mountpoint], capture_output=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
