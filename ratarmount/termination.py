"""SIGTERM ends the command-line tools the way Ctrl-C does: as an exception where the program
is, so that what it was writing (an index, a converted archive) is removed on the way out.

By default SIGTERM ends Python at once, without running ``finally`` blocks or context managers,
and a first index build killed so left its ``.tmp-*`` file behind. While a mount is served,
libfuse's own handlers take SIGTERM over (they unmount) and give it back afterwards.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Any, Dict, Iterator, Optional

#: The exit status of a program ended by SIGTERM.
EXIT_STATUS = 128 + signal.SIGTERM
#: The signals that end a command or a mount (as with libfuse's own handlers).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: The exit statuses of a program that a stop signal ended: SIGINT, SIGTERM, SIGHUP.
STOPPED_STATUSES = (128 + signal.SIGINT, EXIT_STATUS, 128 + signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (handled like Ctrl-C: the program cleans up and exits)."""


class HungUp(Terminated):
    """SIGHUP arrived (the terminal closed, an ssh session dropped): as SIGTERM. By default it
    ended the program at once: a first index build left its ``.tmp-*`` file, and a background
    mount's child, in a session of its own, went on to mount with no one to unmount it (found
    by fuzzing)."""


def _raise_terminated(signum: int, _frame: Optional[FrameType]) -> None:
    # Later stop signals change nothing: the program is on its way out, cleaning up (a SIGTERM
    # 5 ms after a SIGHUP killed it by the default action once the first was handled: found by
    # fuzzing).
    for number in STOP_SIGNALS:
        if signal.getsignal(number) in (_raise_terminated, signal.default_int_handler):
            signal.signal(number, ignore_after_stop)
    raise stop_exception(signum)


def stop_exception(signum: int) -> KeyboardInterrupt:
    """What stop signal ``signum`` raises: ``KeyboardInterrupt`` (SIGINT), ``HungUp`` (SIGHUP)
    or ``Terminated`` (SIGTERM)."""
    if signum == signal.SIGINT:
        return KeyboardInterrupt()
    return HungUp() if signum == signal.SIGHUP else Terminated()


def ignore_after_stop(_signum: int, _frame: Optional[FrameType]) -> None:
    """A stop signal after the first (a Python handler, so that it still interrupts waits)."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """For the block, SIGINT raises ``KeyboardInterrupt``, SIGTERM ``Terminated`` and SIGHUP
    ``HungUp`` in the main thread, the first of them only (those after it are ignored while the
    program cleans up) -- unless the program (or whoever embeds it) already handles the signal
    itself, or ignores it (``nohup``); then it is as it was. A handler left behind in a program that called ``main()``
    (a test suite) made its forked workers outlive ``Pool.terminate()`` whenever one was stuck
    where Python code cannot run."""
    installed = []
    if threading.current_thread() is threading.main_thread():
        for number, default in (
            (signal.SIGINT, signal.default_int_handler),
            (signal.SIGTERM, signal.SIG_DFL),
            (signal.SIGHUP, signal.SIG_DFL),
        ):
            if signal.getsignal(number) == default:
                signal.signal(number, _raise_terminated)
                installed.append(number)
    try:
        yield
    finally:
        for number in installed:
            if signal.getsignal(number) in (_raise_terminated, ignore_after_stop):
                signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)


def ended_by(interrupt: KeyboardInterrupt) -> str:
    """What to tell the user: "hung up" (SIGHUP), "terminated" (SIGTERM) or "interrupted"."""
    if isinstance(interrupt, HungUp):
        return "hung up"
    return "terminated" if isinstance(interrupt, Terminated) else "interrupted"


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The exit status for Ctrl-C (130), SIGTERM (143) or SIGHUP (129)."""
    if isinstance(interrupt, HungUp):
        return 128 + signal.SIGHUP
    return EXIT_STATUS if isinstance(interrupt, Terminated) else 128 + signal.SIGINT


@contextlib.contextmanager
def default_signal_handlers() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP at their defaults for the block, then as they were: libfuse
    installs its handlers (end the loop, unmount) only over default ones, and a Python handler
    would never run while the main thread waits in libfuse's loop."""
    previous: Dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for number in STOP_SIGNALS:
            previous[number] = signal.signal(number, signal.SIG_DFL)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
