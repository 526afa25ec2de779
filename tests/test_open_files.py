"""A union of more archives than the soft open-file limit allows (io/descriptors.py).

Every archive holds about two descriptors (the archive, a connection to its index): a union of
ImageNet's 1,000 class tars needs more than the 1,024 most distributions allow by default. The
mount raises its soft limit to the hard one; where the hard limit is too low as well, the error
says so in one line instead of blaming the index location.
"""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path
from typing import Callable, List

import pytest
from conftest import Mounter, no_descriptor_left, requires_fuse, run_ratarmount, tar_bytes

#: Archives in the union; the limits below allow fewer than two descriptors per archive.
ARCHIVES = 60
LIMIT = 64


def many_tars(folder: Path) -> List[Path]:
    paths = []
    for i in range(ARCHIVES):
        path = folder / f"class{i:03d}.tar"
        path.write_bytes(tar_bytes({f"n{i:03d}/image{j}.JPEG": f"{i}-{j}".encode() for j in range(2)}))
        paths.append(path)
    return paths


def limit_to(soft: int, hard: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


@requires_fuse
def test_union_of_more_archives_than_the_soft_limit_mounts(tmp_path: Path, mounter: Mounter) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4 * ARCHIVES:
        pytest.skip(f"the hard open-file limit ({hard}) is too low to raise the soft one")
    archives = many_tars(tmp_path)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    mounter.mounts.append(mountpoint)
    result = run_ratarmount(*map(str, archives), str(mountpoint), preexec_fn=limit_to(LIMIT, hard))
    assert result.returncode == 0, result.stderr
    assert len(os.listdir(mountpoint)) == ARCHIVES
    for i in (0, ARCHIVES // 2, ARCHIVES - 1):
        assert (mountpoint / f"n{i:03d}" / "image1.JPEG").read_bytes() == f"{i}-1".encode()
    mounter.unmount(mountpoint)


@requires_fuse
def test_too_low_a_hard_limit_is_named_as_the_cause(tmp_path: Path) -> None:
    archives = many_tars(tmp_path)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = run_ratarmount(*map(str, archives), str(mountpoint), preexec_fn=limit_to(LIMIT, LIMIT))
    assert result.returncode != 0
    assert not os.path.ismount(mountpoint)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "too many open files" in lines[0] and f"may open {LIMIT}" in lines[0] and "ulimit -n" in lines[0]
    assert "class0" in lines[0]  # names the archive it was opening
    # No index half-written: the ones written are complete and usable on the next mount.
    names = {a.name for a in archives} | {a.name + ".index.sqlite" for a in archives} | {"mnt"}
    assert [p.name for p in tmp_path.iterdir() if p.name not in names] == []


#: A hard limit that holds a descriptor per archive, but not a second one for each index.
ONE_EACH = 144


@requires_fuse
@pytest.mark.parametrize("folder", [False, True])
def test_indexes_share_what_descriptors_the_archives_leave(tmp_path: Path, mounter: Mounter, folder: bool) -> None:
    """Idle index connections are closed as descriptors run short (``pool.make_room``): 60
    archives mount and read under a hard limit of 144, where a connection kept open for each
    (60 + 60, and the 32 the session keeps free) did not fit."""
    root = tmp_path / "train"
    root.mkdir()
    archives = many_tars(root)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    mounter.mounts.append(mountpoint)
    sources = ["-r", str(root)] if folder else [str(a) for a in archives]
    result = run_ratarmount(*sources, str(mountpoint), preexec_fn=limit_to(ONE_EACH, ONE_EACH))
    assert result.returncode == 0, result.stderr
    for i in range(ARCHIVES):
        inner = f"class{i:03d}.tar/n{i:03d}" if folder else f"n{i:03d}"
        for j in range(2):
            assert (mountpoint / inner / f"image{j}.JPEG").read_bytes() == f"{i}-{j}".encode()
    mounter.unmount(mountpoint)


def class_folder(folder: Path) -> Path:
    """A folder of class tars, as ImageNet's train tar extracts to."""
    folder.mkdir()
    many_tars(folder)
    return folder


@requires_fuse
def test_folder_of_more_archives_than_the_hard_limit_is_named_as_the_cause(tmp_path: Path) -> None:
    folder = class_folder(tmp_path / "train")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    result = run_ratarmount("-r", str(folder), str(mountpoint), preexec_fn=limit_to(LIMIT, LIMIT))
    assert result.returncode != 0
    assert not os.path.ismount(mountpoint)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "too many open files" in lines[0] and f"may open {LIMIT}" in lines[0] and "ulimit -n" in lines[0]
    assert str(folder) in lines[0]  # names what it was opening


@requires_fuse
def test_lazy_folder_out_of_descriptors_says_so_and_never_answers_wrong(tmp_path: Path, mounter: Mounter) -> None:
    """Opened on first use (``--lazy``), the archives run the process out of descriptors while
    it serves. Each read then gives the right bytes or EMFILE: never "no such file", and an
    archive is never shown as the plain file it would be if it could not be opened as one."""
    folder = class_folder(tmp_path / "train")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    mounter.mounts.append(mountpoint)
    result = run_ratarmount("--lazy", "-r", str(folder), str(mountpoint), preexec_fn=limit_to(LIMIT, LIMIT))
    assert result.returncode == 0, result.stderr
    read, exhausted = 0, 0
    for i in range(ARCHIVES):
        try:
            data = (mountpoint / f"class{i:03d}.tar" / f"n{i:03d}" / "image1.JPEG").read_bytes()
        except OSError as exc:
            assert exc.errno == errno.EMFILE, exc
            exhausted += 1
        else:
            assert data == f"{i}-1".encode()
            read += 1
    assert read > 0 and exhausted > 0, (read, exhausted)
    for i in range(ARCHIVES):
        try:
            assert (mountpoint / f"class{i:03d}.tar").is_dir()
        except OSError as exc:
            assert exc.errno == errno.EMFILE, exc
    mounter.unmount(mountpoint)


def test_a_folder_source_out_of_descriptors_raises_instead_of_not_found(tmp_path: Path) -> None:
    """In-process: a path of the folder looked up with no descriptor left is an error, not a
    missing file, and a folder listed then is not an empty one."""
    import ratarmountcore
    from ratarmountcore.errors import TooManyOpenFilesError

    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "file.txt").write_bytes(b"x")
    source = ratarmountcore.open(str(folder))
    assert source.lookup("/sub/file.txt") is not None
    with no_descriptor_left():
        with pytest.raises(TooManyOpenFilesError, match="too many open files"):
            source.lookup("/sub/file.txt")
        with pytest.raises(TooManyOpenFilesError):
            source.list_entries("/sub")
    assert source.lookup("/sub/file.txt") is not None
    source.close()


def test_a_decoder_that_cannot_open_its_file_is_no_corrupt_data(tmp_path: Path) -> None:
    """rapidgzip opens the archive anew for each decoder and says a failed open as an error of
    the data: reads of an intact .tar.gz were EIO with "corrupt gzip data" in the log while the
    process was out of descriptors. Now the error says what it is, and the next read succeeds."""
    import gzip
    import random

    import ratarmountcore
    from ratarmountcore.errors import CorruptDataError, TooManyOpenFilesError

    rng = random.Random(5)
    files = {f"d/f{i}": rng.randbytes(5 << 20) for i in range(3)}  # (read whole, 4 MiB or more: a parallel decoder)
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(gzip.compress(tar_bytes(files), 1))
    ratarmountcore.open(str(archive)).close()  # (the index; its decoders go with it)
    source = ratarmountcore.open(str(archive))
    try:
        info = source.lookup("/d/f1")
        assert info is not None
        buffer = bytearray(info.size)
        with no_descriptor_left():
            try:
                source.read_into(info, 0, memoryview(buffer))
            except CorruptDataError as exc:
                pytest.fail(f"an intact archive reported corrupt: {exc}")
            except TooManyOpenFilesError as exc:
                assert "a.tar.gz: too many open files" in str(exc)
            else:
                pytest.fail("read without a descriptor to open a decoder with")
        assert source.read_into(info, 0, memoryview(buffer)) == len(buffer) and bytes(buffer) == files["d/f1"]
    finally:
        source.close()


def test_scarce_counts_the_descriptors_left_below_the_soft_limit() -> None:
    from ratarmountcore.io.descriptors import scarce

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    probe = os.open(os.devnull, os.O_RDONLY)
    os.close(probe)
    resource.setrlimit(resource.RLIMIT_NOFILE, (probe + 10, hard))
    try:
        assert scarce(10, 1 << 20) and scarce(12, 1 << 20)
        assert not scarce(8, 1 << 20)
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(4)]  # 6 left now
        try:
            assert scarce(6, 1 << 20) and not scarce(4, 1 << 20)
        finally:
            for fd in held:
                os.close(fd)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
