"""Lookups and listings of one folder in parallel, also with libfuse releases that forget to ask.

The kernel serializes every LOOKUP and READDIR of a folder behind a per-folder mutex unless the
daemon's answer to FUSE_INIT carries ``FUSE_PARALLEL_DIROPS``. libfuse 3 sets the capability in
``want`` by default but, up to 3.16, never copies it into that answer (3.17 does), so with
Debian 12's libfuse 3.14 two threads stat-ing files of one folder wait for each other's round
trips, and a listing of a folder waits for every lookup in it. (Measured: a stat beside a lookup
the daemon holds for 2 s waited 1.75 s.)

So the low-level front-end lets libfuse answer FUSE_INIT as usual, into a socket standing in for
``/dev/fuse`` for that one message, sets the bit in the answer when the kernel offered it, and
writes the answer to the device itself. Everything else (libfuse's own state, the init callback)
is untouched, and nothing in our daemon relies on the kernel serializing folder operations.
With libfuse 3.17 and later nothing is patched: the init callback reads whether the kernel
offered the capability (libfuse then asks for it by default).
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import struct
from typing import Any

logger = logging.getLogger(__name__)

FUSE_INIT = 26
#: The first libfuse release that passes the capability on itself (``want_ext`` rework).
LIBFUSE_PASSES_IT = (3, 17)
#: ``flags`` bit of ``fuse_init_in`` / ``fuse_init_out``.
FUSE_PARALLEL_DIROPS = 1 << 18
#: ``struct fuse_in_header``: len, opcode, unique, nodeid, uid, gid, pid, padding.
_IN_HEADER = struct.Struct("=IIQQIIII")
#: ``struct fuse_out_header``: len, error, unique.
_OUT_HEADER = struct.Struct("=IiQ")
#: ``fuse_init_in`` / ``fuse_init_out`` start with major, minor, max_readahead, flags.
_INIT_HEAD = struct.Struct("=IIII")
#: Large enough for any request the kernel sends before the init answer (only FUSE_INIT).
_REQUEST_BUFFER = 1024 * 1024 + 4096


class _FuseBuf(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("flags", ctypes.c_int),
        ("mem", ctypes.c_void_p),
        ("fd", ctypes.c_int),
        ("pos", ctypes.c_long),
        ("mem_size", ctypes.c_size_t),  # (later releases; ignored by 3.14)
    ]


def libfuse_passes_it(version: str) -> bool:
    """Whether libfuse ``version`` ("3.14.0") copies the capability into its answer itself."""
    try:
        numbers = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return numbers >= LIBFUSE_PASSES_IT


def patch_init_reply(request: bytes, reply: bytes) -> bytes:
    """``reply`` (libfuse's answer to the FUSE_INIT ``request``) with FUSE_PARALLEL_DIROPS set
    when the kernel offered it and the answer is a success; otherwise unchanged."""
    if len(request) < _IN_HEADER.size + _INIT_HEAD.size or len(reply) < _OUT_HEADER.size + _INIT_HEAD.size:
        return reply
    opcode = _IN_HEADER.unpack_from(request)[1]
    _major, _minor, _readahead, offered = _INIT_HEAD.unpack_from(request, _IN_HEADER.size)
    error = _OUT_HEADER.unpack_from(reply)[1]
    if opcode != FUSE_INIT or error != 0 or not offered & FUSE_PARALLEL_DIROPS:
        return reply
    major, minor, readahead, flags = _INIT_HEAD.unpack_from(reply, _OUT_HEADER.size)
    patched = bytearray(reply)
    _INIT_HEAD.pack_into(patched, _OUT_HEADER.size, major, minor, readahead, flags | FUSE_PARALLEL_DIROPS)
    return bytes(patched)


def negotiate(lib: Any, session: int) -> bool:
    """Answer the kernel's FUSE_INIT for ``session`` (mounted, its loop not started yet) through
    libfuse, with FUSE_PARALLEL_DIROPS set (see the module docstring); whether it is set."""
    fd = lib.fuse_session_fd(session)
    try:
        request = os.read(fd, _REQUEST_BUFFER)
    except OSError as exc:  # the connection ended before it began: libfuse's loop will see it too
        logger.debug("no FUSE_INIT to answer: %s", exc)
        return False
    if not request:
        return False
    saved = os.dup(fd)
    ours, libfuses = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        os.dup2(libfuses.fileno(), fd)  # libfuse writes its answer to the fd number it holds
        try:
            memory = ctypes.create_string_buffer(request, len(request))
            buffer = _FuseBuf(len(request), 0, ctypes.cast(memory, ctypes.c_void_p), -1, 0, len(request))
            lib.fuse_session_process_buf(session, ctypes.byref(buffer))
            ours.setblocking(False)
            try:
                reply = ours.recv(_REQUEST_BUFFER)
            except BlockingIOError:
                reply = b""  # libfuse answered nothing (it ended the session)
        finally:
            os.dup2(saved, fd)
    finally:
        os.close(saved)
        ours.close()
        libfuses.close()
    if not reply:
        return False
    patched = patch_init_reply(request, reply)
    os.write(fd, patched)
    enabled = init_flags(patched) & FUSE_PARALLEL_DIROPS != 0
    log_outcome(enabled)
    return enabled


def log_outcome(enabled: bool) -> None:
    logger.debug("FUSE_INIT answered; lookups and listings within a folder in parallel: %s", enabled)


def init_flags(reply: bytes) -> int:
    """The ``flags`` of an answer to FUSE_INIT (0 for an error or a short answer)."""
    if len(reply) < _OUT_HEADER.size + _INIT_HEAD.size or _OUT_HEADER.unpack_from(reply)[1] != 0:
        return 0
    return int(_INIT_HEAD.unpack_from(reply, _OUT_HEADER.size)[3])
