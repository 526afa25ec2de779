"""The lock that orders mounts of one mount point (ratarmount/mountpoint_lock.py)."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from ratarmount.mountpoint_lock import MountpointLock


def _hold(path: str, held: Any, go: Any) -> None:
    lock = MountpointLock(path)
    lock.acquire()
    held.set()
    go.wait(10)
    lock.release()


@contextlib.contextmanager
def held_elsewhere(path: Path) -> Iterator[Any]:
    """The point locked by another process (another mount) until the event yielded is set."""
    context = multiprocessing.get_context("fork")
    held, go = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(str(path), held, go))
    holder.start()
    try:
        assert held.wait(10)
        yield go
    finally:
        go.set()
        holder.join(10)


def test_a_second_mount_waits_for_the_first_to_release_its_point(tmp_path: Path) -> None:
    """Another process (another mount) holding the point: ``acquire`` returns only after it
    released it; ``release`` twice is harmless."""
    with held_elsewhere(tmp_path) as go:
        released_at = []

        def release_soon() -> None:
            time.sleep(0.3)
            released_at.append(time.monotonic())
            go.set()

        threading.Thread(target=release_soon).start()
        lock = MountpointLock(str(tmp_path))
        lock.acquire()
        assert released_at and time.monotonic() >= released_at[0]  # (it waited for the release)
        lock.release()
        lock.release()


def test_a_point_held_too_long_is_mounted_without_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mount stuck before it serves must not stop another one for good: after ``WAIT_S`` the
    lock is given up (the check of the point decides)."""
    from ratarmount import mountpoint_lock

    monkeypatch.setattr(mountpoint_lock, "WAIT_S", 0.2)
    with held_elsewhere(tmp_path):
        lock = MountpointLock(str(tmp_path))
        start = time.monotonic()
        lock.acquire()
        assert 0.2 <= time.monotonic() - start < 5
        assert lock._fd == -1  # (not held)  # noqa: SLF001


def test_a_point_that_cannot_be_opened_is_left_to_the_check(tmp_path: Path) -> None:
    lock = MountpointLock(str(tmp_path / "missing"))
    lock.acquire()  # (no error here: check_mountpoint says what is wrong)
    lock.release()
