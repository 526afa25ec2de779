"""libfuse's session loop in a thread of its own, ended by SIGINT, SIGTERM or SIGHUP from Python.

libfuse's own handlers (``fuse_set_signal_handlers``) install only over default ones. So the
main thread had to set the three signals to their defaults, let libfuse install its handlers,
then wait inside the loop in C, where no Python handler runs. Ctrl-C sent at random times in the
first 0.2 s of a foreground mount found two races there:
- a signal between the switch to the default and libfuse's install killed the process by the
  default action (about 1 in 100);
- once, a SIGINT was lost: the mount served on (the cause was not found; nothing here depends on
  which thread takes a signal).
A first version of this module lost one too: a Python handler that ran while libfuse called back
into Python in the main thread (to answer FUSE_INIT) raised inside the callback, where every
exception is caught (see ``signals_deferred``).

Here the loop runs in a thread of its own and the main thread waits for it where Python handles
signals: SIGINT raises ``KeyboardInterrupt``, SIGTERM and SIGHUP ``Terminated``, at any time,
whatever thread the kernel gave the signal to. The loop is then ended the way libfuse's handler
ends it: the session's exit flag is set and the loop thread is interrupted (a signal to that
thread alone, repeated until its loop returns), and the exception goes on to the caller, which
tells a clean end after the mount was ready from an interrupted start.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Any, Callable, Dict, Iterator, Optional

from .termination import STOP_SIGNALS, ignore_after_stop, stop_exception

#: The waiting main thread's wake-up interval: a signal the kernel gave to another thread is
#: handled in the main thread at its next wake-up (one to the main thread at once).
WAKE_S = 0.5
#: Interval of the signals that wake the loop thread once its exit flag is set (the first may
#: come just before the loop sleeps).
POKE_S = 0.05


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """For the block, in the main thread: the first SIGINT raises ``KeyboardInterrupt``, SIGTERM or
    SIGHUP ``Terminated``; those after it are ignored until the block ends (a second Ctrl-C must
    not skip the unmount on the way out). Elsewhere signals stay the program's business."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: Dict[int, Any] = {number: signal.signal(number, _stop) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            if signal.getsignal(number) is not ignore_after_stop:
                signal.signal(number, signal.SIG_DFL if handler is None else handler)
            # (else a stop signal came: the program is on its way out, and the next one must not
            # end it by another way; a second Ctrl-C as the mount ended killed it: found by fuzzing)


#: Whether the main thread runs code called from C that must not raise (see ``signals_deferred``).
_deferring = False
#: A stop signal that came meanwhile.
_deferred: Optional[int] = None


def _stop(signum: int, _frame: Optional[FrameType]) -> None:
    global _deferred
    for number in STOP_SIGNALS:
        signal.signal(number, ignore_after_stop)
    if _deferring:
        _deferred = signum
        return
    raise stop_exception(signum)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """For a block in which libfuse calls back into Python in the main thread (FUSE_INIT answered
    before the loop starts, ``destroy`` at the end): a stop signal is raised when the block ends.
    Raised inside the callback, it was caught there (no exception may cross into C), and the
    mount served on with every later signal ignored (found by sending SIGINT at random times)."""
    global _deferring, _deferred
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
        signum, _deferred = _deferred, None
        if signum is not None:
            raise stop_exception(signum)


def run_loop(loop: Callable[[], Any], exit_loop: Callable[[], None]) -> None:
    """Run ``loop`` (libfuse's loop: it returns once its session exits, unmounted or through
    ``exit_loop``). In the main thread, within ``stop_signals``, it runs in a thread of its own; a
    stop signal ends it, and is raised here once it has returned."""
    if threading.current_thread() is not threading.main_thread():
        loop()
        return
    ended = threading.Event()
    ending = threading.Lock()

    def run() -> None:
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # (see below; for the wake-ups)
            loop()
        finally:
            with ending:  # (no signal is sent to this thread once it may have exited)
                ended.set()

    thread = threading.Thread(target=run, name="ratarmount-loop", daemon=True)
    try:
        # Blocked while the thread starts: a signal raised inside ``start`` would leave it
        # unknown whether the thread runs (its ident is set by the thread itself).
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            thread.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        while not ended.wait(WAKE_S):
            pass
    except KeyboardInterrupt:  # (and Terminated)
        exit_loop()
        _wake_until_ended(thread, ended, ending)
        raise


def _wake_until_ended(thread: threading.Thread, ended: threading.Event, ending: threading.Lock) -> None:
    ident = thread.ident
    if ident is None:  # never started (see run_loop)
        return
    while not ended.wait(POKE_S):
        with ending:
            if not ended.is_set():
                signal.pthread_kill(ident, signal.SIGINT)
