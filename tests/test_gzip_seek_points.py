"""gzip seek points: the default spacing, reuse of indexes built with another spacing, and the
thinned seek points of the parallel decoders."""

from __future__ import annotations

import io
import random
import tarfile
import zlib
from pathlib import Path
from typing import List, Sequence

import pytest

import ratarmountcore
from ratarmountcore.compression import deflate_resume
from ratarmountcore.compression import gzip as gzip_backend
from ratarmountcore.compression.gzip import RapidgzipReader, thin_gztool_index
from ratarmountcore.cores import default_decoder_threads
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

rapidgzip = pytest.importorskip("rapidgzip")


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A .tar.gz of ~3 MB, mostly incompressible, so that 64 KiB spacing gives ~40 seek points."""
    rng = random.Random(11)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(60):
            data = rng.randbytes(rng.randrange(10_000, 90_000)) + bytes(rng.randrange(0, 20_000))
            if i == 30:
                data = rng.randbytes(700_000)  # larger than DIRECT_READ_MIN: read by a parallel decoder
            info = tarfile.TarInfo(f"d{i % 4}/f{i}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path = tmp_path_factory.mktemp("gz") / "a.tar.gz"
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    path.write_bytes(compressor.compress(buffer.getvalue()) + compressor.flush())
    return path


def members(path: Path) -> dict:
    with tarfile.open(path) as tar:
        return {"/" + m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def exported_index(path: Path, spacing: int) -> bytes:
    with rapidgzip.RapidgzipFile(str(path), parallelization=2, chunk_size=spacing) as decoder:
        decoder.seek(0, io.SEEK_END)
        out = io.BytesIO()
        decoder.export_index(out, rapidgzip.IndexFormat.GZTOOL)
        return out.getvalue()


def test_thinned_index_keeps_far_apart_points_and_decodes_the_same(archive: Path) -> None:
    full = exported_index(archive, 64 * 1024)
    thin = thin_gztool_index(full, 256 * 1024)
    assert len(thin) < len(full)
    plain = gzip_decompress(archive)
    counts: List[int] = []
    for payload in (full, thin):
        with rapidgzip.RapidgzipFile(str(archive), parallelization=2, chunk_size=64 * 1024) as decoder:
            decoder.import_index(io.BytesIO(payload))
            offsets = sorted(decoder.block_offsets())  # compressed bit offsets of the seek points
            counts.append(len(offsets))
            if payload is thin:  # (the last offset is the end of the data)
                assert all(b - a >= 256 * 1024 * 8 for a, b in zip(offsets[:-2], offsets[1:-1]))
            assert decoder.read() == plain
            rng = random.Random(3)
            for _ in range(30):
                offset = rng.randrange(len(plain))
                decoder.seek(offset)
                assert decoder.read(5000) == plain[offset : offset + 5000]
    assert counts[1] < counts[0] and counts[1] >= 2


def gzip_decompress(path: Path) -> bytes:
    return zlib.decompress(path.read_bytes(), 31)


@pytest.mark.parametrize("payload", [b"", b"garbage" * 10, bytes(8) + b"gzipindX" + bytes(40)])
def test_thinning_leaves_anything_unexpected_alone(payload: bytes) -> None:
    assert thin_gztool_index(payload, 1 << 20) is payload


@pytest.mark.parametrize("isal", [False, True])
def test_parallel_decoders_get_thinned_seek_points_span_decoders_all(
    archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isal: bool
) -> None:
    copy = tmp_path / archive.name
    copy.write_bytes(archive.read_bytes())
    spacing = CompressionOptions(gzip_backend="rapidgzip", seek_point_spacing=64 * 1024, parallelization=2)
    opts = OpenOptions(index=IndexOptions(progress=False), compression=spacing)
    ratarmountcore.open(str(copy), opts).close()
    monkeypatch.setattr(gzip_backend, "PARALLEL_CHUNK", 256 * 1024)
    if not isal:  # (with python-isal, span-cache misses are decoded without a span decoder)
        monkeypatch.setattr(deflate_resume, "_isal_zlib", lambda: None)
    loaded: List[int] = []
    original = RapidgzipReader._load_seek_points

    def recording(self: RapidgzipReader, decoder, payload: bytes):  # type: ignore[no-untyped-def]
        loaded.append(len(payload))
        return original(self, decoder, payload)

    monkeypatch.setattr(RapidgzipReader, "_load_seek_points", recording)
    expected = members(copy)
    with ratarmountcore.open(str(copy), opts) as src:
        name, data = max(expected.items(), key=lambda item: len(item[1]))
        member = src.open_info(src.info(name))
        small = memoryview(bytearray(100))
        assert member.preadinto(500, small) == 100 and bytes(small) == data[500:600]  # a span decoder
        large = memoryview(bytearray(len(data) - 600))  # (going on from the small read: in order)
        assert member.preadinto(600, large) == len(data) - 600 and bytes(large) == data[600:]  # a parallel one
        for path, content in expected.items():
            assert src.read(path) == content
    assert len(set(loaded)) == (1 if isal else 2), loaded  # the full and the thinned set (or that alone)


def test_an_index_built_with_another_spacing_is_used_unless_a_spacing_is_asked_for(
    archive: Path, tmp_path: Path
) -> None:
    copy = tmp_path / archive.name
    copy.write_bytes(archive.read_bytes())
    index = tmp_path / (archive.name + ".index.sqlite")

    def options(spacing=None) -> OpenOptions:  # type: ignore[no-untyped-def]
        compression = CompressionOptions(gzip_backend="rapidgzip", seek_point_spacing=spacing)
        return OpenOptions(index=IndexOptions(progress=False), compression=compression)

    ratarmountcore.open(str(copy), options(128 * 1024)).close()
    built = index.stat().st_ino
    with ratarmountcore.open(str(copy), options()) as src:  # the default: any spacing will do
        assert src.read("/d0/f0.bin") == members(copy)["/d0/f0.bin"]
    assert index.stat().st_ino == built
    ratarmountcore.open(str(copy), options(128 * 1024)).close()  # the same, asked for
    assert index.stat().st_ino == built
    ratarmountcore.open(str(copy), options(256 * 1024)).close()  # another, asked for: rebuilt
    assert index.stat().st_ino != built


def _tar_gz(path: Path, sizes: List[int]) -> Path:
    rng = random.Random(len(sizes))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i, size in enumerate(sizes):
            info = tarfile.TarInfo(f"folder/ä-long-name-{'x' * 120}-{i}")
            info.size = size
            tar.addfile(info, io.BytesIO(rng.randbytes(size)))
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    path.write_bytes(compressor.compress(buffer.getvalue()) + compressor.flush())
    return path


@pytest.mark.parametrize(
    ("sizes", "tier"),
    [
        ([3000] * 300, "small"),
        ([300_000] * 12, "mid"),
        ([0, 10, 200_000, 200_000, 300_000, 300_000, 300_000], "mid"),
        ([600_000] * 6, "large"),
        ([200_000] * 4, "small"),  # (a stream of less than the sample's 1 MiB: not sampled)
    ],
)
def test_the_first_members_decide_the_seek_points_of_the_first_scan(
    sizes: List[int], tier: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small members: seek points every 384 KiB, scanned with two threads per core. Members of
    128-512 KiB: every 1 MiB, larger ones every 2 MiB (their random reads decode from the seek
    point before them, their reads in order in parallel), one thread per core (pure decoding).
    A stream smaller than the sample is not sampled (the sample would decode most of it)."""

    archive = _tar_gz(tmp_path / "a.tar.gz", sizes)
    made: List[tuple] = []
    original = RapidgzipReader._open_decoder

    def recording(self: RapidgzipReader, raw, threads: int):  # type: ignore[no-untyped-def]
        made.append((self._chunk_size, threads))
        return original(self, raw, threads)

    monkeypatch.setattr(RapidgzipReader, "_open_decoder", recording)
    opts = OpenOptions(index=IndexOptions(progress=False), compression=CompressionOptions(gzip_backend="rapidgzip"))
    with ratarmountcore.open(str(archive), opts) as src:
        for path, data in members(archive).items():
            assert src.read(path) == data
    cores = default_decoder_threads()
    two_per_core = min(2 * cores, max(cores, 16))  # (at most 16 by default, unless the cores are more)
    wanted = {
        "small": (RapidgzipReader.default_spacing, two_per_core),
        "mid": (RapidgzipReader.mid_member_spacing, cores),
        "large": (RapidgzipReader.large_member_spacing, cores),
    }[tier]
    assert made[0] == wanted
    spacings = (
        RapidgzipReader.default_spacing,
        RapidgzipReader.mid_member_spacing,
        RapidgzipReader.large_member_spacing,
    )
    assert spacings == (384 * 1024, 1 << 20, 2 << 20)
    # An explicit spacing and -P are kept whatever the members.
    made.clear()
    (tmp_path / "a.tar.gz.index.sqlite").unlink()
    explicit = CompressionOptions(gzip_backend="rapidgzip", seek_point_spacing=256 * 1024, parallelization=3)
    ratarmountcore.open(str(archive), OpenOptions(index=IndexOptions(progress=False), compression=explicit)).close()
    assert made[0] == (256 * 1024, 3)


def _tar_of_tars(count: int, members: int, size: int, seed: int, tail: Sequence[int] = ()) -> bytes:
    """An uncompressed tar of ``count`` class tars (``c{i}.tar``) of ``members`` random files of
    ``size`` bytes each (ImageNet's train tar in small), then files of the sizes in ``tail``."""
    rng = random.Random(seed)
    outer = io.BytesIO()
    with tarfile.open(fileobj=outer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for c in range(count):
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w", format=tarfile.GNU_FORMAT) as class_tar:
                for i in range(members):
                    info = tarfile.TarInfo(f"n{c}/{'long-' * 30}{i}.JPEG")  # a long name: extra headers
                    info.size = size
                    class_tar.addfile(info, io.BytesIO(rng.randbytes(size)))
            info = tarfile.TarInfo(f"train/c{c}.tar")
            info.size = len(inner.getvalue())
            tar.addfile(info, io.BytesIO(inner.getvalue()))
        for i, length in enumerate(tail):
            info = tarfile.TarInfo(f"extra/{i}")
            info.size = length
            tar.addfile(info, io.BytesIO(rng.randbytes(length)))
    return outer.getvalue()


@pytest.mark.parametrize("recursive", [False, True])
def test_a_recursive_mount_samples_the_members_of_inner_tars(
    recursive: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ImageNet's train tar: class tars of 140 MB holding JPEGs of 110 KB. Mounted with -r, the
    JPEGs are what is read, so they decide the seek points, not the class tars they are in (the
    large members' 2 MiB spacing made 1,000 random reads from a 340 MB .tar.gz of 1,000 class
    tars decode 853 MB instead of 229 MB, and take 2.3 s instead of 0.8 s)."""
    import os

    archive = tmp_path / "train.tar.gz"
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)
    archive.write_bytes(compressor.compress(_tar_of_tars(6, 200, 2000, 5)) + compressor.flush())
    made: List[int] = []
    original = RapidgzipReader._open_decoder

    def recording(self: RapidgzipReader, raw, threads: int):  # type: ignore[no-untyped-def]
        made.append(self._chunk_size)
        return original(self, raw, threads)

    monkeypatch.setattr(RapidgzipReader, "_open_decoder", recording)
    opts = OpenOptions(
        recursive=recursive,
        index=IndexOptions(progress=False),
        compression=CompressionOptions(gzip_backend="rapidgzip"),
    )
    with ratarmountcore.open(str(archive), opts) as src:
        assert len(src.read("/train/c5.tar/n5/" + "long-" * 30 + "199.JPEG" if recursive else "/train/c5.tar")) > 0
    assert os.path.getsize(archive) > 1 << 20  # (sampled)
    assert made[0] == (RapidgzipReader.default_spacing if recursive else RapidgzipReader.large_member_spacing)


def test_member_size_sample() -> None:
    from ratarmountcore.tar.sample import typical_member_size

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for i, size in enumerate([100, 5000, 7000, 0, 90_000]):
            info = tarfile.TarInfo(f"d/{'n' * 150}{i}")  # GNU long names: extra headers, not members
            info.size = size
            tar.addfile(info, io.BytesIO(bytes(size)))
    data = buffer.getvalue()
    assert typical_member_size(data) == 5000
    assert typical_member_size(data[:3000]) == 100  # only the headers inside the sample count
    assert typical_member_size(b"") is None
    assert typical_member_size(b"not a tar header" * 100) is None
    assert typical_member_size(bytes(10240)) is None


def test_member_size_sample_looks_into_inner_tars() -> None:
    from ratarmountcore.tar.sample import typical_member_size

    data = _tar_of_tars(3, 5, 3000, 1, tail=[100] * 20)
    outer = [m.size for m in tarfile.open(fileobj=io.BytesIO(data)).getmembers()]
    assert sorted(outer) == [100] * 20 + [outer[0]] * 3 and outer[0] > 5 * 3000
    assert typical_member_size(data) == 100  # 20 files of 100 bytes, 3 class tars
    # Looking into the class tars: 15 files of 3,000 bytes, then on with the outer tar.
    assert typical_member_size(data, descend=True) == 100
    assert typical_member_size(data, most=16, descend=True) == 3000  # (15 x 3,000, 1 x 100)
    assert typical_member_size(data[:6000], descend=True) == 3000  # a sample ending in a class tar
    # A member that only looks like a tar at first (its first block fails the checksum) is
    # counted as it is.
    broken = data[: 512 + 148] + b"9" + data[512 + 149 :]  # (the first class tar's first header)
    assert typical_member_size(broken, most=2, descend=True) == (outer[0] + 3000) // 2


@pytest.mark.parametrize(("members", "threads"), [(100, 1), (1500, 3)])
def test_a_decoder_gets_no_more_threads_than_its_stream_has_chunks(
    members: int, threads: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream of two chunks or less is decoded by one thread (the first pass of 1,000 inner
    .tar.gz of 340 kB: 3.7-4.4 s with four threads each, 3.4 s with one); a larger one by at
    most a thread a chunk, and at most what was asked for."""
    archive = _tar_gz(tmp_path / "a.tar.gz", [1000] * members)  # (incompressible: ~1.5 kB a member)
    made: List[int] = []
    original = rapidgzip.RapidgzipFile

    def recording(*args, parallelization: int, **kwargs):  # type: ignore[no-untyped-def]
        made.append(parallelization)
        return original(*args, parallelization=parallelization, **kwargs)

    monkeypatch.setattr(rapidgzip, "RapidgzipFile", recording)
    spacing = 384 * 1024
    chunks = -(-archive.stat().st_size // spacing)
    assert (chunks <= 2) is (threads == 1)
    compression = CompressionOptions(gzip_backend="rapidgzip", parallelization=3, seek_point_spacing=spacing)
    with ratarmountcore.open(str(archive), OpenOptions(index=IndexOptions(progress=False), compression=compression)):
        pass
    assert made and made[0] == min(threads, chunks) == max(made), made  # (the first pass's decoder first)
