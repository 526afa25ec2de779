"""The session loop's thread and its stop signals (``ratarmount/session_loop.py``), with a loop
that sleeps in C (``pause``) the way libfuse's loop sleeps in ``sem_wait``: only a signal to its
own thread wakes it."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from typing import Iterator, List

import pytest

from ratarmount.session_loop import run_loop, stop_signals
from ratarmount.termination import Terminated, ignore_after_stop

libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture(autouse=True)
def handlers_put_back() -> Iterator[None]:
    """After a stop signal the handlers stay ignoring (see ``stop_signals``): put back pytest's."""
    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for number, handler in before.items():
        signal.signal(number, handler)


class FakeLoop:
    """Sleeps in ``pause()`` until its exit flag is set; remembers its thread."""

    def __init__(self, linger: float = 0.0) -> None:
        self.exit = False
        self.ended = threading.Event()
        self.thread: List[int] = []
        self.linger = linger

    def __call__(self) -> None:
        self.thread.append(threading.get_ident())
        while not self.exit:
            libc.pause()
        time.sleep(self.linger)  # (workers being joined)
        self.ended.set()

    def stop(self) -> None:
        self.exit = True


def later(seconds: float, action) -> threading.Thread:  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "signum,raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated), (signal.SIGHUP, Terminated)]
)
def test_a_stop_signal_ends_the_loop_then_is_raised(signum: int, raised: type) -> None:
    loop = FakeLoop()
    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    later(0.2, lambda: os.kill(os.getpid(), signum))
    with pytest.raises(raised):
        with stop_signals():
            run_loop(loop, loop.stop)
    assert loop.ended.is_set()  # raised only once the loop had returned
    # Further stop signals stay ignored (the program is on its way out; a second Ctrl-C as the
    # mount ended killed it), until whoever installed the handlers before puts them back.
    assert all(signal.getsignal(number) is ignore_after_stop for number in before)
    for number, handler in before.items():
        signal.signal(number, handler)


def test_a_signal_taken_by_the_loop_thread_ends_it_too() -> None:
    # (libfuse's handler set the exit flag there, but nothing woke the main thread's wait)
    loop = FakeLoop()

    def to_the_loop_thread() -> None:
        for _ in range(100):
            if loop.thread:
                signal.pthread_kill(loop.thread[0], signal.SIGINT)
                return
            time.sleep(0.01)

    later(0.2, to_the_loop_thread)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with stop_signals():
            run_loop(loop, loop.stop)
    assert loop.ended.is_set()
    assert time.monotonic() - started < 5


def test_signals_while_the_loop_ends_are_ignored() -> None:
    loop = FakeLoop(linger=0.5)

    def twice() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)

    later(0.2, twice)
    with pytest.raises(KeyboardInterrupt):
        with stop_signals():
            try:
                run_loop(loop, loop.stop)
            finally:
                time.sleep(0.3)  # (the unmount on the way out: a late signal must not cut it short)
                cleaned = True
    assert cleaned and loop.ended.is_set()


def test_a_loop_that_ends_by_itself_returns() -> None:
    loop = FakeLoop()
    previous = signal.signal(signal.SIGUSR1, lambda _signum, _frame: None)  # (wakes the fake loop)
    try:
        later(0.2, lambda: (loop.stop(), signal.pthread_kill(loop.thread[0], signal.SIGUSR1)))
        with stop_signals():
            run_loop(loop, loop.stop)  # (an unmount from outside: no exception)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert loop.ended.is_set()


def test_outside_the_main_thread_the_loop_runs_in_the_caller() -> None:
    ran: List[int] = []
    caller: List[int] = []

    def run() -> None:
        caller.append(threading.get_ident())
        with stop_signals():  # (changes nothing outside the main thread)
            run_loop(lambda: ran.append(threading.get_ident()), lambda: None)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert ran == caller and len(ran) == 1


def test_a_signal_within_a_callback_block_is_raised_when_it_ends() -> None:
    # (libfuse's init callback runs in the main thread while FUSE_INIT is answered; an exception
    # raised inside it was caught there, and the mount served on ignoring every later signal)
    from ratarmount.session_loop import signals_deferred

    went_on = []
    with pytest.raises(Terminated):
        with stop_signals():
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(50):  # (Python runs the handler at its next check)
                    time.sleep(0.01)
                went_on.append(True)
    assert went_on == [True]
