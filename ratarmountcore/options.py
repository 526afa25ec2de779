"""Typed option objects built once by the CLI (or a Python caller) and passed down as is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

from .cores import default_decoder_threads

#: The cache folder for indexes (and union tables); made when missing, unlike folders the
#: caller names.
DEFAULT_CACHE_FOLDER = "~/.cache/ratarmount"


@dataclass(frozen=True)
class IndexOptions:
    """Where an archive's index is read and written (``OpenOptions.index``).

    index_file / one path for the index of a single archive (``--index-file``); its folder
        must exist. Overrides ``index_folders``.
    index_folders / the folders to look in and to write to, in order (``--index-folders``):
        "" is beside the archive; default ``("", "~/.cache/ratarmount")``. Only these are used;
        each must exist, except ~/.cache/ratarmount, which is made when needed.
    recreate / build the index again even when a valid one exists (``--recreate-index``).
    progress / a progress bar on stderr while indexing, when stderr is a terminal.
    """

    #: Explicit index path; overrides the folder search. Its folder must exist.
    index_file: Optional[str] = None
    #: The folders to look for / write the index in, in order (only these: a list without ""
    #: neither uses nor writes an index beside the archive). "" means "beside the archive".
    #: The default is beside the archive, then ~/.cache/ratarmount. A folder named here must
    #: exist (``FileNotFoundError`` otherwise); only ~/.cache/ratarmount is made when missing.
    index_folders: Tuple[str, ...] = ("", DEFAULT_CACHE_FOLDER)
    #: Rebuild even when a valid index exists.
    recreate: bool = False
    #: Show a progress bar on stderr while indexing (only when stderr is a terminal).
    progress: bool = True


@dataclass(frozen=True)
class CompressionOptions:
    """How compressed archives are decoded (``OpenOptions.compression``). Sizes are in bytes
    here, where the command line takes MiB.

    parallelization / decoder threads; 0 (default): the cores this process may use (its CPU
        affinity and cgroup CPU quota), at most 16 (``-P``; see ``ratarmountcore.cores``).
    gzip_backend / "rapidgzip" or "indexed_gzip"; None (default): the best installed, or the
        one an existing index was built with (``--gzip-backend``).
    seek_point_spacing / bytes between stored gzip seek points (``--seek-point-spacing`` MiB
        times 2**20); None (default): the backend's, and an existing index is used whatever its
        spacing.
    cache_size / bytes of decoded data kept for all compressed archives of the process
        together (``--cache-size`` MiB times 2**20; default 32 MiB); 0 turns the cache off.
        Archives whose decoded data is at most 3 times this (all together) are kept whole.
    """

    #: Threads for parallel decompression; 0 means the usable cores, at most 16.
    parallelization: int = 0
    #: Preferred gzip backend: "rapidgzip" or "indexed_gzip" (None: best available).
    gzip_backend: Optional[str] = None
    #: Spacing of gzip seek points in bytes, not MiB as ``--seek-point-spacing`` (rapidgzip: of
    #: compressed data; indexed_gzip: of decompressed data). None: the backend's default, and an
    #: index built with any spacing is used as it is; a value given here rebuilds an index
    #: built with another.
    seek_point_spacing: Optional[int] = None
    #: Decoded data kept (bytes, not MiB as ``--cache-size``; one bound for all compressed files
    #: of the process) so that reads near each other decode once; 0 disables the cache.
    cache_size: int = 32 * 1024 * 1024

    def threads(self) -> int:
        return self.parallelization if self.parallelization > 0 else default_decoder_threads()


@dataclass(frozen=True)
class OpenOptions:
    """Options of ``ratarmountcore.open``.

    index / an ``IndexOptions``: where the index is read and written.
    compression / a ``CompressionOptions``: decoder threads, gzip backend, seek point spacing
        and cache size (in bytes).
    recursive / show archives inside archives (and the tar archives in a folder source) as
        folders (``-r``).
    lazy / with ``recursive``, open (and index) the archives in a folder source when first
        used instead of at open (``--lazy``).
    strip_tar_extension / with ``recursive``, show an archive ``NAME.tar`` as the folder
        ``NAME`` (``--strip-tar-extension``).
    """

    #: Where the index is read and written.
    index: IndexOptions = field(default_factory=IndexOptions)
    #: How compressed archives are decoded (sizes in bytes).
    compression: CompressionOptions = field(default_factory=CompressionOptions)
    #: Mount archives found inside archives as directories.
    recursive: bool = False
    #: With ``recursive``, open (and index) the archives in a folder source when first used
    #: instead of when the folder is opened (thousands of archives, few of them read).
    lazy: bool = False
    #: With ``recursive``, show an archive ``NAME.tar`` (inside an archive, or in a folder source)
    #: as the folder ``NAME``: ImageNet's class tars as folders named by their class alone.
    strip_tar_extension: bool = False
