"""How the docs tests read the pages: which files, which code blocks, and what a shell line names.

Python blocks are run with Sybil (its Markdown code-block, invisible-code-block and skip
parsers). A block that is only a snippet line (``--8<-- "examples/x.py"``, which MkDocs replaces
with that file) is not executed here: the file must exist and compile, and its own test runs it.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from sybil import Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

SNIPPET = re.compile(r'^\s*--8<--\s+"([^"]+)"\s*$')
FENCE = re.compile(r"^(\s*)```(.*)$")
# A "Not run in CI" note must say why, within the few lines above its skip directive.
SKIP_DIRECTIVE = "<!-- skip: next -->"
NOT_RUN_NOTE = re.compile(r"Not run in CI: (needs a GPU|needs a production cluster|needs a Docker engine)")


def pages() -> list[Path]:
    """Every Markdown page of the site, and the README."""
    return sorted(DOCS.rglob("*.md")) + [README]


def page_id(path: Path) -> str:
    return os.path.relpath(path, ROOT)


class _Evaluator(PythonEvaluator):
    """Runs a Python block, or checks the file that a snippet-only block includes."""

    def __init__(self) -> None:
        super().__init__()
        self.included: list[str] = []

    def __call__(self, example) -> None:
        lines = [line for line in example.parsed.splitlines() if line.strip()]
        if len(lines) == 1 and (match := SNIPPET.match(lines[0])):
            target = match.group(1).split(":", 1)[0]
            source = (ROOT / target).read_text()       # must exist
            compile(source, target, "exec")            # and be Python
            self.included.append(target)
            return
        super().__call__(example)


def python_sybil() -> tuple[Sybil, _Evaluator]:
    evaluator = _Evaluator()
    return Sybil(parsers=[CodeBlockParser(language="python", evaluator=evaluator), SkipParser()],
                 path=str(ROOT)), evaluator


def fenced_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line, language, text) of each fenced block of a page, nested ones included."""
    blocks, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match:
            indent, language = match.group(1), match.group(2).strip()
            body, j = [], i + 1
            while j < len(lines) and lines[j].strip() != "```":
                body.append(lines[j][len(indent):])
                j += 1
            blocks.append((i + 1, language, "\n".join(body)))
            i = j
        i += 1
    return blocks


def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    commands = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            commands.append(shlex.split(line))
    return commands


def cli_path(words: list[str]) -> list[str]:
    """`michelangelo --verbose runs show RUN_ID` -> ['runs', 'show']: the command to ask --help of."""
    path = []
    for word in words[1:]:
        if word.startswith("-") and not path:
            continue                      # the group's own options (--debug, --verbose)
        if not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        path.append(word)
    return path
