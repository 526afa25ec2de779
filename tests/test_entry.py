"""The console commands' entry points: a stop signal anywhere is one line and the signal's status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Runs a console command with a Ctrl-C arriving while it parses its arguments (where neither
#: command reports an interruption itself: it printed a traceback, found by fuzzing).
_INTERRUPTED_WHILE_PARSING = """
import argparse, os, signal, sys
parse = argparse.ArgumentParser.parse_args
def interrupted(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    return parse(self, *args, **kwargs)
argparse.ArgumentParser.parse_args = interrupted
from ratarmount import entry
raise SystemExit(getattr(entry, sys.argv[1])(["archive.tar", "out"]))
"""


@pytest.mark.parametrize("command, program", [("ratarmount", "ratarmount"), ("convert", "ratarmount-convert")])
def test_ctrl_c_while_parsing_arguments_is_one_line(command: str, program: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_WHILE_PARSING, command], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 130, result.stderr
    assert result.stderr == f"{program}: interrupted\n"


def test_stop_signals_from_main_are_reported_by_their_names(monkeypatch: pytest.MonkeyPatch) -> None:
    import signal
    import types

    from ratarmount.entry import _run
    from ratarmount.termination import STOP_SIGNALS, HungUp, Terminated

    saved = {number: signal.getsignal(number) for number in STOP_SIGNALS}
    try:
        for raised, status, words in (
            (KeyboardInterrupt(), 130, "interrupted"),
            (Terminated(), 143, "terminated"),
            (HungUp(), 129, "hung up"),
        ):

            def main(argv: object, exc: BaseException = raised) -> int:
                raise exc

            monkeypatch.setitem(sys.modules, "fake_command", types.SimpleNamespace(main=main))
            errors: list = []
            monkeypatch.setattr(sys, "stderr", types.SimpleNamespace(write=errors.append, flush=lambda: None))
            assert _run("fake_command", "fake", []) == status
            assert "".join(errors) == f"fake: {words}\n"
            # Later stop signals are ignored while Python shuts down.
            assert all(signal.getsignal(number) == signal.SIG_IGN for number in STOP_SIGNALS)
    finally:
        for number, handler in saved.items():
            signal.signal(number, handler)


#: A conversion, then a Ctrl-C while Python shuts down (an exit handler stands in for the
#: signal that arrives just after the output was put in place).
_INTERRUPTED_AFTER_CONVERTING = """
import atexit, io, os, signal, sys, tarfile, time
with tarfile.open("in.tar", "w") as tar:
    info = tarfile.TarInfo("f")
    info.size = 5
    tar.addfile(info, io.BytesIO(b"hello"))
def late():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
atexit.register(late)
from ratarmount import entry
raise SystemExit(entry.convert(["--no-progress", "in.tar", "out.tar.zst"]))
"""


def test_a_stop_signal_after_a_conversion_changes_nothing(tmp_path: Path) -> None:
    """The output in place and its index written: a Ctrl-C while Python shut down killed the
    converter by the signal (status -2, no word), so a script took the finished conversion for
    a failed one (found by a review of bad input). Now the status stays 0."""
    result = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_AFTER_CONVERTING], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert result.returncode == 0 and result.stderr == "", (result.returncode, result.stderr)
    assert sorted(os.listdir(tmp_path)) == ["in.tar", "out.tar.zst", "out.tar.zst.index.sqlite"]
