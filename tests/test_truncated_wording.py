"""A truncated compressed archive is called truncated, and a corrupt one corrupt, with every
backend: rapidgzip said "[IsalInflateWrapper][Thread ...] Decoding failed ..." for a .tar.gz and
"corrupt bzip2 data (End of file reached!)" for a .tar.bz2 whose end was cut off, and a zstd
file was "truncated (inside a block at byte 363282)" when it held 300,000 bytes."""

from __future__ import annotations

import io
import random
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import ratarmountcore
from ratarmountcore.errors import ArchiveError, CorruptDataError, TruncatedArchiveError
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

TOOLS = {
    "gz": ["gzip", "-k", "-f"],
    "bz2": ["bzip2", "-k", "-f"],
    "zst": ["zstd", "-q", "-f"],
    "xz": ["xz", "-k", "-f"],
}


@pytest.fixture(scope="module")
def plain_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~490 KB of half random, half repetitive members (compressed: ~120 KB)."""
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("plain") / "data.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(60):
            data = rng.randbytes(2000) + b"text " * rng.randint(100, 2000)
            info = tarfile.TarInfo(f"f{i}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def compressed(plain_tar: Path, tmp_path: Path, extension: str) -> bytes:
    if shutil.which(TOOLS[extension][0]) is None:
        pytest.skip(f"needs {TOOLS[extension][0]}")
    copy = tmp_path / "source" / "data.tar"
    copy.parent.mkdir()
    shutil.copyfile(plain_tar, copy)
    subprocess.run([*TOOLS[extension], str(copy)], check=True)
    return (copy.parent / f"data.tar.{extension}").read_bytes()


def failure(archive: Path, gzip_backend: str = "") -> BaseException:
    options = OpenOptions(
        index=IndexOptions(index_folders=("",), progress=False),
        compression=CompressionOptions(gzip_backend=gzip_backend or None),
    )
    with pytest.raises((ArchiveError, CorruptDataError)) as caught:
        with ratarmountcore.open(str(archive), options) as src:
            for name in src.listdir("/"):
                src.read(f"/{name}")
    return caught.value


KINDS = ["gz", "gz@indexed_gzip", "bz2", "zst", "xz"]


@pytest.mark.parametrize("cut", [99, 0.4])
@pytest.mark.parametrize("kind", KINDS)
def test_a_truncated_archive_is_called_truncated(plain_tar: Path, tmp_path: Path, kind: str, cut: float) -> None:
    """``head -c -99 data.tar.gz``, and a cut through the middle."""
    extension, _, backend = kind.partition("@")
    data = compressed(plain_tar, tmp_path, extension)
    archive = tmp_path / f"t.tar.{extension}"
    archive.write_bytes(data[:-99] if cut == 99 else data[: int(len(data) * cut)])
    error = failure(archive, backend)
    message = str(error)
    assert isinstance(error, TruncatedArchiveError), message
    assert message.startswith(f"{archive}: ") and "\n" not in message
    assert "truncated" in message and "corrupt" not in message, message
    assert "Thread" not in message and "End of file reached" not in message, message
    if extension == "gz":  # both backends in zlib's words (rapidgzip: "stops at byte 0")
        assert "the last member is incomplete" in message, message
    # Any byte position said is one in the file.
    for position in re.findall(r"byte (\d+)", message):
        assert int(position) < archive.stat().st_size, message


@pytest.mark.parametrize("cut", [0.3, 0.9])
def test_a_cut_through_stored_deflate_blocks_is_said_in_zlibs_words(tmp_path: Path, cut: float) -> None:
    """Incompressible members are stored blocks; rapidgzip's offsets then end at its last
    whole chunk, and the message said "the deflate stream stops at byte 0 of 30124"."""
    tar_path = tmp_path / "random.tar"
    with tarfile.open(tar_path, "w") as tar:
        data = random.Random(2).randbytes(100_000)
        info = tarfile.TarInfo("r.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(["gzip", "-k", "-f", str(tar_path)], check=True)
    whole = tar_path.with_suffix(".tar.gz").read_bytes()
    archive = tmp_path / "cut.tar.gz"
    archive.write_bytes(whole[: int(len(whole) * cut)])
    message = str(failure(archive))
    assert message == f"{archive}: gzip data is truncated (the last member is incomplete)", message


@pytest.mark.parametrize("kind", KINDS)
def test_a_corrupt_byte_is_still_called_corrupt(plain_tar: Path, tmp_path: Path, kind: str) -> None:
    extension, _, backend = kind.partition("@")
    raw = bytearray(compressed(plain_tar, tmp_path, extension))
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0x55
    archive = tmp_path / f"c.tar.{extension}"
    archive.write_bytes(bytes(raw))
    message = str(failure(archive, backend))
    assert "corrupt" in message and "truncated" not in message, message


def test_the_bzip2_end_marker_is_found_at_any_bit_offset() -> None:
    import bz2

    from ratarmountcore.compression.bzip2 import ends_with_end_marker

    for n in range(40):
        data = bz2.compress(bytes(range(n)) * n)
        assert ends_with_end_marker(data[-11:]) and not ends_with_end_marker(data[-12:-1])
