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


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (handled like Ctrl-C: the program cleans up and exits)."""


def _raise_terminated(_signum: int, _frame: Optional[FrameType]) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """For the block, SIGTERM raises ``Terminated`` in the main thread -- unless the program (or
    whoever embeds it) already handles SIGTERM itself; then SIGTERM is as it was. A handler left
    behind in a program that called ``main()`` (a test suite) made its forked workers outlive
    ``Pool.terminate()`` whenever one was stuck where Python code cannot run."""
    installed = threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    )
    if installed:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        if installed and signal.getsignal(signal.SIGTERM) is _raise_terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def ended_by(interrupt: KeyboardInterrupt) -> str:
    """What to tell the user: "terminated" (SIGTERM) or "interrupted" (Ctrl-C)."""
    return "terminated" if isinstance(interrupt, Terminated) else "interrupted"


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The exit status for Ctrl-C (130) or SIGTERM (143)."""
    return EXIT_STATUS if isinstance(interrupt, Terminated) else 128 + signal.SIGINT


@contextlib.contextmanager
def default_signal_handlers() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP at their defaults for the block, then as they were: libfuse
    installs its handlers (end the loop, unmount) only over default ones, and a Python handler
    would never run while the main thread waits in libfuse's loop."""
    previous: Dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[number] = signal.signal(number, signal.SIG_DFL)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)
