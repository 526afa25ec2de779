"""Sources opened before a fork and used on both sides of it (io/forks.py).

A PyTorch DataLoader opens the dataset in the main process and forks its workers; every worker
then reads through the source the parent opened. Before, a worker's read of a .tar.zst or .tar.xz
waited forever for decoder threads that exist only in the parent, and a process that read a few
members of a .tar.gz and exited without closing the source was aborted by rapidgzip (SIGABRT).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from conftest import timed_fork
from test_compression import compress, make_tar, members_of, split_kind

import ratarmountcore
from ratarmountcore.io import forks
from ratarmountcore.sources.base import MountSource

KINDS = ["plain", "gz-cli", "gz-cli@indexed_gzip", "bz2-cli", "zst-python-frames", "zst-cli", "xz-cli-blocks"]

#: What a forked worker reads through (set before the pool forks).
_WORKER: Dict[str, MountSource] = {}


@pytest.fixture(scope="module")
def tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fork") / "data.tar"
    make_tar(path, random.Random(7), members=60, max_size=120_000)
    return path


@pytest.fixture(autouse=True)
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def archive_of(tar: Path, kind: str, tmp_path: Path) -> Tuple[Path, ratarmountcore.OpenOptions]:
    plain, opts = split_kind(kind)
    copy = tmp_path / tar.name
    copy.write_bytes(tar.read_bytes())
    return (copy if plain == "plain" else compress(copy, plain)), opts


def digests(names: List[str]) -> List[Tuple[str, str]]:
    """In a worker: each member's SHA-256 as read there."""
    source = _WORKER["source"]
    out = []
    for name in names:
        with source.open(name) as f:
            out.append((name, hashlib.sha256(f.read()).hexdigest()))
    return out


def read_in_forked_workers(source: MountSource, batches: List[List[str]], processes: int) -> Dict[str, str]:
    """Each batch read by one of ``processes`` forked workers; name -> SHA-256 as read there."""
    _WORKER["source"] = source
    try:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            results = pool.map_async(digests, batches).get(timeout=120)
    finally:
        _WORKER.clear()
    return {name: digest for batch in results for name, digest in batch}


@pytest.mark.parametrize("kind", KINDS)
def test_forked_workers_read_what_the_parent_opened(kind: str, tar: Path, tmp_path: Path) -> None:
    archive, opts = archive_of(tar, kind, tmp_path)
    expected = {name: hashlib.sha256(data).hexdigest() for name, data in members_of(tar).items()}
    names = sorted(expected)
    rng = random.Random(3)
    with ratarmountcore.open(str(archive), opts) as source:
        # The parent reads first: decoders, their threads, caches and connections exist at the fork.
        for name in rng.sample(names, 10):
            with source.open(name) as f:
                assert hashlib.sha256(f.read()).hexdigest() == expected[name]
        held = source.open(names[-1])  # opened before the fork, read after it (in the parent)
        read = read_in_forked_workers(source, [rng.sample(names, 12) for _ in range(6)], 3)
        assert read and all(digest == expected[name] for name, digest in read.items())
        # The parent goes on with what it had.
        for name in rng.sample(names, 10):
            with source.open(name) as f:
                assert hashlib.sha256(f.read()).hexdigest() == expected[name]
        assert hashlib.sha256(held.read()).hexdigest() == expected[names[-1]]
        held.close()


CHILD_SCRIPT = textwrap.dedent(
    """
    import hashlib, os, random, sys
    import ratarmountcore
    from ratarmountcore.options import CompressionOptions, OpenOptions

    archive, backend, expected_name, expected_digest = sys.argv[1:5]
    opts = OpenOptions(compression=CompressionOptions(gzip_backend=backend or None))
    source = ratarmountcore.open(archive, opts)
    names = []
    for folder, _dirs, files in source.walk("/"):
        names += [folder.rstrip("/") + "/" + name for name in files]
    names = [name for name in names if source.info(name).is_file]  # (links are not opened)
    for name in random.Random(1).sample(names, 20):
        with source.open(name) as f:
            f.read()
    held = source.open(expected_name)
    held.read(10)
    pid = os.fork()
    if pid == 0:
        # The child reads on from the handle opened before the fork, then exits the normal way
        # (interpreter shutdown, atexit) without closing anything.
        held.seek(0)
        ok = hashlib.sha256(held.read()).hexdigest() == expected_digest
        for name in random.Random(2).sample(names, 20):
            with source.open(name) as f:
                f.read()
        sys.exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), flush=True)
    # The parent, too, exits without closing its source.
    """
)


@pytest.mark.parametrize("kind", ["gz-cli", "bz2-cli", "zst-python-frames", "xz-cli-blocks"])
def test_processes_that_exit_without_closing_end_normally(kind: str, tar: Path, tmp_path: Path) -> None:
    archive, opts = archive_of(tar, kind, tmp_path)
    members = members_of(tar)
    name = max(members, key=lambda n: len(members[n]))
    digest = hashlib.sha256(members[name]).hexdigest()
    backend = opts.compression.gzip_backend or ""
    command = [sys.executable, "-c", CHILD_SCRIPT, str(archive), backend, name, digest]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"exit status {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.split() == ["child", "0"], result.stdout + result.stderr[-2000:]


THREADS_AT_FORK_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading

    def live(task):
        # (A thread joined just now may stay listed for a moment, exiting: not one that runs.)
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
        except OSError:  # (gone meanwhile: ENOENT, or ESRCH while it was being reaped)
            return False

    def native_threads():
        # Threads of the process that are not Python's (the decoders' worker threads).
        return sum(map(live, os.listdir("/proc/self/task"))) - threading.active_count()

    counts = []
    # Registered before ratarmountcore's hooks, so it runs after them, right before the fork.
    os.register_at_fork(before=lambda: counts.append(native_threads()))
    import ratarmountcore

    # No span cache: reads through it make no decoder with threads (misses are decoded with
    # ISA-L), and the first pass's decoders are closed once the index is written.
    no_cache = ratarmountcore.OpenOptions(compression=ratarmountcore.CompressionOptions(cache_size=0))
    with ratarmountcore.open(sys.argv[1], no_cache) as source:
        names = [folder.rstrip("/") + "/" + name for folder, _, files in source.walk("/") for name in files]
        names = [name for name in names if source.info(name).is_file]
        for name in names[::3]:
            with source.open(name) as f:
                f.read()
        threads_before = native_threads()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        with source.open(names[-1]) as f:  # the parent reads on
            size = len(f.read())
        print(threads_before, counts[0], size == source.info(names[-1]).size)
    """
)


@pytest.mark.parametrize("kind", ["gz-cli", "bz2-cli"])
def test_no_decoder_thread_runs_at_a_fork(kind: str, tar: Path, tmp_path: Path) -> None:
    """rapidgzip's threads take the GIL to read the compressed file, and CPython 3.11 makes their
    thread state under a lock it resets only after using it in the child (cpython#112275): a
    fork at that moment hung the child for good (1-2 in 300). So no such thread is left when a
    fork happens: the decoders are closed first, and made anew when the parent reads on."""
    archive, _opts = archive_of(tar, kind, tmp_path)
    command = [sys.executable, "-c", THREADS_AT_FORK_SCRIPT, str(archive)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    before, at_fork, read_on = result.stdout.split()
    assert int(before) > 0  # (the decoders had threads)
    assert int(at_fork) == 0  # (Python's own threads take that lock only with the GIL held)
    assert read_on == "True"


def test_a_fork_bumps_the_generation_only_in_the_child() -> None:
    before = forks.generation
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, str(forks.generation).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert int(os.read(read, 32)) == before + 1
    os.close(read)
    assert forks.generation == before


def test_union_of_archives_is_read_in_forked_workers(tar: Path, tmp_path: Path) -> None:
    first, _ = archive_of(tar, "gz-cli", tmp_path)
    second = tmp_path / "second.tar"
    make_tar(second, random.Random(8), members=20, max_size=50_000)
    expected = {n: hashlib.sha256(d).hexdigest() for n, d in members_of(tar).items()}
    expected.update({n: hashlib.sha256(d).hexdigest() for n, d in members_of(second).items()})  # later wins
    names = sorted(expected)
    with ratarmountcore.open([str(first), str(second)]) as source:
        with source.open(names[0]) as f:
            f.read()
        read = read_in_forked_workers(source, [names[i::4] for i in range(4)], 2)
    assert read == expected


def digests_of(source: MountSource, names: List[str]) -> List[Tuple[str, str]]:
    """In a spawned worker: the source arrives pickled, as what it was opened from."""
    out = []
    with source:
        for name in names:
            with source.open(name) as f:
                out.append((name, hashlib.sha256(f.read()).hexdigest()))
    return out


@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_sources_pickle_as_what_they_were_opened_from(start: str, tar: Path, tmp_path: Path) -> None:
    archive, opts = archive_of(tar, "zst-python-frames", tmp_path)
    second = tmp_path / "second.tar"
    make_tar(second, random.Random(9), members=10, max_size=20_000)
    expected = {n: hashlib.sha256(d).hexdigest() for n, d in members_of(tar).items()}
    expected.update({n: hashlib.sha256(d).hexdigest() for n, d in members_of(second).items()})
    names = sorted(expected)
    previous = os.getcwd()
    os.chdir(tmp_path)  # relative paths: a worker in another folder opens the same files
    try:
        source = ratarmountcore.open([archive.name, second.name], opts)
    finally:
        os.chdir(previous)
    index_mtime = os.stat(str(archive) + ".index.sqlite").st_mtime_ns
    with source:
        with multiprocessing.get_context(start).Pool(2) as pool:
            results = pool.starmap_async(digests_of, [(source, names[i::2]) for i in range(2)]).get(timeout=120)
    for batch in results:
        for name, digest in batch:
            assert digest == expected[name], name
    assert sum(len(batch) for batch in results) == len(names)
    assert os.stat(str(archive) + ".index.sqlite").st_mtime_ns == index_mtime  # opened, not rebuilt


def test_a_source_not_from_open_refuses_to_pickle(tar: Path) -> None:
    from ratarmountcore.sources.archive import open_archive

    source = open_archive(str(tar))
    with source, pytest.raises(TypeError, match="only sources from ratarmountcore.open pickle"):
        pickle.dumps(source)


def test_folder_of_archives_is_read_in_forked_workers(tar: Path, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.tar").write_bytes(tar.read_bytes())
    gz, _ = archive_of(tar, "gz-cli", tmp_path)
    gz.rename(folder / "b.tar.gz")
    (folder / "plain.txt").write_bytes(b"plain")
    expected = {"/plain.txt": hashlib.sha256(b"plain").hexdigest()}
    for name, data in members_of(tar).items():
        for archive in ("a.tar", "b.tar.gz"):
            expected[f"/{archive}{name}"] = hashlib.sha256(data).hexdigest()
    names = sorted(expected)
    with ratarmountcore.open(str(folder), ratarmountcore.OpenOptions(recursive=True)) as source:
        with source.open(names[-1]) as f:
            f.read()
        read = read_in_forked_workers(source, [names[i::3] for i in range(3)], 2)
    assert read == expected


def test_a_fork_waits_for_a_query_under_way(tar: Path) -> None:
    """SQLite's process-wide mutexes held by another thread at a fork stay locked in the child
    for good (its first connection hung): a fork waits until no query of an index is under
    way (here one that takes 0.3 s)."""
    import threading
    import time

    from ratarmountcore.index.pool import ConnectionPool

    ratarmountcore.open(str(tar)).close()  # (the index)
    pool = ConnectionPool(str(tar) + ".index.sqlite")
    pool.query("SELECT 1")
    for conn in pool._all:
        conn.create_function("slow", 0, lambda: time.sleep(0.3) or 1)
    started = threading.Event()

    def query() -> None:
        started.set()
        pool.query("SELECT slow()")

    thread = threading.Thread(target=query)
    thread.start()
    started.wait(10)
    time.sleep(0.05)  # (inside the query by now)
    waited = timed_fork()
    thread.join()
    pool.close()
    assert waited >= 0.15, waited


def test_forks_while_other_threads_query_never_hang(tar: Path) -> None:
    """Two threads of the parent stat, list and read while the main thread forks children that
    use the index at once (1-2 in 300 hung in sqlite3.connect before the gate)."""
    import threading
    import time

    source = ratarmountcore.open(str(tar))
    names = sorted(members_of(tar))
    stop = threading.Event()

    def busy(offset: int) -> None:
        i = offset
        while not stop.is_set():
            name = names[i % len(names)]
            source.stat(name)
            source.listdir(name.rsplit("/", 1)[0] or "/")
            i += 7

    threads = [threading.Thread(target=busy, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    hung = 0
    try:
        for _ in range(150):
            pid = os.fork()
            if pid == 0:
                source.stat(names[3])
                os._exit(0)
            deadline = time.monotonic() + 5
            while os.waitpid(pid, os.WNOHANG)[0] == 0:
                if time.monotonic() > deadline:
                    hung += 1
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.002)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        source.close()
    assert hung == 0
