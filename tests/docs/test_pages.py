"""Every code block of the site's pages and of the README: Python blocks run, shell blocks name
make targets and `michelangelo` commands that exist.

Blocks of one page share a namespace, so a block may use what an earlier block of the same
page defined. Pages whose blocks train or serve share one Ray session (started for the first
of them and kept to the end of the module); pages whose workflows start their own local
clusters run before it.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import unittest

import pytest

from tests.docs._blocks import (
    NOT_RUN_NOTE,
    README,
    ROOT,
    SKIP_DIRECTIVE,
    cli_path,
    fenced_blocks,
    page_id,
    pages,
    python_sybil,
    shell_commands,
)

# Pages whose blocks use a Ray session of their own making (LightningTrainer, Ray Serve).
SHARED_RAY = {"docs/training.md", "docs/serving.md"}
ALL = [page_id(p) for p in pages()]
# uniflow's own local clusters first (they must not find a connected session), then the rest.
ORDER = [p for p in ALL if p not in SHARED_RAY] + sorted(SHARED_RAY)


@pytest.fixture(scope="module")
def ray_session():
    import ray

    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=4, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    try:
        yield
    finally:
        try:
            from ray import serve

            serve.shutdown()
        finally:
            ray.shutdown()


def _python_blocks_of_the_docs() -> set[str]:
    found = set()
    for path in pages():
        if path != README:
            found |= {text.strip() for _, language, text in fenced_blocks(path)
                      if language == "python"}
    return found


@pytest.mark.parametrize("page", ORDER)
def test_python_blocks_run(page, request, monkeypatch):
    path = ROOT / page
    sybil, evaluator = python_sybil()
    document = sybil.parse(path)
    examples = list(document)
    if not any(isinstance(e.parsed, str) for e in examples):
        pytest.skip(f"{page} has no Python block")
    if page in SHARED_RAY:
        request.getfixturevalue("ray_session")
    # Blocks run as the file a reader saves would: as __main__, with no arguments of pytest's.
    document.namespace["__name__"] = "__main__"
    monkeypatch.setattr(sys, "argv", [path.name])
    monkeypatch.chdir(ROOT)
    # The README repeats blocks of the site word for word (it says nothing the site does not);
    # the site page's test runs them, so a Ray run is not paid twice.
    covered = _python_blocks_of_the_docs() if path == README else set()
    ran = skipped = repeated = 0
    for example in examples:
        if isinstance(example.parsed, str) and example.parsed.strip() in covered:
            repeated += 1
            continue
        try:
            example.evaluate()
        except unittest.SkipTest:
            skipped += 1
            continue
        ran += 1
    assert ran or skipped or repeated


@pytest.mark.parametrize("page", ALL)
def test_every_block_says_its_language(page):
    """A fence without a language would escape both checks below."""
    unlabeled = [line for line, language, _ in fenced_blocks(ROOT / page) if not language]
    assert not unlabeled, f"{page}: fences without a language at lines {unlabeled}"


@pytest.mark.parametrize("page", ALL)
def test_every_skip_shows_its_reason(page):
    lines = (ROOT / page).read_text().splitlines()
    for number, line in enumerate(lines):
        if line.strip() == SKIP_DIRECTIVE:
            above = "\n".join(lines[max(0, number - 6):number])
            assert NOT_RUN_NOTE.search(above), (
                f"{page}:{number + 1}: a skipped block needs a visible 'Not run in CI: needs "
                "a GPU / a production cluster / a Docker engine' note just above it")


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def _shell_commands():
    for page in ALL:
        for line, language, text in fenced_blocks(ROOT / page):
            if language in ("bash", "sh", "shell", "console"):
                for words in shell_commands(text):
                    yield page, line, words


def test_shell_blocks_name_make_targets_that_exist():
    targets = _make_targets()
    missing = [(page, line, words) for page, line, words in _shell_commands()
               if words[0] == "make" and not set(words[1:]) <= targets]
    assert not missing


def test_shell_blocks_name_files_that_exist():
    missing = []
    for page, line, words in _shell_commands():
        if words[0] in ("python", "bash") and len(words) > 1 and not words[1].startswith("-"):
            script = words[1]
            if script != "pipeline.py" and not (ROOT / script).is_file():
                missing.append((page, line, script))
    assert not missing


def test_shell_blocks_name_michelangelo_commands_that_exist(monkeypatch, capsys):
    """`michelangelo <command> --help` exits 0 for every command a shell block names."""
    from michelangelo.cli import main

    commands = sorted({tuple(cli_path(words)) for _, _, words in _shell_commands()
                       if words[0] == "michelangelo"})
    assert len(commands) > 10
    before = signal.getsignal(signal.SIGTERM)
    failed = []
    try:
        for command in commands:
            monkeypatch.setattr(sys, "argv", ["michelangelo", *command, "--help"])
            with pytest.raises(SystemExit) as ended:
                main()
            if ended.value.code not in (0, None):
                failed.append((" ".join(command), capsys.readouterr()))
    finally:
        signal.signal(signal.SIGTERM, before)
    assert not failed


def test_the_readme_stays_short_and_links_into_the_site():
    text = README.read_text()
    assert len(text.splitlines()) <= 160
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link
