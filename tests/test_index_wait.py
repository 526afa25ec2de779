"""A first mount that finds another process building the same index waits for it.

The tasks of a job array mount one new archive at once: each built the same index, each reading
the whole archive from the parallel file system. Now the later ones wait for the build they
see (its partial file locked by its writer) and use its index; when that build ends without
one (killed), they build it themselves.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Dict, List

import pytest
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.index import builder
from ratarmountcore.options import IndexOptions, OpenOptions

#: A child that opens the archive and, once its index is written but not yet committed, says so
#: and waits: ``commit`` seconds before committing, or for good ("never").
BUILDER = textwrap.dedent(
    """
    import sys, time
    import ratarmountcore
    from ratarmountcore.index.sqlite_index import IndexWriter
    from ratarmountcore.options import IndexOptions, OpenOptions
    archive, folder, pause = sys.argv[1], sys.argv[2], sys.argv[3]
    commit = IndexWriter.commit
    def slow_commit(self, *args):
        print("committing", flush=True)
        time.sleep(600 if pause == "never" else float(pause))
        commit(self, *args)
    IndexWriter.commit = slow_commit
    with ratarmountcore.open(archive, OpenOptions(index=IndexOptions(index_folders=(folder,), progress=False))):
        pass
    print("done", flush=True)
    """
)

FILES: Dict[str, bytes] = {f"d{i % 7}/f{i}": os.urandom(i % 300) for i in range(400)}


def _start_builder(tmp_path: Path, pause: str) -> subprocess.Popen:
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_bytes(FILES))
    (tmp_path / "idx").mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(archive), str(tmp_path / "idx"), pause], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "committing"
    return child


def _open_and_check(tmp_path: Path, found: List[bool]) -> None:
    options = OpenOptions(index=IndexOptions(index_folders=(str(tmp_path / "idx"),), progress=False))
    with ratarmountcore.open(str(tmp_path / "a.tar"), options) as src:
        found.append(all(src.read("/" + name) == data for name, data in FILES.items()))


def _messages(caplog: pytest.LogCaptureFixture) -> List[str]:
    return [record.getMessage() for record in caplog.records]


def test_a_second_first_mount_waits_for_the_build_and_uses_its_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    child = _start_builder(tmp_path, "1.0")
    try:
        found: List[bool] = []
        with caplog.at_level(logging.INFO, logger="ratarmountcore"):
            _open_and_check(tmp_path, found)
        assert found == [True]
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait()
    messages = _messages(caplog)
    assert any("another process is building its index" in m and "waiting" in m for m in messages), messages
    assert not any(m.startswith("Creating index") for m in messages), "the index was built twice"
    names = [p.name for p in (tmp_path / "idx").iterdir()]
    assert len(names) == 1 and names[0].endswith(".index.sqlite"), names


def test_when_the_other_build_is_killed_the_waiting_mount_builds_the_index(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(builder, "RENAME_WAIT", 0.3)
    child = _start_builder(tmp_path, "never")
    found: List[bool] = []
    try:
        with caplog.at_level(logging.INFO, logger="ratarmountcore"):
            opener = threading.Thread(target=_open_and_check, args=(tmp_path, found))
            opener.start()
            opener.join(1.0)
            assert opener.is_alive(), "it did not wait for the build in progress"
            child.send_signal(signal.SIGKILL)
            child.wait()
            opener.join(30)
            assert not opener.is_alive()
    finally:
        child.kill()
        child.wait()
    assert found == [True]
    messages = _messages(caplog)
    assert any("waiting" in m for m in messages) and any(m.startswith("Creating index") for m in messages), messages
    names = sorted(p.name for p in (tmp_path / "idx").iterdir())
    assert len(names) == 2 and any(".tmp-" in name for name in names), names  # (the killed one's, left for MIN_AGE)


def test_recreate_index_builds_even_while_another_process_builds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--recreate-index`` asks for a build of this process's own: it does not wait for one."""
    child = _start_builder(tmp_path, "never")
    found: List[bool] = []

    def open_recreating() -> None:
        options = OpenOptions(index=IndexOptions(index_folders=(str(tmp_path / "idx"),), recreate=True, progress=False))
        with ratarmountcore.open(str(tmp_path / "a.tar"), options) as src:
            found.append(all(src.read("/" + name) == data for name, data in FILES.items()))

    try:
        with caplog.at_level(logging.INFO, logger="ratarmountcore"):
            opener = threading.Thread(target=open_recreating, daemon=True)
            opener.start()
            opener.join(20)
            assert not opener.is_alive(), "it waited for the other build"
    finally:
        child.kill()
        child.wait()
    assert found == [True]
    messages = _messages(caplog)
    assert not any("waiting" in m for m in messages) and any(m.startswith("Creating index") for m in messages)
