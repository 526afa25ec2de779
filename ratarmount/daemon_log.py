"""Where a mount's log goes once it runs in the background.

Until the mount is ready its messages reach the terminal (the parent prints them). After that
the daemon's stdio is /dev/null, and so would be everything it finds while serving: corrupt data,
an archive changed while mounted, an index replaced under it. So once detached, warnings and
errors go to ``--log-file`` when one was given, else to the system log (``/dev/log``, tagged
``ratarmount[PID]``, so ``journalctl -t ratarmount`` shows them); with neither they are dropped
as before. A log file also receives the messages of a mount in the foreground, next to stderr.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

from ratarmountcore.errors import RatarmountError

logger = logging.getLogger(__name__)

#: The system log's socket on Linux (journald and rsyslog listen there).
SYSLOG_SOCKET = "/dev/log"
FILE_FORMAT = "%(asctime)s ratarmount[%(process)d]: %(levelname)s: %(message)s"


def add_log_file(path: str) -> logging.Handler:
    """Append the log to ``path`` from now on; a one-line error when it cannot be written."""
    try:
        handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    except OSError as exc:
        folder = os.path.dirname(os.path.abspath(path))
        why = f"the folder {folder} does not exist" if not os.path.exists(folder) else exc.strerror
        raise RatarmountError(f"{path}: cannot write the log file ({why})") from None
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    logging.getLogger().addHandler(handler)
    return handler


def route_background_logs(to_file: bool, syslog_address: str = SYSLOG_SOCKET) -> Optional[logging.Handler]:
    """The daemon detached its stdio: drop the handlers writing to stderr and, unless a log file
    takes the messages, send them to the system log. Returns the handler added, if any."""
    root = logging.getLogger()
    # A new list, not ``removeHandler``: that removes from the list in place, and a thread
    # logging at that moment (``Logger.callHandlers`` iterates over it without a lock) then
    # skipped the handler behind the removed one, the log file's: a mount's "decoding ahead"
    # line, logged as the mount became ready, was missing from its log file.
    root.handlers = [
        handler
        for handler in root.handlers
        if not (type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.__stderr__))
    ]
    if to_file:
        return None
    if not os.path.exists(syslog_address):
        return None
    # Imported only here: logging.handlers costs 15 ms and 1.5 MiB resident (socket, queue, ...),
    # which a mount without a system log need not carry.
    import socket
    from logging.handlers import SysLogHandler

    try:
        handler = SysLogHandler(address=syslog_address, facility=SysLogHandler.LOG_DAEMON, socktype=socket.SOCK_DGRAM)
    except OSError as exc:
        logger.debug("no system log at %s: %s", syslog_address, exc)
        return None
    handler.ident = f"ratarmount[{os.getpid()}]: "
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    root.addHandler(handler)
    return handler
