"""Headers that are legal but unusual, or malformed in ways GNU tar notices: what they hold must be
what GNU tar reads, and a field GNU tar rejects must not be read as some other number."""

from __future__ import annotations

import gzip
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import Mounter
from tarcompare import FRESH, check_archive_against_tar

import ratarmountcore
from ratarmountcore.errors import CorruptHeaderError, RatarmountError

BLOCK = 512


def _checksummed(header: bytearray) -> bytes:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


def _member(name: str, data: bytes, fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_000_000
    return info.tobuf(format=fmt) + data.ljust(-(-len(data) // BLOCK) * BLOCK, b"\0")


def test_a_sparse_member_without_extents_reads_as_zeros(tmp_path: Path) -> None:
    """An old GNU sparse member whose map lists no extent is all hole: reading it must give
    zeros, not the bytes that follow its header (the next member's header and data)."""
    header = bytearray(BLOCK)
    header[0:6] = b"sparse"
    header[100:108] = b"0000644\0"
    header[108:116] = header[116:124] = b"0000000\0"
    header[124:136] = b"%011o\0" % 0  # nothing stored
    header[136:148] = b"%011o\0" % 1000
    header[156:157] = b"S"
    header[257:265] = b"ustar  \0"
    header[483:495] = b"%011o\0" % 1024  # the file's size: 1,024 bytes of hole
    secret = b"next member " * 60
    archive = tmp_path / "sparse.tar"
    archive.write_bytes(_checksummed(header) + _member("secret.txt", secret, tarfile.GNU_FORMAT) + bytes(2 * BLOCK))
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert src.stat("/sparse").st_size == 1024
        with src.open("/sparse") as f:
            assert f.read() == bytes(1024)
            member = f.raw  # (the reads FUSE makes)
            view = memoryview(bytearray(1100))
            assert member.preadinto(0, view) == 1024
            assert bytes(view[:1024]) == bytes(1024)
            assert member.pread(1000, 100) == bytes(24)
        with src.open("/secret.txt") as f:
            assert f.read() == secret


@pytest.mark.parametrize("typeflag", [tarfile.DIRTYPE, tarfile.LNKTYPE])
def test_a_size_on_a_folder_or_hard_link_header_is_not_data(tmp_path: Path, typeflag: bytes) -> None:
    """GNU tar and Python's tarfile read the block after a folder's or hard link's header as the
    next header, whatever its size field says: a member stored there is a member."""
    target = _member("target", b"T")
    info = tarfile.TarInfo("m")
    info.type = typeflag
    info.linkname = "target" if typeflag == tarfile.LNKTYPE else ""
    info.mtime = 1_000_000
    hidden = _member("inner", b"smuggled")
    header = bytearray(info.tobuf(format=tarfile.USTAR_FORMAT))
    header[124:136] = b"%011o\0" % len(hidden)
    archive = tmp_path / "sized.tar"
    archive.write_bytes(target + _checksummed(header) + hidden + bytes(2 * BLOCK))
    with tarfile.open(archive) as tar:
        assert "inner" in tar.getnames()
    check_archive_against_tar(archive, tmp_path)
    with ratarmountcore.open(str(archive), FRESH) as src:
        with src.open("/inner") as f:
            assert f.read() == b"smuggled"


@pytest.mark.parametrize("typeflag", [b"0", b"\0", b"7"])
@pytest.mark.parametrize("fmt", ["ustar", "gnu", "v7"])
def test_a_file_header_named_with_a_trailing_slash_is_a_folder_without_data(
    tmp_path: Path, typeflag: bytes, fmt: str
) -> None:
    """``tar -x`` makes a "regular file" named ``d/`` a folder, and reads the block after its
    header as the next header whatever its size says (``tar -t`` skips the size: extraction is
    what counts). Skipping it hid the member stored there."""
    header = bytearray(BLOCK)
    header[0:2] = b"d/"
    header[100:108] = b"0000755\0"
    header[108:116] = header[116:124] = b"0000000\0"
    header[136:148] = b"%011o\0" % 1_000_000
    header[156:157] = typeflag
    if fmt == "ustar":
        header[257:265] = b"ustar\x0000"
    elif fmt == "gnu":
        header[257:265] = b"ustar  \0"
    hidden = _member("hidden", b"smuggled")
    header[124:136] = b"%011o\0" % len(hidden)
    archive = tmp_path / "slash.tar"
    archive.write_bytes(_checksummed(header) + hidden + _member("b", b"two") + bytes(2 * BLOCK))
    extracted = check_archive_against_tar(archive, tmp_path)
    assert {"/d", "/hidden", "/b"} <= set(extracted)
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert src.stat("/d").st_mode & 0o170000 == 0o040000
        with src.open("/hidden") as f:
            assert f.read() == b"smuggled"
    # Its "data" a zero block: tar -x takes it for the end ("A lone zero block"), as must we.
    one_byte = _checksummed(header[:124] + b"%011o\0" % 1 + header[136:])
    archive.write_bytes(one_byte + bytes(BLOCK) + _member("b", b"two"))
    extracted = check_archive_against_tar(archive, tmp_path / "zero", tar_status=(0, 2))
    assert "/b" not in extracted


def _base256(value: int) -> bytes:
    return bytes([0x80]) + value.to_bytes(7, "big")


def test_owner_ids_tar_cannot_set_are_root_as_after_tar_x(tmp_path: Path, mounter: Mounter) -> None:
    """A uid or gid beyond uid_t (base-256), or (uid_t)-1 (which chown(2) reads as "unchanged"):
    ``tar -x`` as root warns and leaves the file root's. The mount answered lstat of the first
    with EIO, and showed 65534 for the second."""
    members = b""
    for name, uid, gid in (("a", 2**40, 2**31), ("b", 2**32, 5), ("c", 7, 2**32 - 1)):
        header = bytearray(tarfile.TarInfo(name).tobuf(format=tarfile.GNU_FORMAT))
        header[108:116] = _base256(uid)
        header[116:124] = _base256(gid)
        header[124:136] = b"%011o\0" % 1
        members += _checksummed(header) + name.encode().ljust(BLOCK, b"\0")
    info = tarfile.TarInfo("d")
    info.size = 1
    info.pax_headers = {"uid": str(2**32 - 1), "gid": str(2**32 - 1)}
    members += info.tobuf(format=tarfile.PAX_FORMAT) + b"d".ljust(BLOCK, b"\0")
    archive = tmp_path / "owners.tar"
    archive.write_bytes(members + bytes(2 * BLOCK))
    extracted = check_archive_against_tar(archive, tmp_path, extract_args=["--same-owner"], tar_status=(0, 2))
    wanted = {"/a": (0, 2**31), "/b": (0, 5), "/c": (7, 0), "/d": (0, 0)}
    assert {path: (extracted[path].uid, extracted[path].gid) for path in wanted} == wanted
    mountpoint = mounter.mount(archive, extra=["--index-file", str(tmp_path / "owners.index.sqlite")])
    for path, (uid, gid) in wanted.items():
        st = os.lstat(str(mountpoint) + path)
        assert (st.st_uid, st.st_gid) == (uid, gid), path


@pytest.mark.parametrize("field", [b"0o3", b"1_1", b"+3", b"-3", b"3x"])
def test_number_fields_gnu_tar_rejects_are_errors(tmp_path: Path, field: bytes) -> None:
    """Python's ``int(text, 8)`` reads "0o3" and "1_1" as numbers; GNU tar rejects them (and
    reads "+3" as an obsolete base-64 encoding no tar writes today): a clear error, never a size
    guessed from them."""
    header = bytearray(tarfile.TarInfo("f").tobuf(format=tarfile.USTAR_FORMAT))
    header[124:136] = field.ljust(12, b"\0")
    archive = tmp_path / "octal.tar"
    archive.write_bytes(_checksummed(header) + b"abc".ljust(BLOCK, b"\0") + bytes(2 * BLOCK))
    with pytest.raises(CorruptHeaderError, match="invalid size field"):
        ratarmountcore.open(str(archive), FRESH)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["octal.tar"]  # no index left behind


@pytest.mark.parametrize(
    ("field", "size"), [(b"  3 \0", 3), (b"00000000003\0", 3), (b"3 7\0", 3), (b"\0" * 12, 0), (b" " * 12, 0)]
)
def test_number_fields_gnu_tar_accepts(tmp_path: Path, field: bytes, size: int) -> None:
    """Leading spaces, and a space or NUL after the digits (what follows it is ignored), as GNU
    tar reads them. An empty field is read as zero (GNU tar calls it an error)."""
    header = bytearray(tarfile.TarInfo("f").tobuf(format=tarfile.USTAR_FORMAT))
    header[124:136] = field.ljust(12, b"\0")
    archive = tmp_path / "octal.tar"
    data = b"abc".ljust(BLOCK, b"\0") if size else b""
    archive.write_bytes(_checksummed(header) + data + bytes(2 * BLOCK))
    if size:
        check_archive_against_tar(archive, tmp_path)
    with ratarmountcore.open(str(archive), FRESH) as src:
        assert src.stat("/f").st_size == size


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize(("size", "error"), [(1 << 62, "claims"), (8 << 20, "ends inside an extended header")])
def test_an_extended_header_larger_than_the_archive_is_an_error(
    tmp_path: Path, compressed: bool, size: int, error: str
) -> None:
    """A long-name header whose (base-256) size field claims far more than the archive holds:
    a one-line error and no index, without allocating what it claims (it raised MemoryError)."""
    header = bytearray(tarfile.TarInfo("././@LongLink").tobuf(tarfile.GNU_FORMAT)[:BLOCK])
    header[156:157] = b"L"
    header[124:136] = b"\x80" + size.to_bytes(11, "big")
    raw = _checksummed(header) + b"n" * 150 + bytes(BLOCK - 150) + bytes(2 * BLOCK)
    archive = tmp_path / ("huge.tar.gz" if compressed else "huge.tar")
    archive.write_bytes(gzip.compress(raw) if compressed else raw)
    with pytest.raises(RatarmountError, match=error) as caught:
        ratarmountcore.open(str(archive), FRESH)
    assert str(caught.value).startswith(str(archive)) and "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.name]  # no index left behind


def test_a_sparse_map_with_a_damaged_number_is_an_error(tmp_path: Path) -> None:
    """A pax 1.0 sparse map (decimal lines at the start of the member's data) with a newline
    turned into a NUL: GNU tar reports an overflow; we a one-line error (it was a ValueError
    traceback) and no index."""
    folder = tmp_path / "src"
    folder.mkdir()
    with open(folder / "s.bin", "wb") as f:
        f.truncate(2 << 20)
        f.seek(1 << 20)
        f.write(b"data" * 100)
    archive = tmp_path / "sparse.tar"
    subprocess.run(
        ["tar", "--sparse", "--sparse-version=1.0", "--format=posix", "-cf", str(archive), "-C", str(folder), "s.bin"],
        check=True,
    )
    raw = bytearray(archive.read_bytes())
    start = raw.index(b"2\n1048576\n")  # the map: 2 extents, their offsets and sizes
    raw[start + len(b"2\n1048576\n4096")] = 0
    archive.write_bytes(bytes(raw))
    assert subprocess.run(["tar", "-tf", str(archive)], capture_output=True).returncode == 2
    with pytest.raises(CorruptHeaderError, match="invalid sparse map") as caught:
        ratarmountcore.open(str(archive), FRESH)
    assert str(caught.value).startswith(str(archive))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sparse.tar", "src"]  # no index left behind


_SPARSE_01 = {"GNU.sparse.major": "0", "GNU.sparse.minor": "1", "GNU.sparse.name": "sp", "GNU.sparse.size": "100"}
_SPARSE_00 = {"GNU.sparse.size": "100", "GNU.sparse.offset": "0", "GNU.sparse.numbytes": "100"}


@pytest.mark.parametrize(
    ("pax", "data", "error"),
    [
        ({**_SPARSE_01, "GNU.sparse.map": "0,x"}, b"x" * 100, "invalid sparse map"),
        ({**_SPARSE_00, "GNU.sparse.offset": "abc"}, b"x" * 100, "invalid sparse map"),
        ({**_SPARSE_01, "GNU.sparse.map": f"{2**63},100"}, b"x" * 100, "out of range"),
        ({**_SPARSE_00, "GNU.sparse.size": "-1"}, b"x" * 100, "out of range"),
        (
            {
                "GNU.sparse.major": "1",
                "GNU.sparse.minor": "0",
                "GNU.sparse.name": "sp",
                "GNU.sparse.realsize": str(2**64),
            },
            b"1\n0\n100\n".ljust(BLOCK, b"\0") + b"x" * 100,
            "out of range",
        ),
        ({**_SPARSE_01, "GNU.sparse.map": "0,30000"}, b"x" * 100, "the member stores 100"),
    ],
)
def test_sparse_numbers_out_of_range_are_errors(tmp_path: Path, pax: dict, data: bytes, error: str) -> None:  # type: ignore[type-arg]
    """Sparse headers whose numbers are not numbers, do not fit ``off_t``, or whose map needs
    more data than the member stores (GNU tar reports each as malformed): a one-line error and
    no index. They were ValueError or OverflowError tracebacks, a negative size, or reads that
    took the bytes of the next members."""
    archive = tmp_path / "sparse.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("GNUSparseFile.0/sp")
        info.pax_headers = pax
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        tar.addfile(tarfile.TarInfo("after"), io.BytesIO(b""))
    assert subprocess.run(["tar", "-xf", str(archive), "-C", str(tmp_path), "-O"], capture_output=True).returncode != 0
    with pytest.raises(CorruptHeaderError, match=error) as caught:
        ratarmountcore.open(str(archive), FRESH)
    assert str(caught.value).startswith(str(archive)) and "\n" not in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sparse.tar"]


def test_a_member_size_beyond_off_t_is_an_error(tmp_path: Path) -> None:
    header = bytearray(tarfile.TarInfo("f").tobuf(tarfile.GNU_FORMAT))
    header[124:136] = b"\x80\x00\x00" + (2**64).to_bytes(9, "big")  # base-256
    archive = tmp_path / "huge.tar"
    archive.write_bytes(_checksummed(header) + b"a".ljust(BLOCK, b"\0") + bytes(2 * BLOCK))
    with pytest.raises(CorruptHeaderError, match="out of range"):
        ratarmountcore.open(str(archive), FRESH)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge.tar"]
