"""Property: any sequence of reads from any compressed file returns exactly its plain bytes.

Reads arrive in whatever order a user's program makes them: overlapping, backwards, across seek
points and frame ends, past the end, from several threads at once, with the cache of decoded
data too small to hold what was read before. Each codec variant is opened as a plain compressed
file (mounted as one member), with seek points close together so that every read path (span
cache, checked blocks, large reads straight from the decoder, streamed frames) is taken.
"""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compression import compress

import ratarmountcore
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions

SPACING = 64 * 1024
#: More examples for a long hunt: READ_SEQUENCE_EXAMPLES=500 python -m pytest tests/test_read_sequences.py
EXAMPLES = int(os.environ.get("READ_SEQUENCE_EXAMPLES", "25"))
CACHE = 1024 * 1024  # spans up to a quarter of it are cached; less than the data: spans are evicted

KINDS = [
    "gz-cli",
    "gz-python-multimember",
    "bz2-cli",
    "zst-cli",
    "zst-python-frames",
    "xz-cli",
    "xz-cli-blocks",
]


def plain_data() -> bytes:
    """1.2 MB: text-like runs (compress well) between random stretches (do not)."""
    rng = random.Random(11)
    parts = []
    while sum(map(len, parts)) < 1_200_000:
        if rng.random() < 0.7:
            parts.append((b"line %d of the archive\n" % rng.randrange(10**6)) * rng.randrange(1, 400))
        else:
            parts.append(rng.randbytes(rng.randrange(1, 40_000)))
    return b"".join(parts)[:1_200_000]


PLAIN = plain_data()


def options(backend: str) -> OpenOptions:
    return OpenOptions(
        index=IndexOptions(index_folders=("",), progress=False),
        compression=CompressionOptions(
            seek_point_spacing=SPACING, cache_size=CACHE, gzip_backend=backend or None, parallelization=2
        ),
    )


CASES: List[Tuple[str, str]] = [(kind, "") for kind in KINDS] + [("gz-cli", "indexed_gzip")]


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> Dict[Tuple[str, str], Path]:
    made = {}
    for kind, backend in CASES:
        folder = tmp_path_factory.mktemp(f"{kind}-{backend or 'default'}")
        src = folder / "plain.bin"
        src.write_bytes(PLAIN)
        archive = compress(src, kind)
        src.unlink()
        ratarmountcore.open(str(archive), options(backend)).close()  # writes the index
        made[(kind, backend)] = archive
    return made


READS = st.lists(
    st.tuples(
        st.one_of(st.integers(0, len(PLAIN) + 10), st.sampled_from([0, SPACING - 1, SPACING, len(PLAIN) - 1])),
        st.one_of(st.integers(0, 3000), st.integers(0, 400_000)),
    ),
    min_size=1,
    max_size=10,
)


def member_path(source: ratarmountcore.MountSource) -> str:
    (name,) = source.listdir("/")
    return "/" + name


@pytest.mark.parametrize("case", CASES, ids=["-".join(filter(None, case)) for case in CASES])
def test_any_read_sequence_returns_the_plain_bytes(
    archives: Dict[Tuple[str, str], Path], case: Tuple[str, str]
) -> None:
    archive = archives[case]

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(READS)
    def check(sequence: List[Tuple[int, int]]) -> None:
        with ratarmountcore.open(str(archive), options(case[1])) as source:
            with source.open(member_path(source)) as f:
                for offset, size in sequence:
                    f.seek(offset)
                    assert f.read(size) == PLAIN[offset : offset + size], (offset, size)

    check()


@pytest.mark.parametrize("case", CASES, ids=["-".join(filter(None, case)) for case in CASES])
def test_concurrent_read_sequences_return_the_plain_bytes(
    archives: Dict[Tuple[str, str], Path], case: Tuple[str, str]
) -> None:
    """Four threads, each with its own file object on one source, read their own sequences at
    the same time (a DataLoader's workers on one mount)."""
    archive = archives[case]

    @settings(
        max_examples=max(1, EXAMPLES // 3), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )
    @given(st.lists(READS, min_size=4, max_size=4))
    def check(sequences: List[List[Tuple[int, int]]]) -> None:
        wrong: List[Tuple[int, int]] = []
        errors: List[BaseException] = []
        with ratarmountcore.open(str(archive), options(case[1])) as source:
            path = member_path(source)
            barrier = threading.Barrier(len(sequences))

            def work(sequence: List[Tuple[int, int]]) -> None:
                try:
                    with source.open(path) as f:
                        barrier.wait()
                        for _ in range(2):
                            for offset, size in sequence:
                                f.seek(offset)
                                if f.read(size) != PLAIN[offset : offset + size]:
                                    wrong.append((offset, size))
                except BaseException as exc:  # noqa: BLE001  (reported below)
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=(s,)) for s in sequences]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert errors == [] and wrong == []

    check()
