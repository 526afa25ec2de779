"""What ratarmountcore shows must be what GNU tar extracts.

Every case builds an archive (with GNU tar and/or Python's tarfile), extracts it with ``tar -x``
(as root, so modes, owners and times are restored) and compares the extracted tree with the
source returned by ``ratarmountcore.open``: names, content, mode, uid, gid, mtime (to the
nanosecond where the format stores it), size, link counts and symlink targets.
"""

from __future__ import annotations

import fcntl
import io
import logging
import os
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from conftest import fuse_available, lazy_unmount, requires_fuse, run_ratarmount
from tarcompare import (
    FRESH,
    IS_ROOT,
    check_archive_against_tar,
    compare_trees,
    gnu_tar_create,
    implicit_dirs_of,
    snapshot_dir,
    snapshot_source,
    tar_extract,
    tarfile_create,
)

import ratarmountcore

requires_root = pytest.mark.skipif(not IS_ROOT, reason="restoring owners and devices needs root")
# The reference is tar -x restoring owners, modes (setuid, 0o000 files readable) and devices:
# that needs root.
pytestmark = pytest.mark.skipif(not IS_ROOT, reason="comparing with tar -x needs root")


GNU_FORMATS = ["gnu", "oldgnu", "ustar", "pax", "posix"]
TARFILE_FORMATS = {
    "tarfile-ustar": tarfile.USTAR_FORMAT,
    "tarfile-gnu": tarfile.GNU_FORMAT,
    "tarfile-pax": tarfile.PAX_FORMAT,
}

GiB = 1 << 30


def write(path: Path, data: bytes, mode: int = 0o644, mtime_ns: int = 1_600_000_000_000_000_000) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)
    os.utime(path, ns=(mtime_ns, mtime_ns))
    return path


def settle_dir_times(root: Path, mtime_ns: int = 1_500_000_000_000_000_000) -> None:
    """Give every directory a fixed mtime (after its content is final)."""
    for folder, _dirs, _files in sorted(os.walk(root), key=lambda t: -len(t[0])):
        os.utime(folder, ns=(mtime_ns, mtime_ns))


def archive_both_ways(tmp_path: Path, src: Path, gnu_formats: List[str], tarfile_formats: List[str]) -> List[Path]:
    archives = []
    for fmt in gnu_formats:
        archive = tmp_path / f"gnu-{fmt}.tar"
        gnu_tar_create(archive, src, fmt)
        archives.append(archive)
    for name in tarfile_formats:
        archive = tmp_path / f"{name}.tar"
        tarfile_create(archive, src, TARFILE_FORMATS[name])
        archives.append(archive)
    return archives


def make_basic_tree(src: Path, devices: bool = True) -> None:
    write(src / "empty.txt", b"")
    write(src / "one-block.bin", os.urandom(512), 0o600)
    write(src / "odd.bin", os.urandom(513), 0o755)
    write(src / "dir" / "nested" / "deep.txt", b"deep\n", 0o640)
    (src / "empty-dir").mkdir()
    os.chmod(src / "empty-dir", 0o700)
    (src / "sticky").mkdir(mode=0o777)
    os.chmod(src / "sticky", 0o1777)
    write(src / "setuid", b"#!/bin/sh\n", 0o4755)
    write(src / "setgid", b"#!/bin/sh\n", 0o2750)
    write(src / "nothing", b"secret", 0o000)
    os.symlink("dir/nested", src / "link-to-dir")
    os.symlink("does/not/exist", src / "dangling")
    os.symlink("/etc/passwd", src / "absolute-link")
    os.symlink("../..", src / "dir" / "up-link")
    os.link(src / "odd.bin", src / "dir" / "hard-odd.bin")
    os.link(src / "odd.bin", src / "hard-odd-2.bin")
    if devices and IS_ROOT:
        os.mknod(src / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.mknod(src / "loop", 0o660 | stat.S_IFBLK, os.makedev(7, 300))  # minor > 255
        os.mkfifo(src / "fifo", 0o644)
    if IS_ROOT:
        os.lchown(src / "odd.bin", 1000, 100)
        os.lchown(src / "dir" / "nested", 12345, 54321)
        os.lchown(src / "dangling", 7, 8)
    for p in (src / "link-to-dir", src / "dangling", src / "absolute-link", src / "dir" / "up-link"):
        os.utime(p, ns=(1_234_567_890_000_000_000, 1_234_567_890_000_000_000), follow_symlinks=False)
    settle_dir_times(src)


# --- general trees in every format ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", GNU_FORMATS + list(TARFILE_FORMATS))
def test_basic_tree(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_basic_tree(src, devices=True)
    if fmt in TARFILE_FORMATS:
        archives = archive_both_ways(tmp_path, src, [], [fmt])
    else:
        archives = archive_both_ways(tmp_path, src, [fmt], [])
    extracted = check_archive_against_tar(archives[0], tmp_path)
    # The checks are not vacuous: the interesting members are really there.
    assert extracted["/odd.bin"].nlink == 3
    assert extracted["/dangling"].target == "does/not/exist"
    with ratarmountcore.open(str(archives[0]), FRESH) as s:
        assert s.info("/odd.bin").ino == s.info("/dir/hard-odd.bin").ino == s.info("/hard-odd-2.bin").ino
        assert s.info("/odd.bin").ino != s.info("/setuid").ino
    assert stat.S_IMODE(extracted["/setuid"].mode) == 0o4755
    assert stat.S_IMODE(extracted["/sticky"].mode) == 0o1777
    if IS_ROOT:
        assert extracted["/loop"].kind == "b" and os.minor(extracted["/loop"].rdev) == 300
        assert extracted["/fifo"].kind == "p"
        assert extracted["/dir/nested"].uid == 12345


def test_v7_format(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write(src / "a.txt", b"hello v7\n", 0o640)
    write(src / "d" / "b.bin", os.urandom(1000))
    os.symlink("a.txt", src / "sym")
    os.link(src / "a.txt", src / "d" / "hard")
    (src / "empty").mkdir()
    settle_dir_times(src)
    archive = tmp_path / "v7.tar"
    gnu_tar_create(archive, src, "v7")
    assert (archive.read_bytes()[257:263]) != b"ustar\0"
    extracted = check_archive_against_tar(archive, tmp_path)
    assert extracted["/empty"].kind == "d" and extracted["/d/hard"].nlink == 2


# --- long names -----------------------------------------------------------------------------------


def make_long_name_tree(src: Path) -> Dict[str, str]:
    """Names of 100-255 bytes per component and paths above 255 bytes; long link targets."""
    long_file = "f" * 150 + ".txt"
    deep = Path("d" * 120) / ("e" * 120) / ("g" * 120)
    write(src / long_file, b"long file name\n")
    write(src / deep / "x.bin", os.urandom(700))
    write(src / ("prefix-split-" + "p" * 80) / ("n" * 99), b"exactly 99 byte name\n")
    write(src / ("h" * 100), b"100 bytes\n")
    long_target = "t" * 200
    os.symlink(long_target, src / "long-symlink")
    os.symlink(str(deep / "x.bin"), src / ("s" * 130))
    os.link(src / deep / "x.bin", src / ("hardlink-" + "k" * 140))
    # Longer than a 512-byte block: multi-block L/K members and pax records.
    very_deep = Path(*[f"{i}" + "v" * 199 for i in range(7)])
    write(src / very_deep / "end.txt", b"1400-byte path\n")
    os.symlink("../" * 200 + "w" * 300, src / "very-long-target")
    os.link(src / very_deep / "end.txt", src / very_deep.parent / ("hard-" + "y" * 200))
    settle_dir_times(src)
    return {
        "long_file": "/" + long_file,
        "deep": "/" + str(deep / "x.bin"),
        "long_target": long_target,
        "very_deep": "/" + str(very_deep / "end.txt"),
    }


@pytest.mark.parametrize("fmt", ["gnu", "oldgnu", "pax", "posix", "tarfile-gnu", "tarfile-pax"])
def test_long_names_and_link_names(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    names = make_long_name_tree(src)
    archive = archive_both_ways(
        tmp_path, src, [fmt] if fmt in GNU_FORMATS else [], [fmt] if fmt in TARFILE_FORMATS else []
    )[0]
    data = archive.read_bytes()
    if "gnu" in fmt:
        assert b"././@LongLink" in data  # GNU L/K records really used
    else:
        assert b" path=" in data and b" linkpath=" in data
    extracted = check_archive_against_tar(archive, tmp_path)
    assert extracted["/long-symlink"].target == names["long_target"]
    assert extracted[names["very_deep"]].nlink == 2 and len(extracted["/very-long-target"].target or "") == 900
    assert extracted[names["deep"]].nlink == 2
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.read(names["long_file"]) == b"long file name\n"


@pytest.mark.parametrize("fmt", ["ustar", "tarfile-ustar"])
def test_ustar_prefix_names(tmp_path: Path, fmt: str) -> None:
    """Paths of up to 255 bytes split into the ustar prefix and name fields."""
    src = tmp_path / "src"
    src.mkdir()
    rel = Path("a" * 90) / ("b" * 60) / ("c" * 99)  # 251 bytes
    write(src / rel, b"prefix + name\n")
    write(src / ("q" * 97) / "short", b"short name, long prefix\n")
    os.symlink("z" * 100, src / "max-linkname")  # ustar link names: exactly 100 bytes, no NUL
    settle_dir_times(src)
    archive = tmp_path / f"{fmt}.tar"
    if fmt == "ustar":
        gnu_tar_create(archive, src, "ustar")
    else:
        tarfile_create(archive, src, tarfile.USTAR_FORMAT)
    raw = archive.read_bytes()
    assert b"././@LongLink" not in raw and b"path=" not in raw
    extracted = check_archive_against_tar(archive, tmp_path)
    assert "/" + str(rel) in extracted
    assert extracted["/max-linkname"].target == "z" * 100


def test_name_field_without_nul_terminator(tmp_path: Path) -> None:
    """A 100-byte name fills the name field completely (no NUL) and must not run into mode."""
    archive = tmp_path / "full.tar"
    with tarfile.open(archive, "w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("x" * 100)
        info.size = 3
        info.mtime = 1_000_000
        tar.addfile(info, io.BytesIO(b"abc"))
    assert archive.read_bytes()[99:101] == b"x" + b"0"  # mode field starts right after
    check_archive_against_tar(archive, tmp_path)


# --- names: encodings and sanitization --------------------------------------------------------------

NON_ASCII = [
    "héllo wörld.txt",
    "日本語のファイル.txt",
    "emoji-\U0001f600.bin",
    "ΑΒΓ/δέλτα/ε.txt",
    "tab\tand newline\nname",
]


@pytest.mark.parametrize("fmt", GNU_FORMATS + list(TARFILE_FORMATS))
def test_non_ascii_names(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i, name in enumerate(NON_ASCII):
        write(src / name, f"content {i}\n".encode())
    os.symlink("日本語のファイル.txt", src / "ссылка")
    settle_dir_times(src)
    archive = archive_both_ways(
        tmp_path, src, [fmt] if fmt in GNU_FORMATS else [], [fmt] if fmt in TARFILE_FORMATS else []
    )[0]
    extracted = check_archive_against_tar(archive, tmp_path)
    for name in NON_ASCII:
        assert "/" + name in extracted
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.readlink("/ссылка") == "日本語のファイル.txt"
        assert s.read("/ΑΒΓ/δέλτα/ε.txt") == b"content 3\n"


NON_UTF8 = [b"\xff\xfe.bin", b"latin1-caf\xe9.txt", b"dir-\x80\x81/inner-\xc3\x28.txt"]


@pytest.mark.parametrize("fmt", ["gnu", "pax", "ustar", "tarfile-gnu", "tarfile-pax", "tarfile-ustar"])
def test_non_utf8_names(tmp_path: Path, fmt: str) -> None:
    """Names that are not UTF-8 survive byte for byte; the API shows them with surrogateescape."""
    src = tmp_path / "src"
    src.mkdir()
    for i, raw in enumerate(NON_UTF8):
        write(src / os.fsdecode(raw), b"bytes %d\n" % i)
    os.symlink(os.fsdecode(b"\xff\xfe.bin"), src / os.fsdecode(b"link-\xfa"))
    settle_dir_times(src)
    archive = archive_both_ways(
        tmp_path, src, [fmt] if fmt in GNU_FORMATS else [], [fmt] if fmt in TARFILE_FORMATS else []
    )[0]
    extracted = check_archive_against_tar(archive, tmp_path)
    with ratarmountcore.open(str(archive), FRESH) as s:
        for i, raw in enumerate(NON_UTF8):
            path = "/" + os.fsdecode(raw)
            assert path in extracted
            assert s.read(path) == b"bytes %d\n" % i
            assert os.fsencode(path) == b"/" + raw
        assert os.fsencode(s.readlink("/" + os.fsdecode(b"link-\xfa"))) == b"\xff\xfe.bin"


def test_sanitized_member_names(tmp_path: Path) -> None:
    """``..`` and leading ``/`` never lead outside the root: they are resolved inside it."""
    archive = tmp_path / "evil.tar"
    members = {
        "../../etc/x": b"escape attempt\n",
        "/abs/y": b"absolute\n",
        "a/../../b": b"dotdot in the middle\n",
        "./../c": b"dot dotdot\n",
        "//double//slash": b"slashes\n",
        "ok/../ok2/./file": b"normal after resolution\n",
    }
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_000
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("../../hard")
        link.type = tarfile.LNKTYPE
        link.linkname = "../../etc/x"
        tar.addfile(link)
        sym = tarfile.TarInfo("/../sym")
        sym.type = tarfile.SYMTYPE
        sym.linkname = "../../../etc/shadow"
        tar.addfile(sym)
    expected = {
        "/etc/x": b"escape attempt\n",
        "/abs/y": b"absolute\n",
        "/b": b"dotdot in the middle\n",
        "/c": b"dot dotdot\n",
        "/double/slash": b"slashes\n",
        "/ok2/file": b"normal after resolution\n",
        "/hard": b"escape attempt\n",
    }
    with ratarmountcore.open(str(archive), FRESH) as s:
        for path, data in expected.items():
            assert s.read(path) == data, path
        assert s.info("/hard").nlink == 2 and s.info("/etc/x").nlink == 2
        assert s.readlink("/sym") == "../../../etc/shadow"  # targets are verbatim, never followed
        seen = []
        for folder, dirs, files in s.walk("/"):
            for name in dirs + files:
                assert name not in ("", ".", "..") and "/" not in name
                seen.append(folder.rstrip("/") + "/" + name)
        assert sorted(p for p in seen if s.info(p).is_file) == sorted(expected)
        assert not s.exists("/..") or s.info("/..") == s.info("/")

    # GNU tar refuses such members; ratarmount deliberately keeps them, inside the root. What
    # tar does extract (the harmless members) must match.
    dest = tmp_path / "x"
    result = tar_extract(archive, dest, check=False)
    assert result.returncode != 0 and b"contains '..'" in result.stderr
    assert (dest / "abs" / "y").read_bytes() == b"absolute\n"
    assert (dest / "double" / "slash").read_bytes() == b"slashes\n"


@requires_fuse
def test_sanitized_names_through_fuse(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("../../../etc/x")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_ratarmount(str(archive), str(mnt))
    assert result.returncode == 0, result.stderr
    try:
        real = os.path.realpath(mnt / "etc" / "x")
        assert real.startswith(str(mnt) + os.sep)
        with open(real, "rb") as f:
            assert f.read() == b"evil"
        assert sorted(os.listdir(mnt)) == ["etc"]
    finally:
        lazy_unmount(mnt)


# --- times and owners -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["pax", "posix", "tarfile-pax", "gnu", "tarfile-gnu"])
def test_fractional_and_negative_mtimes(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    times = {
        "frac.txt": 1_234_567_890_123_456_789,
        "tiny.txt": 1_000_000_000_000_000_001,
        "zero.txt": 0,
        "pre-1970.txt": -86_400_000_000_000 - 250_000_000,  # 1969-12-30 23:59:59.75
        "far-future.txt": 10_000_000_000_500_000_000,  # beyond the 11-digit octal field
    }
    for name, ns in times.items():
        write(src / name, name.encode(), mtime_ns=ns)
    os.symlink("frac.txt", src / "sym")
    os.utime(src / "sym", ns=(1, 987_654_321_987_654_321), follow_symlinks=False)
    (src / "d").mkdir()
    os.utime(src / "d", ns=(1, 1_111_111_111_999_999_999))
    archive = archive_both_ways(
        tmp_path, src, [fmt] if fmt in GNU_FORMATS else [], [fmt] if fmt in TARFILE_FORMATS else []
    )[0]
    extracted = check_archive_against_tar(archive, tmp_path)
    if fmt in ("pax", "posix"):  # GNU tar stores nanoseconds in pax headers
        assert extracted["/frac.txt"].mtime_ns == times["frac.txt"]
        assert extracted["/pre-1970.txt"].mtime_ns == times["pre-1970.txt"]
        assert extracted["/sym"].mtime_ns == 987_654_321_987_654_321
    elif fmt == "gnu":
        assert extracted["/frac.txt"].mtime_ns == 1_234_567_890_000_000_000
        assert extracted["/pre-1970.txt"].mtime_ns == -86_401_000_000_000  # floor to seconds


@requires_root
@pytest.mark.parametrize("fmt", ["pax", "gnu", "oldgnu", "tarfile-pax", "tarfile-gnu"])
def test_large_uid_gid(tmp_path: Path, fmt: str) -> None:
    """Owners above the 7-digit octal limit (2097151): pax records or GNU base-256 fields."""
    src = tmp_path / "src"
    src.mkdir()
    owners = {
        "small": (1000, 1000),
        "limit": (2_097_151, 2_097_151),
        "above": (2_097_152, 3_000_000),
        "huge": (4_000_000_000, 4_294_967_294),
    }
    for name, (uid, gid) in owners.items():
        write(src / name, name.encode())
        os.chown(src / name, uid, gid)
    (src / "dir").mkdir()
    os.chown(src / "dir", 3_500_000_000, 99)
    os.symlink("small", src / "sym")
    os.lchown(src / "sym", 2_222_222_222, 2_222_222_223)
    settle_dir_times(src)
    archive = archive_both_ways(
        tmp_path, src, [fmt] if fmt in GNU_FORMATS else [], [fmt] if fmt in TARFILE_FORMATS else []
    )[0]
    extracted = check_archive_against_tar(archive, tmp_path)
    assert (extracted["/huge"].uid, extracted["/huge"].gid) == owners["huge"]
    assert extracted["/sym"].uid == 2_222_222_222


# --- sparse and huge files ------------------------------------------------------------------------

SPARSE_SIZE = 9 * GiB + 12345
SPARSE_REGIONS: List[Tuple[int, bytes]] = [
    (0, b"A" * 4096),
    (4 * GiB + 123, os.urandom(10_000)),
    (8 * GiB + 5 * (1 << 20), os.urandom(1 << 20)),
    (SPARSE_SIZE - 100, b"E" * 100),  # ends with data
]
TAIL_HOLE_REGIONS: List[Tuple[int, bytes]] = [(8 * GiB + 4096, b"middle" * 1000)]  # ends with a hole


def make_sparse(path: Path, size: int, regions: List[Tuple[int, bytes]]) -> None:
    with open(path, "wb") as f:
        for offset, data in regions:
            f.seek(offset)
            f.write(data)
        f.truncate(size)
    os.utime(path, ns=(1, 1_650_000_000_000_000_000))


def data_regions(fd: int, size: int) -> List[Tuple[int, int]]:
    regions = []
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:
            break
        end = os.lseek(fd, start, os.SEEK_HOLE)
        regions.append((start, end))
        pos = end
    return regions


def assert_same_sparse_content(src: ratarmountcore.MountSource, path: str, extracted: Path, full: bool) -> None:
    """Compare a huge sparse file chunk by chunk (holes read as zeros on both sides; holes of the
    extracted file are recognized with SEEK_DATA/SEEK_HOLE instead of being read).

    ``full``: read every byte through ratarmount; otherwise the extracted file's data regions,
    the region borders and samples inside the holes."""
    size = extracted.stat().st_size
    info = src.info(path)
    assert info.size == size
    chunk = 64 << 10  # reads below glibc's mmap threshold: no page faults for fresh buffers
    zeros = bytes(chunk)
    with open(extracted, "rb") as ef, src.open(path) as af:
        fd = ef.fileno()
        regions = data_regions(fd, size)
        assert regions, "the extracted file has no data at all"

        def expected(offset: int, n: int) -> bytes:
            if any(s < offset + n and offset < e for s, e in regions):
                return os.pread(fd, n, offset)
            return zeros[:n] if n <= len(zeros) else bytes(n)

        if full:
            regions_left = list(regions)
            offset = 0
            while offset < size:
                n = min(chunk, size - offset)
                got = af.read(n)
                assert len(got) == n
                while regions_left and regions_left[0][1] <= offset:
                    regions_left.pop(0)
                in_data = bool(regions_left) and regions_left[0][0] < offset + n
                if got != (os.pread(fd, n, offset) if in_data else zeros[:n]):
                    raise AssertionError(f"{path}: content differs in [{offset}, {offset + n})")
                offset += n
            assert af.read(1) == b""
        else:
            probes = [(0, 1 << 20), (size - (1 << 20), 1 << 20), (size // 2, 4096), (size // 3 + 7, 100_000)]
            for s, e in regions:
                probes += [
                    (max(0, s - 4096), min(e, s + (1 << 20)) - max(0, s - 4096) + 4096),
                    (max(0, e - 8192), 16384),
                ]
            for offset, n in probes:
                n = min(n, size - offset)
                af.seek(offset)
                assert af.read(n) == expected(offset, n), f"{path}: content differs at {offset}+{n}"


@pytest.fixture(scope="module")
def sparse_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("sparse") / "src"
    src.mkdir()
    make_sparse(src / "big-sparse.bin", SPARSE_SIZE, SPARSE_REGIONS)
    make_sparse(src / "tail-hole.bin", 8 * GiB + (1 << 20), TAIL_HOLE_REGIONS)
    write(src / "small.txt", b"not sparse\n")
    make_sparse(src / "all-hole.bin", 1 << 20, [])
    # 60 data regions: old GNU sparse extension blocks and a pax 1.0 map longer than one block.
    make_sparse(src / "many-regions.bin", 20 << 20, [(i * 320 * 1024 + 8192, os.urandom(5000 + i)) for i in range(60)])
    settle_dir_times(src)
    return src


SPARSE_VARIANTS = {
    "pax": ["--format=pax", "--sparse"],
    "pax-0.0": ["--format=pax", "--sparse", "--sparse-version=0.0"],
    "pax-0.1": ["--format=pax", "--sparse", "--sparse-version=0.1"],
    "pax-1.0": ["--format=pax", "--sparse", "--sparse-version=1.0"],
    "gnu": ["--format=gnu", "-S"],
    "oldgnu": ["--format=oldgnu", "-S"],
}


@pytest.mark.parametrize("variant", list(SPARSE_VARIANTS))
def test_sparse_files_above_8gib(tmp_path: Path, sparse_source: Path, variant: str) -> None:
    archive = tmp_path / f"sparse-{variant}.tar"
    result = subprocess.run(
        ["tar", *SPARSE_VARIANTS[variant], "--numeric-owner", "-C", str(sparse_source), "-cf", str(archive), "."],
        capture_output=True,
    )
    assert result.returncode == 0, result.stderr
    assert archive.stat().st_size < 64 << 20  # the holes were not stored
    raw = archive.read_bytes()
    marker = {
        "pax": b"GNU.sparse.",
        "pax-0.0": b"GNU.sparse.offset=",
        "pax-0.1": b"GNU.sparse.map=",
        "pax-1.0": b"GNU.sparse.major=1",
        "gnu": b"ustar  \0",
        "oldgnu": b"ustar  \0",
    }[variant]
    assert marker in raw
    if "gnu" in variant:
        assert b"GNU.sparse" not in raw and raw.count(b"ustar  \0") >= 2
    big = ["/big-sparse.bin", "/tail-hole.bin"]
    extracted = check_archive_against_tar(archive, tmp_path, skip_content=big)
    dest = tmp_path / (archive.name + ".extracted")
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.info("/big-sparse.bin").size == SPARSE_SIZE == extracted["/big-sparse.bin"].size
        for path in big:
            assert_same_sparse_content(s, path, dest / path[1:], full=variant == "gnu" and path == "/big-sparse.bin")
        assert s.read("/many-regions.bin") == (dest / "many-regions.bin").read_bytes()
        with s.open("/big-sparse.bin") as f:
            for offset, data in SPARSE_REGIONS:
                f.seek(offset)
                assert f.read(len(data)) == data


def _huge_member_archive(path: Path, fmt: int, size: int, writes: List[Tuple[int, bytes]]) -> int:
    """An archive with one non-sparse member of ``size`` bytes, itself a sparse file on disk
    (only ``writes`` hold data); returns the member's data offset."""
    info = tarfile.TarInfo("huge.bin")
    info.size = size
    info.mtime = 1_700_000_000
    info.mode = 0o640
    header = info.tobuf(fmt, "utf-8", "surrogateescape")
    with open(path, "wb") as f:
        f.write(header)
        data_offset = f.tell()
        for offset, data in writes:
            f.seek(data_offset + offset)
            f.write(data)
        end = data_offset + (size + 511) // 512 * 512
        f.seek(end)
        f.write(b"\0" * 1024)
        f.write(b"\0" * (10240 - (end + 1024) % 10240 if (end + 1024) % 10240 else 0))
    return data_offset


@pytest.mark.parametrize("fmt,full", [("pax", True), ("gnu", False)])
def test_huge_non_sparse_member(tmp_path: Path, fmt: str, full: bool) -> None:
    """A member above 8 GiB in a pax ``size`` record or a GNU base-256 size field. The archive is
    a sparse file on disk; GNU tar streams the member (tar -xO) and it is compared chunk by chunk."""
    size = 8 * GiB + 3 * (1 << 20) + 17
    writes = [(0, b"start"), (5 * GiB, os.urandom(70_000)), (size - 9, b"last-byte")]
    archive = tmp_path / f"huge-{fmt}.tar"
    data_offset = _huge_member_archive(
        archive, tarfile.PAX_FORMAT if fmt == "pax" else tarfile.GNU_FORMAT, size, writes
    )
    with open(archive, "rb") as f:
        raw = f.read(data_offset)
    if fmt == "pax":
        assert b" size=%d\n" % size in raw
    else:
        assert raw[-512 + 124] == 0x80  # base-256 size field
    listing = subprocess.run(["tar", "-tvf", str(archive)], capture_output=True, check=True).stdout
    assert str(size).encode() in listing
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.listdir("/") == ["huge.bin"]
        info = s.info("/huge.bin")
        assert (info.size, stat.S_IMODE(info.mode), info.mtime_ns) == (size, 0o640, 1_700_000_000 * 10**9)
        with s.open("/huge.bin") as f:
            for offset, data in writes:
                f.seek(offset)
                assert f.read(len(data)) == data
        if not full:
            return
        # Stream GNU tar's view of the member and compare every byte.
        proc = subprocess.Popen(
            ["tar", "-b", "2048", "-xOf", str(archive), "huge.bin"], stdout=subprocess.PIPE, bufsize=0
        )
        assert proc.stdout is not None
        try:
            fcntl.fcntl(proc.stdout.fileno(), 1031, 1 << 20)  # F_SETPIPE_SZ
        except OSError:
            pass
        chunk, piece = 1 << 20, 64 << 10  # big pipe reads, small member reads: both fast
        want = bytearray(chunk)
        view = memoryview(want)
        offset = 0
        with s.open("/huge.bin") as f:
            while True:
                filled = 0
                while filled < chunk:
                    n = proc.stdout.readinto(view[filled:])
                    if not n:
                        break
                    filled += n
                if not filled:
                    break
                for start in range(0, filled, piece):
                    end = min(start + piece, filled)
                    if f.read(end - start) != want[start:end]:  # bytearray: memcmp, unlike memoryview
                        raise AssertionError(f"content differs from tar -xO in [{offset + start}, {offset + end})")
                offset += filled
            assert f.read(1) == b""
        assert proc.wait() == 0
        assert offset == size


# --- archive layout --------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["gnu", "ustar", "pax"])
def test_implicit_directories(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "src"
    write(src / "a" / "b" / "c.txt", b"c\n")
    write(src / "a" / "b2" / "d.txt", b"d\n")
    write(src / "x" / "y.txt", b"y\n")
    archive = tmp_path / "implicit.tar"
    gnu_tar_create(archive, src, fmt, "--no-recursion", members=["a/b/c.txt", "a/b2/d.txt", "x/y.txt", "x"])
    extracted = check_archive_against_tar(archive, tmp_path)
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.listdir("/") == ["a", "x"]
        assert s.listdir("/a") == ["b", "b2"]
        assert s.info("/a").is_dir and s.info("/a/b").is_dir
        assert s.info("/a").nlink == 4 == extracted["/a"].nlink
        assert s.read("/a/b/c.txt") == b"c\n"
        # The explicit directory keeps its own metadata.
        assert s.info("/x").mtime_ns == extracted["/x"].mtime_ns


@pytest.mark.parametrize("how", ["dot", "dot-slash-names", "plain-names", "absolute"])
def test_dot_slash_prefixes(tmp_path: Path, how: str) -> None:
    src = tmp_path / "src"
    write(src / "f.txt", b"f\n")
    write(src / "sub" / "g.txt", b"g\n")
    os.chmod(src, 0o750)
    settle_dir_times(src, 1_400_000_000_123_456_789)
    archive = tmp_path / f"{how}.tar"
    if how == "dot":
        gnu_tar_create(archive, src, "pax")  # members "./", "./f.txt", ...
    elif how == "dot-slash-names":
        gnu_tar_create(archive, src, "gnu", members=["./f.txt", "./sub"])
    elif how == "plain-names":
        gnu_tar_create(archive, src, "gnu", members=["f.txt", "sub"])
    else:
        gnu_tar_create(archive, src, "gnu", "--absolute-names", members=[str(src / "f.txt"), str(src / "sub")])
    names = subprocess.run(["tar", "-tf", str(archive)], capture_output=True, check=True).stdout.split()
    assert names and (how != "dot" or names[0] == b"./")
    if how == "absolute":
        assert names[0].startswith(b"/")
        with ratarmountcore.open(str(archive), FRESH) as s:
            inner = str(src / "f.txt")
            assert s.read(inner) == b"f\n" and s.read(str(src / "sub" / "g.txt")) == b"g\n"
        return
    extracted = check_archive_against_tar(archive, tmp_path)
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.listdir("/") == ["f.txt", "sub"]
        if how == "dot":  # the "./" member describes the root itself
            assert stat.S_IMODE(s.info("/").mode) == 0o750 == stat.S_IMODE(extracted["/"].mode)
            assert s.info("/").mtime_ns == 1_400_000_000_123_456_789


def test_appended_versions(tmp_path: Path) -> None:
    """``tar -r`` appends new versions: the last one wins, all are reachable as PATH.versions/N."""
    src = tmp_path / "src"
    archive = tmp_path / "appended.tar"
    contents = [b"version one\n", b"version two is longer\n", b"3\n"]
    for i, data in enumerate(contents):
        write(src / "f.txt", data, mode=0o600 + i, mtime_ns=(1_600_000_000 + i) * 10**9)
        write(src / "d" / "inner.txt", data)
        if i == 0:
            os.symlink("f.txt", src / "changes-type")
        elif i == 1:
            os.unlink(src / "changes-type")
            write(src / "changes-type", b"now a file\n")
        settle_dir_times(src, (1_500_000_000 + i) * 10**9)
        # Whenever d/inner.txt is appended, so is d: extracting a new file into a directory
        # whose entry came earlier would otherwise leave tar's own mtime on the directory.
        members = ["f.txt", "changes-type", "d"] if i < 2 else ["f.txt", "d"]
        if i == 0:
            gnu_tar_create(archive, src, "gnu", members=members)
        else:
            result = subprocess.run(
                ["tar", "--numeric-owner", "-C", str(src), "-rf", str(archive), *members], capture_output=True
            )
            assert result.returncode == 0, result.stderr
    extracted = check_archive_against_tar(archive, tmp_path)
    assert extracted["/changes-type"].kind == "f"
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.read("/f.txt") == contents[-1]
        assert s.listdir("/f.txt.versions") == ["1", "2", "3"]
        for i, data in enumerate(contents):
            assert s.read(f"/f.txt.versions/{i + 1}") == data
            assert stat.S_IMODE(s.info(f"/f.txt.versions/{i + 1}").mode) == 0o600 + i
        assert [s.read(f"/d/inner.txt.versions/{i}") for i in (1, 2, 3)] == contents
        assert s.readlink("/changes-type.versions/1") == "f.txt"
        assert s.read("/changes-type.versions/2") == b"now a file\n"
        assert not s.exists("/f.txt.versions/4") and not s.exists("/f.txt.versions/0")
        assert s.info("/d.versions").is_dir and s.listdir("/d.versions") == ["1", "2", "3"]


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"", **fields) -> None:  # type: ignore[no-untyped-def]
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = fields.pop("mtime", 1_000_000)
    for key, value in fields.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if data else None)


def test_hard_links_follow_extraction_order(tmp_path: Path) -> None:
    """A hard link gets the content its target had when tar extracted the link; link counts
    count only what is still visible."""
    archive = tmp_path / "links.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "f", b"first", mode=0o640, uid=5, gid=6)
        _add(tar, "h1", type=tarfile.LNKTYPE, linkname="f")
        _add(tar, "./h2", type=tarfile.LNKTYPE, linkname="./h1")  # link to a link
        _add(tar, "f", b"second version", mode=0o600)  # replaces f; h1/h2 keep "first"
        _add(tar, "h3", type=tarfile.LNKTYPE, linkname="f")
        _add(tar, "s", type=tarfile.SYMTYPE, linkname="f", mode=0o777)
        _add(tar, "hs", type=tarfile.LNKTYPE, linkname="s")  # hard link to a symlink
        _add(tar, "s644", type=tarfile.SYMTYPE, linkname="f", mode=0o644)  # symlinks are 0o777 on disk
        _add(tar, "x", b"stays")
        _add(tar, "x", type=tarfile.LNKTYPE, linkname="missing-target")  # fails in tar: x stays
    dest = tmp_path / "x"
    result = tar_extract(archive, dest, check=False)
    assert result.returncode == 2 and b"missing-target" in result.stderr  # the one broken link
    expected = snapshot_dir(dest)
    with ratarmountcore.open(str(archive), FRESH) as s:
        compare_trees(expected, snapshot_source(s), check_root=False, label="links")
        assert s.read("/h2") == b"first" and s.info("/h2").nlink == 2
        assert s.read("/h3") == b"second version" and s.info("/f").nlink == 2
        assert s.readlink("/hs") == "f"
        assert s.read("/x") == b"stays"
        assert stat.S_IMODE(s.info("/s644").mode) == 0o777


def test_hard_links_to_hard_links_without_conflicts(tmp_path: Path) -> None:
    """Links to links in an archive whose links all name an earlier member (the common case,
    resolved by name without a replay): each has the first target's data and inode."""
    archive = tmp_path / "chain.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "f", b"data of f", mode=0o600)
        _add(tar, "h1", type=tarfile.LNKTYPE, linkname="f")
        _add(tar, "h2", type=tarfile.LNKTYPE, linkname="h1")
        _add(tar, "s", type=tarfile.SYMTYPE, linkname="f")
        _add(tar, "hs", type=tarfile.LNKTYPE, linkname="s")
        _add(tar, "hhs", type=tarfile.LNKTYPE, linkname="hs")
    expected = check_archive_against_tar(archive, tmp_path)
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.read("/h2") == b"data of f" and s.info("/h2").nlink == 3 == expected["/f"].nlink
        assert s.readlink("/hhs") == "f" and s.info("/hhs").ino == s.info("/s").ino


def test_hard_links_through_linked_folders(tmp_path: Path) -> None:
    """A hard link's target path may pass through a symbolic link to a folder: ``tar -x`` makes
    the link with ``linkat``, which follows it. GNU tar makes links that are absolute or hold
    ``..`` only at the end (a placeholder file until then), so links through those fail, as do
    links through a symbolic link made later and loops."""
    archive = tmp_path / "through.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "real", type=tarfile.DIRTYPE, mode=0o755)
        _add(tar, "real/f", b"in real", mode=0o640, uid=7)
        _add(tar, "real/sub", type=tarfile.DIRTYPE, mode=0o755)
        _add(tar, "real/sub/g", b"deeper")
        _add(tar, "real/sub/up", type=tarfile.SYMTYPE, linkname="g-dir")
        _add(tar, "real/sub/g-dir", type=tarfile.DIRTYPE, mode=0o700)
        _add(tar, "real/sub/g-dir/k", b"beside")
        _add(tar, "link", type=tarfile.SYMTYPE, linkname="real")
        _add(tar, "chain", type=tarfile.SYMTYPE, linkname="link")
        _add(tar, "here", type=tarfile.SYMTYPE, linkname=".")
        _add(tar, "abs", type=tarfile.SYMTYPE, linkname="/real")
        _add(tar, "dots", type=tarfile.SYMTYPE, linkname="real/../real")
        _add(tar, "loop1", type=tarfile.SYMTYPE, linkname="loop2")
        _add(tar, "loop2", type=tarfile.SYMTYPE, linkname="loop1")
        _add(tar, "h1", type=tarfile.LNKTYPE, linkname="link/f")
        _add(tar, "h2", type=tarfile.LNKTYPE, linkname="chain/sub/g")
        _add(tar, "h3", type=tarfile.LNKTYPE, linkname="here/here/real/f")
        _add(tar, "h4", type=tarfile.LNKTYPE, linkname="link/sub/up/k")
        _add(tar, "bad-abs", type=tarfile.LNKTYPE, linkname="abs/f")
        _add(tar, "bad-dots", type=tarfile.LNKTYPE, linkname="dots/f")
        _add(tar, "bad-loop", type=tarfile.LNKTYPE, linkname="loop1/f")
        _add(tar, "bad-late", type=tarfile.LNKTYPE, linkname="late/f")
        _add(tar, "late", type=tarfile.SYMTYPE, linkname="real")
        _add(tar, "bad-file", type=tarfile.LNKTYPE, linkname="real/f/x")
    dest = tmp_path / "x"
    result = tar_extract(archive, dest, check=False)
    assert result.returncode == 2
    for name in ("bad-abs", "bad-dots", "bad-loop", "bad-late", "bad-file"):
        assert name.encode() in result.stderr and not os.path.lexists(dest / name)
    expected = snapshot_dir(dest)
    assert expected["/h4"].digest == expected["/real/sub/g-dir/k"].digest
    with ratarmountcore.open(str(archive), FRESH) as s:
        compare_trees(expected, snapshot_source(s), check_root=False, label="through links")
        assert s.read("/h1") == s.read("/h3") == b"in real" and s.info("/real/f").nlink == 3
        assert s.info("/h1").uid == 7 and s.read("/h2") == b"deeper" and s.read("/h4") == b"beside"


@pytest.mark.parametrize("name", ["..", "/", "."])
def test_a_file_named_as_the_root_is_ignored_with_a_warning_in_words(
    tmp_path: Path, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning named the member's kind by its index code ("the f member '/'", found by a
    review of bad input)."""
    archive = tmp_path / "root.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, name, b"data")
        _add(tar, "kept", b"kept")
    with caplog.at_level(logging.WARNING, logger="ratarmountcore"):
        with ratarmountcore.open(str(archive), FRESH) as s:
            assert s.listdir("/") == ["kept"] and s.read("/kept") == b"kept"
    assert [r.getMessage() for r in caplog.records] == [
        'Ignoring a file member named as the root folder ("/", "." or ".."), which it would replace'
    ]


def test_members_tar_cannot_make_leave_what_was_there(tmp_path: Path) -> None:
    """A symbolic link with an empty target (symlink(2) refuses it) and a regular file named
    "/" (its slash is not a trailing one, so it is not a folder member, and it cannot replace
    the extraction folder): tar -x reports both and leaves what was there."""
    archive = tmp_path / "cannot.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "l", b"older")
        _add(tar, "l", type=tarfile.SYMTYPE, linkname="")
        _add(tar, "d/empty", type=tarfile.SYMTYPE, linkname="")  # (tar makes d for it)
        _add(tar, "/", b"", mode=0o700, uid=5, gid=6)
    dest = tmp_path / "x"
    result = tar_extract(archive, dest, check=False)
    assert result.returncode == 2 and b"Cannot create symlink" in result.stderr
    expected = snapshot_dir(dest)
    with ratarmountcore.open(str(archive), FRESH) as s:
        got = snapshot_source(s)
        compare_trees(expected, got, implicit_dirs_of(archive, expected), check_root=False, label="cannot")
        assert s.read("/l") == b"older" and s.listdir("/d") == []
        assert stat.S_IMODE(s.info("/").mode) != 0o700 and s.info("/").uid != 5


def test_the_folders_of_a_link_tar_cannot_make_are_made_where_tar_x_replays(tmp_path: Path) -> None:
    """The same empty-target link below folders without members, in an archive whose name
    conflicts send it through the extraction replay: tar -x still makes the folders."""
    archive = tmp_path / "replayed.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, "p/q/s", type=tarfile.SYMTYPE, linkname="")
        _add(tar, "f", b"x")
        _add(tar, "f", type=tarfile.DIRTYPE)  # (a file, then a folder of its name: a replay)
        _add(tar, "r/t", type=tarfile.SYMTYPE, linkname="")
        _add(tar, "r", b"over r")  # (the folder r holds nothing: the file replaces it)
    dest = tmp_path / "x"
    result = tar_extract(archive, dest, check=False)
    assert result.returncode == 2 and b"Cannot create symlink" in result.stderr
    expected = snapshot_dir(dest)
    assert {"/p", "/p/q", "/f", "/r"} <= set(expected) and expected["/r"].kind == "f"
    with ratarmountcore.open(str(archive), FRESH) as s:
        compare_trees(expected, snapshot_source(s), implicit_dirs_of(archive, expected), check_root=False)


def test_all_zero_archive(tmp_path: Path) -> None:
    archive = tmp_path / "zeros.tar"
    archive.write_bytes(b"\0" * 10240)
    dest = tmp_path / "x"
    tar_extract(archive, dest)
    assert os.listdir(dest) == []
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.listdir("/") == []
        assert s.info("/").is_dir
        assert not s.exists("/anything")
    if fuse_available():
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        result = run_ratarmount(str(archive), str(mnt))
        assert result.returncode == 0, result.stderr
        try:
            assert os.path.ismount(mnt) and os.listdir(mnt) == []
        finally:
            lazy_unmount(mnt)


def test_end_marker_stops_listing(tmp_path: Path) -> None:
    """Data after the end-of-archive marker is not part of the archive (GNU tar without -i)."""
    first, second = tmp_path / "a.tar", tmp_path / "b.tar"
    for archive, name in ((first, "a.txt"), (second, "b.txt")):
        with tarfile.open(archive, "w") as tar:
            _add(tar, name, name.encode())
    both = tmp_path / "both.tar"
    both.write_bytes(first.read_bytes() + second.read_bytes())
    check_archive_against_tar(both, tmp_path)
    with ratarmountcore.open(str(both), FRESH) as s:
        assert s.listdir("/") == ["a.txt"]


def test_trailing_slash_regular_members_are_directories(tmp_path: Path) -> None:
    """Old tars mark directories by a trailing slash on a regular-file member."""
    archive = tmp_path / "slash.tar"
    with tarfile.open(archive, "w", format=tarfile.USTAR_FORMAT) as tar:
        _add(tar, "olddir/", mode=0o711, mtime=1_300_000_000)
        _add(tar, "olddir/file", b"in old dir")
    raw = bytearray(archive.read_bytes())
    raw[156] = ord("0")  # REGTYPE with a trailing slash (tarfile wrote DIRTYPE)
    raw[148:156] = b"%06o\0 " % (sum(raw[:148]) + 256 + sum(raw[156:512]))
    archive.write_bytes(bytes(raw))
    extracted = check_archive_against_tar(archive, tmp_path)
    assert extracted["/olddir"].kind == "d"


def test_unusual_pax_records(tmp_path: Path) -> None:
    """Pax values as GNU tar reads them: Python writes float times like ``1e-09`` (GNU tar reads
    the leading number: 1 s); malformed numbers are reported by tar but do not stop extraction,
    the header's value is kept. Neither may make the archive unreadable."""
    archive = tmp_path / "pax-records.tar"
    records = {
        "exp-small": {"mtime": "1e-09"},
        "exp-big": {"mtime": "1.5e+20"},
        "many-digits": {"mtime": "1234567890.12345678999"},
        "neg-many-digits": {"mtime": "-1.10000000000001"},
        "neg-fraction": {"mtime": "-0.5"},
        "plus-uid": {"uid": " +42", "gid": "7"},
        "bad-mtime": {"mtime": "yesterday"},
        "bad-uid": {"uid": "12x", "gid": "-5"},
        "huge-uid": {"uid": "99999999999999999999"},
        "bad-size": {"size": "3 bytes"},
    }
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, pax in records.items():
            info = tarfile.TarInfo(name)
            info.mtime = 1_111_111_111
            info.uid, info.gid = 3, 4
            info.pax_headers = dict(pax)
            data = b"abc" if name == "bad-size" else name.encode()
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = archive.read_bytes()
    assert b"mtime=1e-09" in raw and b"uid=12x" in raw
    extracted = check_archive_against_tar(archive, tmp_path, tar_status=(0, 2))
    assert extracted["/exp-small"].mtime_ns == 1_000_000_000
    assert extracted["/neg-many-digits"].mtime_ns == -1_100_000_001
    assert extracted["/bad-mtime"].mtime_ns == 1_111_111_111_000_000_000
    assert (extracted["/bad-uid"].uid, extracted["/bad-uid"].gid) == (3, 4)
    assert extracted["/plus-uid"].uid == 3 and extracted["/plus-uid"].gid == 7  # "+42" is malformed


def test_pax_global_headers(tmp_path: Path) -> None:
    """Global extended headers ('g') apply to every following member, below local records. GNU
    tar replaces the whole global set with each new 'g' header (no merging)."""
    archive = tmp_path / "global.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT, pax_headers={"uid": "777", "mtime": "1234.5"}) as tar:
        _add(tar, "a", b"a", uid=1, gid=2)
        info = tarfile.TarInfo("b")
        info.pax_headers = {"uid": "55"}
        info.size = 1
        tar.addfile(info, io.BytesIO(b"b"))
    raw = bytearray(archive.read_bytes())
    # Append a second global header (gid=4242) and one more member in place of the end marker.
    offset = 0
    while raw[offset : offset + 512] != bytes(512):
        size = int(raw[offset + 124 : offset + 136].strip(b"\0 ") or b"0", 8)
        offset += 512 + (size + 511) // 512 * 512
    tail = io.BytesIO()
    with tarfile.open(fileobj=tail, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"gid": "4242"}) as tar:
        _add(tar, "c", b"c", uid=9, gid=9)
    archive.write_bytes(bytes(raw[:offset]) + tail.getvalue())
    assert archive.read_bytes().count(b"PaxHeader") >= 2
    extracted = check_archive_against_tar(archive, tmp_path)
    assert extracted["/a"].uid == 777 and extracted["/a"].mtime_ns == 1_234_500_000_000
    assert extracted["/b"].uid == 55
    assert extracted["/c"].gid == 4242 and extracted["/c"].uid == 9  # uid=777 no longer applies


def test_gnu_incremental_dumpdirs(tmp_path: Path) -> None:
    """``--listed-incremental`` archives store directories as 'D' members with a listing as data."""
    src = tmp_path / "src"
    write(src / "top" / "a.txt", b"a\n")
    write(src / "top" / "sub" / "b.txt", b"b\n")
    (src / "top" / "empty").mkdir()
    settle_dir_times(src)
    archive = tmp_path / "incremental.tar"
    gnu_tar_create(archive, src, "gnu", f"--listed-incremental={tmp_path / 'snapshot'}", members=["top"])
    raw = archive.read_bytes()
    assert raw[156:157] == b"D"
    extracted = check_archive_against_tar(archive, tmp_path)
    assert extracted["/top/sub"].kind == "d" and extracted["/top/empty"].kind == "d"
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.listdir("/top") == ["a.txt", "empty", "sub"]


def test_contiguous_and_unknown_typeflags(tmp_path: Path) -> None:
    """'7' (contiguous) and unknown typeflags are extracted as regular files by GNU tar."""
    archive = tmp_path / "types.tar"
    with tarfile.open(archive, "w", format=tarfile.USTAR_FORMAT) as tar:
        _add(tar, "contiguous", b"contiguous data", type=tarfile.CONTTYPE, mode=0o600)
        _add(tar, "vendor", b"vendor typeflag data", type=b"Z")
        _add(tar, "after", b"still in sync")
    raw = archive.read_bytes()
    assert raw[156:157] == b"7" and raw[1024 + 156 : 1024 + 157] == b"Z"
    extracted = check_archive_against_tar(archive, tmp_path)
    assert extracted["/vendor"].kind == "f" and extracted["/contiguous"].kind == "f"
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.read("/vendor") == b"vendor typeflag data" and s.read("/after") == b"still in sync"


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_type_changes_across_appends(tmp_path: Path, fmt: str) -> None:
    """Members replaced by a member of another type (tar -r): the last one wins as on disk."""
    src = tmp_path / "src"
    src.mkdir()
    archive = tmp_path / "types.tar"
    write(src / "file-then-dir", b"was a file")
    (src / "dir-then-file").mkdir()
    os.symlink("somewhere", src / "link-then-dir")
    write(src / "file-then-link", b"was a file too")
    settle_dir_times(src)
    gnu_tar_create(archive, src, fmt, members=sorted(os.listdir(src)))
    for name in ("file-then-dir", "file-then-link"):
        os.unlink(src / name)
    os.rmdir(src / "dir-then-file")
    os.unlink(src / "link-then-dir")
    (src / "file-then-dir").mkdir()
    write(src / "dir-then-file", b"now a file")
    (src / "link-then-dir").mkdir()
    os.symlink("target", src / "file-then-link")
    settle_dir_times(src, 1_600_000_000 * 10**9)
    result = subprocess.run(
        ["tar", f"--format={fmt}", "--numeric-owner", "-C", str(src), "-rf", str(archive), *sorted(os.listdir(src))],
        capture_output=True,
    )
    assert result.returncode == 0, result.stderr
    extracted = check_archive_against_tar(archive, tmp_path)
    assert extracted["/file-then-dir"].kind == "d" and extracted["/dir-then-file"].kind == "f"
    assert extracted["/link-then-dir"].kind == "d" and extracted["/file-then-link"].kind == "l"
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.read("/file-then-dir.versions/1") == b"was a file"
        assert s.info("/dir-then-file.versions/1").is_dir


def test_hard_link_to_sparse_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_sparse(src / "sparse.bin", 50 << 20, [(1 << 20, b"x" * 5000), (30 << 20, os.urandom(9000))])
    os.link(src / "sparse.bin", src / "hard.bin")
    settle_dir_times(src)
    for variant in ("pax", "gnu"):
        archive = tmp_path / f"hard-sparse-{variant}.tar"
        result = subprocess.run(
            ["tar", *SPARSE_VARIANTS[variant], "--numeric-owner", "-C", str(src), "-cf", str(archive), "."],
            capture_output=True,
        )
        assert result.returncode == 0, result.stderr
        assert archive.stat().st_size < 1 << 20
        extracted = check_archive_against_tar(archive, tmp_path)
        assert extracted["/hard.bin"].nlink == 2 and extracted["/hard.bin"].size == 50 << 20


@requires_fuse
@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_basic_tree_through_fuse(tmp_path: Path, fmt: str) -> None:
    """The same comparison through a real mount with plain os calls (devices, fifos, setuid
    bits, hard links, dangling symlinks, a sparse file)."""
    src = tmp_path / "src"
    src.mkdir()
    make_basic_tree(src, devices=True)
    make_sparse(src / "sparse.bin", 100 << 20, [(4096 * 3, b"s" * 10_000), (90 << 20, os.urandom(70_000))])
    settle_dir_times(src)
    archive = tmp_path / f"{fmt}.tar"
    gnu_tar_create(archive, src, fmt, "--sparse")
    dest = tmp_path / "x"
    tar_extract(archive, dest)
    expected = snapshot_dir(dest)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = run_ratarmount(str(archive), str(mnt))
    assert result.returncode == 0, result.stderr
    try:
        actual = snapshot_dir(mnt)
        assert os.readlink(mnt / "dangling") == "does/not/exist"
        inodes = {os.lstat(mnt / p).st_ino for p in ("odd.bin", "hard-odd-2.bin", "dir/hard-odd.bin")}
        assert len(inodes) == 1 and os.lstat(mnt / "odd.bin").st_ino != os.lstat(mnt / "setuid").st_ino
        with open(mnt / "sparse.bin", "rb") as f:
            f.seek(90 << 20)
            assert f.read(70_000) == (dest / "sparse.bin").read_bytes()[90 << 20 : (90 << 20) + 70_000]
    finally:
        lazy_unmount(mnt)
    compare_trees(expected, actual, label=f"{fmt} (FUSE)")
    if IS_ROOT:
        assert actual["/null"].kind == "c" and actual["/null"].rdev == os.makedev(1, 3)
        assert actual["/fifo"].kind == "p"
    assert actual["/odd.bin"].nlink == 3


def test_non_directory_members_named_like_the_root(tmp_path: Path) -> None:
    """Members named ".", "/" or "./" that are not directories cannot replace the root: GNU tar
    reports "File exists" and the root stays a folder; so it does here."""
    archive = tmp_path / "root-names.tar"
    with tarfile.open(archive, "w") as tar:
        _add(tar, "a.txt", b"a")
        _add(tar, ".", b"")
        _add(tar, "/", type=tarfile.SYMTYPE, linkname="a.txt")
        _add(tar, "./", type=tarfile.LNKTYPE, linkname="a.txt")
        _add(tar, "b.txt", b"b")
    extracted = check_archive_against_tar(archive, tmp_path, tar_status=(2,), check_root=False)
    assert sorted(extracted) == ["/", "/a.txt", "/b.txt"]
    with ratarmountcore.open(str(archive), FRESH) as s:
        assert s.info("/").is_dir and s.listdir("/") == ["a.txt", "b.txt"]
