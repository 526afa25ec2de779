"""FolderPrefetcher: lists folders in a thread of its own, each once, none too large, failures
swallowed; started on first use (after the daemon forked), stopped at the end of a session."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import List

import pytest

from ratarmount import folder_prefetch
from ratarmount.folder_prefetch import FolderPrefetcher


def wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_folders_are_listed_once_in_a_thread_started_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = []
    real_listdir = os.listdir

    def recording_listdir(path):  # type: ignore[no-untyped-def]
        listed.append(path)
        return real_listdir(path)

    monkeypatch.setattr(folder_prefetch.os, "listdir", recording_listdir)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    prefetcher = FolderPrefetcher(str(tmp_path) + "/")
    assert not prefetcher._threads
    prefetcher.request("/a", 10)
    prefetcher.request("/a", 10)  # listed already
    prefetcher.request("/b", folder_prefetch.FOLDER_MAX + 1)  # too large
    prefetcher.request("/b", 1)  # nothing to gain
    prefetcher.request("/", 2)
    wait_for(lambda: prefetcher.listings == 2)
    assert sorted(listed) == [f"{tmp_path}/", f"{tmp_path}/a"]  # (by two threads: in any order)
    wait_for(lambda: len(prefetcher.thread_ids) == folder_prefetch.THREADS)
    prefetcher.close()
    prefetcher.request("/b", 10)
    assert len(prefetcher._threads) == folder_prefetch.THREADS
    for thread in prefetcher._threads:  # every thread stops
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert prefetcher.listings == 2


def test_failures_only_log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    prefetcher = FolderPrefetcher(str(tmp_path))
    with caplog.at_level(logging.DEBUG, logger="ratarmount.folder_prefetch"):
        prefetcher.request("/missing", 5)
        (tmp_path / "there").mkdir()
        prefetcher.request("/there", 5)
        wait_for(lambda: prefetcher.listings == 1)
    assert any("/missing" in record.getMessage() for record in caplog.records)
    prefetcher.close()


def test_remembered_folders_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(folder_prefetch, "REMEMBERED", 3)
    prefetcher = FolderPrefetcher(str(tmp_path))
    for name in "abcde":
        (tmp_path / name).mkdir()
        prefetcher.request("/" + name, 5)
    wait_for(lambda: prefetcher.listings == 5)
    assert list(prefetcher._listed) == ["/c", "/d", "/e"]
    assert [prefetcher.has_listed("/" + name) for name in "abcde"] == [False, False, True, True, True]
    prefetcher.request("/a", 5)  # forgotten: listed again
    wait_for(lambda: prefetcher.listings == 6)
    prefetcher.close()


def test_a_listing_tells_who_waits_for_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``done`` is set once the folder was listed, or failed to be; a folder listed already is
    refused (nobody may wait for it)."""
    import threading

    release = threading.Event()
    real_listdir = os.listdir

    def slow_listdir(path):  # type: ignore[no-untyped-def]
        release.wait(10)
        return real_listdir(path)

    monkeypatch.setattr(folder_prefetch.os, "listdir", slow_listdir)
    (tmp_path / "a").mkdir()
    prefetcher = FolderPrefetcher(str(tmp_path))
    done, failed = threading.Event(), threading.Event()
    assert prefetcher.request("/a", 5, done)
    assert prefetcher.request("/missing", 5, failed)
    assert not done.is_set()
    release.set()
    assert done.wait(10) and failed.wait(10)
    wait_for(lambda: prefetcher.listings == 1)
    assert not prefetcher.request("/a", 5, threading.Event())
    prefetcher.close()


def test_a_listing_may_be_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``hold`` runs after the folder's attributes were fetched, right before the listing."""
    import threading

    calls: List[str] = []
    real_listdir, real_stat = os.listdir, os.stat
    monkeypatch.setattr(folder_prefetch.os, "listdir", lambda path: calls.append("list " + path) or real_listdir(path))
    monkeypatch.setattr(folder_prefetch.os, "stat", lambda path: calls.append("stat " + path) or real_stat(path))
    (tmp_path / "b").mkdir()
    prefetcher = FolderPrefetcher(str(tmp_path))
    listed = threading.Event()
    assert prefetcher.request("/b", 2, listed, hold=lambda: calls.append("hold b"))
    assert listed.wait(10)
    assert calls == [f"stat {tmp_path}/b", "hold b", f"list {tmp_path}/b"]
    assert prefetcher.listings == 1
    prefetcher.close()
