"""The first pass over a large .tar.gz decoded in a child process.

The first mount reads the whole decompressed stream once, parsing tar headers in Python while
rapidgzip decodes. In one process the two do not overlap: rapidgzip's reads take the GIL back
many times per call, and every time the parsing thread holds it, decoding waits up to a switch
interval (measured on 2 vCPUs: decoding a 333 MB tar alone 1.05 s; beside a thread busy in Python
for 1 s, 2.05 s; first mount of a 100,000-file .tar.gz 1.9 s in-process with 3.1 s of CPU).
Here the rapidgzip that ships with the Python package runs as a child process (its command-line
tool, ``rapidgzip.cli``): it decodes into a pipe, which the scan reads, and writes the seek
points it made on the way to an anonymous file (a memfd; gztool format, exactly what the
in-process decoder would export). The scan parses while the child decodes, on another core.

Integrity is unchanged: the child verifies every CRC32 and exits non-zero on corrupt data, and
the index is committed only after the child has exited successfully (bytes it sent before
failing are never served: the failed build leaves no index). The child accepts a truncated
stream silently; the reader checks the end itself (``_GzipReader._check_complete``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
from typing import IO, TYPE_CHECKING, Optional, Tuple

from ..errors import CorruptDataError, RatarmountError
from ..io.proc_io import ReadCounter
from .base import data_errors

if TYPE_CHECKING:
    from ..io.readers import RandomAccessReader

logger = logging.getLogger(__name__)

#: The child: rapidgzip's command-line tool in this interpreter, deaf to Ctrl-C (the parent's
#: KeyboardInterrupt ends it; it must not look like a decoding error first). Exit status 100
#: says that it could not start (rapidgzip cannot be imported there), not that the data is bad.
_PROGRAM = (
    "import signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # Ctrl-C is for the parent, which ends us
    "try:\n"
    "    import rapidgzip\n"
    "except ImportError:\n"
    "    sys.exit(100)\n"
    "sys.argv[0] = 'rapidgzip'\n"
    "sys.exit(rapidgzip.cli())\n"
)
CANNOT_START = 100
#: F_SETPIPE_SZ: a 64 KiB pipe makes both sides wake each other for every 64 KiB (the first
#: mount of a 100,000-file .tar.gz 2.0 s with it, 1.26 s with 1 MiB).
_SET_PIPE_SIZE = 1031
PIPE_SIZE = 1 << 20


class DecoderStartError(RatarmountError):
    """The child could not be started (no usable interpreter or rapidgzip); decode in-process."""


class DecoderProcess:
    """``rapidgzip -d`` of the file open at ``fd`` into a pipe, seek points into a memfd.

    Bytes arrive strictly in order (``readinto``); ``finish`` reads what is left, waits for the
    child and returns the decompressed size and the seek points. ``close`` always cleans up: the
    child is killed if still running.
    """

    def __init__(self, label: str, fd: int, threads: int, chunk_size: int) -> None:
        self.label = label
        self.position = 0
        if not hasattr(os, "memfd_create"):
            raise DecoderStartError("no memfd_create on this system")
        if getattr(sys, "frozen", False) or not sys.executable:
            # A bundled application's executable is the application, not an interpreter.
            raise DecoderStartError(f"{sys.executable or 'this program'} cannot run Python code")
        # Both the child's messages and its seek points go to anonymous files: nothing is left
        # behind whatever happens, and no temporary folder has to be writable.
        self._seek_points = -1
        try:
            self._stderr: IO[bytes] = tempfile.TemporaryFile(prefix="ratarmount-rapidgzip-")
        except OSError as exc:
            raise DecoderStartError(f"no temporary file for the decoding process: {exc.strerror}") from None
        try:
            self._seek_points = os.memfd_create("ratarmount-seek-points", os.MFD_CLOEXEC)
        except OSError as exc:
            self._stderr.close()
            raise DecoderStartError(f"no memfd for the decoding process: {exc.strerror}") from None
        arguments = [
            sys.executable,
            "-c",
            _PROGRAM,
            "-d",
            "-c",
            "-f",
            "-q",
            "-P",
            str(max(1, threads)),
            "--chunk-size",
            str(max(1, chunk_size // 1024)),
            "--index-format",
            "gztool",
            "--export-index",
            f"/proc/self/fd/{self._seek_points}",
            f"/proc/self/fd/{fd}",  # the child's own copies of our descriptors (pass_fds)
        ]
        try:
            self._child: Optional[subprocess.Popen[bytes]] = subprocess.Popen(
                arguments,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                pass_fds=(fd, self._seek_points),
                bufsize=0,
            )
        except OSError as exc:
            self.close()
            raise DecoderStartError(f"cannot start {arguments[0]}: {exc.strerror}") from None
        assert self._child.stdout is not None
        self._pipe = self._child.stdout.fileno()
        try:
            fcntl.fcntl(self._pipe, _SET_PIPE_SIZE, PIPE_SIZE)
        except OSError:
            pass  # a smaller pipe only costs more wake-ups
        self._read_counter = ReadCounter(self._child.pid)
        logger.debug("%s: first pass by rapidgzip in process %d (%d threads)", label, self._child.pid, threads)

    def compressed_read(self) -> int:
        """About how many compressed bytes the child has read (for progress bars): what it read
        since the first call, from ``/proc/PID/io``."""
        return self._read_counter()

    def readinto(self, view: memoryview) -> int:
        """Fill ``view`` with the next bytes; fewer only at the end of the stream. At the end,
        the child's verdict is checked: a failed child raises its error here."""
        done = 0
        while done < len(view):
            count = os.readv(self._pipe, [view[done:]])
            if count == 0:
                self._wait()
                break
            done += count
        self.position += done
        return done

    def skip(self, size: int, scratch: memoryview) -> int:
        """Read and drop up to ``size`` bytes (through ``scratch``); the bytes dropped."""
        left = size
        while left > 0:
            count = self.readinto(scratch[: min(left, len(scratch))])
            if count == 0:
                break
            left -= count
        return size - left

    def finish(self) -> Tuple[int, bytes]:
        """Read to the end, wait for the child; (decompressed size, gztool seek points)."""
        scratch = memoryview(bytearray(PIPE_SIZE))
        while self.readinto(scratch):
            pass
        self._wait()
        with open(f"/proc/self/fd/{self._seek_points}", "rb") as file:
            payload = file.read()
        if not payload:
            raise CorruptDataError(f"{self.label}: rapidgzip wrote no seek points")
        return self.position, payload

    def _wait(self) -> None:
        child = self._child
        if child is None:
            return
        code = child.wait()
        if code == 0:
            return
        self._stderr.seek(0)
        lines = [line.strip() for line in self._stderr.read().decode("utf-8", "replace").splitlines() if line.strip()]
        if code == CANNOT_START:
            raise DecoderStartError(f"{self.label}: rapidgzip cannot be imported by {sys.executable}")
        if code < 0:  # killed (the OOM killer, a user): says nothing about the data
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            raise RatarmountError(f"{self.label}: the decoding process {child.pid} was killed by {name}")
        reason = lines[-1] if lines else f"rapidgzip exited with status {code}"
        # The child's message is the last line of its traceback: "ValueError: Mismatching CRC32 ..."
        kind, _, rest = reason.partition(": ")
        if rest and kind.endswith(("Error", "Exception")):
            reason = rest
        reason = re.sub(r"^(\[[^]]*\])+ *", "", reason)  # "[IsalInflateWrapper][Thread 1234] ..."
        with data_errors(self.label, "gzip"):
            raise ValueError(reason)

    def close(self) -> None:
        child = getattr(self, "_child", None)
        if child is not None:
            if child.poll() is None:
                child.kill()
            child.wait()
            if child.stdout is not None:
                child.stdout.close()
            self._child = None
        self._stderr.close()
        seek_points, self._seek_points = self._seek_points, -1
        if seek_points >= 0:
            os.close(seek_points)


class ProcessScan:
    """The first pass's reader (a ``RandomAccessReader``) over a ``DecoderProcess``.

    The scan reads forward; a read of the last piece again (a member's first block, sniffed
    for recursion) comes from memory, and anything else from ``fallback`` (the in-process
    decoders: correct, slow). If the child cannot start, every read goes to ``fallback``.
    """

    def __init__(self, process: DecoderProcess, fallback: "RandomAccessReader") -> None:
        self.process: Optional[DecoderProcess] = process
        self._fallback = fallback
        #: The bytes last read from the pipe; they end at ``process.position``.
        self._last = b""
        self._scratch = memoryview(bytearray(PIPE_SIZE))

    def pread(self, offset: int, size: int) -> bytes:
        process = self.process
        if process is None or size <= 0:
            return self._fallback.pread(offset, size) if size > 0 else b""
        position = process.position
        last_start = position - len(self._last)
        head = b""
        if offset < position:
            if offset < last_start:
                return self._fallback.pread(offset, size)
            head = self._last[offset - last_start : offset - last_start + size]
            if len(head) == size:
                return head
            offset, size = position, size - len(head)
        try:
            if offset > position:
                self._last = b""
                if process.skip(offset - position, self._scratch) < offset - position:
                    return head  # the stream ended before ``offset``
            buffer = bytearray(size)
            count = process.readinto(memoryview(buffer))
        except DecoderStartError as exc:
            if process.position:
                raise CorruptDataError(str(exc)) from None  # it had started: cannot happen
            logger.info("%s; decoding in this process", exc)
            self.close()
            return self._fallback.pread(offset, size)
        del buffer[count:]
        self._last = bytes(buffer)
        return head + self._last if head else self._last

    def finish(self) -> Tuple[int, bytes]:
        assert self.process is not None
        return self.process.finish()

    def close(self) -> None:
        process, self.process = self.process, None
        self._last = b""
        if process is not None:
            process.close()
