"""SHA-256 without loading OpenSSL.

``hashlib`` initializes OpenSSL on import, which adds about 3.5 MiB to the resident size of every
mount daemon; we only hash a few short strings and samples (index names, archive fingerprints).
CPython's own implementation gives the same digests; ``hashlib`` is the fallback.
"""

from __future__ import annotations

from typing import Any

try:  # Python 3.12+
    from _sha2 import sha256 as _sha256  # type: ignore[import-not-found]
except ImportError:
    try:  # Python 3.8-3.11
        from _sha256 import sha256 as _sha256  # type: ignore[import-not-found,no-redef]
    except ImportError:  # pragma: no cover - builds without the built-in modules
        from hashlib import sha256 as _sha256  # type: ignore[assignment]


def sha256(data: bytes = b"") -> Any:
    """A ``hashlib``-compatible SHA-256 object (``update``, ``digest``, ``hexdigest``)."""
    return _sha256(data)
