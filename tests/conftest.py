"""Shared fixtures: real mounts in a subprocess, waited for and lazily unmounted."""

from __future__ import annotations

import contextlib
import io
import os
import pty
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

RATARMOUNT = [sys.executable, "-m", "ratarmount"]


def pytest_configure(config: pytest.Config) -> None:
    """A test run started in the background of a script (``cmd &``) inherits SIGINT ignored,
    and so does every command a test starts: the tests of Ctrl-C then saw no interruption
    (an ignored signal stays ignored across ``exec``; a handled one is reset to the default)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and (shutil.which("fusermount3") or shutil.which("fusermount")) is not None


requires_fuse = pytest.mark.skipif(not fuse_available(), reason="needs /dev/fuse and fusermount")


def read_tree(src: Any) -> Dict[str, bytes]:
    """Path -> content of every file of the ``MountSource`` ``src``."""
    found = {}
    for folder, _dirs, files in src.walk("/"):
        for name in files:
            path = folder.rstrip("/") + "/" + name
            found[path] = src.read(path)
    return found


def tar_bytes(files: Dict[str, bytes]) -> bytes:
    """A GNU tar of regular files (all with the same mtime), in memory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_600_000_000
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def stderr_on_terminal(command: Sequence[str], timeout: float = 120) -> Tuple[int, str]:
    """Run ``command`` with its stderr on a pseudo-terminal (progress bars show only there);
    its exit status and what it wrote there."""
    master, slave = pty.openpty()
    try:
        try:
            result = subprocess.run(list(command), stderr=slave, stdout=subprocess.PIPE, timeout=timeout)
        finally:
            os.close(slave)
        output = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: nothing left once the other side is closed
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(master)
    return result.returncode, output.decode(errors="replace")


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Indexes that go to ~/.cache/ratarmount (unions, read-only archive folders) stay out of
    the real home folder; tests that look at that folder set a HOME of their own."""
    home = tmp_path_factory.mktemp("home")
    previous = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        yield home
    finally:
        if previous is None:
            del os.environ["HOME"]
        else:
            os.environ["HOME"] = previous


@pytest.fixture(scope="session", autouse=True)
def hangup_as_at_a_terminal() -> Iterator[None]:
    """The tests that send SIGHUP expect its default action, as in a terminal. Under ``nohup``
    the suite and every process it starts inherit SIGHUP ignored, and ratarmount rightly keeps
    it so (``termination.sigterm_raises``): those tests then failed (session 36)."""
    previous = signal.getsignal(signal.SIGHUP)
    if previous == signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        if previous == signal.SIG_IGN:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)


def rot_between_samples(archive: Path) -> None:
    """Flip one byte of ``archive`` halfway between two of the blocks its index's fingerprint
    samples, keeping its size and mtime: bit rot after indexing that the index cannot notice."""
    from ratarmountcore.index.fingerprint import SAMPLE, SAMPLES

    raw = bytearray(archive.read_bytes())
    step = (len(raw) - SAMPLE) // (SAMPLES - 1)
    raw[step * (SAMPLES // 2) + SAMPLE + (step - SAMPLE) // 2] ^= 0x55
    mtime = archive.stat().st_mtime_ns
    archive.write_bytes(bytes(raw))
    os.utime(archive, ns=(mtime, mtime))


def run_ratarmount(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    return subprocess.run([*RATARMOUNT, *args], capture_output=True, text=True, timeout=timeout, **kwargs)


def lazy_unmount(mountpoint: Path) -> None:
    if os.path.ismount(mountpoint):
        tool = shutil.which("fusermount3") or shutil.which("fusermount")
        subprocess.run([tool or "umount", "-u", "-z", str(mountpoint)], capture_output=True)
        for _ in range(100):
            if not os.path.ismount(mountpoint):
                break
            time.sleep(0.05)


class Mounter:
    """Mounts with the real CLI (daemon mode) and cleans up whatever is left at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.mounts: List[Path] = []

    def mount(
        self, *sources: os.PathLike, extra: Optional[List[str]] = None, mountpoint: Optional[Path] = None
    ) -> Path:
        if mountpoint is None:
            mountpoint = self.tmp_path / f"mnt{len(self.mounts)}"
            mountpoint.mkdir()
        result = run_ratarmount(*(extra or []), *map(str, sources), str(mountpoint))
        assert result.returncode == 0, f"mount failed: {result.stderr}"
        assert os.path.ismount(mountpoint), "ratarmount returned before the mount was ready"
        self.mounts.append(mountpoint)
        return mountpoint

    def unmount(self, mountpoint: Path) -> None:
        result = run_ratarmount("-u", str(mountpoint))
        assert result.returncode == 0, result.stderr
        assert not os.path.ismount(mountpoint)

    def cleanup(self) -> None:
        for mountpoint in self.mounts:
            lazy_unmount(mountpoint)


@pytest.fixture
def mounter(tmp_path: Path) -> Iterator[Mounter]:
    if not fuse_available():
        pytest.skip("needs /dev/fuse and fusermount")
    m = Mounter(tmp_path)
    try:
        yield m
    finally:
        m.cleanup()


def timed_fork() -> float:
    """Fork a child that exits at once and wait for it; how long the fork itself took (its
    hooks included: ratarmountcore's wait for index queries and decoders in use)."""
    begin = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    waited = time.monotonic() - begin
    os.waitpid(pid, 0)
    return waited


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of its own, to fill up (mounting one needs root, as in CI)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {made.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)]).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], check=True)
            pytest.fail(f"{disk} was busy at the end: a file on it was left open")


def fill_disk(disk: Path, leave: int) -> None:
    """Fill ``disk`` with a file named ``filler`` until only ``leave`` bytes are free."""
    st = os.statvfs(disk)
    (disk / "filler").write_bytes(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))


@contextlib.contextmanager
def no_descriptor_left() -> Iterator[None]:
    """This process at its open-file limit (a soft limit a little above what is open, every
    descriptor up to it taken) for the duration; all given back afterwards."""
    import errno
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: List[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(len(os.listdir("/proc/self/fd")) + 16, 64), hard))
    try:
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
