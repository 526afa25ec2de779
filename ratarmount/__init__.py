"""ratarmount: command line and FUSE front-end over ratarmountcore."""

from typing import Any

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    # (not imported at the package's import: the console commands import this package first,
    # and ``entry.py`` wants as little as possible imported before its own code runs)
    if name == "__version__":
        from ratarmountcore import __version__

        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
