#!/usr/bin/env python3
"""Profile our FUSE callbacks while a command runs against the mount.

cProfile only sees the thread that enabled it, and libfuse calls back into Python on its own
worker threads, so profiling ``ratarmount -f`` as a whole shows nothing but the main loop. This
script mounts in the foreground (in this process) with mfusepy's callback wrapper replaced by one
that enables a shared profiler around every callback (callbacks are serialized by a lock while
profiling), runs COMMAND, unmounts, and prints per-callback counts and times plus the cProfile
hot spots.

    python benchmarks/profile_fuse.py ARCHIVE -- find {} -type f
    python benchmarks/profile_fuse.py ARCHIVE --stat-paths paths.txt

This profiles the mfusepy front-end (``--fuse-api high``); the default low-level front-end
calls back through ctypes, which this wrapper does not see: sample that one with
``py-spy record --gil --nonblocking -p PID`` while the command runs.

``{}`` in COMMAND is replaced by the mount point. ``--stat-paths FILE`` / ``--read-paths FILE``
additionally stat / read the listed paths (relative to the mount) from this process.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive")
    parser.add_argument(
        "--stat-paths", metavar="FILE", help="after COMMAND, os.stat every path listed in FILE (relative to the mount)"
    )
    parser.add_argument(
        "--read-paths",
        metavar="FILE",
        help="after that, open and read every path listed in FILE (relative to the mount)",
    )
    parser.add_argument("--sort", default="tottime", help="pstats sort key (default tottime)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", help="also dump the raw profile to this file")
    argv = sys.argv[1:]
    command: List[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    parser.epilog = "After the options: -- COMMAND [ARGS...] to run against the mount ({} = mount point)."
    args = parser.parse_args(argv)
    args.command = command

    from ratarmount import cli, fuse_compat

    profiler = cProfile.Profile()
    lock = threading.Lock()
    calls: Dict[str, int] = collections.Counter()
    seconds: Dict[str, float] = collections.defaultdict(float)
    original = fuse_compat.FUSE._wrapper

    def profiled_wrapper(self: Any, func: Any, *a: Any, **kw: Any) -> Any:
        name = getattr(func, "__name__", str(func))
        with lock:
            start = time.perf_counter()
            profiler.enable()
            try:
                return original(self, func, *a, **kw)
            finally:
                profiler.disable()
                calls[name] += 1
                seconds[name] += time.perf_counter() - start

    fuse_compat.FUSE._wrapper = profiled_wrapper  # type: ignore[method-assign]

    mountpoint = tempfile.mkdtemp(prefix="ratarmount-profile-")
    report: List[str] = []

    def workload() -> None:
        deadline = time.monotonic() + 600
        while not os.path.ismount(mountpoint) and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            if args.command:
                cmd = [mountpoint if part == "{}" else part.replace("{}", mountpoint) for part in args.command]
                start = time.perf_counter()
                subprocess.run(cmd, stdout=subprocess.DEVNULL)
                report.append(f"command {' '.join(args.command)}: {time.perf_counter() - start:.3f} s wall")
            if args.stat_paths:
                with open(args.stat_paths) as f:
                    paths = [os.path.join(mountpoint, line.rstrip("\n").lstrip("/")) for line in f if line.strip()]
                start = time.perf_counter()
                for path in paths:
                    os.stat(path)
                report.append(f"os.stat of {len(paths):,} paths: {time.perf_counter() - start:.3f} s wall")
            if args.read_paths:
                with open(args.read_paths) as f:
                    paths = [os.path.join(mountpoint, line.rstrip("\n").lstrip("/")) for line in f if line.strip()]
                start = time.perf_counter()
                total = 0
                for path in paths:
                    with open(path, "rb") as member:
                        total += len(member.read())
                report.append(f"read {len(paths):,} files ({total:,} bytes): {time.perf_counter() - start:.3f} s wall")
        finally:
            subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True)

    thread = threading.Thread(target=workload, daemon=True)
    thread.start()
    try:
        # (mfusepy's front-end: its callbacks go through the wrapper profiled here. The default,
        # low-level front-end calls back through ctypes; sample it with ``py-spy record --gil``.)
        cli.main(["-f", "--fuse-api", "high", args.archive, mountpoint])
    finally:
        thread.join(timeout=30)
        os.rmdir(mountpoint)

    print("\n".join(report))
    total = sum(seconds.values())
    print(f"\ncallbacks (time inside Python, serialized): {total:.3f} s")
    for name, count in sorted(calls.items(), key=lambda kv: -seconds[kv[0]]):
        print(f"  {name:<24} {count:>9,} calls  {seconds[name]:8.3f} s  {seconds[name] / count * 1e6:8.1f} us/call")
    print()
    if args.out:
        profiler.dump_stats(args.out)
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats(args.sort).print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
