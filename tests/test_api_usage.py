"""The Python API's edges: an empty list of sources, a source used after ``close()``, and what
``help(ratarmountcore.open)`` and the option dataclasses tell."""

from __future__ import annotations

import pydoc
from pathlib import Path

import pytest
from conftest import tar_bytes

import ratarmountcore
from ratarmountcore.options import CompressionOptions, IndexOptions, OpenOptions


def test_an_empty_list_of_sources_is_a_value_error() -> None:
    """It raised IndexError."""
    with pytest.raises(ValueError, match="no source to open") as caught:
        ratarmountcore.open([])
    assert isinstance(caught.value, ratarmountcore.RatarmountError)


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "folder", "union"])
def test_a_closed_source_raises_value_error_as_a_closed_file_does(tmp_path: Path, kind: str) -> None:
    """It raised sqlite3.ProgrammingError "the index was closed" (a folder: OSError EBADF)."""
    import gzip

    data = tar_bytes({"d/f": b"data"})
    archive = tmp_path / "a.tar"
    archive.write_bytes(data)
    (tmp_path / "gz.tar.gz").write_bytes(gzip.compress(data))
    (tmp_path / "folder" / "d").mkdir(parents=True)
    (tmp_path / "folder" / "d" / "f").write_bytes(b"data")
    source = {
        "tar": str(archive),
        "tar.gz": str(tmp_path / "gz.tar.gz"),
        "folder": str(tmp_path / "folder"),
        "union": [str(archive), str(tmp_path / "folder")],
    }[kind]
    with ratarmountcore.open(source) as src:  # type: ignore[arg-type]
        assert src.read("/d/f") == b"data"
    for use in (
        lambda: src.read("/d/f"),
        lambda: src.listdir("/d"),
        lambda: src.stat("/d/f"),
        lambda: src.exists("/d/f"),
        lambda: src.open("/d/f"),
    ):
        with pytest.raises(ValueError, match="I/O operation on a closed source"):
            use()


def test_help_of_open_documents_arguments_options_use_and_errors() -> None:
    text = pydoc.render_doc(ratarmountcore.open, renderer=pydoc.plaintext)
    for words in (
        "source",
        "OpenOptions",
        "IndexOptions",
        "CompressionOptions",
        "with ratarmountcore.open(",
        "close()",
        "FileNotFoundError",
        "ValueError",
        "CorruptDataError",
        "in bytes",
    ):
        assert words in text, words


@pytest.mark.parametrize(
    ("cls", "field", "words"),
    [
        (CompressionOptions, "cache_size", "bytes"),
        (CompressionOptions, "seek_point_spacing", "bytes"),
        (IndexOptions, "index_folders", "must exist"),
        (OpenOptions, "recursive", "-r"),
    ],
)
def test_the_option_classes_document_their_fields_with_units(cls: type, field: str, words: str) -> None:
    doc = cls.__doc__ or ""
    line = next((line for line in doc.splitlines() if line.strip().startswith(f"{field} /")), "")
    described = doc[doc.index(line) :].split(" / ", 2)[1] if line else ""
    assert words in described, (field, doc)
