"""The first pass over a .tar.gz in a child process (``compression/scan_process.py``): the same
index and bytes as in-process, every failure of the child reported as the in-process decoder
would report it, nothing left behind, and a fall-back when the child cannot start."""

from __future__ import annotations

import bz2
import logging
import os
import random
import signal
import sqlite3
import stat
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Dict, Iterator

import pytest
from conftest import stderr_on_terminal, tar_bytes

import ratarmountcore
from ratarmountcore.compression import scan_process
from ratarmountcore.compression.gzip import RapidgzipReader
from ratarmountcore.convert import convert_to_seekable_zstd
from ratarmountcore.errors import CorruptDataError, RatarmountError, TruncatedArchiveError
from ratarmountcore.options import IndexOptions, OpenOptions

pytest.importorskip("rapidgzip")

CHILD_LOG = "first pass by rapidgzip in process"
OPTIONS = OpenOptions(index=IndexOptions(progress=False))


@pytest.fixture(autouse=True)
def child_for_every_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """Every .tar.gz goes through the child, and its temporary files into a folder of our own."""
    monkeypatch.setattr(RapidgzipReader, "scan_process_min", 0)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    yield temp
    assert list(temp.iterdir()) == [], "the child's temporary files were left behind"


def gzip_bytes(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


def sample_members(count: int = 400, seed: int = 5) -> Dict[str, bytes]:
    rng = random.Random(seed)
    members = {}
    for i in range(count):
        size = rng.choice([0, 1, 100, 511, 512, 513, 5000, 20000, 300_000 if i % 97 == 0 else 3000])
        members[f"d{i % 7}/f{i}.bin"] = rng.randbytes(size // 2) + bytes(size - size // 2)
    return members


def open_archive(path: Path) -> ratarmountcore.MountSource:
    return ratarmountcore.open(str(path), OPTIONS)


def read_all(source: ratarmountcore.MountSource, names: Iterator[str]) -> Dict[str, bytes]:
    out = {}
    for name in names:
        with source.open("/" + name) as file:
            out[name] = file.read()
    return out


def test_child_builds_the_index_and_every_byte_matches(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    members = sample_members()
    path = tmp_path / "a.tar.gz"
    path.write_bytes(gzip_bytes(tar_bytes(members)))
    with caplog.at_level(logging.DEBUG, logger="ratarmountcore.compression.scan_process"):
        with open_archive(path) as source:
            assert CHILD_LOG in caplog.text
            names = list(members)
            random.Random(1).shuffle(names)
            assert read_all(source, iter(names)) == {name: members[name] for name in names}
            assert source.stat("/d3/f3.bin").st_size == len(members["d3/f3.bin"])
    index = Path(str(path) + ".index.sqlite")
    with sqlite3.connect(index) as connection:
        (count,) = connection.execute("SELECT COUNT(*) FROM seek_points").fetchone()
    assert count > 0
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="ratarmountcore.compression.scan_process"):
        with open_archive(path) as source:  # the stored seek points: no child, same bytes
            assert read_all(source, iter(reversed(names))) == {name: members[name] for name in names}
    assert CHILD_LOG not in caplog.text


def test_child_and_in_process_pass_store_the_same_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = gzip_bytes(tar_bytes(sample_members(150, seed=9)))
    (tmp_path / "child.tar.gz").write_bytes(data)
    (tmp_path / "here.tar.gz").write_bytes(data)
    open_archive(tmp_path / "child.tar.gz").close()
    monkeypatch.setattr(RapidgzipReader, "scan_process_min", 1 << 62)
    open_archive(tmp_path / "here.tar.gz").close()

    def rows(name: str) -> list:
        with sqlite3.connect(tmp_path / (name + ".index.sqlite")) as connection:
            # Folders that exist only implicitly are dated by the build: leave their mtime out.
            query = "SELECT *, CASE WHEN offset_header < 0 THEN NULL ELSE mtime_ns END FROM files ORDER BY 1, 2"
            return [row[:6] + row[7:] for row in connection.execute(query).fetchall()]

    assert rows("child.tar.gz") == rows("here.tar.gz")


def test_recursive_inner_tar_is_read_through_the_child(tmp_path: Path) -> None:
    inner = tar_bytes({"x/inner.txt": b"inside" * 1000, "y.bin": bytes(range(256)) * 50})
    outer = {"pre.bin": os.urandom(70_000), "nested.tar": inner, "post.txt": b"after"}
    path = tmp_path / "r.tar.gz"
    path.write_bytes(gzip_bytes(tar_bytes(outer)))
    options = OpenOptions(index=IndexOptions(progress=False), recursive=True)
    with ratarmountcore.open(str(path), options) as source:
        assert sorted(source.listdir("/nested.tar")) == ["x", "y.bin"]
        with source.open("/nested.tar/x/inner.txt") as file:
            assert file.read() == b"inside" * 1000
        with source.open("/post.txt") as file:
            assert file.read() == b"after"


def corrupt_middle(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0x55
    return bytes(damaged)


def bad_crc(data: bytes) -> bytes:
    damaged = bytearray(data)
    damaged[-8] ^= 0xFF  # the CRC32 of the (only) member
    return bytes(damaged)


@pytest.mark.parametrize(
    ("damage", "error", "text"),
    [
        (corrupt_middle, RatarmountError, ""),
        (bad_crc, CorruptDataError, "incorrect data check"),
        (lambda data: data + b"garbage!" * 8, CorruptDataError, "corrupt gzip data"),
        (lambda data: data[: len(data) * 2 // 3], TruncatedArchiveError, "truncated"),
    ],
    ids=["corrupt-middle", "bad-crc", "trailing-garbage", "truncated"],
)
def test_child_failures_are_reported_and_leave_no_index(tmp_path: Path, damage, error, text) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bad.tar.gz"
    # Small members first, 1.8 MB of them: the sample of the first members (zlib, in this
    # process) does not reach the damage, the child meets it.
    rng = random.Random(2)
    members = {**{f"first/{i}": rng.randbytes(3000) for i in range(600)}, **sample_members(120, seed=3)}
    path.write_bytes(damage(gzip_bytes(tar_bytes(members))))
    with pytest.raises(error) as caught:
        open_archive(path).close()
    message = str(caught.value)
    assert message.startswith(str(path)) and text in message
    assert "Traceback" not in message and "\n" not in message
    assert not [p for p in tmp_path.iterdir() if "index" in p.name]


def test_concatenated_members_are_complete(tmp_path: Path) -> None:
    """Several gzip members: the last member's ISIZE is not the total, so the end is checked
    with one more pass, which must accept the file."""
    tar = tar_bytes(sample_members(80, seed=4))
    cut = len(tar) // 3
    path = tmp_path / "multi.tar.gz"
    path.write_bytes(gzip_bytes(tar[:cut]) + gzip_bytes(tar[cut:]))
    with open_archive(path) as source:
        with source.open("/d1/f1.bin") as file:
            assert file.read() == sample_members(80, seed=4)["d1/f1.bin"]


@pytest.mark.parametrize("how", ["missing", "exits-100", "frozen"])
def test_child_that_cannot_start_falls_back_to_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    if how == "missing":
        interpreter = str(tmp_path / "no-such-python")
    elif how == "frozen":  # a bundled application: its executable would run the application
        interpreter = sys.executable
        monkeypatch.setattr(sys, "frozen", True, raising=False)
    else:
        script = tmp_path / "fake-python"
        script.write_text("#!/bin/sh\nexit 100\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        interpreter = str(script)
    monkeypatch.setattr(sys, "executable", interpreter)
    members = sample_members(60, seed=8)
    path = tmp_path / "f.tar.gz"
    path.write_bytes(gzip_bytes(tar_bytes(members)))
    with caplog.at_level(logging.INFO):
        with open_archive(path) as source:
            assert read_all(source, iter(members)) == members
    assert "decoding in this process" in caplog.text


def test_conversion_reads_through_the_child(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    members = sample_members(200, seed=6)
    source = tmp_path / "in.tar.gz"
    source.write_bytes(gzip_bytes(tar_bytes(members)))
    out = tmp_path / "out.tar.zst"
    with caplog.at_level(logging.DEBUG, logger="ratarmountcore.compression.scan_process"):
        convert_to_seekable_zstd(str(source), str(out), frame_size=256 * 1024, options=OPTIONS)
    assert CHILD_LOG in caplog.text
    with ratarmountcore.open(str(out), OPTIONS) as converted:
        assert read_all(converted, iter(members)) == members


@pytest.mark.parametrize(
    ("damage", "error"),
    [(bad_crc, CorruptDataError), (lambda data: data[: len(data) * 2 // 3], TruncatedArchiveError)],
    ids=["bad-crc", "truncated"],
)
def test_conversion_of_a_damaged_stream_fails_and_writes_nothing(tmp_path: Path, damage, error) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(7)
    members = {**{f"first/{i}": rng.randbytes(3000) for i in range(600)}, **sample_members(100, seed=7)}
    source = tmp_path / "in.tar.gz"
    source.write_bytes(damage(gzip_bytes(tar_bytes(members))))
    with pytest.raises(error):
        convert_to_seekable_zstd(str(source), str(tmp_path / "out.tar.zst"), options=OPTIONS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.tar.gz", "tmp"]


def test_a_killed_child_is_not_reported_as_corrupt_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = scan_process.DecoderProcess.__init__

    def start_then_kill(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        original(self, *args, **kwargs)
        os.kill(self._child.pid, signal.SIGKILL)

    monkeypatch.setattr(scan_process.DecoderProcess, "__init__", start_then_kill)
    path = tmp_path / "k.tar.gz"
    path.write_bytes(gzip_bytes(tar_bytes(sample_members(100, seed=12))))
    with pytest.raises(RatarmountError) as caught:
        open_archive(path).close()
    assert not isinstance(caught.value, CorruptDataError)
    assert "killed by SIGKILL" in str(caught.value) and str(caught.value).startswith(str(path))
    assert not [p for p in tmp_path.iterdir() if "index" in p.name]


def test_the_child_ignores_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group; only the parent may act on it."""
    data = tar_bytes(sample_members(300, seed=13))
    path = tmp_path / "c.gz"
    path.write_bytes(gzip_bytes(data))
    fd = os.open(path, os.O_RDONLY)
    process = scan_process.DecoderProcess(str(path), fd, 1, 512 * 1024)
    try:
        first = bytearray(1000)
        assert process.readinto(memoryview(first)) == 1000  # the child is decoding by now
        os.kill(process._child.pid, signal.SIGINT)  # type: ignore[union-attr]
        size, payload = process.finish()
        assert size == len(data) and payload
    finally:
        process.close()
        os.close(fd)


def test_no_memfd_means_decoding_in_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object) -> int:
        raise PermissionError(1, "Operation not permitted")  # e.g. a seccomp filter

    monkeypatch.setattr(os, "memfd_create", refuse)
    members = sample_members(50, seed=14)
    path = tmp_path / "m.tar.gz"
    path.write_bytes(gzip_bytes(tar_bytes(members)))
    with open_archive(path) as source:
        assert read_all(source, iter(members)) == members


def progress_output(code: str) -> str:
    """stderr of ``python -c code`` on a terminal."""
    status, text = stderr_on_terminal([sys.executable, "-c", code])
    assert status == 0, text
    return text


@pytest.mark.parametrize("child", [True, False], ids=["child", "in-process"])
def test_progress_of_a_tar_gz_is_a_share_of_the_compressed_file(tmp_path: Path, child: bool) -> None:
    path = tmp_path / "p.tar.gz"
    path.write_bytes(gzip_bytes(tar_bytes({f"d{i % 10}/f{i}": b"x" * (i % 50) for i in range(3000)})))
    code = (
        "import ratarmountcore\n"
        "from ratarmountcore.compression.gzip import RapidgzipReader\n"
        f"RapidgzipReader.scan_process_min = {0 if child else 1 << 62}\n"
        f"ratarmountcore.open({str(path)!r}).close()\n"
    )
    text = progress_output(code)
    assert "Indexing" in text and "members" in text and "%" in text, text


def test_progress_of_a_tar_bz2_shows_what_was_decoded(tmp_path: Path) -> None:
    """rapidgzip's bzip2 reader reads the whole file early: no share of it is shown."""
    path = tmp_path / "p.tar.bz2"
    path.write_bytes(bz2.compress(tar_bytes({f"d{i % 10}/f{i}": b"y" * (i % 50) for i in range(3000)})))
    text = progress_output(f"import ratarmountcore\nratarmountcore.open({str(path)!r}).close()\n")
    assert "Indexing" in text and "members" in text and "%" not in text, text


@pytest.mark.parametrize("suffix", ["gz", "bz2"])
def test_conversion_progress(tmp_path: Path, suffix: str) -> None:
    """A share of the input for .gz (bytes read), the decoded bytes for .bz2; no member count."""
    data = tar_bytes({f"d{i % 10}/f{i}": bytes([i % 251]) * (i % 700) for i in range(3000)})
    path = tmp_path / f"p.tar.{suffix}"
    path.write_bytes(gzip_bytes(data) if suffix == "gz" else bz2.compress(data))
    out = tmp_path / "out.tar.zst"
    code = (
        "from ratarmountcore.convert import convert_to_seekable_zstd\n"
        f"convert_to_seekable_zstd({str(path)!r}, {str(out)!r})\n"
    )
    text = progress_output(code)
    assert "Converting" in text and "members" not in text, text
    assert ("%" in text) is (suffix == "gz"), text
