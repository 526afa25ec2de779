"""ratarmountcore: read-only file trees over archives, usable from Python without FUSE.

>>> import ratarmountcore
>>> with ratarmountcore.open("train.tar") as src:      # doctest: +SKIP
...     names = src.listdir("/")
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

from .errors import RatarmountError
from .options import CompressionOptions, IndexOptions, OpenOptions
from .sources.base import FileInfo, MountSource

__version__ = "0.1.0"

__all__ = [
    "CompressionOptions",
    "FileInfo",
    "IndexOptions",
    "MountSource",
    "OpenOptions",
    "RatarmountError",
    "__version__",
    "open",
]


def open(  # noqa: A001 - the natural name for the entry point
    source: Union[str, Sequence[str]], options: Optional[OpenOptions] = None
) -> MountSource:
    """Open an archive or folder (or a list of them, union-mounted) as a read-only ``MountSource``.

    source / a path (``str`` or ``os.PathLike``) of a tar archive (plain, .gz, .bz2, .zst, .xz),
        a single compressed file or a folder; or a non-empty list of them, shown as one tree in
        which later sources win where names clash.
    options / an ``OpenOptions`` (default: ``OpenOptions()``): ``recursive``, ``lazy``,
        ``strip_tar_extension``, plus ``index`` (an ``IndexOptions``: where the index is read and
        written, ``index_file`` / ``index_folders``, ``recreate``, ``progress``) and
        ``compression`` (a ``CompressionOptions``: ``parallelization``, ``gzip_backend``, and
        ``seek_point_spacing`` and ``cache_size`` in bytes, where the command line takes MiB).
        See those dataclasses' fields for the details.

    The first open of an archive scans it and writes its index (beside it, else in
    ``~/.cache/ratarmount``); later opens take a fraction of a second. Use it as a context
    manager, or call ``close()``; a source used after that raises ``ValueError``::

        with ratarmountcore.open("train.tar") as src:
            names = src.listdir("/")
            data = src.read("/n01440764/n01440764_10026.JPEG")  # or src.open(path) for a file

    Errors (all ``RatarmountError`` subclasses, each also the builtin named; see
    ``ratarmountcore.errors``):

    - ``FileNotFoundError``: a source does not exist, or a folder named for the index does not;
    - ``ValueError`` (``ArchiveError``): not a supported format, an empty or truncated archive,
      a damaged tar header; also an empty list of sources (``NoSourceError``);
    - ``OSError`` (``CorruptDataError``, EIO): compressed data failing its checks;
    - ``PermissionError`` (``IndexNotWritableError``): no place to write the index;
    - ``ImportError`` (``MissingBackendError``): the decompression library is not installed.

    Path methods of the source raise what the OS would (``FileNotFoundError``,
    ``NotADirectoryError``, ``IsADirectoryError``, ``OSError`` with ELOOP for ``open`` of a
    symbolic link).
    """
    from .sources.factory import open_source

    return open_source(source, options or OpenOptions())
