"""The command line as a user meets it: mounting, unmounting, bad input, signals, index places."""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import pytest
from conftest import RATARMOUNT, Mounter, lazy_unmount, requires_fuse, run_ratarmount, stderr_on_terminal, tar_bytes

from ratarmountcore.errors import RatarmountError


def make_tar(path: Path, files: Dict[str, bytes]) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


FILES = {f"folder{i % 3}/file{i}.txt": f"content {i}\n".encode() * (i + 1) for i in range(20)}


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    return make_tar(tmp_path / "data.tar", FILES)


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep ~/.cache/ratarmount inside the test's folder."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def leftovers(*folders: Path) -> list:
    found = []
    for folder in folders:
        for root, _dirs, files in os.walk(folder):
            found += [os.path.join(root, f) for f in files if ".index.sqlite" in f]
    return found


def test_output_to_a_reader_that_stopped_reading_ends_quietly() -> None:
    """``ratarmount --version | head -1``: the pipe's reader is gone before we write; no
    traceback, no error message, the exit status a tool killed by SIGPIPE has."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([*RATARMOUNT, "--version"], stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 128 + signal.SIGPIPE


def test_version_lists_backends() -> None:
    result = run_ratarmount("--version")
    assert result.returncode == 0
    assert "fuse front-end: " in result.stdout
    for name in (
        "ratarmount",
        "mfusepy",
        "libfuse",
        "sqlite",
        "rapidgzip",
        "indexed_gzip",
        "zstandard",
        "python-xz",
        "crc32c",
    ):
        assert name in result.stdout


def test_without_libfuse_version_still_works_and_mount_fails_before_indexing(archive: Path, tmp_path: Path) -> None:
    """A node without libfuse: --version says so (exit 0); a mount is refused with one line
    before any index is built."""
    env = {**os.environ, "FUSE_LIBRARY_PATH": str(tmp_path / "no-such-libfuse.so")}
    result = run_ratarmount("--version", env=env)
    assert result.returncode == 0, result.stderr
    assert "fuse front-end: none: libfuse not found" in result.stdout
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = run_ratarmount(str(archive), str(mountpoint), env=env)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "libfuse not found" in lines[0] and "fuse3" in lines[0]
    assert leftovers(tmp_path) == [] and not os.path.ismount(mountpoint)


@requires_fuse
def test_mount_list_read_unmount(mounter: Mounter, archive: Path) -> None:
    mnt = mounter.mount(archive)
    assert sorted(os.listdir(mnt)) == ["folder0", "folder1", "folder2"]
    for name, data in FILES.items():
        assert (mnt / name).read_bytes() == data
        assert os.stat(mnt / name).st_mtime == 1_700_000_000
    assert (archive.parent / "data.tar.index.sqlite").exists()
    mounter.unmount(mnt)


@requires_fuse
def test_writes_fail_with_erofs(mounter: Mounter, archive: Path) -> None:
    mnt = mounter.mount(archive)
    for action in (
        lambda: open(mnt / "new", "w"),
        lambda: open(mnt / "folder0/file0.txt", "r+b"),
        lambda: os.mkdir(mnt / "newdir"),
        lambda: os.unlink(mnt / "folder0/file0.txt"),
        lambda: os.rename(mnt / "folder0", mnt / "x"),
        lambda: os.chmod(mnt / "folder0/file0.txt", 0o777),
        lambda: os.symlink("a", mnt / "s"),
    ):
        with pytest.raises(OSError) as info:
            action()
        assert info.value.errno == 30  # EROFS


@requires_fuse
def test_second_mount_reuses_index(mounter: Mounter, archive: Path) -> None:
    mnt = mounter.mount(archive)
    index = archive.parent / "data.tar.index.sqlite"
    first = index.stat().st_mtime_ns
    mounter.unmount(mnt)
    mnt = mounter.mount(archive, mountpoint=mnt)
    assert index.stat().st_mtime_ns == first
    assert (mnt / "folder1/file1.txt").read_bytes() == FILES["folder1/file1.txt"]


def test_changed_archive_is_reindexed_with_message(tmp_path: Path, archive: Path) -> None:
    import ratarmountcore

    with ratarmountcore.open(str(archive)) as src:
        assert src.read("/folder0/file0.txt") == FILES["folder0/file0.txt"]
    make_tar(archive, {"other.txt": b"new"})
    env = dict(os.environ)
    code = (
        "import ratarmountcore, logging, sys; logging.basicConfig();"
        f"s = ratarmountcore.open({str(archive)!r}); sys.stdout.write(repr(s.listdir('/')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.stdout == "['other.txt']"
    assert "does not match the archive" in result.stderr


def test_index_in_cache_when_archive_folder_not_writable(tmp_path: Path, private_home: Path, archive: Path) -> None:
    import ratarmountcore
    from ratarmountcore.options import IndexOptions, OpenOptions

    # A folder we cannot write to even as root: a read-only bind is not available everywhere, so
    # name an impossible first candidate instead and check the fallback order.
    (private_home / "c").mkdir()
    options = OpenOptions(index=IndexOptions(index_folders=("/proc", str(private_home / "c"))))
    with ratarmountcore.open(str(archive), options) as src:
        assert src.listdir("/") == ["folder0", "folder1", "folder2"]
        assert src.index_path.startswith(str(private_home / "c"))  # type: ignore[attr-defined]
    assert not (archive.parent / "data.tar.index.sqlite").exists()


@requires_fuse
def test_index_beside_read_only_archive_goes_to_home_cache(
    mounter: Mounter, tmp_path: Path, private_home: Path
) -> None:
    """An archive inside a read-only mount gets its index in ~/.cache/ratarmount."""
    outer = make_tar(tmp_path / "outer.tar", {})
    inner_dir = tmp_path / "inner"
    inner_dir.mkdir()
    inner = make_tar(inner_dir / "inner.tar", {"x.txt": b"x"})
    with tarfile.open(outer, "w") as tar:
        tar.add(inner, arcname="inner.tar")
    mnt = mounter.mount(outer)
    mnt2 = mounter.mount(mnt / "inner.tar")
    assert (mnt2 / "x.txt").read_bytes() == b"x"
    cached = list((private_home / ".cache" / "ratarmount").glob("inner.tar.*.index.sqlite"))
    assert len(cached) == 1


@requires_fuse
@pytest.mark.parametrize("foreground", [False, True])
def test_a_lone_archive_is_mounted_at_its_name(tmp_path: Path, foreground: bool) -> None:
    """`ratarmount data.tar.gz` mounts at `data/` beside it, made for the mount and removed once
    it is unmounted (daemon) or ends (foreground)."""
    archive = tmp_path / "data.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in FILES.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    target = tmp_path / "data"
    if not foreground:
        result = run_ratarmount(str(archive))
        try:
            assert result.returncode == 0, result.stderr
            assert "created the mount point" in result.stderr and str(target) in result.stderr
            assert os.path.ismount(target)
            assert (target / "folder1" / "file4.txt").read_bytes() == FILES["folder1/file4.txt"]
            assert run_ratarmount("-u", str(target)).returncode == 0
        finally:
            lazy_unmount(target)
    else:
        process = subprocess.Popen([*RATARMOUNT, "-f", str(archive)], stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(200):
                if os.path.ismount(target):
                    break
                time.sleep(0.05)
            assert os.path.ismount(target)
            assert (target / "folder2" / "file5.txt").read_bytes() == FILES["folder2/file5.txt"]
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=30) == 0
        finally:
            lazy_unmount(target)
            process.kill()
    for _ in range(100):  # the daemon removes it right after its loop ends
        if not target.exists():
            break
        time.sleep(0.05)
    assert not target.exists()


def test_a_lone_archive_that_fails_leaves_no_folder(tmp_path: Path) -> None:
    bad = tmp_path / "broken.tar"
    bad.write_bytes(b"this is not a tar archive" * 100)
    result = run_ratarmount(str(bad))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.tar", "home"]
    plain = tmp_path / "README"
    plain.write_bytes(b"x")
    result = run_ratarmount(str(plain))
    assert result.returncode == 2 and "name a MOUNTPOINT" in result.stderr
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "keep.txt").write_text("mine")
    result = run_ratarmount(str(bad))
    assert result.returncode != 0 and (tmp_path / "broken" / "keep.txt").read_text() == "mine"


@requires_fuse
def test_index_file_and_index_folders_options(mounter: Mounter, tmp_path: Path, archive: Path) -> None:
    index = tmp_path / "elsewhere" / "my.index"
    (tmp_path / "elsewhere").mkdir()
    mnt = mounter.mount(archive, extra=["--index-file", str(index)])
    assert index.exists() and not (archive.parent / "data.tar.index.sqlite").exists()
    mounter.unmount(mnt)
    folder = tmp_path / "indexes"
    folder.mkdir()
    mnt = mounter.mount(archive, extra=["--index-folders", str(folder)], mountpoint=mnt)
    assert len(list(folder.glob("data.tar.*.index.sqlite"))) == 1


def test_built_index_opens_without_write_access(tmp_path: Path, archive: Path) -> None:
    import ratarmountcore

    ratarmountcore.open(str(archive)).close()
    index = archive.parent / "data.tar.index.sqlite"
    os.chmod(index, 0o444)
    os.chmod(archive.parent, 0o555)
    try:
        # A locking-free open: even with SQLite's locking disabled at the VFS level, reading works.
        conn = sqlite3.connect(f"file:{index}?mode=ro&immutable=1", uri=True)
        assert conn.execute("SELECT COUNT(*) FROM files").fetchone()[0] >= 20
        conn.close()
        with ratarmountcore.open(str(archive)) as src:
            assert src.read("/folder2/file2.txt") == FILES["folder2/file2.txt"]
        assert sorted(os.listdir(archive.parent)) == sorted(["data.tar", "data.tar.index.sqlite", "home"])
    finally:
        os.chmod(archive.parent, 0o755)


# --- bad input ---------------------------------------------------------------------------------


def corrupt_header(path: Path) -> Path:
    data = bytearray(make_tar(path, FILES).read_bytes())
    data[1024 + 10] ^= 0xFF  # inside the name field of the second member's header
    path.write_bytes(bytes(data))
    return path


BAD_INPUTS = {
    "not_a_tar": (lambda p: (p.write_bytes(b"hello world, this is not an archive\n" * 40), p)[1], "not a tar archive"),
    "empty": (lambda p: (p.write_bytes(b""), p)[1], "empty"),
    "truncated": (lambda p: (p.write_bytes(make_tar(p, FILES).read_bytes()[:3000]), p)[1], "ends inside"),
    "shorter_than_a_header": (lambda p: (p.write_bytes(b"hello\n"), p)[1], "not a tar archive (6 bytes"),
    "cut_in_first_header": (
        lambda p: (p.write_bytes(make_tar(p, FILES).read_bytes()[:300]), p)[1],
        "ends inside a header",
    ),
    "corrupt_checksum": (corrupt_header, "checksum"),
    "missing": (lambda p: p, "no such file"),
    # (A loop of links was said to be missing.)
    "link_loop": (lambda p: (os.symlink(p.name, p), p)[1], "too many levels of symbolic links"),
    # (A folder is a source, not bad input: tests/test_directory_source.py.)
    # Opening a FIFO for reading waits for a writer: the mount must refuse it, not hang.
    "fifo": (lambda p: (os.mkfifo(p), p)[1], "not a regular file"),
}


@requires_fuse
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gives_one_line_error(tmp_path: Path, private_home: Path, case: str) -> None:
    make, cause = BAD_INPUTS[case]
    work = tmp_path / "work"
    work.mkdir()
    path = make(work / "bad.tar")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = run_ratarmount(str(path), str(mnt), timeout=60)
    finally:
        lazy_unmount(mnt)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert str(path) in lines[0] and cause in lines[0].lower(), lines[0]
    assert not os.path.ismount(mnt)
    assert leftovers(work, private_home) == []
    assert [p.name for p in work.iterdir()] == ([] if case == "missing" else ["bad.tar"])
    assert case != "link_loop" or os.readlink(path) == "bad.tar"


@pytest.mark.skipif(os.getuid() != 0, reason="drops privileges to make the archive unreadable")
def test_unreadable_archive(tmp_path: Path, archive: Path) -> None:
    """Root reads everything, so the CLI runs in a forked child that became 'nobody'."""
    import shutil
    import tempfile

    public = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path is private to root
    try:
        _check_unreadable(public, archive)
    finally:
        shutil.rmtree(public)


def _check_unreadable(public: Path, original: Path) -> None:
    public.chmod(0o777)
    archive = public / "data.tar"
    archive.write_bytes(original.read_bytes())
    os.chmod(archive, 0)
    mnt = public / "mnt"
    mnt.mkdir()
    status, text = _main_as_nobody(public, ["-f", str(archive), str(mnt)])
    assert status == 1, text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1
    assert "permission denied" in text.lower() and str(archive) in text


def _main_as_nobody(public: Path, argv: List[str]) -> Tuple[int, str]:
    """``ratarmount.cli.main(argv)`` in a forked child that became 'nobody': its exit status and
    what it wrote to stderr (kept in ``public``, which 'nobody' can write)."""
    err = public / "stderr.txt"
    # The interpreter's own files may be unreadable for 'nobody': import everything first.
    import importlib

    for module in (
        "ratarmount.cli",
        "ratarmount.fuse_ops",
        "ratarmount.lowlevel",
        "ratarmount.mount",
        "ratarmountcore.compression.registry",
        "ratarmountcore.sources.factory",
        "traceback",
    ):
        importlib.import_module(module)

    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            fd = os.open(err, os.O_WRONLY | os.O_CREAT, 0o666)
            os.dup2(fd, 2)
            sys.stderr = open(2, "w", closefd=False)
            os.setgid(65534)
            os.setuid(65534)
            from ratarmount.cli import main

            code = main(argv)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err.read_text()


def test_missing_fuse_device_is_named(tmp_path: Path) -> None:
    from ratarmount.mount import check_fuse_device

    missing = tmp_path / "fuse"
    with pytest.raises(RatarmountError) as info:
        check_fuse_device({}, str(missing))
    message = str(info.value)
    assert "no FUSE device" in message and str(missing) in message and "ratarmountcore.open" in message
    check_fuse_device({"auto_unmount": True}, str(missing))  # (fusermount3 opens it then, as root)


@pytest.mark.skipif(os.getuid() != 0, reason="drops privileges to be a user the FUSE device refuses")
@pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or os.stat("/dev/fuse").st_mode & 0o006 == 0o006,
    reason="every user may open /dev/fuse here",
)
def test_user_without_fuse_is_told_before_an_index_is_built(archive: Path) -> None:
    """A node where only some users may open /dev/fuse (mode 0600 here): the mount fails at once
    with the cause, and no index is built for it (the archive's folder is writable)."""
    import shutil
    import tempfile

    public = Path(tempfile.mkdtemp(dir="/tmp"))  # pytest's tmp_path is private to root
    try:
        public.chmod(0o777)
        copy = public / "data.tar"
        copy.write_bytes(archive.read_bytes())
        mnt = public / "mnt"
        mnt.mkdir()
        mnt.chmod(0o777)
        status, text = _main_as_nobody(public, [str(copy), str(mnt)])
        assert status == 1, text
        lines = text.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in text, text
        assert "/dev/fuse: permission denied" in lines[0] and "ratarmountcore.open" in lines[0]
        assert sorted(p.name for p in public.iterdir()) == ["data.tar", "mnt", "stderr.txt"]
        assert not os.path.ismount(mnt)
    finally:
        shutil.rmtree(public)


@requires_fuse
def test_debug_shows_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"x" * 1024)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_ratarmount("-d", str(bad), str(mnt))
    assert result.returncode != 0 and "Traceback" in result.stderr


@pytest.mark.parametrize("problem", ["missing", "not_empty", "file", "already_mounted"])
def test_bad_mountpoint(mounter: Mounter, tmp_path: Path, archive: Path, problem: str) -> None:
    mnt = tmp_path / "mp"
    if problem == "not_empty":
        mnt.mkdir()
        (mnt / "x").write_text("x")
    elif problem == "file":
        mnt.write_text("x")
    elif problem == "already_mounted":
        mnt.mkdir()
        mounter.mount(archive, mountpoint=mnt)
    result = run_ratarmount(str(archive), str(mnt))
    assert result.returncode != 0
    words = {
        "missing": "does not exist",
        "not_empty": "not empty",
        "file": "not a directory",
        "already_mounted": "already a mount point",
    }
    assert words[problem] in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def daemon_of(mountpoint: Path) -> int:
    """The pid of the mount daemon serving ``mountpoint`` (from /proc)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if os.fsencode(mountpoint) in args and any(b"ratarmount" in a for a in args):
                return int(entry)
    raise AssertionError(f"no daemon found for {mountpoint}")


def child_of(pid: int) -> int:
    """A child process of ``pid`` (from /proc: pgrep is not on every machine)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat_line = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat_line.rpartition(")")[2].split()[1]) == pid:
                return int(entry)
    raise AssertionError(f"no child of {pid}")


def kill_daemon(mountpoint: Path) -> None:
    """SIGKILL to the mount's daemon, then wait until the kernel says so (ENOTCONN)."""
    os.kill(daemon_of(mountpoint), signal.SIGKILL)
    for _ in range(100):
        try:
            os.listdir(mountpoint)
        except OSError:
            return
        time.sleep(0.02)


@requires_fuse
def test_mount_point_left_by_a_killed_daemon_is_named_as_such(mounter: Mounter, archive: Path) -> None:
    mnt = mounter.mount(archive)
    kill_daemon(mnt)
    result = run_ratarmount(str(archive), str(mnt))
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "process has ended" in result.stderr and f"ratarmount -u {mnt}" in result.stderr
    mounter.unmount(mnt)


@requires_fuse
def test_unmount_of_a_dead_mount_in_use_says_its_process_ended(mounter: Mounter, archive: Path) -> None:
    """A busy mount whose daemon was killed: ``-u`` said only "busy (in use by ...)", while the
    mount point can never be used again until it is detached (found by fuzzing)."""
    mnt = mounter.mount(archive)
    holder = subprocess.Popen(["sleep", "60"], cwd=mnt)
    try:
        kill_daemon(mnt)
        result = run_ratarmount("-u", str(mnt))
        assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert f"in use by {holder.pid} (" in result.stderr
        assert "its process has ended" in result.stderr and f"fusermount3 -u -z {mnt}" in result.stderr
    finally:
        holder.kill()
        holder.wait()
        lazy_unmount(mnt)


def test_unmount_of_non_mount_fails(tmp_path: Path) -> None:
    result = run_ratarmount("-u", str(tmp_path))
    assert result.returncode != 0 and "not a mount point" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs and a bind mount needs root")
@pytest.mark.parametrize("kind", ["tmpfs", "bind"])
def test_unmount_leaves_other_file_systems_mounted(tmp_path: Path, kind: str) -> None:
    """``-u`` of a tmpfs or a bind mount: as root, the ``umount`` fallback after fusermount took
    away any file system (found by a review of bad input); a bind mount of a folder on the same
    file system was called "not a mount point" (``os.path.ismount``)."""
    point = tmp_path / "point"
    point.mkdir()
    if kind == "tmpfs":
        command = ["mount", "-t", "tmpfs", "none", str(point)]
    else:
        (tmp_path / "src").mkdir()
        command = ["mount", "--bind", str(tmp_path / "src"), str(point)]
    if subprocess.run(command, capture_output=True).returncode != 0:
        pytest.skip(f"cannot {' '.join(command[:3])} here")
    try:
        result = run_ratarmount("-u", str(point))
        assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert f"{point} is not a ratarmount mount (" in result.stderr and "left mounted" in result.stderr
        with open("/proc/self/mountinfo") as f:
            assert f" {point} " in f.read()
    finally:
        subprocess.run(["umount", str(point)], check=False)


@requires_fuse
def test_unmount_waits_a_moment_while_the_mount_is_busy(mounter: Mounter, archive: Path) -> None:
    """``-u`` of a mount in use for a moment (the mount lists folders through its mount point for
    runs of lookups) succeeds once it is free; one in use for good fails with one line."""
    mnt = mounter.mount(archive)
    held = open(mnt / "folder0" / "file0.txt", "rb")  # noqa: SIM115 - closed by the timer
    timer = threading.Timer(0.5, held.close)
    timer.start()
    try:
        result = run_ratarmount("-u", str(mnt))
    finally:
        timer.join()
    assert result.returncode == 0, result.stderr
    assert not os.path.ismount(mnt)
    mnt = mounter.mount(archive)
    with open(mnt / "folder0" / "file0.txt", "rb"):
        started = time.monotonic()
        result = run_ratarmount("-u", str(mnt))
        assert time.monotonic() - started >= 1.5
    assert result.returncode != 0 and "busy" in result.stderr.lower()
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert f"in use by {os.getpid()} (" in result.stderr  # who holds it: this test's process
    mounter.unmount(mnt)


def test_lazy_without_recursion_is_a_usage_error(tmp_path: Path) -> None:
    result = run_ratarmount("--lazy", str(tmp_path), str(tmp_path / "mnt"))
    assert result.returncode == 2 and "--lazy works with -r" in result.stderr


def test_usage_error() -> None:
    result = run_ratarmount("only-one-argument")
    assert result.returncode == 2 and "MOUNTPOINT" in result.stderr


@requires_fuse
@pytest.mark.parametrize(
    "sig,twice", [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGINT, True)]
)
def test_foreground_signal_unmounts_cleanly(tmp_path: Path, archive: Path, sig: int, twice: bool) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.Popen([*RATARMOUNT, "-f", str(archive), str(mnt)], stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(200):
            if os.path.ismount(mnt):
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        assert os.path.ismount(mnt)
        assert (mnt / "folder0/file0.txt").read_bytes() == FILES["folder0/file0.txt"]
        with open(mnt / "folder0/file0.txt", "rb"):  # (in use: the unmount is lazy)
            proc.send_signal(sig)
            if twice:  # (a second Ctrl-C as the mount ends must not cut its end short)
                proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=30)
        assert code == 0, proc.stderr.read() if proc.stderr else ""
        assert not os.path.ismount(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
        lazy_unmount(mnt)


@requires_fuse
def test_statfs_and_fuse_options(mounter: Mounter, archive: Path) -> None:
    mnt = mounter.mount(archive, extra=["-o", "allow_other"])
    st = os.statvfs(mnt)
    assert st.f_files == len(FILES) + 3  # files plus the three implicit folders
    assert st.f_flag & os.ST_RDONLY
    with open("/proc/self/mountinfo") as f:
        line = next(line for line in f if f" {mnt} " in line)
    assert "allow_other" in line


@requires_fuse
def test_a_name_longer_than_255_bytes_that_is_not_there_is_enametoolong(mounter: Mounter, tmp_path: Path) -> None:
    """As on a disk (ENOENT said such a name could exist); a member with a name that long (pax
    allows it) is still found."""
    import errno

    long_member = "m" * 300
    archive = make_tar(tmp_path / "long.tar", {long_member: b"long", "d/f": b"x"})
    mnt = mounter.mount(archive)
    for missing in (mnt / ("n" * 256), mnt / "d" / ("n" * 300)):
        with pytest.raises(OSError) as caught:
            os.stat(missing)
        assert caught.value.errno == errno.ENAMETOOLONG
    with pytest.raises(FileNotFoundError):
        os.stat(mnt / ("n" * 255))
    assert (mnt / long_member).read_bytes() == b"long"
    assert sorted(os.listdir(mnt)) == ["d", long_member]


@requires_fuse
def test_progress_bar_on_a_terminal(tmp_path: Path, private_home: Path) -> None:
    archive = make_tar(tmp_path / "many.tar", {f"d{i % 10}/f{i}": b"x" for i in range(3000)})
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        code, text = stderr_on_terminal([*RATARMOUNT, str(archive), str(mnt)])
    finally:
        lazy_unmount(mnt)
    assert code == 0
    assert "Indexing" in text and "%" in text and "members" in text, text


def test_no_progress_bar_when_not_a_terminal(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "many.tar", {f"f{i}": b"x" for i in range(2000)})
    code = f"import ratarmountcore; ratarmountcore.open({str(archive)!r}).close()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stderr == ""


@requires_fuse
def test_relative_paths(mounter: Mounter, tmp_path: Path, archive: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """libfuse changes to "/" once running: relative archive and mount point paths still work."""
    (tmp_path / "rel").mkdir()
    result = subprocess.run([*RATARMOUNT, archive.name, "rel"], cwd=tmp_path, capture_output=True, text=True)
    mounter.mounts.append(tmp_path / "rel")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "rel/folder1/file4.txt").read_bytes() == FILES["folder1/file4.txt"]


@requires_fuse
def test_mount_that_libfuse_rejects_after_init_fails(tmp_path: Path, archive: Path) -> None:
    """libfuse may still give up after calling init (here: a max_read it cannot honour); the
    command must then fail with libfuse's message instead of reporting a mount that is gone."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        result = run_ratarmount("-o", "max_read=1048576", str(archive), str(mnt))
    finally:
        lazy_unmount(mnt)
    from ratarmount.fuse_compat import libfuse_version

    if not libfuse_version().startswith("3"):
        pytest.skip("libfuse 2 accepts this option")
    assert result.returncode == 1
    assert "maximum read size" in result.stderr and "Traceback" not in result.stderr
    assert not os.path.ismount(mnt)


def _read_ahead_kib(mountpoint: Path) -> int:
    device = os.stat(mountpoint).st_dev
    with open(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb") as f:
        return int(f.read())


@requires_fuse
def test_read_ahead_is_raised_when_permitted(mounter: Mounter, archive: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root may change a mount's read-ahead")
    default = mounter.mount(archive, extra=["--read-ahead", "0"])
    raised = mounter.mount(archive, extra=["--read-ahead", "2048"])
    assert _read_ahead_kib(raised) == 2048  # set before the mount command returned
    assert _read_ahead_kib(default) != 2048
    name = next(iter(FILES))
    assert (raised / name).read_bytes() == (default / name).read_bytes() == FILES[name]


def _kernel_at_least(major: int, minor: int) -> bool:
    parts = os.uname().release.split(".")
    try:
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (IndexError, ValueError):
        return False


def _requests_during(
    tmp_path: Path, archive: Path, action: Callable[[Path], None], extra: Sequence[str] = ()
) -> List[str]:
    """The opcodes of the FUSE requests a foreground mount received (libfuse's debug log) while
    ``action(mountpoint)`` ran."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "fuse.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([*RATARMOUNT, *extra, "-f", "-d", "-d", str(archive), str(mnt)], stderr=err)
    try:
        for _ in range(200):
            if os.path.ismount(mnt):
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        action(mnt)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        lazy_unmount(mnt)
    return [
        line.split("opcode: ")[1].split(" ")[0].rstrip(",")
        for line in log.read_text().splitlines()
        if "opcode: " in line
    ]


@requires_fuse
def test_files_are_read_without_open_and_release_round_trips(tmp_path: Path, archive: Path) -> None:
    """After the first OPEN (answered ENOSYS), the kernel opens files without asking us and reads
    come by path; the bytes must be the same, and no RELEASE is ever sent. (Plain ``os.open``:
    Python's ``open()`` asks isatty, whose answer puts small files into the page cache, and
    their READs never come; test_store_on_open.py.)"""
    if not _kernel_at_least(5, 10):
        pytest.skip("zero-message opens need a newer kernel")

    def read_twice(mnt: Path) -> None:
        for name, data in FILES.items():
            for offset in (0, len(data) // 2):  # again, and at an offset
                fd = os.open(mnt / name, os.O_RDONLY)
                try:
                    assert os.pread(fd, len(data) + 1, offset) == data[offset:]
                finally:
                    os.close(fd)

    opcodes = _requests_during(tmp_path, archive, read_twice)
    assert opcodes.count("READ") >= len(FILES)
    assert opcodes.count("OPEN") == 1 and opcodes.count("RELEASE") == 0, sorted(set(opcodes))


@requires_fuse
@pytest.mark.parametrize("api", ["low", "high"])
def test_stat_after_listing_a_large_folder_asks_nothing(tmp_path: Path, api: str) -> None:
    """`ls -l` of an ImageNet-sized folder must not send a LOOKUP per entry: the listing names
    the files without attributes (see test_find_links_no_inode_per_file), the first lookups
    make a run, and the folder is listed again with every entry's attributes on every page (not
    only the first one, as in the kernel's READDIRPLUS auto mode)."""
    names = [f"n{index:05d}_{'x' * 40}.JPEG" for index in range(1500)]  # ~8 pages of 32 KiB
    archive = tmp_path / "large-folder.tar"
    archive.write_bytes(tar_bytes({f"folder/{name}": name.encode() for name in names}))

    def list_then_stat(mnt: Path) -> None:
        listed = os.listdir(mnt / "folder")
        assert sorted(listed) == names
        for name in listed:
            assert os.lstat(mnt / "folder" / name).st_size == len(name)

    opcodes = _requests_during(tmp_path, archive, list_then_stat, ["--fuse-api", api])
    assert opcodes.count("READDIRPLUS") >= 2 and opcodes.count("LOOKUP") <= 3, sorted(set(opcodes))


@requires_fuse
@pytest.mark.parametrize("kind", ["archive", "folder"])
def test_find_links_no_inode_per_file(tmp_path: Path, kind: str) -> None:
    """A listing names files with their inode numbers and types but without attributes (the
    kernel links no inode for them: `find` over a million files costs the kernel no million
    inodes), so the first stat of a listed file is a LOOKUP; folders come with theirs. The same
    in an archive inside a folder source (``-r``; listings opened with OPENDIR there)."""
    names = [f"f{index:03d}" for index in range(50)]
    data = tmp_path / "data"
    data.mkdir()
    archive = data / "find.tar"
    archive.write_bytes(tar_bytes({**{f"folder/{name}": name.encode() for name in names}, "folder/sub/x": b"x"}))
    seen: Dict[str, Tuple[int, bool]] = {}

    def list_then_stat_one(mnt: Path) -> None:
        folder = mnt / "folder" if kind == "archive" else mnt / "find.tar" / "folder"
        os.lstat(folder)
        with os.scandir(folder) as entries:
            for entry in entries:
                seen[entry.name] = (entry.inode(), entry.is_file(follow_symlinks=False))
        found = os.lstat(folder / "f007")
        assert (found.st_ino, found.st_size) == (seen["f007"][0], 4)
        os.lstat(folder / "sub")

    if kind == "archive":
        opcodes = _requests_during(tmp_path, archive, list_then_stat_one)
        before = 1  # the folder
    else:
        opcodes = _requests_during(tmp_path, data, list_then_stat_one, ["-r"])
        before = 2  # find.tar, its folder
    assert sorted(seen) == sorted([*names, "sub"]) and seen["sub"][1] is False
    assert all(seen[name][1] for name in names)
    assert opcodes.count("LOOKUP") == before + 1, opcodes  # then the file; not the subfolder


@requires_fuse
def test_a_walk_that_stats_what_it_lists_gets_attributes_with_the_listings(tmp_path: Path) -> None:
    """Once files named without attributes were looked up in a run (a walk that stats every
    file: `du`, `ls -lR`, `os.walk` + `stat`), the following listings carry the attributes:
    the stats in the folders listed after that ask the daemon nothing."""
    folders = [f"d{index}" for index in range(4)]
    archive = tmp_path / "walk.tar"
    members = {f"{folder}/f{index:03d}": b"x" * index for folder in folders for index in range(60)}
    archive.write_bytes(tar_bytes(members))

    def walk_and_stat(mnt: Path) -> None:
        for folder in folders:
            for name in os.listdir(mnt / folder):
                assert os.lstat(mnt / folder / name).st_size == int(name[1:])

    opcodes = _requests_during(tmp_path, archive, walk_and_stat)
    # each folder's own LOOKUP, up to 3 for the first folder's files, none for the others' files
    assert opcodes.count("LOOKUP") <= len(folders) + 3, opcodes


@requires_fuse
def test_folders_are_listed_without_opendir_round_trips(tmp_path: Path, archive: Path) -> None:
    """After the first OPENDIR (answered ENOSYS), the kernel lists folders by node id without
    opening them; listings stay complete and cached."""
    if not _kernel_at_least(5, 10):
        pytest.skip("listing without OPENDIR needs a newer kernel")

    def list_twice(mnt: Path) -> None:
        for _ in range(2):
            for folder in (".", "folder0", "folder1", "folder2"):
                expected = sorted({name.split("/")[1] for name in FILES if name.startswith(folder + "/")})
                if folder == ".":
                    expected = ["folder0", "folder1", "folder2"]
                assert sorted(os.listdir(mnt / folder)) == expected

    opcodes = _requests_during(tmp_path, archive, list_twice)
    assert opcodes.count("OPENDIR") == 1 and opcodes.count("RELEASEDIR") == 0, sorted(set(opcodes))
    assert opcodes.count("READDIRPLUS") <= 2 * 4  # a page and the empty one per folder, once


@requires_fuse
def test_a_run_of_lookups_in_a_folder_is_answered_by_the_kernel(tmp_path: Path) -> None:
    """Stat-ing every file of a folder without listing it (paths from a manifest): the mount
    lists the folder for the kernel once the lookups come in a run, so most of them never
    reach the daemon; every answer stays right."""
    names = [f"img_{index:05d}.JPEG" for index in range(1000)]
    archive = tmp_path / "manifest.tar"
    archive.write_bytes(
        tar_bytes({f"class/{name}": name.encode() * (1 + index % 3) for index, name in enumerate(names)})
    )

    def stat_from_manifest(mnt: Path) -> None:
        for index, name in enumerate(names):
            assert os.stat(mnt / "class" / name).st_size == len(name) * (1 + index % 3)
        assert (mnt / "class" / names[-1]).read_bytes() == names[-1].encode() * (1 + 999 % 3)

    opcodes = _requests_during(tmp_path, archive, stat_from_manifest)
    assert opcodes.count("LOOKUP") < len(names) // 2 and opcodes.count("READDIRPLUS") >= 1, sorted(set(opcodes))


@pytest.mark.parametrize("api", ["low", "high"])
def test_archives_and_mount_points_with_names_that_are_not_utf8(mounter: Mounter, tmp_path: Path, api: str) -> None:
    """File names are bytes: an archive (plain, compressed, a single compressed file), the
    folder it is in, and the mount point may have names that do not decode as UTF-8 (index
    metadata, the libfuse option string and the union's cache key all failed on them)."""
    import gzip

    folder = tmp_path / os.fsdecode(b"data \xff")
    folder.mkdir()
    archive = folder / os.fsdecode(b"a\xfe.tar")
    archive.write_bytes(tar_bytes({"x/f": b"hello"}))
    compressed = folder / os.fsdecode(b"b\xfe.tar.gz")
    compressed.write_bytes(gzip.compress(tar_bytes({"y/g": b"gzipped"})))
    single = folder / os.fsdecode(b"c\xfe.txt.gz")
    single.write_bytes(gzip.compress(b"plain"))
    extra = ["--fuse-api", api]
    for source, path, expected in ((archive, "x/f", b"hello"), (compressed, "y/g", b"gzipped")):
        mountpoint = tmp_path / os.fsdecode(b"m\xfd" + source.name[0].encode())
        mountpoint.mkdir()
        mounter.mount(source, extra=extra, mountpoint=mountpoint)
        assert (mountpoint / path).read_bytes() == expected
        mounter.unmount(mountpoint)
    mountpoint = mounter.mount(single, extra=extra)
    assert os.listdir(os.fsencode(mountpoint)) == [b"c\xfe.txt"]
    assert (mountpoint / os.fsdecode(b"c\xfe.txt")).read_bytes() == b"plain"
    mounter.unmount(mountpoint)
    union = mounter.mount(archive, compressed, extra=extra)
    assert sorted(os.listdir(union)) == ["x", "y"]
    assert (union / "y" / "g").read_bytes() == b"gzipped"


@requires_fuse
def test_a_stat_of_every_file_costs_two_lookups_per_folder(tmp_path: Path) -> None:
    """Paths from a manifest, folder after folder, none listed first: the second lookup in a
    folder hands it to the prefetcher and is answered once the kernel knows the whole folder,
    which the mount may do because it negotiated parallel lookups and listings within a folder
    (libfuse up to 3.16 never asks for them). Lookups that raced with the listing used to make
    the kernel drop the attributes it had just been given: ~25 more LOOKUPs and ~40 GETATTRs
    per folder of 100."""
    folders, per_folder = 12, 100
    files = {f"class{f:02d}/img_{i:04d}.JPEG": b"x" * (f + i % 7) for f in range(folders) for i in range(per_folder)}
    archive = tmp_path / "manifest.tar"
    archive.write_bytes(tar_bytes(files))

    def stat_from_manifest(mnt: Path) -> None:
        for name, data in files.items():
            assert os.stat(mnt / name).st_size == len(data)

    opcodes = _requests_during(tmp_path, archive, stat_from_manifest)
    log = (tmp_path / "fuse.log").read_text(errors="replace")
    assert "lookups and listings within a folder in parallel: True" in log
    # (the mount's own checks stat the root)
    assert opcodes.count("LOOKUP") <= 2 * folders + 4, opcodes.count("LOOKUP")  # and a few folders
    assert opcodes.count("GETATTR") <= 2, opcodes.count("GETATTR")
    assert opcodes.count("READDIRPLUS") >= folders


def _drop_dentries() -> bool:
    """``echo 2 > /proc/sys/vm/drop_caches`` (the kernel forgets unused names and inodes, as
    under memory pressure); False when not permitted."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")
        return True
    except OSError:
        return False


@requires_fuse
def test_a_second_pass_after_the_kernel_forgot_the_names_is_answered_by_the_kernel(tmp_path: Path) -> None:
    """Every file read folder after folder, twice, with the kernel's dentries dropped in
    between: the second pass's runs of lookups list each folder again (the prefetcher listed it
    in the first pass), so it costs a few lookups per folder, not one per file; every byte is
    right."""
    if not os.access("/proc/sys/vm/drop_caches", os.W_OK):
        pytest.skip("dropping the kernel's caches needs root")
    folders, per_folder = 6, 60
    files = {
        f"class{f:02d}/img_{i:04d}.JPEG": bytes([65 + f]) * (1 + i) for f in range(folders) for i in range(per_folder)
    }
    archive = tmp_path / "passes.tar"
    archive.write_bytes(tar_bytes(files))

    def two_passes(mnt: Path) -> None:
        for _ in range(2):
            for name, data in files.items():
                assert (mnt / name).read_bytes() == data
            assert _drop_dentries()

    opcodes = _requests_during(tmp_path, archive, two_passes)
    # Both passes: ~3 lookups per folder (and the folders themselves); one per file in the
    # second pass was 360 more.
    assert opcodes.count("LOOKUP") <= 2 * (3 * folders + 4), opcodes.count("LOOKUP")
    assert opcodes.count("READDIRPLUS") >= 2 * folders


def _requests_of(log: Path, pid: int) -> List[str]:
    """The opcodes of the requests process ``pid`` sent, from a foreground mount's debug log."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if "opcode: " in line and line.endswith(f", pid: {pid}"):
            found.append(line.split("opcode: ")[1].split(" ")[0])
    return found


@requires_fuse
def test_a_stat_of_every_file_after_a_find_finds_folders_listed_ahead(tmp_path: Path) -> None:
    """A ``find`` (its listings name the files without attributes), then a stat of every file
    it found, in its order: runs of lookups. Once runs came in two folders one after the other,
    the next folders are listed ahead of the stats: they need fewer than the two lookups per
    folder of a run, and get the attributes of every file right.

    The listing ahead runs in a thread of the mount, racing the stats, and can fall behind (a
    fresh-clone run of the suite here, once in about eight: 70 lookups). Attributes must be
    right in every walk; the count of lookups in the better of two walks, each on a new mount."""
    folders, per_folder = 12, 60
    files = {f"train/n{f:04d}/img_{i:04d}.JPEG": b"y" * (f * 7 + i) for f in range(folders) for i in range(per_folder)}
    archive = tmp_path / "walk.tar"
    archive.write_bytes(tar_bytes(files))
    lookups = []
    for attempt in range(2):
        seen: Dict[str, int] = {}

        def find_then_stat(mnt: Path) -> None:
            found = [os.path.join(top, name) for top, _dirs, names in os.walk(mnt) for name in sorted(names)]
            for path in found:
                seen[os.path.relpath(path, mnt)] = os.stat(path).st_size  # noqa: B023 - run at once

        walk = tmp_path / f"walk{attempt}"
        walk.mkdir()
        _requests_during(walk, archive, find_then_stat)
        assert seen == {name: len(data) for name, data in files.items()}
        ours = _requests_of(walk / "fuse.log", os.getpid())
        assert ours.count("GETATTR") <= 2, ours.count("GETATTR")  # no attributes dropped by races
        lookups.append(ours.count("LOOKUP"))
        if lookups[-1] < 2 * folders:
            break
    assert min(lookups) < 2 * folders, lookups


@requires_fuse
@pytest.mark.parametrize("api", ["low", "high"])
def test_symlink_targets_are_asked_for_once(tmp_path: Path, api: str) -> None:
    """On an immutable mount the kernel keeps symlink targets (FUSE_CACHE_SYMLINKS): a software
    environment resolving ``bin/python`` at every start sends one READLINK per link and mount."""
    archive = tmp_path / "env.tar"
    with tarfile.open(archive, "w") as tar:
        for name, target in (("bin/python", "python3.11"), ("lib/libz.so.1", "libz.so.1.2.13")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        data = tarfile.TarInfo("bin/python3.11")
        data.size = 3
        tar.addfile(data, io.BytesIO(b"elf"))

    def resolve_often(mnt: Path) -> None:
        for _ in range(5):
            assert os.readlink(mnt / "bin/python") == "python3.11"
            assert os.readlink(mnt / "lib/libz.so.1") == "libz.so.1.2.13"
            assert (mnt / "bin/python").read_bytes() == b"elf"  # followed by the kernel

    opcodes = _requests_during(tmp_path, archive, resolve_often, ["--fuse-api", api])
    assert opcodes.count("READLINK") == 2, opcodes.count("READLINK")


@pytest.mark.parametrize("tool", ["ratarmount", "ratarmount-convert"])
@pytest.mark.parametrize("signum,status,said", [(signal.SIGTERM, 143, "terminated"), (signal.SIGHUP, 129, "hung up")])
def test_sigterm_during_the_first_index_build_leaves_nothing(
    tmp_path: Path, tool: str, signum: int, status: int, said: str
) -> None:
    """SIGTERM (and SIGHUP: a closed terminal) ends Python without cleanups by default: a build
    killed so left its temporary index (and the converter its temporary output). Now it cleans
    up as Ctrl-C does, exit 143 (129)."""
    archive = tmp_path / "many.tar"
    with open(archive, "wb") as out:  # 40,000 empty members: a build of a few tenths of a second
        for i in range(40_000):
            out.write(tarfile.TarInfo(f"d{i % 400:03d}/f{i:05d}").tobuf(format=tarfile.USTAR_FORMAT))
        out.write(bytes(1024))
    work = tmp_path / "work"
    work.mkdir()
    index = work / "many.sqlite"
    if tool == "ratarmount":
        (work / "mnt").mkdir()
        command = [*RATARMOUNT, "-f", "--index-file", str(index), str(archive), str(work / "mnt")]
    else:
        command = [sys.executable, "-m", "ratarmount.convert_cli", "--no-progress", "--index-file", str(index)]
        command += [str(archive), str(work / "many.tar.zst")]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(2000):  # until the temporary index exists: the build is under way
            if any(".tmp-" in p.name for p in work.iterdir()) or process.poll() is not None:
                break
            time.sleep(0.002)
        assert process.poll() is None, "the build ended before it could be interrupted"
        process.send_signal(signum)
        _out, err = process.communicate(timeout=60)
        assert process.returncode == status, err
        assert said in err and "Traceback" not in err, err
        assert sorted(p.name for p in work.iterdir()) == (["mnt"] if tool == "ratarmount" else [])
    finally:
        if process.poll() is None:
            process.kill()
        lazy_unmount(work / "mnt")


@pytest.mark.parametrize(
    "option,value",
    [
        ("--cache-size", "inf"),
        ("--cache-size", "nan"),
        ("--cache-size", "-1"),
        ("--seek-point-spacing", "inf"),
        ("--seek-point-spacing", "0"),
        ("-P", "-2"),
        ("--frame-size", "inf"),
        ("--frame-size", "nan"),
        ("--frame-size", "0"),
        ("--frame-size", "0.0000001"),
        ("--level", "100"),  # (zstd's "level must be less than 23", status 1, naming no option)
        ("--level", "-200000"),
    ],
)
def test_sizes_and_counts_out_of_range_are_usage_errors(tmp_path: Path, option: str, value: str) -> None:
    """``inf``/``nan`` went on to ``int()`` and ended in a traceback (found by fuzzing)."""
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes({"f": b"abc"}))
    if option in ("--frame-size", "--level"):
        command = [
            sys.executable,
            "-m",
            "ratarmount.convert_cli",
            option,
            value,
            str(archive),
            str(tmp_path / "o.tar.zst"),
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    else:
        (tmp_path / "mnt").mkdir()
        try:
            result = run_ratarmount(option, value, str(archive), str(tmp_path / "mnt"))
        finally:
            lazy_unmount(tmp_path / "mnt")  # (when it mounted after all)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and f"{value!r}" in result.stderr
    assert not [name for name in os.listdir(tmp_path) if name not in ("a.tar", "mnt", "home")]


@pytest.fixture(scope="module")
def slow_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A .tar.gz whose index takes a second or two to build (20,000 members)."""
    path = tmp_path_factory.mktemp("slow") / "slow.tar.gz"
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for i in range(20_000):
            data = os.urandom(1000) * 2
            info = tarfile.TarInfo(f"d{i % 100}/f{i}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _start_mount(archive: Path, index_folder: Path, mnt: Path) -> "subprocess.Popen[str]":
    index_folder.mkdir()
    mnt.mkdir(exist_ok=True)
    command = [*RATARMOUNT, "--index-folders", str(index_folder), str(archive), str(mnt)]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def _building(archive: Path, index_folder: Path, process: "subprocess.Popen[str]") -> None:
    """Wait until the index of ``archive`` is being written (its temporary file exists)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        if any(".tmp-" in name for name in os.listdir(index_folder)):
            return
        time.sleep(0.005)
    raise AssertionError("the index build was not seen")


def _mounts_at(mountpoint: Path) -> int:
    with open("/proc/mounts") as f:
        return sum(line.split()[1] == str(mountpoint) for line in f)


@requires_fuse
@pytest.mark.parametrize(
    "signum,status,said",
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated"), (signal.SIGHUP, 129, "hung up")],
)
def test_a_background_mount_interrupted_during_its_build_mounts_nothing_later(
    slow_archive: Path, tmp_path: Path, signum: int, status: int, said: str
) -> None:
    """Ctrl-C while the index was built: the command said "interrupted", and a second later the
    mount appeared anyway, served by the daemon it had forked (found by fuzzing)."""
    index_folder, mnt = tmp_path / "idx", tmp_path / "mnt"
    process = _start_mount(slow_archive, index_folder, mnt)
    try:
        _building(slow_archive, index_folder, process)
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
        assert process.returncode == status and err.strip().splitlines()[-1] == f"ratarmount: {said}"
        time.sleep(1.5)
        assert _mounts_at(mnt) == 0 and not os.listdir(index_folder)
    finally:
        lazy_unmount(mnt)


@requires_fuse
def test_the_mount_process_terminated_during_its_build_says_so(slow_archive: Path, tmp_path: Path) -> None:
    """A job scheduler's SIGTERM to the (detached) mount process: the command said only
    "ratarmount: error: " (found by fuzzing)."""
    index_folder, mnt = tmp_path / "idx", tmp_path / "mnt"
    process = _start_mount(slow_archive, index_folder, mnt)
    try:
        _building(slow_archive, index_folder, process)
        os.kill(child_of(process.pid), signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 143 and err.strip().splitlines()[-1] == "ratarmount: terminated"
        assert _mounts_at(mnt) == 0 and not os.listdir(index_folder)
    finally:
        lazy_unmount(mnt)


@requires_fuse
def test_two_mounts_at_one_point_started_together_make_one_mount(slow_archive: Path, tmp_path: Path) -> None:
    """Both used to succeed, stacked at the mount point (the check came before the index build,
    which takes seconds); the second now says the point is a mount point (found by fuzzing)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    processes = []
    try:
        # Both started at once, so that both builds run together: started one after the other,
        # the second one's Python start-up on a busy machine outlasted the first one's build, and
        # it found the mount there before it built (a test run beside two busy loops).
        folders = (tmp_path / "idx1", tmp_path / "idx2")
        processes = [_start_mount(slow_archive, index_folder, mnt) for index_folder in folders]
        for index_folder, process in zip(folders, processes):
            _building(slow_archive, index_folder, process)
        results = sorted((p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in processes)
        assert [code for code, _ in results] == [0, 1]
        assert "is already a mount point" in results[1][1]
        assert _mounts_at(mnt) == 1
    finally:
        for _ in range(3):
            lazy_unmount(mnt)


@requires_fuse
def test_dotdot_after_a_symlink_in_the_archive_and_mount_paths_is_where_the_kernel_goes(tmp_path: Path) -> None:
    """``ratarmount lnk/../x.tar lnk/../mnt`` (``lnk`` -> ``d1/sub``): another ``x.tar`` was
    mounted, at another folder, as paths were made absolute by text (found by fuzzing)."""
    (tmp_path / "d1" / "sub").mkdir(parents=True)
    (tmp_path / "d1" / "mnt").mkdir()
    (tmp_path / "mnt").mkdir()
    (tmp_path / "d1" / "x.tar").write_bytes(tar_bytes({"fa": b"I am A"}))
    (tmp_path / "x.tar").write_bytes(tar_bytes({"fb": b"I am B"}))
    (tmp_path / "lnk").symlink_to("d1/sub")
    result = run_ratarmount("lnk/../x.tar", "lnk/../mnt", cwd=tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        assert os.path.ismount(tmp_path / "d1" / "mnt") and not os.path.ismount(tmp_path / "mnt")
        assert os.listdir(tmp_path / "d1" / "mnt") == ["fa"]
    finally:
        lazy_unmount(tmp_path / "d1" / "mnt")
        lazy_unmount(tmp_path / "mnt")


@requires_fuse
def test_a_mount_point_named_by_a_symlink(tmp_path: Path, archive: Path) -> None:
    """The kernel mounts on the link's target; a background mount waited forever for its mount
    point (the link) to look mounted, and ``-u LINK`` said "not a mount point" (found by fuzzing)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    result = run_ratarmount(str(archive), str(tmp_path / "link"), timeout=60)
    try:
        assert result.returncode == 0, result.stderr
        assert os.path.ismount(tmp_path / "real")
        assert (tmp_path / "link" / "folder0" / "file0.txt").read_bytes() == FILES["folder0/file0.txt"]
        done = run_ratarmount("-u", str(tmp_path / "link"))
        assert done.returncode == 0, done.stderr
        assert not os.path.ismount(tmp_path / "real")
    finally:
        lazy_unmount(tmp_path / "real")
