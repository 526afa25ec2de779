"""Decompression backends behind one random-access interface.

* ``base``: the ``CompressedReader`` ABC (thread-safe ``pread``, ``size``, seek point export and
  import), the counting ``FdFile`` all backends read through, seek point (de)serialization.
* ``registry``: which backend opens which format (``BACKENDS``), ``open_compressed``.
* ``pool`` / ``pooled``: bounded pools of library decoders (rapidgzip, indexed_gzip).
* ``framed``: frame-table random access with a shared frame cache (zstd, xz).
* ``gzip``, ``bzip2``, ``zstd``, ``xz``: one module per library.

Importing this package imports no decompression library; backends are imported on first use.
"""

from __future__ import annotations

from typing import Dict


def backend_versions() -> Dict[str, str]:
    """Installed versions of the decompression libraries, of crc32c (gzip block checksums) and of
    isal (span-cache misses of .tar.gz files decoded only as far as needed), without importing
    them."""
    from importlib import metadata

    result = {}
    for name in ("rapidgzip", "indexed_gzip", "zstandard", "python-xz", "crc32c", "isal"):
        try:
            result[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            result[name] = "not installed"
    return result
