"""One error hierarchy for the whole library.

Every leaf also inherits the builtin exception a caller would naturally catch, so
``except FileNotFoundError`` keeps working for users who never heard of ratarmount.
"""

from __future__ import annotations

import errno


class RatarmountError(Exception):
    """Base of every error raised on purpose by ratarmountcore."""

    #: errno the FUSE layer reports for this error.
    errno_code: int = errno.EIO


class _CodedOSError(RatarmountError, OSError):
    """An OSError raised with a message alone: its ``errno`` is the class's code (callers of
    the library see EIO, ESTALE, ... too)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        if self.errno is None:
            self.errno = self.errno_code


class NotFoundError(RatarmountError, FileNotFoundError):
    errno_code = errno.ENOENT


class NotADirectoryRatarmountError(RatarmountError, NotADirectoryError):
    errno_code = errno.ENOTDIR


class IsADirectoryRatarmountError(RatarmountError, IsADirectoryError):
    errno_code = errno.EISDIR


class NotASymlinkError(RatarmountError, OSError):
    errno_code = errno.EINVAL


class IsASymlinkError(RatarmountError, OSError):
    """A symbolic link where a regular file was asked for: the core never follows links (ELOOP,
    as ``open`` with ``O_NOFOLLOW`` says)."""

    errno_code = errno.ELOOP


class ReplacedFileError(_CodedOSError):
    """A folder's file was replaced (another file renamed over its name) since it was looked
    up: it is not opened in its place (ESTALE; the kernel then looks the name up again)."""

    errno_code = errno.ESTALE


class ArchiveError(RatarmountError, ValueError):
    """The archive cannot be read as what it claims to be."""

    def naming(self, path: str) -> "ArchiveError":
        """The same error, its message starting with ``path`` (as one-line errors name the file)."""
        message = str(self)
        return type(self)(message if message.startswith(path) else f"{path}: {message}")


class UnsupportedFormatError(ArchiveError):
    """The file is not in any format we can mount."""


class EmptyArchiveError(ArchiveError):
    """The file is empty."""


class TruncatedArchiveError(ArchiveError):
    """The archive ends in the middle of a member."""


class CorruptHeaderError(ArchiveError):
    """A tar header fails its checksum or holds impossible values."""


class CorruptDataError(_CodedOSError):
    """Stored data failed an integrity check (CRC, hash); never served."""

    errno_code = errno.EIO


class CorruptIndexError(CorruptDataError):
    """The index file was damaged after it was written, as far as SQLite sees it ("database
    disk image is malformed"): reads through it fail with EIO."""


class ArchiveChangedError(CorruptDataError):
    """The archive file changed while mounted: its index no longer describes it. Logged once
    where it is detected (``logged``), so front-ends do not log every read it fails."""

    logged = True


class NoSourceError(RatarmountError, ValueError):
    """``ratarmountcore.open`` was given an empty list of sources."""


class ClosedSourceError(RatarmountError, ValueError):
    """A source used after its ``close()``: a ``ValueError``, as an operation on a closed Python
    file raises (it was a raw ``sqlite3.ProgrammingError``)."""


class MissingBackendError(RatarmountError, ImportError):
    """An optional library needed for this file is not installed."""


class IndexFileError(RatarmountError, RuntimeError):
    """Base for problems with an index file."""


class InvalidIndexError(IndexFileError):
    """The index file is not a valid ratarmount index."""


class StaleIndexError(InvalidIndexError):
    """The index does not belong to the archive as it is now (or to this format version)."""


class OtherOptionsIndexError(StaleIndexError):
    """The index belongs to the archive but was built with other options (``-r``,
    ``--strip-tar-extension``, a seek point spacing, a backend, a format of an older version)."""


class IndexWriteError(IndexFileError, _CodedOSError):
    """Writing the index failed on the way (the disk filled up, an I/O error)."""

    @classmethod
    def of(cls, archive: str, index: str, cause: object) -> "IndexWriteError":
        return cls(f"{archive}: cannot write its index {index} ({cause})")


class IndexLocationFailedError(IndexWriteError):
    """Writing the index failed at ``index`` for a reason of that place (its disk filled up, a
    quota, an I/O error), with another location left to try: the archive is opened again and
    indexed there."""

    errno_code = errno.ENOSPC

    def __init__(self, message: str, index: str, cause: str) -> None:
        super().__init__(message)
        self.index = index
        self.cause = cause


class IndexFolderNotFoundError(IndexFileError, _CodedOSError, FileNotFoundError):
    """A folder named for indexes (``--index-folders``, the folder of ``--index-file``) does not
    exist: it is not made (a typo would leave folders behind, and pass the index beside the
    archive over)."""

    errno_code = errno.ENOENT


class IndexNotWritableError(IndexFileError, PermissionError):
    """No candidate location for the index is writable."""


class TooManyOpenFilesError(RatarmountError, OSError):
    """The process ran out of file descriptors (EMFILE)."""

    errno_code = errno.EMFILE


class MountError(RatarmountError, OSError):
    """The mount point cannot be used."""
