#!/usr/bin/env python3
"""Benchmark ratarmount (ours) against the PyPI ratarmount release (the peer), archivemount,
squashfuse and a plain directory, on an uncompressed tar of many small files.

One command does everything (see benchmarks/README.md):

    python benchmarks/bench_tar.py --files 100000 --out benchmarks/work/results.json \
        --report docs/benchmarks.md

Per tool it measures first mount (no index), second mount (index present), ``find | wc -l``,
``os.stat`` of every file (after a find, and on a fresh mount without one), reading 1,000 random
files after dropping the page cache, and the mount daemon's peak RSS. Every figure is checked
for correctness (file count, sizes, bytes read) so that a broken tool cannot look fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import io
import json
import os
import platform
import random
import shlex
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WORK = os.path.join(HERE, "work")
PEER_VENV = os.path.join(WORK, "peer-venv")
#: Where ``--ours-install venv`` installs this checkout (snapshots get a venv of their own).
OURS_VENV = os.path.join(WORK, "ours-venv")

MTIME = 1_600_000_000  # fixed member mtime: archives are byte-identical for the same parameters
POOL_SIZE = 1 << 22
ALL_TOOLS = ("ours", "peer", "dir", "archivemount", "squashfuse")

# Targets (ratio ours/peer unless stated).
TARGETS = [
    ("first_mount_s", "first mount", "<=", 0.5),
    ("find_s", "find | wc -l", "<=", 0.5),
    ("random_reads_s", "1,000 random reads", "<=", 0.5),
    ("stat_after_find_s", "stat all files (after find)", "<=", 0.2),
    ("stat_no_find_s", "stat all files (no find)", "<=", 0.2),
    ("peak_rss_kib", "peak RSS", "<=", 0.5),
]
SECOND_MOUNT_TARGET_S = 0.3
FLATNESS_LIMIT = 2.0  # "flat": the 1M second mount is at most this multiple of the 10k one


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# The data set
# --------------------------------------------------------------------------------------------
def parse_size_range(text: str) -> Tuple[int, int]:
    def one(value: str) -> int:
        value = value.strip().lower()
        factor = 1
        for suffix, mult in (("kib", 1024), ("k", 1024), ("mib", 1 << 20), ("m", 1 << 20), ("b", 1)):
            if value.endswith(suffix):
                value, factor = value[: -len(suffix)], mult
                break
        return int(float(value) * factor)

    low, _, high = text.partition("-")
    lo = one(low)
    hi = one(high) if high else lo
    if lo < 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"bad size range {text!r}")
    return lo, hi


class Dataset:
    """N files in F ImageNet-like folders (``n01440764/n01440764_10026.JPEG``), sizes and
    contents a pure function of the seed. Members are grouped by folder, as ``tar -c`` of an
    ImageNet class tree would store them; each folder has its own directory entry."""

    def __init__(self, files: int, folders: int, size_range: Tuple[int, int], seed: int, name: str) -> None:
        self.files = files
        self.folders = max(1, min(folders, files))
        self.size_range = size_range
        self.seed = seed
        self.base = os.path.join(WORK, "data", name)
        self.tar_path = self.base + ".tar"
        self.dir_path = self.base + ".dir"
        rng = random.Random(seed)
        self._pool = rng.randbytes(POOL_SIZE + size_range[1] + 1)
        self.folder_names = [f"n{1440764 + 1637 * f:08d}" for f in range(self.folders)]
        self.paths: List[str] = []
        self.sizes: List[int] = []
        for f, wnid in enumerate(self.folder_names):
            lo = f * files // self.folders
            hi = (f + 1) * files // self.folders
            for j in range(hi - lo):
                path = f"{wnid}/{wnid}_{10000 + 7 * j + (f % 7)}.JPEG"
                prefix = len(path) + 1
                self.paths.append(path)
                self.sizes.append(max(prefix, rng.randint(*size_range)))

    def params(self) -> Dict[str, Any]:
        return {
            "files": self.files,
            "folders": self.folders,
            "size_range": list(self.size_range),
            "seed": self.seed,
            "format": "ustar",
            "generator": 1,
        }

    def content(self, i: int) -> bytes:
        path = self.paths[i]
        head = path.encode() + b"\n"
        rest = self.sizes[i] - len(head)
        offset = (i * 2654435761) % POOL_SIZE
        return head + self._pool[offset : offset + rest]

    def total_bytes(self) -> int:
        return sum(self.sizes)

    # --- materialize ------------------------------------------------------------------------
    def _sidecar(self, path: str) -> str:
        return path + ".params.json"

    def _is_current(self, path: str) -> bool:
        try:
            with open(self._sidecar(path)) as f:
                return json.load(f) == self.params() and os.path.exists(path)
        except (OSError, ValueError):
            return False

    def _mark_current(self, path: str) -> None:
        with open(self._sidecar(path), "w") as f:
            json.dump(self.params(), f)

    def ensure_tar(self) -> float:
        """Write the tar (reused when one with the same parameters exists). Returns seconds."""
        if self._is_current(self.tar_path):
            log(f"reusing {self.tar_path}")
            return 0.0
        os.makedirs(os.path.dirname(self.tar_path), exist_ok=True)
        start = time.perf_counter()
        tmp = self.tar_path + ".tmp"
        folder_start = [f * self.files // self.folders for f in range(self.folders)]
        with open(tmp, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            next_folder = 0
            for i, path in enumerate(self.paths):
                while next_folder < self.folders and folder_start[next_folder] == i:
                    info = tarfile.TarInfo(self.folder_names[next_folder])
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    info.mtime = MTIME
                    info.uname = info.gname = "root"
                    tar.addfile(info)
                    next_folder += 1
                data = self.content(i)
                info = tarfile.TarInfo(path)
                info.size = len(data)
                info.mode = 0o644
                info.mtime = MTIME
                info.uname = info.gname = "root"
                tar.addfile(info, io.BytesIO(data))
                if i and i % 200_000 == 0:
                    log(f"  {i:,} / {self.files:,} members written")
        os.replace(tmp, self.tar_path)
        self._mark_current(self.tar_path)
        return time.perf_counter() - start

    def ensure_dir(self) -> float:
        if self._is_current(self.dir_path):
            log(f"reusing {self.dir_path}")
            return 0.0
        start = time.perf_counter()
        tmp = self.dir_path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(self.dir_path, ignore_errors=True)
        os.makedirs(tmp)
        subprocess.run(["tar", "-xf", self.tar_path, "-C", tmp], check=True)
        os.replace(tmp, self.dir_path)
        self._mark_current(self.dir_path)
        return time.perf_counter() - start


# --------------------------------------------------------------------------------------------
# System helpers
# --------------------------------------------------------------------------------------------
_DROP_WARNED = False


def drop_caches(level: int = 3) -> bool:
    """``sync; echo LEVEL > /proc/sys/vm/drop_caches``; False when not permitted."""
    global _DROP_WARNED
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write(f"{level}\n")
        return True
    except OSError as exc:
        if not _DROP_WARNED:
            log(f"cannot drop caches ({exc}); cache-sensitive figures are taken with warm caches")
            _DROP_WARNED = True
        return False


def _process_ticks(pid: Optional[int]) -> int:
    """CPU time of process ``pid``, all its threads, in the clock ticks of /proc/stat (0: none)."""
    if not pid:
        return 0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime


def cpu_busy_fraction(interval: float = 0.5, exclude_pid: Optional[int] = None) -> float:
    """Fraction of all CPUs busy over ``interval`` (from /proc/stat), without what process
    ``exclude_pid`` used (the mount being measured, decoding in the background)."""

    def sample() -> Tuple[int, int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return idle, sum(values), _process_ticks(exclude_pid)

    idle0, total0, own0 = sample()
    time.sleep(interval)
    idle1, total1, own1 = sample()
    return max(0.0, 1.0 - (idle1 - idle0 + own1 - own0) / max(1, total1 - total0))


QUIET_LOG: List[Dict[str, Any]] = []
QUIET_BUDGET = 300.0  # seconds of waiting for idle CPUs per run, in total (--quiet-budget)


def wait_for_quiet(label: str, max_wait: float, threshold: float = 0.25, exclude_pid: Optional[int] = None) -> float:
    """Wait (at most ``max_wait`` s) until other processes keep less than ``threshold`` of the
    CPUs busy, so that a measurement does not share the 2 cores with someone's test run.
    ``exclude_pid``: a mount whose own background work must not delay its measurement.
    Returns the busy fraction seen last; every wait is logged into QUIET_LOG."""
    global QUIET_BUDGET
    max_wait = min(max_wait, QUIET_BUDGET)
    start = time.monotonic()
    busy = cpu_busy_fraction(0.5 if max_wait > 0 else 0.2, exclude_pid)
    while busy > threshold and time.monotonic() - start < max_wait:
        busy = cpu_busy_fraction(1.0, exclude_pid)
    waited = time.monotonic() - start
    QUIET_BUDGET = max(0.0, QUIET_BUDGET - waited)
    QUIET_LOG.append({"before": label, "busy": round(busy, 3), "waited_s": round(waited, 1)})
    if busy > threshold and max_wait > 0:
        log(f"  note: CPUs still {busy:.0%} busy with other work before {label} (waited {waited:.0f} s)")
    return busy


def warm_file(path: str) -> None:
    """Read a file once so that it sits in the page cache (same state for every tool)."""
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 22):
            pass


def proc_status(pid: int) -> Dict[str, int]:
    values: Dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "Threads"):
                values[key] = int(rest.split()[0])
    return values


def proc_cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fuse_daemon_pid(mountpoint: str) -> Optional[int]:
    """The process serving ``mountpoint``: like ``pgrep -f MOUNTPOINT`` (a process whose command
    line names the mount point), narrowed to the one that holds ``/dev/fuse`` open."""
    target = os.path.realpath(mountpoint)
    me = os.getpid()
    found: List[Tuple[bool, int]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = "/"
        if not any(
            os.path.normpath(os.path.join(cwd, a)) in (os.path.normpath(os.path.abspath(mountpoint)), target)
            for a in args
        ):
            continue
        holds_fuse = False
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/fuse":
                        holds_fuse = True
                        break
                except OSError:
                    pass
        except OSError:
            continue
        found.append((holds_fuse, pid))
    with_fuse = [pid for holds, pid in found if holds]
    if with_fuse:
        return min(with_fuse)
    return min(pid for _, pid in found) if found else None


def is_mounted(mountpoint: str) -> bool:
    """True when /proc/self/mountinfo lists the mount point (also for a dead FUSE daemon, whose
    mount point ``os.path.ismount`` cannot stat)."""
    target = os.path.abspath(mountpoint)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                field4 = line.split()[4].replace("\\040", " ")
                if field4 == target:
                    return True
    except OSError:
        pass
    return os.path.ismount(mountpoint)


#: Runs a command and writes its ru_maxrss (KiB) to argv[1]. Started as a separate small process
#: because Linux carries the RSS high-water mark of the process that spawned a program into the
#: program's ru_maxrss: spawned straight from this (large) benchmark process, every mount command
#: would report at least our own RSS.
LAUNCHER = """
import os, sys
out, cmd = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execvp(cmd[0], cmd)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(out, "w") as f:
    f.write(f"{usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}")
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


class RssGuard(threading.Thread):
    """Samples the daemon's VmRSS every 0.2 s; kills it (SIGKILL) above ``limit_kib`` so that a
    leaking tool cannot take the machine down. ``max_kib`` is the largest sample seen."""

    def __init__(self, pid: Optional[int], limit_kib: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.limit_kib = limit_kib
        self.max_kib = 0
        self.tripped = False
        self._stop_event = threading.Event()

    def run(self) -> None:
        while self.pid and not self._stop_event.wait(0.2):
            try:
                rss = proc_status(self.pid)["VmRSS"]
            except (OSError, KeyError):
                return
            self.max_kib = max(self.max_kib, rss)
            if rss > self.limit_kib:
                self.tripped = True
                log(f"  daemon {self.pid} RSS {rss / 1024:.0f} MiB exceeds the limit: killing it")
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except OSError:
                    pass
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)


def unmount(mountpoint: str, pid: Optional[int], timeout: float = 60.0) -> None:
    if is_mounted(mountpoint):
        for cmd in (["fusermount3", "-u", mountpoint], ["fusermount", "-u", mountpoint], ["umount", mountpoint]):
            if shutil.which(cmd[0]) is None:
                continue
            if subprocess.run(cmd, capture_output=True).returncode == 0:
                break
        else:
            subprocess.run(["fusermount3", "-uz", mountpoint], capture_output=True)
        if is_mounted(mountpoint):  # a dead daemon or a busy mount: detach lazily
            subprocess.run(["fusermount3", "-uz", mountpoint], capture_output=True)
    deadline = time.monotonic() + timeout
    while pid is not None and os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "Z":
                    break
        except OSError:
            break
        time.sleep(0.01)
    if is_mounted(mountpoint):
        raise RuntimeError(f"could not unmount {mountpoint}")


def command_output(cmd: Sequence[str]) -> str:
    try:
        result = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
        return (result.stdout + result.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"


# --------------------------------------------------------------------------------------------
# Tools
# --------------------------------------------------------------------------------------------
@dataclass
class MountResult:
    seconds: float
    pid: Optional[int]
    command_maxrss_kib: int
    #: user + system CPU seconds of the mount command (and its waited-for children)
    command_cpu_s: float = 0.0

    def total_cpu_s(self) -> float:
        """CPU of the command plus CPU the daemon used so far (the daemon may be a fork of the
        command that was never waited for): what the mount cost, whatever else ran meanwhile."""
        daemon = 0.0
        if self.pid:
            try:
                daemon = proc_cpu_seconds(self.pid)
            except OSError:
                pass
        return self.command_cpu_s + daemon


def install_ours(src: str, venv: str) -> str:
    """Install ``src`` (this checkout, or a snapshot of a commit) into ``venv`` the way a user
    installs it and the way the peer is installed: ``pip install``, not editable. Returns the
    venv's bin folder. An editable install makes every start of the interpreter import the
    editable finder's modules through the site hooks (pathlib, shutil and with it bz2, lzma,
    tempfile, random, zipfile, importlib.resources): 1.4 MiB more resident in the mount process
    (19.9-20.0 against 21.3 MiB at the end of find + random reads on 100,000 files), which the
    peer, installed from PyPI into its own venv, does not pay."""
    python = os.path.join(venv, "bin", "python")
    quiet = ["--quiet", "--disable-pip-version-check"]
    if not os.path.exists(python):
        log(f"installing {src} into a new venv {venv}")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", *quiet, src], check=True)
    else:  # our package again (the checkout may have changed), and dependencies it gained since
        log(f"installing {src} into {venv}")
        subprocess.run([python, "-m", "pip", "install", *quiet, "--no-deps", "--force-reinstall", src], check=True)
        subprocess.run([python, "-m", "pip", "install", *quiet, src], check=True)
    if not BYTECODE_AS_IS:
        # Compiled once into the cache the mounts use (``tool_env``): the run's first mount paid
        # for compiling what the install changed (the first .tar.gz of bench_compressed.py:
        # 0.55 s against 0.31 s when run again).
        code = (
            "import compileall, os, ratarmount, ratarmountcore\n"
            "for module in (ratarmount, ratarmountcore):\n"
            "    compileall.compile_dir(os.path.dirname(module.__file__), quiet=1)"
        )
        subprocess.run([python, "-c", code], env=tool_env(), check=True)
    return os.path.join(venv, "bin")


def tool_env() -> Dict[str, str]:
    """The environment for mount commands: Python byte code may be cached (this machine sets
    PYTHONDONTWRITEBYTECODE=1, which would make our editable install compile every module on every
    mount while the peer's pip install ships compiled files); the cache goes to
    benchmarks/work/pycache, not into the source tree."""
    env = dict(os.environ)
    if not BYTECODE_AS_IS:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(WORK, "pycache")
    return env


BYTECODE_AS_IS = False


class Tool:
    """A way of presenting the archive as a directory tree."""

    name = ""
    mounts = True
    has_index = False

    def __init__(self, ds: Dataset, args: argparse.Namespace) -> None:
        self.ds = ds
        self.args = args
        self.folder = os.path.join(WORK, "run", ds.base.rsplit("/", 1)[-1], self.name)
        self.mountpoint = os.path.join(self.folder, "mnt")
        self.archive = os.path.join(self.folder, "archive.tar")
        self.prep_seconds = 0.0

    def available(self) -> Optional[str]:
        """None when usable, else why not."""
        return None

    def version(self) -> str:
        return ""

    def prepare(self) -> None:
        """Give the tool its own hard link of the archive (indexes beside it cannot collide)."""
        os.makedirs(self.folder, exist_ok=True)
        if is_mounted(self.mountpoint):
            unmount(self.mountpoint, fuse_daemon_pid(self.mountpoint))
        os.makedirs(self.mountpoint, exist_ok=True)
        if os.path.exists(self.archive) and not os.path.samefile(self.archive, self.ds.tar_path):
            os.unlink(self.archive)
        if not os.path.exists(self.archive):
            os.link(self.ds.tar_path, self.archive)

    def index_files(self) -> List[str]:
        return []

    def remove_index(self) -> None:
        for path in self.index_files():
            for match in glob.glob(path):
                os.unlink(match)

    def index_size(self) -> Optional[int]:
        sizes = [os.path.getsize(m) for p in self.index_files() for m in glob.glob(p)]
        return sum(sizes) if sizes else None

    def mount_command(self) -> List[str]:
        raise NotImplementedError

    @property
    def root(self) -> str:
        return self.mountpoint

    def mount(self, timeout: float, measure_rss: bool = False, kill_after: Optional[float] = None) -> MountResult:
        """Run the mount command; the time runs until it returned AND the mount point is a mount.

        With ``measure_rss`` the command runs under LAUNCHER (a small Python process, ~15 ms of
        start-up added to the time) to get a clean ``ru_maxrss`` of the mount command. With
        ``kill_after`` the command (its whole process group) is killed after that many seconds
        and MountTimeoutError is raised."""
        if os.listdir(self.mountpoint):
            raise RuntimeError(f"{self.mountpoint} is not empty")
        command = self.mount_command()
        maxrss_file = None
        if measure_rss:
            fd, maxrss_file = tempfile.mkstemp(prefix="maxrss-")
            os.close(fd)
            command = [sys.executable, "-S", "-E", "-c", LAUNCHER, maxrss_file, *command]
        with tempfile.TemporaryFile() as err:
            start = time.perf_counter()
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                env=tool_env(),
                start_new_session=kill_after is not None,
            )
            killer: Optional[threading.Timer] = None
            killed: List[bool] = []
            if kill_after is not None:

                def kill() -> None:
                    killed.append(True)
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except OSError:
                        pass

                killer = threading.Timer(kill_after, kill)
                killer.daemon = True
                killer.start()
            _, status, usage = os.wait4(proc.pid, 0)
            if killer is not None:
                killer.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            if killed:
                if is_mounted(self.mountpoint):
                    unmount(self.mountpoint, fuse_daemon_pid(self.mountpoint))
                raise MountTimeoutError(time.perf_counter() - start)
            while proc.returncode == 0 and not os.path.ismount(self.mountpoint):
                if time.perf_counter() - start > timeout:
                    break
                time.sleep(0.0005)
            seconds = time.perf_counter() - start
            if proc.returncode != 0 or not os.path.ismount(self.mountpoint):
                err.seek(0)
                message = err.read().decode(errors="replace").strip()[-2000:]
                raise RuntimeError(f"{self.name}: mount failed (exit {proc.returncode}): {message}")
        pid = fuse_daemon_pid(self.mountpoint)
        maxrss = usage.ru_maxrss
        cpu = usage.ru_utime + usage.ru_stime
        if maxrss_file:
            with open(maxrss_file) as f:
                parts = f.read().split()
            os.unlink(maxrss_file)
            maxrss = int(parts[0]) if parts else 0
            cpu = float(parts[1]) if len(parts) > 1 else cpu
        return MountResult(seconds, pid, maxrss, cpu)


class MountTimeoutError(RuntimeError):
    """The mount command was killed after ``kill_after`` seconds."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"mount gave up after {seconds:.0f} s")
        self.seconds = seconds


class Ours(Tool):
    name = "ours"
    has_index = True

    def executable(self) -> str:
        if self.args.ours_cmd:
            return self.args.ours_cmd
        # The console script beside the interpreter, not a pyenv shim (a shim adds ~100 ms).
        beside = os.path.join(os.path.dirname(sys.executable), "ratarmount")
        return beside if os.path.exists(beside) else (shutil.which("ratarmount") or "ratarmount")

    def version(self) -> str:
        return command_output([self.executable(), "--version"])

    def index_files(self) -> List[str]:
        return [
            self.archive + ".index.sqlite",
            self.archive + ".index.sqlite.tmp-*",
            os.path.expanduser("~/.cache/ratarmount/archive.tar.*.index.sqlite"),
        ]

    def mount_command(self) -> List[str]:
        return [self.executable(), self.archive, self.mountpoint]


class Peer(Tool):
    name = "peer"
    has_index = True

    def executable(self) -> str:
        return os.path.join(PEER_VENV, "bin", "ratarmount")

    def available(self) -> Optional[str]:
        if not os.path.exists(self.executable()):
            return f"{self.executable()} missing: run benchmarks/setup_peers.sh"
        return None

    def version(self) -> str:
        text = command_output([self.executable(), "--version"])
        wanted = (
            "ratarmount ",
            "ratarmountcore ",
            "mfusepy ",
            "indexed_gzip ",
            "rapidgzip ",
            "indexed_zstd ",
            "python-xz ",
            "libarchive-c ",
            "cpython ",
            "libsqlite3 ",
            "libfuse ",
            "fusermount ",
        )
        keep: Dict[str, str] = {}
        for line in text.splitlines():
            line = line.strip()
            if line.startswith(wanted):
                keep.setdefault(line.split()[0], line)  # the first of each name (not the loaded .so list)
        return "\n".join(keep.values())

    def index_files(self) -> List[str]:
        flat = self.archive.replace("/", "_")
        return [
            self.archive + ".index.sqlite",
            self.archive + ".index.sqlite.tmp*",
            os.path.expanduser(f"~/.ratarmount/*{flat}*.index.sqlite"),
            os.path.expanduser(f"~/.cache/ratarmount/*{flat}*.index.sqlite"),
        ]

    def mount_command(self) -> List[str]:
        return [self.executable(), self.archive, self.mountpoint]


class ArchiveMount(Tool):
    name = "archivemount"

    def available(self) -> Optional[str]:
        return None if shutil.which("archivemount") else "archivemount is not installed (setup_peers.sh)"

    def version(self) -> str:
        text = command_output(["archivemount", "--version"])
        keep = [line for line in text.splitlines() if line.startswith(("archivemount version", "FUSE library"))]
        return "; ".join(keep) or text

    def mount_command(self) -> List[str]:
        return ["archivemount", "-o", "readonly", self.archive, self.mountpoint]


class SquashFuse(Tool):
    name = "squashfuse"
    has_index = False

    def __init__(self, ds: Dataset, args: argparse.Namespace) -> None:
        super().__init__(ds, args)
        self.image = ds.base + ".squashfs"

    def available(self) -> Optional[str]:
        for exe in ("squashfuse", "mksquashfs"):
            if not shutil.which(exe):
                return f"{exe} is not installed (setup_peers.sh)"
        return None

    def version(self) -> str:
        text = command_output(["squashfuse", "--version"])
        keep = [line for line in text.splitlines() if line.startswith("squashfuse ")]
        return (keep[0] if keep else text) + "; mksquashfs " + command_output(["mksquashfs", "-version"]).split()[2]

    def prepare(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        os.makedirs(self.mountpoint, exist_ok=True)
        if not self.ds._is_current(self.image):
            start = time.perf_counter()
            subprocess.run(
                [
                    "mksquashfs",
                    self.ds.dir_path,
                    self.image,
                    "-noappend",
                    "-quiet",
                    "-no-progress",
                    "-noI",
                    "-noD",
                    "-noF",
                    "-noX",
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            self.ds._mark_current(self.image)
            self.prep_seconds = time.perf_counter() - start

    def mount_command(self) -> List[str]:
        return ["squashfuse", self.image, self.mountpoint]


class PlainDir(Tool):
    name = "dir"
    mounts = False

    def prepare(self) -> None:
        pass

    def version(self) -> str:
        return "extracted with GNU tar to " + os.path.relpath(self.ds.dir_path, REPO)

    @property
    def root(self) -> str:
        return self.ds.dir_path


TOOL_CLASSES = {cls.name: cls for cls in (Ours, Peer, PlainDir, ArchiveMount, SquashFuse)}


# --------------------------------------------------------------------------------------------
# Measurements (each verifies what it measured)
# --------------------------------------------------------------------------------------------
class InvalidResultError(Exception):
    """A tool returned something wrong (count, size, bytes)."""


class PhaseTimeoutError(Exception):
    def __init__(self, done: Optional[int], total: int, seconds: float) -> None:
        progress = f" ({done:,} of {total:,} done)" if done is not None else ""
        super().__init__(f"gave up after {seconds:.0f} s{progress}")
        self.done = done
        self.total = total
        self.seconds = seconds


def measure_find(root: str, expected: int, timeout: float, exclude: Optional[str] = None) -> float:
    """``find ROOT -type f | wc -l``; ``exclude``: a name pattern not counted (``! -name``)."""
    start = time.perf_counter()
    skip = f" ! -name {shlex.quote(exclude)}" if exclude else ""
    try:
        result = subprocess.run(
            ["bash", "-c", f"find {shlex.quote(root)} -type f{skip} | wc -l"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise PhaseTimeoutError(None, expected, time.perf_counter() - start) from None
    seconds = time.perf_counter() - start
    count = int(result.stdout.strip() or -1)
    if count != expected:
        raise InvalidResultError(f"find counted {count} files, expected {expected} ({result.stderr.strip()[-300:]})")
    return seconds


def _check_stats(ds: Dataset, sizes: List[int], modes: List[int]) -> None:
    expected = ds.sizes[: len(sizes)]
    if sizes != expected:
        bad = next(i for i, (a, b) in enumerate(zip(sizes, expected)) if a != b)
        raise InvalidResultError(f"stat size mismatch for {ds.paths[bad]}: {sizes[bad]} != {expected[bad]}")
    if not all(stat.S_ISREG(m) for m in modes):
        raise InvalidResultError("stat: some files are not regular files")


def measure_stat(root: str, ds: Dataset, timeout: float) -> float:
    paths = [os.path.join(root, p) for p in ds.paths]
    sizes: List[int] = []
    modes: List[int] = []
    start = time.perf_counter()
    for path in paths:
        st = os.stat(path)
        sizes.append(st.st_size)
        modes.append(st.st_mode)
        if len(sizes) & 255 == 0 and time.perf_counter() - start > timeout:
            elapsed = time.perf_counter() - start
            _check_stats(ds, sizes, modes)
            raise PhaseTimeoutError(len(sizes), len(paths), elapsed)
    seconds = time.perf_counter() - start
    _check_stats(ds, sizes, modes)
    return seconds


def random_sample(ds: Dataset, count: int) -> List[int]:
    return random.Random(ds.seed + 1).sample(range(ds.files), min(count, ds.files))


def measure_reads(root: str, ds: Dataset, indices: List[int], timeout: float) -> float:
    data: List[bytes] = []
    start = time.perf_counter()
    for i in indices:
        with open(os.path.join(root, ds.paths[i]), "rb") as f:
            data.append(f.read())
        if time.perf_counter() - start > timeout:
            break
    seconds = time.perf_counter() - start
    for i, got in zip(indices, data):
        if got != ds.content(i):
            raise InvalidResultError(f"read of {ds.paths[i]} returned wrong bytes ({len(got)} bytes)")
    if len(data) < len(indices):
        raise PhaseTimeoutError(len(data), len(indices), seconds)
    return seconds


#: What the forked readers of ``measure_parallel_reads`` read (set before the pool forks).
_PARALLEL: Dict[str, Any] = {}


def _parallel_reader(indices: List[int]) -> Tuple[float, List[int]]:
    """One reader process: its files in turn; when it finished, and which files came back wrong
    (checked after the clock stopped)."""
    root, ds = _PARALLEL["root"], _PARALLEL["ds"]
    data = []
    for i in indices:
        with open(os.path.join(root, ds.paths[i]), "rb") as f:
            data.append(f.read())
    finished = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    return finished, [i for i, got in zip(indices, data) if got != ds.content(i)]


def measure_parallel_reads(root: str, ds: Dataset, indices: List[int], workers: int, timeout: float) -> float:
    """``workers`` processes (a DataLoader's) read their share of ``indices`` at the same time;
    the time from the start until the last one is done (the processes are forked beforehand)."""
    import multiprocessing

    _PARALLEL.update(root=root, ds=ds)
    shares = [indices[k::workers] for k in range(workers)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(abs, range(workers))  # the workers exist and have run once
        start = time.perf_counter()
        pending = pool.map_async(_parallel_reader, shares)
        try:
            results = pending.get(timeout)
        except multiprocessing.TimeoutError:
            # A partial figure, not the end of the run; the pool's exit kills the readers.
            raise PhaseTimeoutError(None, len(indices), time.perf_counter() - start) from None
    seconds = max(finished for finished, _ in results) - start
    wrong = [i for _, bad in results for i in bad]
    if wrong:
        raise InvalidResultError(f"read of {ds.paths[wrong[0]]} by parallel readers returned wrong bytes")
    return seconds


@dataclass
class ToolResult:
    tool: str
    version: str = ""
    first_mount_s: Optional[float] = None
    second_mount_s: Optional[float] = None
    second_mount_all_s: List[float] = field(default_factory=list)
    mount_after_drop_caches_s: Optional[float] = None
    find_s: Optional[float] = None
    stat_after_find_s: Optional[float] = None
    stat_no_find_s: Optional[float] = None
    random_reads_s: Optional[float] = None
    parallel_reads_s: Optional[float] = None
    peak_rss_kib: Optional[int] = None
    rss_at_end_kib: Optional[int] = None
    first_mount_peak_rss_kib: Optional[int] = None
    daemon_threads: Optional[int] = None
    daemon_cpu_s: Optional[float] = None
    index_bytes: Optional[int] = None
    prep_s: Optional[float] = None
    daemon_pid_found: Optional[bool] = None
    #: False when a check failed: a wrong count, size or byte.
    valid: bool = True
    #: False when a phase timed out or the daemon was killed at the RSS limit.
    complete: bool = True
    #: key -> {"done", "total", "seconds"} for phases that timed out.
    partial: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: CPU seconds (user + system) per phase: mount command + daemon for mounts, the daemon
    #: alone for find/stat/reads. Less sensitive than wall time to other work on the machine.
    cpu_s: Dict[str, float] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)
    skipped: Optional[str] = None


def run_phase(result: ToolResult, key: str, label: str, guard: Optional[RssGuard], func: Any, *a: Any) -> None:
    """Run one measurement; record its value, or why there is none. With a daemon (``guard``)
    also the daemon's CPU seconds for the phase (in ``result.cpu_s``)."""
    pid = guard.pid if guard is not None else None
    cpu_before = None
    if pid:
        try:
            cpu_before = proc_cpu_seconds(pid)
        except OSError:
            pass
    try:
        _run_phase(result, key, label, guard, func, *a)
    finally:
        if cpu_before is not None:
            try:
                result.cpu_s[key.removesuffix("_s")] = proc_cpu_seconds(pid) - cpu_before  # type: ignore[arg-type]
            except OSError:
                pass


def _run_phase(result: ToolResult, key: str, label: str, guard: Optional[RssGuard], func: Any, *a: Any) -> None:
    if guard is not None and guard.tripped:
        result.complete = False
        result.errors.append(f"{label}: not run, the daemon had been killed at the RSS limit")
        return
    try:
        setattr(result, key, func(*a))
    except PhaseTimeoutError as exc:
        result.complete = False
        result.partial[key] = {"done": exc.done, "total": exc.total, "seconds": exc.seconds}
        result.errors.append(f"{label}: {exc}")
        log(f"  {result.tool}: {label}: {exc}")
    except (InvalidResultError, OSError) as exc:
        if guard is not None and guard.tripped:
            result.complete = False
            result.errors.append(f"{label}: daemon killed at the RSS limit ({guard.limit_kib // 1024} MiB): {exc}")
        else:
            result.valid = False
            result.errors.append(f"{label}: {exc}")
        log(f"  {result.tool}: {label} FAILED: {exc}")


def bench_tool(tool: Tool, ds: Dataset, args: argparse.Namespace) -> ToolResult:
    result = ToolResult(tool.name)
    why = tool.available()
    if why:
        result.skipped = why
        result.valid = False
        log(f"skipping {tool.name}: {why}")
        return result
    result.version = tool.version()
    tool.prepare()
    result.prep_s = tool.prep_seconds or None
    timeout = args.phase_timeout
    indices = random_sample(ds, args.random_reads)
    parallel = random.Random(ds.seed + 2).sample(range(ds.files), min(args.parallel_reads, ds.files))
    log(f"{tool.name}: start")

    quiet = args.quiet_wait
    name = tool.name
    if not tool.mounts:  # the plain directory: the same workload, no mount
        wait_for_quiet(f"{name} find", quiet)
        drop_caches(2)  # dentries and inodes only: like a fresh mount, the disk blocks stay cached
        run_phase(result, "find_s", "find", None, measure_find, tool.root, ds.files, timeout)
        run_phase(result, "stat_after_find_s", "stat after find", None, measure_stat, tool.root, ds, timeout)
        wait_for_quiet(f"{name} stat without find", quiet)
        drop_caches(2)
        run_phase(result, "stat_no_find_s", "stat without find", None, measure_stat, tool.root, ds, timeout)
        wait_for_quiet(f"{name} random reads", quiet)
        drop_caches(3)
        run_phase(result, "random_reads_s", "random reads", None, measure_reads, tool.root, ds, indices, timeout)
        if args.parallel_readers:
            wait_for_quiet(f"{name} parallel reads", quiet)
            drop_caches(3)
            run_phase(
                result, "parallel_reads_s", "parallel reads", None,
                measure_parallel_reads, tool.root, ds, parallel, args.parallel_readers, timeout,
            )  # fmt: skip
        log(
            f"  find {result.find_s}, stat {result.stat_after_find_s} / {result.stat_no_find_s}, "
            f"reads {result.random_reads_s}, parallel reads {result.parallel_reads_s}"
        )
        return result

    limit = int(args.rss_limit_mib * 1024)
    mounted: Optional[MountResult] = None
    guard: Optional[RssGuard] = None

    def session_end() -> None:
        nonlocal mounted, guard
        if guard is not None:
            guard.stop()
        unmount(tool.mountpoint, mounted.pid if mounted else None)
        mounted = None

    try:
        # 1. First mount: no index anywhere, archive in the page cache (same state for all tools).
        tool.remove_index()
        warm_file(tool.image if isinstance(tool, SquashFuse) else tool.archive)
        wait_for_quiet(f"{name} first mount", quiet)
        mounted = tool.mount(args.mount_timeout, measure_rss=True)
        result.first_mount_s = mounted.seconds
        result.daemon_pid_found = mounted.pid is not None
        hwm = proc_status(mounted.pid)["VmHWM"] if mounted.pid else 0
        result.first_mount_peak_rss_kib = max(hwm, mounted.command_maxrss_kib)
        result.cpu_s["first_mount"] = mounted.total_cpu_s()
        log(f"  first mount {mounted.seconds:.3f} s")
        guard = None
        session_end()
        result.index_bytes = tool.index_size()
        if tool.has_index and result.index_bytes is None:
            result.errors.append("no index file found after the first mount")

        # 2. Second mounts (index present, warm caches): the median of a few.
        times: List[float] = []
        cpu_times: List[float] = []
        for _ in range(args.mount_repeats):
            wait_for_quiet(f"{name} second mount", quiet)
            mounted = tool.mount(args.mount_timeout)
            times.append(mounted.seconds)
            cpu_times.append(mounted.total_cpu_s())
            session_end()
        result.second_mount_all_s = times
        result.second_mount_s = statistics.median(times)
        result.cpu_s["second_mount"] = statistics.median(cpu_times)
        log(f"  second mounts {', '.join(f'{t:.3f}' for t in times)} s")

        # 3. A fresh mount: find + stat + random reads; peak RSS just before unmounting.
        wait_for_quiet(f"{name} find", quiet)
        mounted = tool.mount(args.mount_timeout)
        guard = RssGuard(mounted.pid, limit)
        guard.start()
        cpu_before = proc_cpu_seconds(mounted.pid) if mounted.pid else None
        run_phase(result, "find_s", "find", guard, measure_find, tool.root, ds.files, timeout)
        log(f"  find {result.find_s}")
        wait_for_quiet(f"{name} stat after find", quiet)
        run_phase(result, "stat_after_find_s", "stat after find", guard, measure_stat, tool.root, ds, timeout)
        log(f"  stat after find {result.stat_after_find_s}")
        wait_for_quiet(f"{name} random reads", quiet)
        drop_caches(3)
        run_phase(result, "random_reads_s", "random reads", guard, measure_reads, tool.root, ds, indices, timeout)
        log(f"  random reads {result.random_reads_s}")
        if guard.tripped:
            result.peak_rss_kib = guard.max_kib
        elif mounted.pid:
            status = proc_status(mounted.pid)
            result.peak_rss_kib = status["VmHWM"]
            result.rss_at_end_kib = status["VmRSS"]
            result.daemon_threads = status["Threads"]
            if cpu_before is not None:
                result.daemon_cpu_s = proc_cpu_seconds(mounted.pid) - cpu_before
        session_end()

        # 4. A fresh mount (after the page cache was dropped: the tool's own code is read from
        # disk again), then stat every file without a find first.
        wait_for_quiet(f"{name} stat without find", quiet)
        mounted = tool.mount(args.mount_timeout)
        result.mount_after_drop_caches_s = mounted.seconds
        guard = RssGuard(mounted.pid, limit)
        guard.start()
        run_phase(result, "stat_no_find_s", "stat without find", guard, measure_stat, tool.root, ds, timeout)
        log(f"  stat without find {result.stat_no_find_s}")
        if guard.tripped:
            result.peak_rss_kib = max(result.peak_rss_kib or 0, guard.max_kib)
        session_end()
        guard = None

        # 5. A fresh mount, cold page cache: several processes read random files at once (a
        # DataLoader's workers). Not in the peak RSS: that figure stays the single reader's.
        if args.parallel_readers:
            wait_for_quiet(f"{name} parallel reads", quiet)
            mounted = tool.mount(args.mount_timeout)
            guard = RssGuard(mounted.pid, limit)
            guard.start()
            drop_caches(3)
            run_phase(
                result, "parallel_reads_s", "parallel reads", guard,
                measure_parallel_reads, tool.root, ds, parallel, args.parallel_readers, timeout,
            )  # fmt: skip
            log(f"  parallel reads {result.parallel_reads_s}")
            session_end()
            guard = None
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        result.complete = False
        result.errors.append(str(exc))
        log(f"  {tool.name} FAILED: {exc}")
    finally:
        if guard is not None:
            guard.stop()
        if is_mounted(tool.mountpoint):
            unmount(tool.mountpoint, mounted.pid if mounted else fuse_daemon_pid(tool.mountpoint))
    return result


def warm_up(names: Sequence[str], args: argparse.Namespace) -> None:
    """Mount a tiny archive once with each Python tool, so that byte code is compiled and the
    interpreters are in the page cache before anything is timed."""
    ds = Dataset(50, 5, (100, 200), args.seed, "warmup")
    ds.ensure_tar()
    for name in names:
        tool = TOOL_CLASSES[name](ds, args)
        if name not in ("ours", "peer") or tool.available():
            continue
        tool.prepare()
        tool.remove_index()
        try:
            for _ in range(2):
                m = tool.mount(args.mount_timeout)
                os.stat(os.path.join(tool.root, ds.paths[0]))
                unmount(tool.mountpoint, m.pid)
        except (RuntimeError, OSError) as exc:
            log(f"warm-up of {name} failed: {exc}")
        finally:
            if is_mounted(tool.mountpoint):
                unmount(tool.mountpoint, fuse_daemon_pid(tool.mountpoint))
            tool.remove_index()


# --------------------------------------------------------------------------------------------
# Scaling: second-mount time against the number of members
# --------------------------------------------------------------------------------------------
def bench_scaling(args: argparse.Namespace) -> Dict[str, Any]:
    rows: List[Dict[str, Any]] = []
    for n in args.scaling_sizes:
        ds = Dataset(n, args.scaling_folders, args.scaling_file_size, args.seed, f"scale-{n}")
        log(f"scaling: {n:,} members")
        tar_s = ds.ensure_tar()
        for name in args.scaling_tools:
            tool = TOOL_CLASSES[name](ds, args)
            row: Dict[str, Any] = {
                "tool": name,
                "files": n,
                "tar_bytes": os.path.getsize(ds.tar_path),
                "tar_build_s": tar_s,
                "valid": True,
                "errors": [],
            }
            why = tool.available()
            if why or not tool.mounts:
                continue
            tool.prepare()
            pid = None
            try:
                tool.remove_index()
                warm_file(tool.archive)
                wait_for_quiet(f"scaling {name} {n} first mount", args.quiet_wait)
                m = tool.mount(args.mount_timeout, measure_rss=True)
                row["first_mount_s"] = m.seconds
                row["first_mount_cpu_s"] = m.total_cpu_s()
                row["first_mount_peak_rss_kib"] = (
                    max(proc_status(m.pid)["VmHWM"], m.command_maxrss_kib) if m.pid else m.command_maxrss_kib
                )
                unmount(tool.mountpoint, m.pid)
                row["index_bytes"] = tool.index_size()
                times = []
                cpu_times = []
                for rep in range(args.mount_repeats):
                    wait_for_quiet(f"scaling {name} {n} second mount", args.quiet_wait)
                    m = tool.mount(args.mount_timeout)
                    pid = m.pid
                    times.append(m.seconds)
                    cpu_times.append(m.total_cpu_s())
                    if rep == 0:  # sanity: sizes of 100 random files and bytes of 20
                        sample = random_sample(ds, 100)
                        for i in sample:
                            if os.stat(os.path.join(tool.root, ds.paths[i])).st_size != ds.sizes[i]:
                                raise InvalidResultError(f"wrong size for {ds.paths[i]}")
                        measure_reads(tool.root, ds, sample[:20], args.phase_timeout)
                        row["rss_after_sample_kib"] = proc_status(pid)["VmHWM"] if pid else None
                    unmount(tool.mountpoint, pid)
                    pid = None
                row["second_mount_all_s"] = times
                row["second_mount_s"] = statistics.median(times)
                row["second_mount_cpu_s"] = statistics.median(cpu_times)
                log(f"  {name}: first {row['first_mount_s']:.2f} s, second {row['second_mount_s']:.3f} s")
            except (InvalidResultError, PhaseTimeoutError, RuntimeError, OSError) as exc:
                row["valid"] = False
                row["errors"].append(str(exc))
                log(f"  {name} FAILED: {exc}")
            finally:
                if is_mounted(tool.mountpoint):
                    unmount(tool.mountpoint, pid or fuse_daemon_pid(tool.mountpoint))
                tool.remove_index()
            rows.append(row)
        if not args.keep_data and n >= 1_000_000:
            for path in (ds.tar_path, ds.tar_path + ".params.json"):
                if os.path.exists(path):
                    os.unlink(path)
    return {"file_size": list(args.scaling_file_size), "folders": args.scaling_folders, "rows": rows}


# --------------------------------------------------------------------------------------------
# Machine description and report
# --------------------------------------------------------------------------------------------
def machine_info() -> Dict[str, str]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    libfuse = command_output(["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", "libfuse3-3", "libfuse2"])
    if "unavailable" in libfuse or "no packages" in libfuse:
        libfuse = command_output(["pkg-config", "--modversion", "fuse3"])
    return {
        "nproc": command_output(["nproc"]),
        "cpu": cpu,
        "memory": mem,
        "kernel": platform.release(),
        "os": command_output(["sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"]),
        "libfuse": ", ".join(libfuse.splitlines()),
        "fusermount3": command_output(["fusermount3", "--version"]),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_description(),
    }


def git_description() -> str:
    """HEAD of this checkout, plus "(with local changes to ...)" outside benchmarks/."""
    head = command_output(["git", "-C", REPO, "log", "-1", "--format=%h %s"])
    try:
        status = subprocess.run(
            ["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        status = ""
    changed = [
        line[3:] for line in status.splitlines() if line[3:] and not line[3:].startswith(("benchmarks/", "docs/"))
    ]
    return head + (f" (with local changes to {', '.join(changed)})" if changed else "")


def fmt_value(key: str, value: Any) -> str:
    if value is None:
        return "–"
    if key.endswith("_kib"):
        return f"{value / 1024:.0f} MiB"
    if key.endswith("_bytes"):
        return f"{value / 1024 / 1024:.1f} MiB"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


ROWS = [
    ("first_mount_s", "first mount (s, no index)"),
    ("second_mount_s", "second mount (s, median)"),
    ("mount_after_drop_caches_s", "mount with index after drop_caches (s)"),
    ("find_s", "find -type f | wc -l (s)"),
    ("stat_after_find_s", "stat all files after find (s)"),
    ("stat_no_find_s", "stat all files, fresh mount (s)"),
    ("random_reads_s", "1,000 random reads, cold cache (s)"),
    ("parallel_reads_s", "4,000 random reads by 8 processes, cold cache (s)"),
    ("peak_rss_kib", "peak RSS of the mount process"),
    ("first_mount_peak_rss_kib", "peak RSS during first mount"),
    ("daemon_cpu_s", "daemon CPU s during find+stat+reads"),
    ("index_bytes", "index file size"),
]


def fmt_cell(res: Dict[str, Any], key: str) -> str:
    value = res.get(key)
    part = (res.get("partial") or {}).get(key)
    if value is None and part:
        done = f", {part['done']:,}/{part['total']:,} done" if part.get("done") is not None else ""
        return f"> {fmt_value('_s', part['seconds'])} (timeout{done})"
    if key == "peak_rss_kib" and any("RSS limit" in e for e in res.get("errors", [])):
        return f">= {fmt_value(key, value)} (killed at limit)"
    return fmt_value(key, value)


def status_cell(res: Dict[str, Any]) -> str:
    if not res["valid"]:
        return "**NO: wrong results**"
    if not res.get("complete", True):
        return "yes, but incomplete"
    return "yes"


def table(results: Dict[str, Any], markdown: bool = False) -> str:
    """The figures, one column per tool (Markdown table syntax, also printed as is)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|") if markdown else text

    tools = [t for t in results["tools"] if not results["tools"][t].get("skipped")]
    header = "| figure | " + " | ".join(tools) + " |"
    lines = [header, "|---|" + "---:|" * len(tools)]
    for key, label in ROWS:
        cells = [fmt_cell(results["tools"][t], key) for t in tools]
        lines.append(f"| {cell(label)} | " + " | ".join(cells) + " |")
    for key, label in CPU_ROWS:
        cells = [fmt_value("_s", (results["tools"][t].get("cpu_s") or {}).get(key)) for t in tools]
        if any(c != "–" for c in cells):
            lines.append(f"| CPU s: {label} | " + " | ".join(cells) + " |")
    lines.append("| all checks passed | " + " | ".join(status_cell(results["tools"][t]) for t in tools) + " |")
    return "\n".join(lines)


CPU_ROWS = [
    ("first_mount", "first mount (command + daemon)"),
    ("second_mount", "second mount (median)"),
    ("find", "daemon during find"),
    ("stat_after_find", "daemon during stat after find"),
    ("stat_no_find", "daemon during stat, fresh mount"),
    ("random_reads", "daemon during random reads"),
]


def median_result(runs: List[ToolResult]) -> ToolResult:
    """One tool's rounds as one result: the median of each figure (of the rounds that have it),
    every error, valid and complete only if every round was."""
    if len(runs) == 1:
        return runs[0]
    out = ToolResult(runs[0].tool)
    for spec in dataclasses.fields(ToolResult):
        values = [getattr(run, spec.name) for run in runs]
        if spec.name in ("valid", "complete"):
            merged: Any = all(values)
        elif spec.name == "errors":
            merged = [f"round {i + 1}: {e}" for i, run in enumerate(runs) for e in run.errors]
        elif spec.name == "second_mount_all_s":
            merged = [t for run in runs for t in run.second_mount_all_s]
        elif spec.name == "partial":
            merged = {k: v for run in runs for k, v in run.partial.items()}
        elif spec.name == "cpu_s":
            keys = sorted({k for run in runs for k in run.cpu_s})
            merged = {k: statistics.median([run.cpu_s[k] for run in runs if k in run.cpu_s]) for k in keys}
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) or v is None for v in values):
            present = [v for v in values if v is not None]
            merged = statistics.median(present) if present else None
            if present and all(isinstance(v, int) for v in present):
                merged = int(merged)
        else:
            merged = values[0]
        setattr(out, spec.name, merged)
    return out


def evaluate_targets(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    tools = results.get("tools", {})
    ours, peer = tools.get("ours"), tools.get("peer")
    if ours and peer and not peer.get("skipped"):
        for key, label, _op, limit in TARGETS:
            a, b = ours.get(key), peer.get(key)
            lower_bound = False
            part = (ours.get("partial") or {}).get(key)
            if a is None and part:  # timed out: the time so far is a lower bound
                a, lower_bound = part["seconds"], True
            if key == "peak_rss_kib" and any("RSS limit" in e for e in ours.get("errors", [])):
                lower_bound = True
            ratio = (a / b) if (a is not None and b) else None
            met = ratio is not None and ratio <= limit and ours["valid"] and not lower_bound
            ca = (ours.get("cpu_s") or {}).get(key.removesuffix("_s"))
            cb = (peer.get("cpu_s") or {}).get(key.removesuffix("_s"))
            cpu_ratio = (ca / cb) if (ca is not None and cb) else None
            # Per round (same conditions: the tools ran one after the other): ours / peer.
            per_round = [
                (r["ours"].get(key) / r["peer"][key]) if r["ours"].get(key) is not None and r["peer"].get(key) else None
                for r in results.get("rounds", [])
                if "ours" in r and "peer" in r
            ]
            out.append(
                {
                    "figure": label,
                    "ours": a,
                    "peer": b,
                    "ratio": ratio,
                    "target": f"<= {limit}x peer",
                    "met": met,
                    "key": key,
                    "lower_bound": lower_bound,
                    "cpu_ratio": cpu_ratio,
                    "round_ratios": per_round,
                    "met_in_rounds": sum(1 for r in per_round if r is not None and r <= limit),
                }
            )
    if ours:
        value = ours.get("second_mount_s")
        out.append(
            {
                "figure": f"second mount at {results['config']['files']:,} members",
                "ours": value,
                "peer": tools.get("peer", {}).get("second_mount_s"),
                "ratio": None,
                "target": f"< {SECOND_MOUNT_TARGET_S} s",
                "key": "second_mount_s",
                "met": value is not None and value < SECOND_MOUNT_TARGET_S,
            }
        )
    scaling = results.get("scaling")
    if scaling:
        rows = [r for r in scaling["rows"] if r["tool"] == "ours" and r.get("second_mount_s") is not None]
        if rows:
            rows.sort(key=lambda r: r["files"])
            worst = max(r["second_mount_s"] for r in rows)
            flat = rows[-1]["second_mount_s"] / rows[0]["second_mount_s"]
            out.append(
                {
                    "figure": f"second mount, {rows[0]['files']:,} to {rows[-1]['files']:,} members",
                    "ours": worst,
                    "peer": None,
                    "ratio": flat,
                    "target": f"< {SECOND_MOUNT_TARGET_S} s everywhere and flat (largest/smallest <= {FLATNESS_LIMIT})",
                    "key": "scaling",
                    "met": worst < SECOND_MOUNT_TARGET_S and flat <= FLATNESS_LIMIT and all(r["valid"] for r in rows),
                }
            )
    return out


def print_summary(results: Dict[str, Any]) -> None:
    if results.get("tools"):
        print()
        print(table(results))
    targets = results.get("targets") or []
    if targets:
        print()
        for t in targets:
            ratio = ((">=" if t.get("lower_bound") else "") + f"{t['ratio']:.2f}") if t["ratio"] is not None else "–"
            rounds = t.get("round_ratios") or []
            shown = ""
            if rounds:
                each = ", ".join("–" if r is None else f"{r:.2f}" for r in rounds)
                shown = f"  rounds {each} (met in {t['met_in_rounds']} of {len(rounds)})"
            print(
                f"  {'MET ' if t['met'] else 'MISS'}  {t['figure']:<42} ours {fmt_value(t['key'], t['ours']):>9}"
                f"  peer {fmt_value(t['key'], t['peer']):>9}  ratio {ratio:>6}  target {t['target']}{shown}"
            )
    scaling = results.get("scaling")
    if scaling:
        print()
        for r in scaling["rows"]:
            print(
                f"  scaling {r['tool']:<6} {r['files']:>9,} members: first {fmt_value('s', r.get('first_mount_s'))}"
                f" s, second {fmt_value('s', r.get('second_mount_s'))} s {'' if r['valid'] else 'INVALID'}"
            )


def markdown_report(results: Dict[str, Any], notes: Optional[str]) -> str:
    m = results["machine"]
    c = results["config"]
    out: List[str] = []
    out.append("# Benchmarks: ratarmount (ours) against the PyPI ratarmount release and others\n")
    out.append(
        "Generated by `benchmarks/bench_tar.py` (see `benchmarks/README.md` for how to run it and "
        "what each figure means). Raw figures: `benchmarks/results/results.json`.\n"
    )
    out.append("## Machine\n")
    for key in ("date", "commit", "nproc", "cpu", "memory", "kernel", "os", "libfuse", "fusermount3", "python"):
        out.append(f"- **{key}**: {m.get(key)}")
    out.append(
        f"- **page cache drop** (`echo 3 > /proc/sys/vm/drop_caches`): "
        f"{'permitted' if results.get('drop_caches_permitted') else 'NOT permitted: reads are warm'}"
    )
    out.append("")
    out.append("## Tools and backends\n")
    for name, res in results["tools"].items():
        if res.get("skipped"):
            out.append(f"- **{name}**: skipped ({res['skipped']})")
            continue
        version = (res.get("version") or "").strip()
        if "\n" in version:
            out.append(f"- **{name}**:\n\n```\n{version}\n```")
        else:
            out.append(f"- **{name}**: {version}")
    out.append("")
    quiet = results.get("quiet_log") or []
    noisy = [q for q in quiet if q["busy"] > 0.25]
    out.append(
        f"- **load average** at start / end: {' '.join(results.get('loadavg_start', []))} / "
        f"{' '.join(results.get('loadavg_end', []))}. Other sessions share this machine; before each "
        f"measurement the benchmark waits (up to 60 s each, 300 s in all) for the CPUs to be idle "
        f"(busy < 25%): {len(quiet) - len(noisy)} "
        f"of {len(quiet)} measurements started on idle CPUs"
        + (
            ", the others with other work running: "
            + "; ".join(f"{q['before']} ({q['busy']:.0%} busy)" for q in noisy[:12])
            if noisy
            else ""
        )
        + "."
    )
    out.append(
        f"- **niceness** of the benchmark and the tools it starts: {results.get('niceness', 0)} (so that "
        "other work on the machine disturbs the timings less)."
    )
    bytecode = (
        "cached (PYTHONPYCACHEPREFIX=benchmarks/work/pycache), as after a pip install"
        if results.get("bytecode_cached")
        else "environment as is"
    )
    out.append(f"- **Python byte code**: {bytecode}.")
    out.append("")
    if not c.get("files"):
        out.append("(No main run in this result file: scaling only.)\n")
    out.append("## Data set\n")
    out.append(
        f"- {c['files']:,} files in {c['folders']:,} folders (ImageNet-like names "
        f"`n01440764/n01440764_10000.JPEG`), sizes {c['size_range'][0]}–{c['size_range'][1]} bytes "
        f"(uniform, seed {c['seed']}), uncompressed ustar archive of "
        f"{c['tar_bytes'] / 1024 / 1024:.0f} MiB; {c['random_reads']:,} random reads (seed {c['seed'] + 1})."
    )
    out.append(
        f"- Before each first mount the archive is read once so that it is in the page cache for every "
        f"tool alike; second mounts are the median of {c['mount_repeats']}."
    )
    out.append(f"- Total run time: {results.get('elapsed_s', 0) / 60:.1f} min.\n")
    out.append("## Results\n")
    out.append(table(results, markdown=True))
    out.append("")
    targets = results.get("targets") or []
    if targets:
        out.append("## Targets\n")
        out.append("| figure | ours | peer | ours/peer | target | met? | ours/peer by CPU seconds |")
        out.append("|---|---:|---:|---:|---|---|---:|")
        for t in targets:
            ratio = ((">= " if t.get("lower_bound") else "") + f"{t['ratio']:.2f}") if t["ratio"] is not None else "–"
            key = "s" if t["key"] == "scaling" else t["key"]
            cpu_ratio = f"{t['cpu_ratio']:.2f}" if t.get("cpu_ratio") is not None else "–"
            figure = t["figure"].replace("|", "\\|")
            out.append(
                f"| {figure} | {fmt_value(key, t['ours'])} | {fmt_value(key, t['peer'])} | {ratio} | "
                f"{t['target']} | {'**met**' if t['met'] else '**NOT met**'} | {cpu_ratio} |"
            )
        met = [t["figure"] for t in targets if t["met"]]
        missed = [t["figure"] for t in targets if not t["met"]]
        out.append("")
        out.append(f"Met: {', '.join(met) if met else 'none'}.\n")
        out.append(f"Not met: {', '.join(missed) if missed else 'none'}.\n")
    scaling = results.get("scaling")
    if scaling:
        out.append("## Scaling: mount time against the number of members\n")
        out.append(
            f"Files of {scaling['file_size'][0]}–{scaling['file_size'][1]} bytes in "
            f"{scaling['folders']:,} folders (small files keep the archives small; mount times depend on "
            "the member count, not on the data size).\n"
        )
        out.append(
            "| tool | members | archive | first mount (s) | second mount (s, median) | all second mounts (s) "
            "| CPU s first / second mount | index | peak RSS first mount | checks |"
        )
        out.append("|---|---:|---:|---:|---:|---|---|---:|---:|---|")
        for r in scaling["rows"]:
            alls = ", ".join(f"{v:.3f}" for v in r.get("second_mount_all_s", []))
            out.append(
                f"| {r['tool']} | {r['files']:,} | {fmt_value('_bytes', r['tar_bytes'])} | "
                f"{fmt_value('s', r.get('first_mount_s'))} | {fmt_value('s', r.get('second_mount_s'))} | "
                f"{alls} | {fmt_value('s', r.get('first_mount_cpu_s'))} / "
                f"{fmt_value('s', r.get('second_mount_cpu_s'))} | {fmt_value('_bytes', r.get('index_bytes'))} | "
                f"{fmt_value('_kib', r.get('first_mount_peak_rss_kib'))} | "
                f"{'ok' if r['valid'] else 'FAILED: ' + '; '.join(r['errors'])} |"
            )
        out.append("")
    errors = [(name, e) for name, res in results["tools"].items() for e in res.get("errors", [])]
    if errors:
        out.append("## Errors and failed checks\n")
        for name, e in errors:
            out.append(f"- {name}: {e}")
        out.append("")
    out.append("## Method\n")
    out.append(METHOD)
    if notes:
        out.append("")
        out.append(notes.strip())
    return "\n".join(out) + "\n"


METHOD = """\
- **first mount**: the tool's index files are removed (ours and the peer both write
  `ARCHIVE.index.sqlite` beside the archive, so each tool gets its own hard link of the archive
  in its own folder under `benchmarks/work/run/`), then the wall time from starting the mount
  command until it has returned *and* `os.path.ismount` is true.
- **second mount**: the same with the index present: median of 5 mounts right after the first
  one (warm caches). **mount with index after drop_caches**: one more mount, right after the
  random reads dropped the page cache (interpreter, modules and index come from disk again).
- **find**: `find MOUNT -type f | wc -l` on a fresh mount (the count must equal the number of files).
- **stat all files after find**: right after that find, `os.stat` of every file path from Python
  (sizes and types are checked). **fresh mount**: `os.stat` of every file on a new mount
  without a find first (each path costs the kernel a LOOKUP).
- **random reads**: `echo 3 > /proc/sys/vm/drop_caches`, then open + read + close 1,000 random
  files (fixed seed) in the same mount session; every byte is compared with the expected content.
- **peak RSS**: `VmHWM` from `/proc/PID/status` of the daemon serving the mount, read just before
  unmounting the session that ran find, stat and the random reads. The daemon is found like
  `pgrep -f MOUNTPOINT` (a process whose command line names the mount point), narrowed to the one
  holding `/dev/fuse` open. **peak RSS during first mount** is the larger of that daemon's `VmHWM`
  right after the first mount and the `ru_maxrss` of the mount command itself (from `wait4`), so
  that an index built before daemonizing counts too.
- **CPU s**: user + system CPU seconds. For mounts: the mount command (`wait4` rusage) plus the
  daemon so far (`/proc/PID/stat`); for the other phases: the daemon during the phase. Steadier
  than wall times when other work shares the CPUs.
- **dir**: the archive extracted with GNU tar. Nothing to mount; `echo 2 > drop_caches` (dentries
  and inodes) before find and before the stat without find stands in for a fresh mount, `echo 3`
  before the random reads.
"""


# --------------------------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=100_000, help="number of files (default 100000)")
    p.add_argument("--folders", type=int, default=1000, help="number of folders (default 1000)")
    p.add_argument(
        "--file-size",
        type=parse_size_range,
        default=(1024, 4096),
        metavar="MIN-MAX",
        help="file size or range, e.g. 1KiB-4KiB (default) or 2048",
    )
    p.add_argument("--random-reads", type=int, default=1000, help="random files to read (default 1000)")
    p.add_argument(
        "--parallel-readers",
        type=int,
        default=8,
        help="processes reading random files at once, as a DataLoader's workers do (default 8; 0: skip)",
    )
    p.add_argument("--parallel-reads", type=int, default=4000, help="files they read in all (default 4000)")
    p.add_argument(
        "--tools", default="ours,peer,dir", help=f"comma-separated, from {','.join(ALL_TOOLS)} (default ours,peer,dir)"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every tool this many times, interleaved (the order turns each round); figures are "
        "the medians, and each target also shows its ratio in every round (default 1)",
    )
    p.add_argument("--seed", type=int, default=20240601)
    p.add_argument("--mount-repeats", type=int, default=5, help="second mounts to take the median of (default 5)")
    p.add_argument(
        "--phase-timeout", type=float, default=180, help="seconds before a measurement phase is given up (default 180)"
    )
    p.add_argument("--mount-timeout", type=float, default=1800, help="seconds a mount may take")
    p.add_argument(
        "--rss-limit-mib",
        type=float,
        default=8192,
        help="kill a mount daemon whose RSS exceeds this (MiB, default 8192)",
    )
    p.add_argument("--scaling", action="store_true", help="also measure second-mount time against member count")
    p.add_argument("--scaling-only", action="store_true", help="only the scaling measurement")
    p.add_argument("--scaling-sizes", default="10000,100000,1000000")
    p.add_argument("--scaling-tools", default="ours", help="tools for the scaling mode (default ours)")
    p.add_argument("--scaling-folders", type=int, default=1000)
    p.add_argument("--scaling-file-size", type=parse_size_range, default=(64, 512), metavar="MIN-MAX")
    p.add_argument("--ours-cmd", help="our ratarmount executable (default: see --ours-install)")
    p.add_argument(
        "--ours-install",
        choices=("venv", "editable"),
        default="venv",
        help="venv (default): pip-install this checkout into benchmarks/work/ours-venv, as a user "
        "would (the peer is a pip install too); editable: the ratarmount beside this python",
    )
    p.add_argument("--out", default=os.path.join(WORK, "results.json"), help="JSON results file")
    p.add_argument("--report", metavar="MARKDOWN", help="also write a Markdown report (e.g. docs/benchmarks.md)")
    p.add_argument("--notes", metavar="FILE", help="Markdown appended to the report (analysis, hot spots)")
    p.add_argument("--report-only", metavar="JSON", help="only render --report from an existing results JSON")
    p.add_argument("--keep-data", action="store_true", help="keep the 1M-member scaling archive")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60,
        help="before each measurement wait up to this many seconds for other processes to leave "
        "the CPUs idle (default 60; 0: do not wait)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=-10,
        help="niceness for the benchmark and the tools it starts (default -10 when root, so that "
        "other sessions' work on the same CPUs disturbs the timings less; 0: leave as is)",
    )
    p.add_argument(
        "--quiet-budget",
        type=float,
        default=300,
        help="total seconds a run may spend waiting for idle CPUs (default 300)",
    )
    p.add_argument(
        "--bytecode-as-is",
        action="store_true",
        help="run the tools with the environment's PYTHONDONTWRITEBYTECODE as it is (default: let "
        "Python cache byte code in benchmarks/work/pycache)",
    )
    args = p.parse_args(argv)
    args.tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    args.scaling_tools = [t.strip() for t in args.scaling_tools.split(",") if t.strip()]
    for t in args.tools + args.scaling_tools:
        if t not in TOOL_CLASSES:
            p.error(f"unknown tool {t!r}; choose from {', '.join(ALL_TOOLS)}")
    args.scaling_sizes = [int(s.replace("_", "")) for s in args.scaling_sizes.split(",") if s.strip()]
    args.mount_repeats = max(1, args.mount_repeats)
    args.rounds = max(1, args.rounds)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    notes = None
    if args.notes:
        with open(args.notes) as f:
            notes = f.read()
    if args.report_only:
        with open(args.report_only) as f:
            stored: Dict[str, Any] = json.load(f)
        stored["targets"] = evaluate_targets(stored)
        print_summary(stored)
        if args.report:
            write_report(args.report, markdown_report(stored, notes))
        return 0

    global BYTECODE_AS_IS, QUIET_BUDGET
    BYTECODE_AS_IS = args.bytecode_as_is
    QUIET_BUDGET = args.quiet_budget
    if args.nice:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, args.nice)
        except OSError as exc:
            log(f"cannot set niceness {args.nice} ({exc}); running at {os.getpriority(os.PRIO_PROCESS, 0)}")
    start = time.perf_counter()
    if not os.path.exists("/dev/fuse"):
        log("/dev/fuse is missing: cannot mount anything")
        return 2
    if not args.ours_cmd and args.ours_install == "venv" and "ours" in args.tools + args.scaling_tools:
        args.ours_cmd = os.path.join(install_ours(REPO, OURS_VENV), "ratarmount")
    results: Dict[str, Any] = {"machine": machine_info(), "tools": {}}
    results["ours_install"] = "command " + args.ours_cmd if args.ours_cmd else "editable"
    results["drop_caches_permitted"] = drop_caches(3)
    results["loadavg_start"] = open("/proc/loadavg").read().split()[:3]
    results["niceness"] = os.getpriority(os.PRIO_PROCESS, 0)
    results["bytecode_cached"] = not args.bytecode_as_is
    warm_up(sorted(set(args.tools + (args.scaling_tools if args.scaling or args.scaling_only else []))), args)
    if not args.scaling_only:
        ds = Dataset(args.files, args.folders, args.file_size, args.seed, f"files-{args.files}")
        log(f"data set: {ds.files:,} files in {ds.folders:,} folders, {ds.total_bytes() / 1024 / 1024:.0f} MiB")
        tar_s = ds.ensure_tar()
        dir_s = ds.ensure_dir()
        results["config"] = {
            **ds.params(),
            "random_reads": args.random_reads,
            "parallel_readers": args.parallel_readers,
            "parallel_reads": args.parallel_reads,
            "tools": args.tools,
            "mount_repeats": args.mount_repeats,
            "tar_bytes": os.path.getsize(ds.tar_path),
            "tar_build_s": tar_s,
            "extract_s": dir_s,
        }
        rounds: Dict[str, List[ToolResult]] = {name: [] for name in args.tools}
        for number in range(args.rounds):
            # Each round runs every tool once; the order turns round by round, so that no tool
            # always runs first (or right after another's page-cache use).
            order = args.tools[number % len(args.tools) :] + args.tools[: number % len(args.tools)]
            if args.rounds > 1:
                log(f"round {number + 1} of {args.rounds}: {', '.join(order)}")
            for name in order:
                tool = TOOL_CLASSES[name](ds, args)
                res = bench_tool(tool, ds, args)
                rounds[name].append(res)
                for e in res.errors:
                    log(f"  {name}: {e}")
                results["tools"][name] = median_result(rounds[name]).__dict__
                if args.rounds > 1:
                    results["rounds"] = [
                        {name: runs[i].__dict__ for name, runs in rounds.items() if i < len(runs)}
                        for i in range(number + 1)
                    ]
                write_json(args.out, results)
    else:
        results["config"] = {
            "files": 0,
            "folders": 0,
            "size_range": [0, 0],
            "seed": args.seed,
            "random_reads": 0,
            "tools": [],
            "mount_repeats": args.mount_repeats,
            "tar_bytes": 0,
        }
    if args.scaling or args.scaling_only:
        results["scaling"] = bench_scaling(args)
    results["elapsed_s"] = time.perf_counter() - start
    results["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    results["quiet_log"] = QUIET_LOG
    results["targets"] = evaluate_targets(results)
    write_json(args.out, results)
    print_summary(results)
    if args.report:
        write_report(args.report, markdown_report(results, notes))
        log(f"wrote {args.report}")
    log(f"wrote {args.out}; {results['elapsed_s'] / 60:.1f} min")
    return 0


#: Sections of the report written by other scripts (bench_compressed.py) sit between these
#: markers; regenerating the report here keeps them.
KEPT_SECTION_RE = r"<!-- section:(?P<name>[\w-]+):start -->.*?<!-- section:(?P=name):end -->\n?"


def write_report(path: str, text: str) -> None:
    """Write the report, carrying over the marked sections of the file it replaces."""
    import re

    kept: List[str] = []
    try:
        with open(path) as f:
            kept = [m.group(0) for m in re.finditer(KEPT_SECTION_RE, f.read(), flags=re.S)]
    except OSError:
        pass
    with open(path, "w") as f:
        f.write(text)
        for block in kept:
            f.write("\n" + block.rstrip("\n") + "\n")


def write_json(path: str, results: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=2, default=str)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
