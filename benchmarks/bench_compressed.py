#!/usr/bin/env python3
"""Benchmark ratarmount (ours) against the PyPI ratarmount release (the peer) and archivemount on
compressed tar archives of many small files, plus one large tar.gz against the rapidgzip CLI.

One command does everything (see benchmarks/README.md, "Compressed archives"):

    python benchmarks/bench_compressed.py --out benchmarks/results/compressed.json \\
        --report docs/benchmarks.md --notes benchmarks/notes_compressed.md

Archives (built once, reused while their parameters stay the same), for 10,000 and 100,000 files
of 1-4 KiB (ImageNet-like names, deterministic content):

* ``.tar.gz``  -- ``gzip -6 -n``;
* ``.tar.bz2`` -- ``bzip2 -9``;
* ``.tar.xz``  -- ``xz -6 -T2``: threaded xz, so the stream is cut into independent blocks
  (24 MiB of uncompressed data each at -6);
* ``.tar.zst`` -- multi-frame, written by *our* ``ratarmount-convert`` from the ``.tar``
  (4 MiB frames, level 3);
* ``.tar.zst`` single frame -- plain ``zstd -3``, the kind of file the peer usually meets.

Per archive and tool, in the same run: first mount (no index), second mount (median), 1,000
random files read after ``drop_caches``, a sequential read of every file in archive order
(MB/s of file data) and the peak RSS of the mount process. Then a large tar.gz (~1 GiB
decompressed) is read sequentially through the mount and decompressed by ``rapidgzip -d -P 2``.

Every byte read is checked (random reads byte for byte, sequential reads by CRC-32 per file), so
that a broken tool cannot look fast. A step that takes absurdly long is capped (``--cap``,
default 120 s): reads stop early once their rate projects beyond 1.2x the cap, and the figure is
shown as ``> CAP s`` with the projection.

The measurement machinery (mounting, unmounting, finding the daemon, peak RSS, drop_caches,
waiting for idle CPUs, byte-code caching, the peer's venv) is bench_tar.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import bench_tar as bt  # noqa: E402  (the shared machinery)
from bench_tar import log  # noqa: E402

REPO = bt.REPO
WORK = bt.WORK
SECTION = "compressed"
SECTION_TITLE = "Compressed archives (issue 3)"

# Targets (ours / peer unless stated).
RANDOM_GZ_TARGET = 0.2  # random reads from tar.gz at least 5x faster
FIRST_MOUNT_TARGET = 0.5  # first mount of every compressed format at least 2x faster
RSS_TARGET = 0.5  # peak RSS at most 0.5x
SEQ_FRACTION_TARGET = 0.7  # sequential read of the large tar.gz >= 70% of rapidgzip -d -P 2
#: A step stops early (after --early-stop seconds) when its rate projects beyond this multiple
#: of the cap: the margin keeps a "> cap" claim safe from the noise of a short sample.
EARLY_STOP_FACTOR = 1.2


# --------------------------------------------------------------------------------------------
# Data: deterministic, "random-ish compressible" content, unique per file
# --------------------------------------------------------------------------------------------
def skewed_table(spread: int = 12) -> bytes:
    """A byte-translation table that turns uniform random bytes into 62 symbols with a geometric
    distribution (entropy ~5.4 bits/byte): entropy coders (Huffman, range coding) shrink such
    data to ~70%, LZ matching finds nothing, like camera images re-encoded. Every decompressor
    therefore does real work, unlike with purely random bytes (gzip would store them)."""
    weights = [2 ** (-k / spread) for k in range(256)]
    total = sum(weights)
    counts = [w * 256 / total for w in weights]
    whole = [int(c) for c in counts]
    for k in sorted(range(256), key=lambda k: counts[k] - whole[k], reverse=True)[: 256 - sum(whole)]:
        whole[k] += 1
    symbols = list(range(256))
    random.Random(1).shuffle(symbols)
    return bytes(symbols[k] for k, c in enumerate(whole) for _ in range(c))


TABLE = skewed_table()


class SkewedDataset(bt.Dataset):
    """bench_tar's ImageNet-like data set (same names and sizes for the same seed), with each
    file's content generated on its own (no repeats across files, whatever the dictionary size
    of the compressor): ``path + "\\n"`` and then skewed random bytes."""

    def params(self) -> Dict[str, Any]:
        return {**super().params(), "content": "skewed-random-1"}

    def content(self, i: int) -> bytes:
        head = self.paths[i].encode() + b"\n"
        rest = self.sizes[i] - len(head)
        return head + random.Random(self.seed * 1_000_003 + i).randbytes(rest).translate(TABLE)

    def crcs(self) -> List[int]:
        return [zlib.crc32(self.content(i)) for i in range(self.files)]


@dataclass
class Format:
    key: str
    label: str
    suffix: str  # of the data file
    ext: str  # of each tool's link (what the tools see)
    how: str  # for the report


FORMATS: Dict[str, Format] = {
    f.key: f
    for f in (
        Format("gz", "tar.gz", ".tar.gz", ".tar.gz", "`gzip -6 -n`"),
        Format("bz2", "tar.bz2", ".tar.bz2", ".tar.bz2", "`bzip2 -9`"),
        Format("xz", "tar.xz", ".tar.xz", ".tar.xz", "`xz -6 -T2` (threaded: independent blocks of 24 MiB)"),
        Format(
            "zst",
            "tar.zst multi-frame",
            ".mf.tar.zst",
            ".tar.zst",
            "our `ratarmount-convert` from the .tar (4 MiB frames, level 3)",
        ),
        Format("zst1", "tar.zst single frame", ".sf.tar.zst", ".tar.zst", "`zstd -3` (one frame)"),
    )
}


def our_script(name: str) -> str:
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.path.exists(beside) else name


SNAPSHOT_WRAPPER = """#!{python}
import sys
sys.path.insert(0, {src!r})  # before the editable install's finder (which is on sys.meta_path's end)
from {module} import main
if __name__ == "__main__":
    sys.exit(main())
"""


def make_snapshot(rev: str = "HEAD") -> Dict[str, str]:
    """Export ``rev`` of this repository (``git archive``, no change to the repository) to
    benchmarks/work/snapshots/<commit>/src and write ``ratarmount`` / ``ratarmount-convert``
    wrappers that run it. Other sessions may commit while a long run goes on: a snapshot keeps
    "ours" one fixed commit for the whole run."""
    commit = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short=12", rev], capture_output=True, text=True, check=True
    ).stdout.strip()
    subject = bt.command_output(["git", "-C", REPO, "log", "-1", "--format=%h %s", commit])
    folder = os.path.join(WORK, "snapshots", commit)
    src = os.path.join(folder, "src")
    if not os.path.isdir(src):
        tmp = src + ".tmp"
        subprocess.run(["rm", "-rf", tmp], check=True)
        os.makedirs(tmp)
        archive = subprocess.Popen(["git", "-C", REPO, "archive", commit], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", tmp], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise RuntimeError(f"git archive {commit} failed")
        os.replace(tmp, src)
    scripts = {}
    for name, module in (("ratarmount", "ratarmount.cli"), ("ratarmount-convert", "ratarmount.convert_cli")):
        path = os.path.join(folder, "bin", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(SNAPSHOT_WRAPPER.format(python=sys.executable, src=src, module=module))
        os.chmod(path, 0o755)
        scripts[name] = path
    return {"commit": commit, "description": subject, "src": src, **scripts}


def compressed_path(ds: bt.Dataset, fmt: Format) -> str:
    return ds.base + fmt.suffix


def ensure_compressed(ds: bt.Dataset, fmt: Format) -> Dict[str, Any]:
    """Build ds's archive in ``fmt`` (reused while the data set and the command are the same)."""
    path = compressed_path(ds, fmt)
    if fmt.key == "gz":
        cmd = ["gzip", "-6", "-n", "-c"]
    elif fmt.key == "bz2":
        cmd = ["bzip2", "-9", "-c"]
    elif fmt.key == "xz":
        cmd = ["xz", "-6", "-T2", "-c"]
    elif fmt.key == "zst1":
        cmd = ["zstd", "-3", "-q", "-c"]
    else:
        cmd = [our_script("ratarmount-convert"), "--no-progress", "-f", "--frame-size", "4", "-l", "3"]
    params = {**ds.params(), "command": [os.path.basename(c) for c in cmd]}
    sidecar = path + ".params.json"
    info: Dict[str, Any] = {}
    try:
        with open(sidecar) as f:
            stored = json.load(f)
        if stored.get("params") == params and os.path.exists(path):
            info = stored.get("info", {})
            log(f"reusing {path}")
    except (OSError, ValueError):
        pass
    if not info:
        log(f"building {path} ({' '.join(cmd)})")
        tmp = path + ".tmp"
        start = time.perf_counter()
        if fmt.key == "zst":
            subprocess.run([*cmd, ds.tar_path, tmp], check=True, env=bt.tool_env())
            for leftover in (tmp + ".index.sqlite",):
                if os.path.exists(leftover):  # the index it wrote beside the output: not needed
                    os.unlink(leftover)
        else:
            with open(ds.tar_path, "rb") as src, open(tmp, "wb") as dst:
                subprocess.run(cmd, stdin=src, stdout=dst, check=True)
        os.replace(tmp, path)
        info = {"build_s": round(time.perf_counter() - start, 1)}
        info.update(describe(path, fmt))
        with open(sidecar, "w") as f:
            json.dump({"params": params, "info": info}, f)
    info["bytes"] = os.path.getsize(path)
    info["tar_bytes"] = os.path.getsize(ds.tar_path)
    return info


def describe(path: str, fmt: Format) -> Dict[str, Any]:
    """Blocks of an xz file, frames of a zstd file."""
    if fmt.key == "xz":
        out = bt.command_output(["xz", "-l", "--robot", path])
        for line in out.splitlines():
            parts = line.split("\t")
            if parts[0] == "totals":
                return {"blocks": int(parts[2])}
    if fmt.key in ("zst", "zst1"):
        out = bt.command_output(["zstd", "-lv", path])
        match = re.search(r"Frames:\s*(\d+)", out)
        if match:
            return {"frames": int(match.group(1))}
    return {}


# --------------------------------------------------------------------------------------------
# Tools: bench_tar's, each with its own hard link named like the format
# --------------------------------------------------------------------------------------------
class _ArchiveRef:
    """What bench_tar's Tool needs of a data set: a folder name and the file to link."""

    def __init__(self, base: str, path: str) -> None:
        self.base = base
        self.tar_path = path


class PeerP2(bt.Peer):
    name = "peer -P 2"

    def mount_command(self) -> List[str]:
        return [self.executable(), "-P", "2", self.archive, self.mountpoint]


TOOLS: Dict[str, Any] = {"ours": bt.Ours, "peer": bt.Peer, "archivemount": bt.ArchiveMount, "peer -P 2": PeerP2}


def make_tool(name: str, ds: bt.Dataset, fmt: Format, args: argparse.Namespace) -> bt.Tool:
    ref = _ArchiveRef(f"{ds.base}-{fmt.key}", compressed_path(ds, fmt))
    tool = TOOLS[name](ref, args)
    tool.folder = os.path.join(WORK, "run-compressed", os.path.basename(ref.base), name.replace(" ", ""))
    tool.mountpoint = os.path.join(tool.folder, "mnt")
    tool.archive = os.path.join(tool.folder, "archive" + fmt.ext)
    return tool


# --------------------------------------------------------------------------------------------
# Capped measurements
# --------------------------------------------------------------------------------------------
class CappedError(Exception):
    """A step given up: it ran past the cap, or its rate projected far beyond it."""

    def __init__(self, done: int, total: int, seconds: float, projected: Optional[float], why: str) -> None:
        super().__init__(why)
        self.done = done
        self.total = total
        self.seconds = seconds
        self.projected = projected


class Watchdog:
    """Kills the FUSE daemon after ``seconds`` (a read blocked inside the daemon returns with an
    error then): the last resort when a single read takes longer than the cap."""

    def __init__(self, pid: Optional[int], seconds: float) -> None:
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire, args=(pid,))
        self._timer.daemon = True
        if pid:
            self._timer.start()

    def _fire(self, pid: int) -> None:
        self.fired = True
        log(f"  watchdog: killing daemon {pid}")
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


def _should_stop(
    elapsed: float, done: int, total: int, cap: float, early: float
) -> Optional[Tuple[Optional[float], str]]:
    if done >= total:
        return None
    projected = elapsed / done * total if done else None
    if elapsed > cap:
        return projected, f"stopped at the cap of {cap:.0f} s"
    if elapsed > early and (projected is None or projected > EARLY_STOP_FACTOR * cap):
        return projected, f"stopped after {elapsed:.0f} s: the rate projects beyond the cap"
    return None


def capped_loop(pid: Optional[int], total: int, cap: float, early: float, step: Callable[[int], None]) -> float:
    """Run ``step(k)`` for k in range(total) under the cap; returns the seconds taken."""
    dog = Watchdog(pid, cap + 10)
    done = 0
    start = time.perf_counter()
    try:
        for k in range(total):
            try:
                step(k)
            except OSError as exc:
                if dog.fired:
                    elapsed = time.perf_counter() - start
                    why = f"a single read blocked past the cap; daemon killed after {elapsed:.0f} s"
                    raise CappedError(done, total, elapsed, None, why) from exc
                raise
            done += 1
            stop = _should_stop(time.perf_counter() - start, done, total, cap, early)
            if stop:
                raise CappedError(done, total, time.perf_counter() - start, *stop)
    finally:
        dog.cancel()
    return time.perf_counter() - start


def random_reads(
    root: str, ds: SkewedDataset, indices: List[int], pid: Optional[int], cap: float, early: float
) -> float:
    data: List[bytes] = []

    def step(k: int) -> None:
        with open(os.path.join(root, ds.paths[indices[k]]), "rb") as f:
            data.append(f.read())

    try:
        return capped_loop(pid, len(indices), cap, early, step)
    finally:  # also when capped: what was read must be right
        for i, got in zip(indices, data):
            if got != ds.content(i):
                raise bt.InvalidResultError(f"read of {ds.paths[i]} returned wrong bytes ({len(got)} bytes)")


def sequential_read(
    root: str, ds: SkewedDataset, crcs: Optional[List[int]], pid: Optional[int], cap: float, early: float
) -> float:
    """Every file in archive order (open, read to the end into one reused buffer, close). With
    ``crcs`` each file's CRC-32 is computed on the fly and checked afterwards; without, only the
    byte counts are checked (the pure read rate)."""
    buffer = bytearray(max(ds.sizes) + 1)
    view = memoryview(buffer)
    got_sizes: List[int] = []
    got_crcs: List[int] = []

    def step(k: int) -> None:
        with open(os.path.join(root, ds.paths[k]), "rb", buffering=0) as f:
            n = 0
            while True:
                r = f.readinto(view[n:])
                if not r:
                    break
                n += r
        got_sizes.append(n)
        if crcs is not None:
            got_crcs.append(zlib.crc32(view[:n]))

    try:
        return capped_loop(pid, ds.files, cap, early, step)
    finally:
        for k, n in enumerate(got_sizes):
            if n != ds.sizes[k]:
                raise bt.InvalidResultError(f"{ds.paths[k]}: read {n} bytes, expected {ds.sizes[k]}")
        if crcs is not None:
            for k, c in enumerate(got_crcs):
                if c != crcs[k]:
                    raise bt.InvalidResultError(f"{ds.paths[k]}: wrong bytes (CRC-32 mismatch)")


# --------------------------------------------------------------------------------------------
# One archive, one tool
# --------------------------------------------------------------------------------------------
def new_row(tool: str, fmt: Format, ds: bt.Dataset) -> Dict[str, Any]:
    return {
        "tool": tool,
        "format": fmt.key,
        "files": ds.files,
        "valid": True,
        "complete": True,
        "partial": {},
        "errors": [],
        "cpu_s": {},
    }


def record_failure(row: Dict[str, Any], key: str, label: str, exc: BaseException) -> None:
    if isinstance(exc, CappedError):
        row["complete"] = False
        row["partial"][key] = {"done": exc.done, "total": exc.total, "seconds": exc.seconds, "projected": exc.projected}
        row["errors"].append(f"{label}: {exc} ({exc.done:,} of {exc.total:,} in {exc.seconds:.1f} s)")
    elif isinstance(exc, bt.MountTimeoutError):
        row["complete"] = False
        row["partial"][key] = {"done": None, "total": None, "seconds": exc.seconds, "projected": None}
        row["errors"].append(f"{label}: {exc}")
    else:
        row["valid"] = False
        row["errors"].append(f"{label}: {exc}")
    log(f"  {row['tool']}: {label}: {exc}")


class Session:
    """The tool's current mount, with an RssGuard and the largest VmHWM seen across sessions."""

    def __init__(self, tool: bt.Tool, args: argparse.Namespace) -> None:
        self.tool = tool
        self.args = args
        self.mounted: Optional[bt.MountResult] = None
        self.guard: Optional[bt.RssGuard] = None
        self.peak_kib = 0

    @property
    def pid(self) -> Optional[int]:
        return self.mounted.pid if self.mounted else None

    def mount(self, measure_rss: bool = False) -> bt.MountResult:
        self.end()
        self.mounted = self.tool.mount(self.args.mount_timeout, measure_rss=measure_rss, kill_after=self.args.cap)
        self.guard = bt.RssGuard(self.mounted.pid, int(self.args.rss_limit_mib * 1024))
        self.guard.start()
        return self.mounted

    def alive(self) -> bool:
        return bool(self.pid) and os.path.exists(f"/proc/{self.pid}") and bt.is_mounted(self.tool.mountpoint)

    def note_peak(self) -> None:
        if self.guard is not None:
            self.peak_kib = max(self.peak_kib, self.guard.max_kib)
        if self.pid:
            try:
                self.peak_kib = max(self.peak_kib, bt.proc_status(self.pid)["VmHWM"])
            except (OSError, KeyError):
                pass

    def end(self) -> None:
        self.note_peak()
        if self.guard is not None:
            self.guard.stop()
            self.guard = None
        if bt.is_mounted(self.tool.mountpoint) or self.mounted:
            bt.unmount(self.tool.mountpoint, self.pid or bt.fuse_daemon_pid(self.tool.mountpoint))
        self.mounted = None


def timed_phase(row: Dict[str, Any], key: str, label: str, session: Session, func: Callable[[], float]) -> bool:
    """Run a read phase: seconds into row[key], daemon CPU into row['cpu_s']. False if it failed."""
    pid = session.pid
    cpu0 = bt.proc_cpu_seconds(pid) if pid else None
    try:
        row[key] = func()
        ok = True
    except (CappedError, bt.InvalidResultError, OSError) as exc:
        record_failure(row, key, label, exc)
        ok = False
    if cpu0 is not None and pid:
        try:
            row["cpu_s"][key.removesuffix("_s")] = round(bt.proc_cpu_seconds(pid) - cpu0, 3)
        except OSError:
            pass
    return ok


def bench_case(name: str, ds: SkewedDataset, fmt: Format, crcs: List[int], args: argparse.Namespace) -> Dict[str, Any]:
    tool = make_tool(name, ds, fmt, args)
    row = new_row(name, fmt, ds)
    why = tool.available()
    if why:
        row["skipped"] = why
        row["valid"] = False
        return row
    tool.prepare()
    session = Session(tool, args)
    quiet = args.quiet_wait
    label = f"{name} {fmt.key} {ds.files}"
    log(f"{label}: start")
    try:
        # 1. First mount: no index; the archive in the page cache (the same for every tool).
        tool.remove_index()
        bt.warm_file(tool.archive)
        bt.wait_for_quiet(f"{label} first mount", quiet)
        try:
            m = session.mount(measure_rss=True)
        except bt.MountTimeoutError as exc:
            record_failure(row, "first_mount_s", "first mount", exc)
            return row
        row["first_mount_s"] = m.seconds
        row["cpu_s"]["first_mount"] = round(m.total_cpu_s(), 3)
        hwm = bt.proc_status(m.pid)["VmHWM"] if m.pid else 0
        row["first_mount_peak_rss_kib"] = max(hwm, m.command_maxrss_kib)
        log(f"  first mount {m.seconds:.2f} s")
        session.end()
        row["index_bytes"] = tool.index_size()
        if tool.has_index and row["index_bytes"] is None:
            row["errors"].append("no index file found after the first mount")

        # 2. Second mounts (warm caches); the last one stays mounted for the reads.
        times, cpus = [], []
        repeats = args.mount_repeats if tool.has_index else 1  # archivemount re-reads everything
        for rep in range(repeats):
            bt.wait_for_quiet(f"{label} second mount", quiet)
            m = session.mount()
            times.append(m.seconds)
            cpus.append(m.total_cpu_s())
            if rep < repeats - 1:
                session.end()
        row["second_mount_s"] = statistics.median(times)
        row["second_mount_all_s"] = times
        row["cpu_s"]["second_mount"] = round(statistics.median(cpus), 3)
        log(f"  second mounts {', '.join(f'{t:.3f}' for t in times)} s")

        # 3. Random reads, caches dropped before.
        indices = bt.random_sample(ds, args.random_reads)
        # (Not waiting for the mount itself: ours decodes a small archive into its cache right
        # after the mount, and the reads start a fixed ~0.5 s after it for every tool.)
        bt.wait_for_quiet(f"{label} random reads", quiet, exclude_pid=session.pid)
        bt.drop_caches(3)
        timed_phase(
            row,
            "random_reads_s",
            "random reads",
            session,
            lambda: random_reads(tool.root, ds, indices, session.pid, args.cap, args.early_stop),
        )
        log(f"  random reads {row.get('random_reads_s')}")

        # 4. Sequential read of every file (caches dropped, then the archive read once).
        if not session.alive():
            session.mount()
        bt.drop_caches(3)
        bt.warm_file(tool.archive)
        bt.wait_for_quiet(f"{label} sequential read", quiet)
        if timed_phase(
            row,
            "seq_s",
            "sequential read",
            session,
            lambda: sequential_read(tool.root, ds, crcs, session.pid, args.cap, args.early_stop),
        ):
            row["seq_mb_s"] = ds.total_bytes() / row["seq_s"] / 1e6
        log(f"  sequential read {row.get('seq_s')} s")
        session.note_peak()
        row["session_peak_rss_kib"] = session.peak_kib or None
        if session.guard is not None and session.guard.tripped:
            row["complete"] = False
            row["errors"].append(f"daemon killed at the RSS limit ({args.rss_limit_mib:.0f} MiB)")
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        row["complete"] = False
        row["errors"].append(str(exc))
        log(f"  {label} FAILED: {exc}")
    finally:
        session.end()
        if session.peak_kib:
            row["session_peak_rss_kib"] = max(row.get("session_peak_rss_kib") or 0, session.peak_kib)
        peaks = [v for v in (row.get("first_mount_peak_rss_kib"), row.get("session_peak_rss_kib")) if v]
        row["peak_rss_kib"] = max(peaks) if peaks else None
        tool.remove_index()
    return row


# --------------------------------------------------------------------------------------------
# The large tar.gz: sequential read through the mount against the rapidgzip CLI
# --------------------------------------------------------------------------------------------
def time_shell(command: str, repeats: int, timeout: float) -> Dict[str, Any]:
    times = []
    out = ""
    for _ in range(repeats):
        bt.wait_for_quiet(command, 30)
        start = time.perf_counter()
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout)
        times.append(time.perf_counter() - start)
        out = result.stdout.strip()
        if result.returncode != 0:
            raise RuntimeError(f"{command}: exit {result.returncode}: {result.stderr.strip()[-500:]}")
    return {"command": command, "all_s": [round(t, 3) for t in times], "s": statistics.median(times), "stdout": out}


def bench_large(ds: SkewedDataset, args: argparse.Namespace) -> Dict[str, Any]:
    fmt = FORMATS["gz"]
    info = ensure_compressed(ds, fmt)
    path = compressed_path(ds, fmt)
    tar_bytes = os.path.getsize(ds.tar_path)
    out: Dict[str, Any] = {
        "files": ds.files,
        "file_size": ds.size_range[0],
        "archive": info,
        "data_bytes": ds.total_bytes(),
        "tar_bytes": tar_bytes,
        "cli": {},
        "rows": [],
    }
    log(f"large tar.gz: {ds.files:,} files, {tar_bytes / 1e6:.0f} MB tar, {info['bytes'] / 1e6:.0f} MB gz")
    crcs = ds.crcs()
    rapidgzip = our_script("rapidgzip")
    bt.warm_file(path)
    q = shlex.quote(path)
    # The reference: exactly `rapidgzip -d -P 2 < file > /dev/null`; then with `| wc -c` to show
    # that it really decompresses everything (the byte count must be the tar's size).
    ref = time_shell(f"{shlex.quote(rapidgzip)} -d -P 2 < {q} > /dev/null", args.cli_repeats, 600)
    out["cli"]["rapidgzip -d -P 2 > /dev/null"] = ref
    check = time_shell(f"{shlex.quote(rapidgzip)} -d -P 2 < {q} | wc -c", 1, 600)
    out["cli"]["rapidgzip -d -P 2 | wc -c"] = check
    if int(check["stdout"] or -1) != tar_bytes:
        out.setdefault("errors", []).append(f"rapidgzip produced {check['stdout']} bytes, expected {tar_bytes}")
    out["cli"]["gzip -dc > /dev/null"] = time_shell(f"gzip -dc < {q} > /dev/null", 1, 600)
    for name, res in out["cli"].items():
        res["mb_s"] = tar_bytes / res["s"] / 1e6
        log(f"  {name}: {res['s']:.2f} s ({res['mb_s']:.0f} MB/s of tar)")

    for name in args.large_tools:
        tool = make_tool(name, ds, fmt, args)
        row = new_row(name, fmt, ds)
        if tool.available():
            continue
        tool.prepare()
        session = Session(tool, args)
        label = f"{name} large gz"
        try:
            tool.remove_index()
            bt.warm_file(tool.archive)
            bt.wait_for_quiet(f"{label} first mount", args.quiet_wait)
            m = session.mount(measure_rss=True)
            row["first_mount_s"] = m.seconds
            row["cpu_s"]["first_mount"] = round(m.total_cpu_s(), 3)
            row["first_mount_peak_rss_kib"] = max(bt.proc_status(m.pid)["VmHWM"] if m.pid else 0, m.command_maxrss_kib)
            session.end()
            row["index_bytes"] = tool.index_size()
            bt.wait_for_quiet(f"{label} second mount", args.quiet_wait)
            row["second_mount_s"] = session.mount().seconds
            # Pass 1: every file's CRC-32 checked (the correctness check for the rate below).
            bt.drop_caches(3)
            bt.warm_file(tool.archive)
            bt.wait_for_quiet(f"{label} sequential read (checked)", args.quiet_wait)

            def read_all(checks: Optional[List[int]], tool: bt.Tool = tool, session: Session = session) -> float:
                return sequential_read(tool.root, ds, checks, session.pid, args.cap, args.early_stop)

            if timed_phase(row, "seq_checked_s", "sequential read with CRC-32", session, lambda: read_all(crcs)):
                row["seq_checked_mb_s"] = ds.total_bytes() / row["seq_checked_s"] / 1e6
            # Pass 2: the same reads without computing anything (like `> /dev/null`), repeated.
            runs = []
            for _ in range(args.cli_repeats if row["valid"] else 0):
                if not session.alive():
                    session.mount()
                bt.drop_caches(3)
                bt.warm_file(tool.archive)
                bt.wait_for_quiet(f"{label} sequential read", args.quiet_wait)
                if not timed_phase(row, "seq_s", "sequential read", session, lambda: read_all(None)):
                    break
                runs.append(row["seq_s"])
            if runs:
                row["seq_all_s"] = [round(t, 3) for t in runs]
                row["seq_s"] = statistics.median(runs)
                row["seq_mb_s"] = ds.total_bytes() / row["seq_s"] / 1e6
                row["seq_tar_mb_s"] = tar_bytes / row["seq_s"] / 1e6
                row["fraction_of_rapidgzip"] = ref["s"] / row["seq_s"]
            log(
                f"  {name}: first mount {row.get('first_mount_s')}, sequential {row.get('seq_all_s')} s "
                f"(checked pass {row.get('seq_checked_s')})"
            )
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            row["complete"] = False
            row["errors"].append(str(exc))
            log(f"  {label} FAILED: {exc}")
        finally:
            session.end()
            row["session_peak_rss_kib"] = session.peak_kib or None
            peaks = [v for v in (row.get("first_mount_peak_rss_kib"), row.get("session_peak_rss_kib")) if v]
            row["peak_rss_kib"] = max(peaks) if peaks else None
            tool.remove_index()
        out["rows"].append(row)
    return out


# --------------------------------------------------------------------------------------------
# Warm-up: each Python tool mounts a tiny archive of every format twice (not timed)
# --------------------------------------------------------------------------------------------
def warm_up(formats: Sequence[Format], args: argparse.Namespace) -> None:
    ds = SkewedDataset(50, 5, (100, 200), args.seed, "warmup-skewed")
    ds.ensure_tar()
    for fmt in formats:
        ensure_compressed(ds, fmt)
        for name in ("ours", "peer"):
            tool = make_tool(name, ds, fmt, args)
            if tool.available():
                continue
            tool.prepare()
            tool.remove_index()
            try:
                for _ in range(2):
                    m = tool.mount(args.mount_timeout)
                    with open(os.path.join(tool.root, ds.paths[0]), "rb") as f:
                        if f.read() != ds.content(0):
                            log(f"warm-up: {name} read wrong bytes from {fmt.label}")
                    bt.unmount(tool.mountpoint, m.pid)
            except (RuntimeError, OSError) as exc:
                log(f"warm-up of {name} on {fmt.label} failed: {exc}")
            finally:
                if bt.is_mounted(tool.mountpoint):
                    bt.unmount(tool.mountpoint, bt.fuse_daemon_pid(tool.mountpoint))
                tool.remove_index()


# --------------------------------------------------------------------------------------------
# Targets and report
# --------------------------------------------------------------------------------------------
def find_row(results: Dict[str, Any], tool: str, fmt: str, files: int) -> Optional[Dict[str, Any]]:
    for r in results.get("rows", []):
        if r["tool"] == tool and r["format"] == fmt and r["files"] == files:
            return r
    return None


def value_or_bound(row: Optional[Dict[str, Any]], key: str) -> Tuple[Optional[float], bool]:
    """(value, is_lower_bound): a capped step counts as at least the cap (or its projection)."""
    if row is None:
        return None, False
    if row.get(key) is not None:
        return row[key], False
    part = (row.get("partial") or {}).get(key)
    if part:
        return max(part["seconds"], part.get("projected") or 0), True
    return None, False


def evaluate_targets(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    sizes = results["config"]["sizes"]
    formats = results["config"]["formats"]

    def compare(figure: str, key: str, fmt: str, files: int, limit: float, target: str) -> None:
        ours, peer = find_row(results, "ours", fmt, files), find_row(results, "peer", fmt, files)
        a, a_bound = value_or_bound(ours, key)
        b, b_bound = value_or_bound(peer, key)
        ratio = a / b if a is not None and b else None
        # A capped peer figure is a lower bound: the ratio is then an upper bound, still fine to
        # claim "met" with; a capped figure of ours cannot meet a target.
        met = (
            ratio is not None
            and ratio <= limit
            and not a_bound
            and bool(ours and ours["valid"])
            and bool(peer and peer["valid"])
        )
        out.append(
            {
                "figure": figure,
                "format": fmt,
                "files": files,
                "key": key,
                "ours": a,
                "peer": b,
                "ratio": ratio,
                "ratio_is_upper_bound": b_bound and not a_bound,
                "target": target,
                "met": met,
            }
        )

    for files in sizes:
        if "gz" in formats:
            compare(
                f"random reads, tar.gz, {files:,} files",
                "random_reads_s",
                "gz",
                files,
                RANDOM_GZ_TARGET,
                "<= 0.2x peer (5x faster)",
            )
    for fmt in formats:
        for files in sizes:
            compare(
                f"first mount, {FORMATS[fmt].label}, {files:,} files",
                "first_mount_s",
                fmt,
                files,
                FIRST_MOUNT_TARGET,
                "<= 0.5x peer (2x faster)",
            )
    for fmt in formats:
        for files in sizes:
            compare(
                f"peak RSS, {FORMATS[fmt].label}, {files:,} files",
                "peak_rss_kib",
                fmt,
                files,
                RSS_TARGET,
                "<= 0.5x peer",
            )
    large = results.get("large")
    if large:
        ours = next((r for r in large["rows"] if r["tool"] == "ours"), None)
        frac = ours.get("fraction_of_rapidgzip") if ours else None
        out.append(
            {
                "figure": "sequential read of the large tar.gz / rapidgzip -d -P 2",
                "format": "gz",
                "files": large["files"],
                "key": "fraction",
                "ours": frac,
                "peer": None,
                "ratio": frac,
                "target": ">= 0.70",
                "met": frac is not None and frac >= SEQ_FRACTION_TARGET and bool(ours and ours["valid"]),
            }
        )
    return out


def fmt_s(value: Optional[float]) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def fmt_mib(kib: Optional[float]) -> str:
    return "–" if not kib else f"{kib / 1024:.0f} MiB"


def cell(row: Optional[Dict[str, Any]], key: str) -> str:
    if row is None:
        return "–"
    if row.get("skipped"):
        return "skipped"
    value = row.get(key)
    part = (row.get("partial") or {}).get(key)
    if value is None and part:
        if part.get("total") is None:
            return f"> {part['seconds']:.0f} s (killed)"
        proj = f", projected {part['projected']:.0f} s" if part.get("projected") else ""
        bound = CAP_FOR_REPORT if part["seconds"] < CAP_FOR_REPORT else part["seconds"]
        return f"> {bound:.0f} s ({part['done']:,}/{part['total']:,} in {part['seconds']:.0f} s{proj})"
    if key.endswith("_kib"):
        return fmt_mib(value)
    if key.endswith("_bytes"):
        return "–" if value is None else f"{value / 1024 / 1024:.1f} MiB"
    if key.endswith("mb_s"):
        return "–" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.2f}"
    return fmt_s(value)


CAP_FOR_REPORT = 120.0


def status(row: Dict[str, Any]) -> str:
    if row.get("skipped"):
        return "skipped"
    if not row["valid"]:
        return "**WRONG RESULTS**"
    return "ok" if row.get("complete", True) else "ok, capped"


COLUMNS = [
    ("first_mount_s", "first mount (s)"),
    ("second_mount_s", "second mount (s)"),
    ("random_reads_s", "1,000 random reads (s)"),
    ("seq_s", "sequential read (s)"),
    ("seq_mb_s", "sequential MB/s"),
    ("peak_rss_kib", "peak RSS"),
    ("index_bytes", "index"),
]


def results_table(results: Dict[str, Any]) -> List[str]:
    out = [
        "| archive | tool | " + " | ".join(label for _, label in COLUMNS) + " | checks |",
        "|---|---|" + "---:|" * len(COLUMNS) + "---|",
    ]
    archives = results.get("archives", {})
    for files in results["config"]["sizes"]:
        for fmt in results["config"]["formats"]:
            info = archives.get(f"{fmt}-{files}", {})
            extra = []
            if info.get("blocks"):
                extra.append(plural(info["blocks"], "block"))
            if info.get("frames"):
                extra.append(plural(info["frames"], "frame"))
            name = f"{FORMATS[fmt].label}, {files:,} files, {info.get('bytes', 0) / 1e6:.0f} MB" + (
                f" ({', '.join(extra)})" if extra else ""
            )
            for tool in results["config"]["tools"]:
                row = find_row(results, tool, fmt, files)
                if row is None:
                    continue
                out.append(
                    f"| {name} | {tool} | " + " | ".join(cell(row, k) for k, _ in COLUMNS) + f" | {status(row)} |"
                )
                name = ""
    return out


def ratio_table(results: Dict[str, Any]) -> List[str]:
    out = [
        "| archive | first mount | second mount | random reads | sequential read (time) | peak RSS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for files in results["config"]["sizes"]:
        for fmt in results["config"]["formats"]:
            ours, peer = find_row(results, "ours", fmt, files), find_row(results, "peer", fmt, files)
            if not ours or not peer:
                continue
            cells = []
            for key in ("first_mount_s", "second_mount_s", "random_reads_s", "seq_s", "peak_rss_kib"):
                a, ab = value_or_bound(ours, key)
                b, bb = value_or_bound(peer, key)
                if a is None or not b:
                    cells.append("–")
                else:
                    prefix = ">= " if ab and not bb else "<= " if bb and not ab else "~" if ab and bb else ""
                    cells.append(f"{prefix}{a / b:.2f}")
            out.append(f"| {FORMATS[fmt].label}, {files:,} | " + " | ".join(cells) + " |")
    return out


def markdown_section(results: Dict[str, Any], notes: Optional[str]) -> str:
    m = results["machine"]
    c = results["config"]
    o: List[str] = [f"<!-- section:{SECTION}:start -->", f"## {SECTION_TITLE}", ""]
    o.append(
        "Generated by `benchmarks/bench_compressed.py` (how to run it: `benchmarks/README.md`, "
        '"Compressed archives"). Raw figures: `benchmarks/results/compressed.json`. Ours against the '
        "PyPI `ratarmount` release (the peer, in its own venv) and archivemount, all in the same run."
    )
    o.append("")
    o.append("### Machine and backends\n")
    source = results.get("ours_source") or "commit " + m.get("commit", "")
    o.append(f"- {m.get('date')}; ours measured from the {source}")
    o.append(
        f"- {m.get('nproc')} cores ({m.get('cpu')}), {m.get('memory')}, kernel {m.get('kernel')}, "
        f"{m.get('os')}, {m.get('libfuse')}, Python {m.get('python')}"
    )
    o.append(
        f"- load average at start / end: {' '.join(results.get('loadavg_start', []))} / "
        f"{' '.join(results.get('loadavg_end', []))}; "
        + quiet_summary(results)
        + f" Niceness {results.get('niceness')}; byte code cached as after a pip "
        "install (as in the section above)."
    )
    o.append("")
    for name in ("ours", "peer"):
        version = (results.get("versions") or {}).get(name, "")
        o.append(
            f"`{'ratarmount' if name == 'ours' else 'benchmarks/work/peer-venv/bin/ratarmount'} --version` "
            f"({name}):\n\n```\n{version}\n```\n"
        )
    o.append(f"- **archivemount**: {(results.get('versions') or {}).get('archivemount', '')}")
    o.append(f"- **rapidgzip CLI**: {(results.get('versions') or {}).get('rapidgzip_cli', '')}")
    o.append(
        "- Parallelism: each tool with its default: ours `-P 0` (all cores, 2) for every format; the "
        "peer's default is `:1,rapidgzip-bzip2:0` (one thread for gzip and the others, all cores for "
        "bzip2). For the large tar.gz the peer was also run with `-P 2`."
    )
    o.append("")
    o.append("### Archives\n")
    o.append(
        f"- {' and '.join(f'{n:,}' for n in c['sizes'])} files of {c['size_range'][0]}–{c['size_range'][1]} "
        f"bytes in folders of {c['files_per_folder']} (ImageNet-like names `n01440764/n01440764_10000.JPEG`; "
        f"the same names and sizes as the uncompressed benchmark for the same seed, {c['seed']}). Content: "
        "the path, then deterministic pseudo-random bytes, unique per file, drawn from 62 symbols with a "
        "skewed distribution (5.4 bits/byte): entropy coders shrink it to ~70%, LZ matching finds "
        "nothing (like JPEG data, so every decompressor does real work; purely random bytes would make "
        "gzip store them)."
    )
    o.append("- Compression: " + "; ".join(f"**{FORMATS[k].label}**: {FORMATS[k].how}" for k in c["formats"]) + ".")
    for files in c["sizes"]:
        parts = []
        for fmt in c["formats"]:
            info = results["archives"].get(f"{fmt}-{files}", {})
            if info:
                parts.append(
                    f"{FORMATS[fmt].label} {info['bytes'] / 1e6:.0f} MB"
                    + (f" ({plural(info['blocks'], 'xz block')})" if info.get("blocks") else "")
                    + (f" ({plural(info['frames'], 'frame')})" if info.get("frames") else "")
                )
        tar_bytes = next(iter(results["archives"].get(f"{f}-{files}", {}).get("tar_bytes") for f in c["formats"]), None)
        o.append(f"- {files:,} files: tar {tar_bytes / 1e6 if tar_bytes else 0:.0f} MB; " + ", ".join(parts) + ".")
    o.append("")
    o.append("### How each figure is taken\n")
    o.append(
        f"- **first mount**: no index anywhere, the archive read once beforehand (in the page cache for "
        f"every tool alike); time until the mount command returned and the mount point is mounted. For ours "
        f"and the peer this includes decompressing the whole archive and writing the index; archivemount "
        f"reads the whole archive on every mount. **second mount**: index present, warm caches, median of "
        f"{c['mount_repeats']} (archivemount: one)."
    )
    o.append(
        f"- **random reads**: `echo 3 > /proc/sys/vm/drop_caches`, then open + read + close of "
        f"{c['random_reads']:,} random files (seed {c['seed'] + 1}) on the mount of the last second mount; "
        "every byte compared with the expected content."
    )
    o.append(
        "- **sequential read**: the same mount; caches dropped, then the archive read once (decompression, "
        "not the disk, is measured), then every file in archive order: open, read to the end, close, "
        "CRC-32 of each file computed on the fly and checked. MB/s = file data / time."
    )
    o.append(
        "- **peak RSS**: the largest of: the mount command's `ru_maxrss` and the daemon's `VmHWM` after the "
        "first mount (an index built before daemonizing counts), and the daemon's `VmHWM` at the end of "
        "the reading session (sampled every 0.2 s as well)."
    )
    o.append(
        f"- **caps**: a step stops when it passes {c['cap']:.0f} s, or after {c['early_stop']:.0f} s when "
        f"its rate projects beyond {c.get('early_stop_factor', 1.5) * c['cap']:.0f} s (reads of archivemount "
        f"get slower the further "
        f"into the archive the file lies, so a projection from the first files is a lower bound). Shown "
        f"as `> {c['cap']:.0f} s (files done in the time taken, projected total)`; every byte read "
        "until then was checked."
    )
    o.append("")
    o.append("### Results\n")
    o.extend(results_table(results))
    o.append("")
    o.append("### Ours / peer (lower is better for us; `<=` where the peer was capped, `~` where both were)\n")
    o.extend(ratio_table(results))
    o.append("")
    large = results.get("large")
    if large:
        o.append("### Large tar.gz: sequential read through the mount against `rapidgzip -d -P 2`\n")
        a = large["archive"]
        o.append(
            f"{large['files']:,} files of {large['file_size'] // 1024} KiB (same content generator), tar "
            f"{large['tar_bytes'] / 1e6:.0f} MB, `gzip -6 -n` {a['bytes'] / 1e6:.0f} MB. The .tar.gz is "
            "in the page cache for every command. Through the mount: every file read in archive order "
            "(open, read to the end into one buffer, close); the first pass also computes and checks "
            "each file's CRC-32, the others (median) only count the bytes, like `> /dev/null`. "
            "MB/s of the tar stream, so that mount and CLI compare like for like.\n"
        )
        o.append("| command / tool | time (s) | MB/s (tar stream) | all runs (s) | notes |")
        o.append("|---|---:|---:|---|---|")
        for name, res in large["cli"].items():
            note = f"output {int(res['stdout']):,} bytes" if res.get("stdout", "").isdigit() else ""
            o.append(
                f"| `{name.replace('|', chr(92) + '|')}` | {fmt_s(res['s'])} | {res['mb_s']:.0f} | "
                f"{', '.join(fmt_s(t) for t in res['all_s'])} | {note} |"
            )
        for r in large["rows"]:
            runs = ", ".join(fmt_s(t) for t in r.get("seq_all_s", []))
            frac = r.get("fraction_of_rapidgzip")
            checked = r.get("seq_checked_s")
            note = (
                f"first mount {fmt_s(r.get('first_mount_s'))} s, second {fmt_s(r.get('second_mount_s'))} s; "
                f"pass with CRC-32 {fmt_s(checked)} s; peak RSS {fmt_mib(r.get('peak_rss_kib'))}; "
                f"{status(r)}"
            )
            o.append(
                f"| {r['tool']} through the mount | {cell(r, 'seq_s')} | {r['seq_tar_mb_s']:.0f} | {runs} | {note} |"
                if r.get("seq_tar_mb_s")
                else f"| {r['tool']} through the mount | {cell(r, 'seq_s')} | – | {runs} | {note} |"
            )
            if frac is not None:
                o.append(f"| ↳ {r['tool']} / rapidgzip | | **{frac:.0%}** | | |")
        o.append("")
    targets = results.get("targets") or []
    if targets:
        o.append("### Targets\n")
        o.append("| target | ours | peer | ours/peer | wanted | met? |")
        o.append("|---|---:|---:|---:|---|---|")
        for t in targets:
            unit = fmt_mib if t["key"].endswith("_kib") else fmt_s
            ratio = (
                "–" if t["ratio"] is None else (("<= " if t.get("ratio_is_upper_bound") else "") + f"{t['ratio']:.2f}")
            )
            ours = f"{t['ours']:.0%}" if t["key"] == "fraction" and t["ours"] is not None else unit(t["ours"])
            o.append(
                f"| {t['figure']} | {ours} | {unit(t['peer']) if t['peer'] is not None else '–'} | {ratio} | "
                f"{t['target']} | {'**met**' if t['met'] else '**NOT met**'} |"
            )
        o.append("")
        o.append(target_summary(targets))
        o.append("")
    errors = [(f"{r['tool']} {r['format']} {r['files']:,}", e) for r in results.get("rows", []) for e in r["errors"]]
    if large:
        errors += [(f"{r['tool']} large gz", e) for r in large["rows"] for e in r["errors"]]
        errors += [("rapidgzip CLI", e) for e in large.get("errors", [])]
    if errors:
        o.append("### Capped steps and errors\n")
        for name, e in errors:
            o.append(f"- {name}: {e}")
        o.append("")
    build_s = sum(a.get("build_s", 0) for a in results.get("archives", {}).values())
    if large:
        build_s += large["archive"].get("build_s", 0)
    o.append(
        f"Total run time: {results.get('elapsed_s', 0) / 60:.1f} min, not counting the archives, which are "
        f"built once and reused (building them took {build_s / 60:.1f} min, plus the .tar files)."
    )
    o.append("")
    if notes:
        o.append(notes.strip())
        o.append("")
    o.append(f"<!-- section:{SECTION}:end -->")
    return "\n".join(o) + "\n"


def plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def quiet_summary(results: Dict[str, Any]) -> str:
    quiet = results.get("quiet_log") or []
    noisy = [q for q in quiet if q["busy"] > 0.25]
    text = (
        f"other sessions share this machine: {len(quiet) - len(noisy)} of {len(quiet)} measurements started "
        "on idle CPUs (busy < 25%)"
    )
    if noisy:
        text += (
            ", the others with other work running ("
            + "; ".join(f"{q['before']} {q['busy']:.0%}" for q in noisy[:10])
            + ("; …" if len(noisy) > 10 else "")
            + ")"
        )
    return text + "."


def target_summary(targets: List[Dict[str, Any]]) -> str:
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for t in targets:
        groups.setdefault(t["figure"].split(",")[0].split(" / ")[0], []).append(t)
    parts = []
    for name, ts in groups.items():
        met = sum(t["met"] for t in ts)
        parts.append(f"**{name}**: {'met' if met == len(ts) else 'NOT met'} ({met} of {len(ts)} cases)")
    return "Summary: " + "; ".join(parts) + "."


def write_section(path: str, section: str) -> None:
    """Replace the marked section in ``path`` (append it if absent), keeping everything else."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        text = ""
    pattern = re.compile(rf"<!-- section:{SECTION}:start -->.*?<!-- section:{SECTION}:end -->\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    with open(path, "w") as f:
        f.write(text)


def print_summary(results: Dict[str, Any]) -> None:
    print()
    print("\n".join(results_table(results)))
    print()
    print("\n".join(ratio_table(results)))
    large = results.get("large")
    if large:
        print()
        for name, res in large["cli"].items():
            print(f"  {name:<36} {res['s']:7.2f} s  {res['mb_s']:6.0f} MB/s")
        for r in large["rows"]:
            print(
                f"  {r['tool']:<36} {cell(r, 'seq_s'):>7} s  {r.get('seq_tar_mb_s') or 0:6.0f} MB/s  "
                f"fraction {r.get('fraction_of_rapidgzip') or 0:.2f}  checked pass {cell(r, 'seq_checked_s')} s"
            )
    print()
    for t in results.get("targets") or []:
        ratio = "–" if t["ratio"] is None else f"{t['ratio']:.2f}"
        print(f"  {'MET ' if t['met'] else 'MISS'}  {t['figure']:<48} ratio {ratio:>6}  target {t['target']}")


# --------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,100000", help="file counts (default 10000,100000)")
    p.add_argument("--files-per-folder", type=int, default=100)
    p.add_argument("--file-size", type=bt.parse_size_range, default=(1024, 4096), metavar="MIN-MAX")
    p.add_argument("--formats", default="gz,bz2,xz,zst,zst1", help=f"from {','.join(FORMATS)} (default all)")
    p.add_argument("--tools", default="ours,peer,archivemount")
    p.add_argument("--random-reads", type=int, default=1000)
    p.add_argument("--mount-repeats", type=int, default=3, help="second mounts to take the median of (default 3)")
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--cap", type=float, default=120, help="seconds after which a step is given up (default 120)")
    p.add_argument(
        "--early-stop",
        type=float,
        default=15,
        help="after this many seconds a step stops when its rate projects beyond 1.2x the cap",
    )
    p.add_argument("--large-files", type=int, default=2000, help="files in the large tar.gz (0: skip it)")
    p.add_argument("--large-file-size", type=bt.parse_size_range, default=(512 * 1024, 512 * 1024))
    p.add_argument("--large-tools", default="ours,peer,peer -P 2")
    p.add_argument("--cli-repeats", type=int, default=3, help="runs of rapidgzip and of the large read (median)")
    p.add_argument("--mount-timeout", type=float, default=600)
    p.add_argument("--rss-limit-mib", type=float, default=8192)
    p.add_argument("--quiet-wait", type=float, default=30)
    p.add_argument("--quiet-budget", type=float, default=180)
    p.add_argument("--nice", type=int, default=-10)
    p.add_argument("--prepare-only", action="store_true", help="only build the archives")
    p.add_argument("--out", default=os.path.join(WORK, "compressed.json"))
    p.add_argument("--report", metavar="MARKDOWN", help="write/replace the section in this file (docs/benchmarks.md)")
    p.add_argument("--notes", metavar="FILE", help="Markdown appended to the section (analysis)")
    p.add_argument("--report-only", metavar="JSON", help="only render the section from an existing JSON")
    p.add_argument("--ours-cmd", help="our ratarmount executable (default: the one beside this python)")
    p.add_argument(
        "--snapshot",
        nargs="?",
        const="HEAD",
        metavar="REV",
        help="measure ours from a `git archive` export of REV (default HEAD) instead of the working "
        "tree, so that commits made by others during the run do not change what is measured",
    )
    p.add_argument(
        "--ours-install",
        choices=("venv", "editable"),
        default="venv",
        help="venv (default): pip-install ours (the working tree, or the snapshot) into a venv of "
        "its own, as a user would and as the peer is; editable: run the working tree's editable "
        "install (or the snapshot through a wrapper script)",
    )
    args = p.parse_args(argv)
    args.sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    args.formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    args.large_tools = [t.strip() for t in args.large_tools.split(",") if t.strip()]
    for f in args.formats:
        if f not in FORMATS:
            p.error(f"unknown format {f!r}")
    for t in args.tools + args.large_tools:
        if t not in TOOLS:
            p.error(f"unknown tool {t!r}; choose from {', '.join(TOOLS)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    notes = None
    if args.notes and os.path.exists(args.notes):
        with open(args.notes) as f:
            notes = f.read()
    if args.report_only:
        with open(args.report_only) as f:
            stored = json.load(f)
        stored["targets"] = evaluate_targets(stored)
        print_summary(stored)
        if args.report:
            write_section(args.report, markdown_section(stored, notes))
        return 0

    bt.BYTECODE_AS_IS = False
    bt.QUIET_BUDGET = args.quiet_budget
    if args.nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except OSError as exc:
            log(f"cannot set niceness {args.nice}: {exc}")
    if not os.path.exists("/dev/fuse"):
        log("/dev/fuse is missing")
        return 2
    snapshot = None
    if args.snapshot:
        snapshot = make_snapshot(args.snapshot)
        args.ours_cmd = snapshot["ratarmount"]
        if args.ours_install == "venv":
            venv = os.path.join(os.path.dirname(snapshot["src"]), "venv")
            args.ours_cmd = os.path.join(bt.install_ours(snapshot["src"], venv), "ratarmount")
        log(f"ours: snapshot of {snapshot['description']} in {snapshot['src']}")
    elif not args.ours_cmd and args.ours_install == "venv" and "ours" in args.tools + args.large_tools:
        args.ours_cmd = os.path.join(bt.install_ours(REPO, bt.OURS_VENV), "ratarmount")

    # Archives first (not timed as part of the run).
    prep_start = time.perf_counter()
    formats = [FORMATS[k] for k in args.formats]
    datasets: List[SkewedDataset] = []
    archives: Dict[str, Any] = {}
    for n in args.sizes:
        ds = SkewedDataset(n, max(1, n // args.files_per_folder), args.file_size, args.seed, f"skewed-{n}")
        ds.ensure_tar()
        for fmt in formats:
            archives[f"{fmt.key}-{n}"] = ensure_compressed(ds, fmt)
        datasets.append(ds)
    large = None
    if args.large_files:
        large = SkewedDataset(
            args.large_files,
            max(1, args.large_files // 100),
            args.large_file_size,
            args.seed,
            f"skewed-large-{args.large_files}",
        )
        large.ensure_tar()
        ensure_compressed(large, FORMATS["gz"])
    prep_s = time.perf_counter() - prep_start
    if args.prepare_only:
        log(f"archives ready ({prep_s:.0f} s)")
        return 0

    start = time.perf_counter()
    results: Dict[str, Any] = {
        "machine": bt.machine_info(),
        "config": {
            "sizes": args.sizes,
            "formats": args.formats,
            "tools": args.tools,
            "seed": args.seed,
            "size_range": list(args.file_size),
            "files_per_folder": args.files_per_folder,
            "random_reads": args.random_reads,
            "mount_repeats": args.mount_repeats,
            "cap": args.cap,
            "early_stop": args.early_stop,
            "early_stop_factor": EARLY_STOP_FACTOR,
        },
        "archives": archives,
        "ours_source": (
            f"snapshot of commit {snapshot['description']} (git archive, run as {os.path.relpath(args.ours_cmd, REPO)})"
            if snapshot
            else f"working tree: {bt.git_description()}"
            + (f" (pip-installed, run as {os.path.relpath(args.ours_cmd, REPO)})" if args.ours_cmd else "")
        ),
        "prep_s": prep_s,
        "rows": [],
    }
    global CAP_FOR_REPORT
    CAP_FOR_REPORT = args.cap
    results["drop_caches_permitted"] = bt.drop_caches(3)
    results["loadavg_start"] = open("/proc/loadavg").read().split()[:3]
    results["niceness"] = os.getpriority(os.PRIO_PROCESS, 0)
    versions = {}
    dummy = _ArchiveRef(os.path.join(WORK, "data", "none"), "")
    versions["ours"] = TOOLS["ours"](dummy, args).version()
    versions["peer"] = TOOLS["peer"](dummy, args).version()
    versions["archivemount"] = TOOLS["archivemount"](dummy, args).version()
    versions["rapidgzip_cli"] = bt.command_output([our_script("rapidgzip"), "--version"]).splitlines()[0]
    results["versions"] = versions
    warm_up(formats, args)
    for ds in datasets:
        crcs = ds.crcs()
        for fmt in formats:
            for name in args.tools:
                row = bench_case(name, ds, fmt, crcs, args)
                results["rows"].append(row)
                bt.write_json(args.out, results)
    if large is not None:
        results["large"] = bench_large(large, args)
    results["elapsed_s"] = time.perf_counter() - start
    results["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    results["quiet_log"] = bt.QUIET_LOG
    results["targets"] = evaluate_targets(results)
    bt.write_json(args.out, results)
    print_summary(results)
    if args.report:
        write_section(args.report, markdown_section(results, notes))
        log(f"wrote the section into {args.report}")
    log(f"wrote {args.out}; {results['elapsed_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
