"""What the mount asks of the kernel at FUSE_INIT: the answer gets FUSE_PARALLEL_DIROPS when the
kernel offers it (libfuse up to 3.16 leaves it out; nothing else in the answer changes), and
symlink targets are cached on immutable mounts."""

from __future__ import annotations

import struct

from ratarmount.parallel_dirops import FUSE_INIT, FUSE_PARALLEL_DIROPS, init_flags, libfuse_passes_it, patch_init_reply

IN_HEADER = struct.Struct("=IIQQIIII")
OUT_HEADER = struct.Struct("=IiQ")


def init_request(flags: int, opcode: int = FUSE_INIT) -> bytes:
    body = struct.pack("=IIII", 7, 38, 131072, flags) + bytes(48)  # then flags2 and unused
    return IN_HEADER.pack(IN_HEADER.size + len(body), opcode, 2, 0, 0, 0, 0, 0) + body


def init_reply(flags: int, error: int = 0) -> bytes:
    body = struct.pack("=IIIIHHIIHHI", 7, 38, 131072, flags, 12, 9, 1 << 20, 1, 256, 0, 0) + bytes(28)
    if error:
        body = b""
    return OUT_HEADER.pack(OUT_HEADER.size + len(body), error, 2) + body


OFFERED = 0x3FFFFFFF
LIBFUSE_3_14 = 0x0010B829  # an answer of libfuse 3.14: without bit 18


def test_the_bit_is_set_when_offered_and_nothing_else_changes() -> None:
    reply = init_reply(LIBFUSE_3_14)
    patched = patch_init_reply(init_request(OFFERED), reply)
    assert init_flags(patched) == LIBFUSE_3_14 | FUSE_PARALLEL_DIROPS
    assert len(patched) == len(reply)
    changed = [i for i, (a, b) in enumerate(zip(reply, patched)) if a != b]
    assert changed == [OUT_HEADER.size + 12 + 2]  # the third byte of ``flags``


def test_answers_left_alone() -> None:
    reply = init_reply(LIBFUSE_3_14)
    assert patch_init_reply(init_request(OFFERED & ~FUSE_PARALLEL_DIROPS), reply) == reply  # not offered
    assert patch_init_reply(init_request(OFFERED, opcode=1), reply) == reply  # not FUSE_INIT
    failed = init_reply(0, error=-71)
    assert patch_init_reply(init_request(OFFERED), failed) == failed
    assert init_flags(failed) == 0
    assert patch_init_reply(init_request(OFFERED)[:20], reply) == reply  # short
    assert patch_init_reply(init_request(OFFERED), reply[:20]) == reply[:20]
    already = init_reply(LIBFUSE_3_14 | FUSE_PARALLEL_DIROPS)  # libfuse 3.17 and later
    assert patch_init_reply(init_request(OFFERED), already) == already


def test_only_releases_that_leave_it_out_get_the_answer_patched() -> None:
    assert not libfuse_passes_it("3.14.0") and not libfuse_passes_it("3.16.2")
    assert libfuse_passes_it("3.17.1") and libfuse_passes_it("3.18.0") and libfuse_passes_it("4.0")
    assert not libfuse_passes_it("") and not libfuse_passes_it("unknown")


def test_the_answer_goes_through_libfuse_and_out_patched() -> None:
    """``negotiate`` with a socket as the device: the kernel's INIT is handed to libfuse (a
    stand-in that answers on the descriptor number the session holds, as libfuse does), and the
    device receives that answer with the bit set; the session's descriptor is the device again."""
    import ctypes
    import os
    import socket

    from ratarmount.parallel_dirops import negotiate

    kernel, device = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fd = device.fileno()
    request = init_request(OFFERED)
    kernel.send(request)
    seen = []

    class FakeLibfuse:
        def fuse_session_fd(self, session: int) -> int:
            return fd

        def fuse_session_process_buf(self, session: int, buffer: object) -> None:
            raw = ctypes.cast(buffer, ctypes.POINTER(ctypes.c_size_t * 3)).contents
            seen.append(ctypes.string_at(raw[2], raw[0]))
            os.write(fd, init_reply(LIBFUSE_3_14))  # libfuse writes to the fd number it holds

    try:
        assert negotiate(FakeLibfuse(), 1)
        assert seen == [request]
        answer = kernel.recv(4096)
        assert init_flags(answer) == LIBFUSE_3_14 | FUSE_PARALLEL_DIROPS
        os.write(fd, b"later")  # the descriptor is the device again
        assert kernel.recv(4096) == b"later"
    finally:
        kernel.close()
        device.close()


def test_symlinks_are_cached_only_on_immutable_mounts() -> None:
    from ratarmount.capabilities import FUSE_CAP_CACHE_SYMLINKS, FUSE_CAP_READDIRPLUS_AUTO, wanted_capabilities

    default = FUSE_CAP_READDIRPLUS_AUTO | 1
    assert wanted_capabilities(default, ~0, immutable=True) == 1 | FUSE_CAP_CACHE_SYMLINKS
    assert wanted_capabilities(default, ~0, immutable=False) == 1
    assert wanted_capabilities(default, ~FUSE_CAP_CACHE_SYMLINKS, immutable=True) == 1  # not offered
