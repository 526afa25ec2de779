"""What a mount in the background finds while serving reaches a log (see ratarmount/daemon_log.py)."""

from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
from conftest import RATARMOUNT, Mounter, lazy_unmount, run_ratarmount, tar_bytes
from test_cli import daemon_of

from ratarmount.daemon_log import route_background_logs

FILES = {f"d/f{i:03d}.bin": bytes([i]) * (4000 + 97 * i) for i in range(120)}
OTHER = {name: bytes([255 - i]) * len(data) for i, (name, data) in enumerate(FILES.items())}


def test_background_mount_writes_what_it_finds_to_the_log_file(mounter: Mounter, tmp_path: Path) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    log = tmp_path / "mount.log"
    mountpoint = mounter.mount(archive, extra=["--log-file", str(log)])
    with open(archive, "r+b") as f:  # rewritten in place while mounted
        f.truncate(0)
        f.write(tar_bytes(OTHER))
    time.sleep(1.2)  # (the mount looks at the archive at most once a second)
    for name in sorted(FILES)[:3]:
        with pytest.raises(OSError) as caught:
            (mountpoint / name).read_bytes()
        assert caught.value.errno == errno.EIO
    lines: list = []
    for _ in range(40):
        lines = [line for line in log.read_text().splitlines() if "changed since it was mounted" in line]
        if lines:
            break
        time.sleep(0.05)
    assert len(lines) == 1, log.read_text()
    assert str(archive) in lines[0] and "ratarmount[" in lines[0] and "ERROR" in lines[0]


def _change_and_read(archive: Path, mountpoint: Path) -> None:
    """Rewrite the mounted archive in place and read from it: EIO, and an error in the log."""
    with open(archive, "r+b") as f:
        f.truncate(0)
        f.write(tar_bytes(OTHER))
    time.sleep(1.2)  # (the mount looks at the archive at most once a second)
    with pytest.raises(OSError) as caught:
        (mountpoint / sorted(FILES)[0]).read_bytes()
    assert caught.value.errno == errno.EIO


def _wait_for_line(path: Path, text: str) -> List[str]:
    lines: List[str] = []
    for _ in range(40):
        lines = [line for line in path.read_text().splitlines() if text in line]
        if lines:
            break
        time.sleep(0.05)
    return lines


def _daemon_stdio(mountpoint: Path) -> List[str]:
    """Where fds 0, 1 and 2 of the daemon serving ``mountpoint`` point."""
    pid = daemon_of(mountpoint)
    return [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (0, 1, 2)]


def test_debug_mount_in_the_background_returns_when_its_output_is_a_pipe(mounter: Mounter, tmp_path: Path) -> None:
    """``ratarmount -d A M 2>&1 | tee log``: the daemon kept the pipes, and the reader of the
    output waited for their end until the unmount (so did a program capturing the output)."""
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    log = tmp_path / "mount.log"
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    mounter.mounts.append(mountpoint)  # (unmounted at the end, also when this hangs)
    result = run_ratarmount("-d", "--log-file", str(log), str(archive), str(mountpoint), timeout=60)
    assert result.returncode == 0, result.stderr
    assert os.path.ismount(mountpoint)
    assert f"debug messages go to {log} from now on" in result.stderr
    assert _daemon_stdio(mountpoint) == [os.devnull] * 3
    _change_and_read(archive, mountpoint)
    lines = _wait_for_line(log, "changed since it was mounted")
    assert len(lines) == 1 and "ERROR" in lines[0], log.read_text()


def test_debug_mount_in_the_background_keeps_writing_to_a_file_as_stderr(mounter: Mounter, tmp_path: Path) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    err = tmp_path / "stderr.txt"
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    mounter.mounts.append(mountpoint)
    with open(err, "w") as stderr:
        result = subprocess.run(
            [*RATARMOUNT, "-d", str(archive), str(mountpoint)], stdout=subprocess.PIPE, stderr=stderr, timeout=60
        )
    assert result.returncode == 0, err.read_text()
    assert _daemon_stdio(mountpoint) == [os.devnull, os.devnull, str(err)]
    _change_and_read(archive, mountpoint)
    lines = _wait_for_line(err, "changed since it was mounted")
    assert len(lines) == 1 and "ERROR" in lines[0], err.read_text()
    assert "DEBUG" in err.read_text()


def test_unwritable_log_file_is_a_one_line_error(tmp_path: Path) -> None:
    archive = tmp_path / "data.tar"
    archive.write_bytes(tar_bytes(FILES))
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    try:
        result = run_ratarmount("--log-file", str(tmp_path / "missing" / "mount.log"), str(archive), str(mountpoint))
    finally:
        mounted = os.path.ismount(mountpoint)
        lazy_unmount(mountpoint)
    assert not mounted
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "cannot write the log file" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def root_handlers() -> object:
    root = logging.getLogger()
    saved = list(root.handlers)
    yield root
    for handler in list(root.handlers):
        if handler not in saved:
            root.removeHandler(handler)
            handler.close()
    for handler in saved:
        if handler not in root.handlers:
            root.addHandler(handler)


def test_detached_daemon_logs_to_the_system_log(tmp_path: Path, root_handlers: logging.Logger) -> None:
    address = str(tmp_path / "log")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(address)
    server.settimeout(5)
    try:
        stderr_handler = logging.StreamHandler(sys.stderr)
        root_handlers.addHandler(stderr_handler)
        added = route_background_logs(to_file=False, syslog_address=address)
        assert added is not None
        assert stderr_handler not in root_handlers.handlers  # (its stderr is /dev/null now)
        logging.getLogger("ratarmountcore.sources.watch").error("%s: changed since it was mounted", "/a.tar")
        message = server.recv(4096)
    finally:
        server.close()
    assert message.startswith(b"<27>")  # facility daemon (3), severity error (3)
    assert b"ratarmount[%d]: " % os.getpid() in message and b"/a.tar: changed since it was mounted" in message


def test_no_system_log_without_its_socket(tmp_path: Path, root_handlers: logging.Logger) -> None:
    assert route_background_logs(to_file=False, syslog_address=str(tmp_path / "absent")) is None
    assert route_background_logs(to_file=True, syslog_address=str(tmp_path / "absent")) is None


def test_a_message_logged_while_stderr_is_dropped_still_reaches_the_log_file(root_handlers: logging.Logger) -> None:
    """The stderr handler is dropped (``route_background_logs``) while another thread's message
    passes through the handlers: the handler behind it (the log file's) must still get it.
    Here the drop happens inside the stderr handler's filter, i.e. in the middle of the
    iteration over the handlers, as when the two threads interleave."""
    got: List[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record.getMessage())

    def drop_stderr_now(_record: logging.LogRecord) -> bool:
        route_background_logs(to_file=True)
        return False  # (nothing on the test's stderr)

    stderr_handler = logging.StreamHandler(sys.stderr)
    stderr_handler.addFilter(drop_stderr_now)
    root_handlers.addHandler(stderr_handler)
    root_handlers.addHandler(Keep())
    logging.getLogger("ratarmountcore.compression.pooled").warning("decoding ahead")
    assert stderr_handler not in root_handlers.handlers
    assert got == ["decoding ahead"]
