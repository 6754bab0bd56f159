"""The shell (and Python) examples of README.md and docs/*.md, as a doc test sees them.

A fenced block in ``bash``, ``sh``, ``shell`` or ``python`` is an example a reader
will paste. An HTML comment on the line just above the fence says what it needs
(markdown renders nothing of it):

* no comment — runs as it is, in a folder of sample photos, no server;
* ``<!-- doctest: server -->`` — needs the API on ``localhost:8000`` (the test
  starts one, admin routes open as on a laptop, and points the port at it; a
  ``make serve`` line in such a block is that server);
* ``<!-- doctest: keys -->`` — the same with API keys on (``API_KEY`` and
  ``ADMIN_KEY`` in the environment hold a user and an admin key);
* ``<!-- doctest: serve -->`` — the block starts a server itself: it is run (on a
  free loopback port instead of the one written), must answer ``/readyz``, and is
  stopped with SIGTERM;
* ``<!-- doctest: slow -->`` — minutes of CPU; run only with FACEFUSE_DOCTEST_SLOW=1;
* ``<!-- doctest: skip <reason> -->`` — cannot run here (a cluster, a container
  build, ``make`` itself); the reason is required.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The documents a newcomer reads.
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"bash": "shell", "sh": "shell", "shell": "shell", "python": "python"}
KINDS = ("local", "server", "keys", "serve", "slow", "skip")

#: A fence, also indented (inside a list item): its indent, language and body.
_FENCE = re.compile(r"^([ \t]*)```(\w*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.M | re.S)
_MARK = re.compile(r"<!--\s*doctest:\s*(\w+)\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Example:
    """One fenced example: where it is, its language, what it needs, its text."""

    path: Path
    line: int
    language: str
    kind: str
    reason: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def examples(paths: list[Path] | None = None) -> list[Example]:
    """Every shell and Python example of ``paths`` (default :data:`DOCUMENTS`), in order.

    Raises ValueError for a marker of an unknown kind or a skip without a reason.
    """
    found = []
    for path in paths or DOCUMENTS:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            language = LANGUAGES.get(m.group(2))
            if language is None:
                continue
            line = text.count("\n", 0, m.start()) + 1
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            kind, reason = "local", ""
            mark = _MARK.search(before)
            if mark:
                kind, reason = mark.group(1), mark.group(2)
            where = f"{path.relative_to(ROOT)}:{line}"
            if kind not in KINDS:
                raise ValueError(f"{where}: unknown doctest kind {kind!r}")
            if kind == "skip" and not reason:
                raise ValueError(f"{where}: a skipped example needs its reason")
            code = textwrap.dedent(m.group(3)) if m.group(1) else m.group(3)
            found.append(Example(path, line, language, kind, reason, code))
    return found
