"""Writing reports: named sections of BENCHMARKS.md (written atomically).

Each benchmark owns one block of BENCHMARKS.md between ``<!-- NAME:begin -->``
and ``<!-- NAME:end -->``; rewriting it keeps every other section.
"""

from __future__ import annotations

from pathlib import Path

from facefuse.runtime.files import atomic_write_text


def section_markers(name: str) -> tuple[str, str]:
    """The (begin, end) HTML comments that delimit section ``name``."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def splice_section(document: str, name: str, section: str) -> str:
    """``document`` with section ``name`` replaced by ``section`` (appended, with
    its markers, when the document has none)."""
    begin, end = section_markers(name)
    block = f"{begin}\n{section.rstrip()}\n{end}"
    start = document.find(begin)
    stop = document.find(end)
    if start != -1 and stop > start:
        return document[:start] + block + document[stop + len(end):]
    sep = "" if not document or document.endswith("\n\n") else (
        "\n" if document.endswith("\n") else "\n\n")
    return f"{document}{sep}{block}\n"


def write_section(path: Path, name: str, section: str, *,
                  new_document: str = "# Benchmarks\n\n") -> None:
    """Rewrite section ``name`` of the markdown file at ``path`` (created from
    ``new_document`` when missing)."""
    doc = path.read_text() if path.is_file() else new_document
    atomic_write_text(path, splice_section(doc, name, section))
