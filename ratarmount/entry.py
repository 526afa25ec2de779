"""The console commands' entry points, which import the command-line modules only when run.

Python takes ~40 ms to import the command-line modules. A Ctrl-C in that time raised
``KeyboardInterrupt`` out of the import in the console script: a traceback, and an exit by the
signal, where Ctrl-C a moment later ends the command with one line and status 130. The same
holds for a stop signal anywhere in ``main`` that ``main`` does not report itself.
"""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Optional, Sequence


def _run(module: str, program: str, argv: Optional[Sequence[str]]) -> int:
    # (light: signals and contextlib)
    from .termination import STOP_SIGNALS, ended_by, exit_status

    try:
        status: int = importlib.import_module(module).main(argv)
    except KeyboardInterrupt as interrupt:
        # Stopped while importing, or where ``main`` catches nothing: parsing the arguments
        # (Ctrl-C 0.1-0.4 s after ``ratarmount-convert`` started printed a traceback; found by
        # fuzzing), or between the blocks that report an interruption themselves.
        print(f"{program}: {ended_by(interrupt)}", file=sys.stderr)
        status = exit_status(interrupt)
    # The command is done, whatever its status: a stop signal while Python shuts down (its
    # threads, finalizers) would end it by the default action, with another status and no word
    # -- after a stop signal (found by fuzzing), or after a conversion whose output was already
    # in place (status -2, and the output left: found by a review of bad input).
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    return status


def ratarmount(argv: Optional[Sequence[str]] = None) -> int:
    """``ratarmount``: ``ratarmount.cli.main``."""
    return _run("ratarmount.cli", "ratarmount", argv)


def convert(argv: Optional[Sequence[str]] = None) -> int:
    """``ratarmount-convert``: ``ratarmount.convert_cli.main``."""
    return _run("ratarmount.convert_cli", "ratarmount-convert", argv)
