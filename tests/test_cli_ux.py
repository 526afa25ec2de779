"""Rough edges a user review found on the command line: folders named for indexes and logs,
unmounting several mount points, ``-o rw``, and the messages of a failed start."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import tarfile
from pathlib import Path
from typing import List

import pytest
from conftest import Mounter, lazy_unmount, requires_fuse, run_ratarmount


def make_tar(path: Path) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
    return path


def tree(folder: Path) -> List[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    return make_tar(tmp_path / "A.tar")


def refused(*args: str) -> subprocess.CompletedProcess:
    """``ratarmount ARGS``, expected to fail; a mount it made all the same is undone."""
    result = run_ratarmount(*args)
    if result.returncode == 0:
        mountpoint = Path(args[-1]) if Path(args[-1]).is_dir() else Path(args[-1].rsplit(".tar", 1)[0])
        lazy_unmount(mountpoint)
    return result


def one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ratarmount: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("option", ["--index-folders", "--index-file", "--log-file"])
@pytest.mark.parametrize("mountpoint", ["given", "derived"])
def test_a_missing_folder_the_user_names_is_an_error_and_not_made(
    tmp_path: Path, archive: Path, option: str, mountpoint: str
) -> None:
    """``--index-folders /nonexistent`` made the folder and built the index there (a valid one
    beside the archive notwithstanding); ``--index-file nodir/x.sqlite`` made ``nodir``."""
    missing = tmp_path / "nonexistent"
    value = {"--index-folders": f",{missing}", "--index-file": f"{missing}/x.sqlite"}.get(option, f"{missing}/log")
    args = [option, value, str(archive)]
    if mountpoint == "given":
        (tmp_path / "mnt").mkdir()
        args.append(str(tmp_path / "mnt"))
    before = tree(tmp_path)
    line = one_line_error(refused(*args))
    assert str(missing) in line and "does not exist" in line
    assert tree(tmp_path) == before  # (no folder, no index, no mount point made)


@requires_fuse
def test_unmount_unmounts_every_mount_point_given(mounter: Mounter, archive: Path, tmp_path: Path) -> None:
    """``ratarmount -u mnt1 mnt2`` unmounted mnt1 only, and exited 0."""
    first, second = mounter.mount(archive), mounter.mount(archive)
    result = run_ratarmount("-u", str(first), str(second))
    assert result.returncode == 0, result.stderr
    assert not os.path.ismount(first) and not os.path.ismount(second)

    third = mounter.mount(archive)
    missing = tmp_path / "nonexistent"
    result = run_ratarmount("-u", str(first), str(third), str(missing))
    assert result.returncode != 0 and not os.path.ismount(third)
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"ratarmount: error: {first} is not a mount point",
        f"ratarmount: error: {missing} does not exist",
    ]


@pytest.mark.parametrize("options", ["rw", "allow_other,rw"])
def test_o_rw_is_refused(tmp_path: Path, archive: Path, options: str) -> None:
    """``-o rw`` mounted read-write; writes then failed with ENOSYS instead of EROFS."""
    (tmp_path / "mnt").mkdir()
    line = one_line_error(refused("-o", options, str(archive), str(tmp_path / "mnt")))
    assert "rw" in line and "read-only" in line
    assert not os.path.ismount(tmp_path / "mnt")


@requires_fuse
def test_writes_fail_with_erofs(mounter: Mounter, archive: Path) -> None:
    mnt = mounter.mount(archive)
    with pytest.raises(OSError) as caught:
        open(mnt / "new", "wb")
    assert caught.value.errno == errno.EROFS


def test_a_mount_point_that_cannot_be_created_says_so(tmp_path: Path) -> None:
    """``ratarmount ro/train.tar`` in a read-only folder said ".../ro/train: Read-only file
    system" without saying it was creating the mount point."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        archive = make_tar(folder / "train.tar")
        folder.chmod(0o555)
        try:
            line = one_line_error(run_ratarmount(str(archive)))
        finally:
            folder.chmod(0o755)
        assert f"cannot create the mount point {folder / 'train'}: Permission denied" in line
        return
    # Root writes into any folder: a file system mounted read-only, as in the review.
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {made.stderr.decode().strip()}")
    try:
        archive = make_tar(folder / "train.tar")
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        line = one_line_error(run_ratarmount(str(archive), "--index-folders", str(tmp_path)))
    finally:
        subprocess.run(["umount", str(folder)], check=True)
    assert line == f"ratarmount: error: cannot create the mount point {folder / 'train'}: Read-only file system"


def test_creating_the_mount_point_is_named_in_the_error(
    tmp_path: Path, archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratarmount import mount as mount_module
    from ratarmount.cli import build_parser, to_mount_options
    from ratarmountcore.errors import RatarmountError

    options = to_mount_options(build_parser().parse_args([str(archive)]), build_parser())

    def read_only(path: str) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(mount_module.os, "mkdir", read_only)
    with pytest.raises(RatarmountError) as caught:
        mount_module.mount(options)
    assert str(caught.value) == f"cannot create the mount point {tmp_path / 'A'}: Read-only file system"


def test_unmount_of_a_missing_path_says_it_does_not_exist(tmp_path: Path) -> None:
    line = one_line_error(run_ratarmount("-u", str(tmp_path / "nonexist")))
    assert line == f"ratarmount: error: {tmp_path / 'nonexist'} does not exist"


@requires_fuse
@pytest.mark.parametrize(
    ("first", "second", "said"),
    [
        (["-r"], [], "without -r"),
        ([], ["-r"], "with -r"),
        (["-r"], ["-r", "--strip-tar-extension"], "with --strip-tar-extension"),
    ],
)
def test_an_index_built_with_other_options_is_said_to_be_so(
    mounter: Mounter, tmp_path: Path, first: List[str], second: List[str], said: str
) -> None:
    """It said "Index ... does not match the archive (index was built with recursive='1', need
    '0')": the archive was the same."""
    inner = make_tar(tmp_path / "inner.tar")
    archive = tmp_path / "outer.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(inner, "inner.tar")
    mnt = mounter.mount(archive, extra=first)
    mounter.unmount(mnt)
    result = run_ratarmount(*second, str(archive), str(mnt))
    mounter.mounts.append(mnt)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "Index" in line]
    index = f"{archive}.index.sqlite"
    assert len(lines) == 1 and f"Index {index} was built with other options (" in lines[0], result.stderr
    assert f"now {said}); it will be rebuilt" in lines[0] and "does not match" not in lines[0]


@requires_fuse
def test_names_with_newlines_escapes_and_bytes_not_utf8_are_printed_on_one_line(tmp_path: Path) -> None:
    """A newline in a name split an error over two lines, an escape sequence reached the
    terminal, and bytes that are not UTF-8 were "?" from one command and "\\udcff" from the
    other (found by a review of bad input). Warnings about members likewise."""
    import sys

    path = tmp_path / "bad\n\x1b[31mname\udcff.tar"
    path.write_bytes(b"not an archive\n" * 100)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    convert = [sys.executable, "-m", "ratarmount.convert_cli", "--no-progress"]
    try:
        mounted = run_ratarmount(str(path), str(mnt), timeout=60)
    finally:
        lazy_unmount(mnt)
    converted = subprocess.run([*convert, str(path), str(tmp_path / "o.tar.zst")], capture_output=True, timeout=60)
    for result in (mounted.stderr.encode(), converted.stderr):
        assert result.count(b"\n") == 1 and b"\x1b" not in result, result
        assert b"/bad\\n\\x1b[31mname\\xff.tar: n" in result, result  # (not a tar / neither a tar ...)
    assert mounted.returncode == converted.returncode == 1

    archive = tmp_path / "links.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a\nb")
        info.type, info.linkname = tarfile.LNKTYPE, "missing\x1b[31m"
        tar.addfile(info)
    warned = subprocess.run([*convert, str(archive), str(tmp_path / "l.tar.zst")], capture_output=True, timeout=60)
    assert warned.returncode == 0 and warned.stderr.count(b"\n") == 1, warned.stderr
    assert b"/a\\nb to /missing\\x1b[31m cannot be made" in warned.stderr
