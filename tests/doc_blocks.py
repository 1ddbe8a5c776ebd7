"""The code blocks of the README and docs/*.md that a test runs as written, or checks.

A fenced ```python block, and a ```bash block holding a command of this project's CLI
(a line that runs ``raylight``), is run by ``tests/project/test_doc_blocks_on_ray.py`` unless an HTML
comment right above its fence says why it is not run. Where a cheaper check is honest, the
comment names it (``tests/doc_checks.py`` has the kinds, run in-process by
``tests/project/test_doc_blocks.py``), then the reason:

    <!-- check: python: a fragment: train_loop is the reader's -->
    <!-- check: shell: needs a Ray cluster's address -->
    <!-- check: config: a section of a config -->

and where no check is honest, only the reason:

    <!-- not-run: needs a GPU -->

Any block may carry a comment (a ```bash block of ``pip install`` lines, say); a comment
with no reason, an unknown check, or a comment above no block is an error
(``tests/project/test_doc_blocks.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# <!-- not-run: REASON --> or <!-- check: KIND: REASON -->
MARKER = re.compile(r"^<!--\s*(not-run|check):(.*?)-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
# A line that runs this project's CLI: `raylight ...`, after any VAR=value assignments.
CLI_LINE = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*raylight\s")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason given in the comment above the fence; None: no comment
    check: str | None = None  # <!-- check: KIND: ... -->: the check run instead (tests/doc_checks.py)

    @property
    def id(self) -> str:
        return f"{self.page.name}:{self.line}"

    @property
    def runnable(self) -> bool:
        """Whether the test runs it: python, or bash that runs this project's CLI."""
        if self.lang == "python":
            return True
        return self.lang == "bash" and any(CLI_LINE.match(line.strip()) for line in self.code.splitlines())


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with the ``not-run`` comment right above it (blank
    lines between them allowed). A comment that no fence follows raises ValueError."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    pending: tuple[int, str, str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if m := MARKER.match(line.strip()):
            pending = (i + 1, m.group(1), m.group(2).strip())
        elif m := FENCE.match(line):
            start, body = i, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            found.append(_block(page, start + 1, m.group(1), "\n".join(body) + "\n", pending))
            pending = None
        elif line.strip() and pending is not None:
            raise ValueError(
                f"{page.name}:{pending[0]}: a <!-- {pending[1]}: ... --> comment must stand right above a "
                "code fence (blank lines allowed); move it there or remove it"
            )
        i += 1
    if pending is not None:
        raise ValueError(f"{page.name}:{pending[0]}: a <!-- {pending[1]}: ... --> comment above no code block; remove it")
    return found


def _block(page: Path, line: int, lang: str, code: str, marker: tuple[int, str, str] | None) -> Block:
    if marker is None:
        return Block(page, line, lang, code, None)
    _, verb, text = marker
    if verb == "not-run":
        return Block(page, line, lang, code, text)
    kind, _, reason = text.partition(":")
    return Block(page, line, lang, code, reason.strip(), check=kind.strip())


def all_blocks() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)]
