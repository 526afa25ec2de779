"""Decompression backends behind one random-access interface."""

from __future__ import annotations

from typing import Dict


def backend_versions() -> Dict[str, str]:
    """Installed versions of the optional decompression libraries (no import of the libraries)."""
    from importlib import metadata

    result = {}
    for name in ("rapidgzip", "indexed_gzip", "zstandard", "python-xz"):
        try:
            result[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            result[name] = "not installed"
    return result
