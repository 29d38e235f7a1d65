"""The site builds strictly, fetches nothing from the network, and draws in a real browser."""

from __future__ import annotations

import functools
import http.server
import json
import re
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

from tests.docs._blocks import ROOT
from tests.docs._browser import Browser

# Any address elsewhere in a src or href: scripts, stylesheets, icons, fonts, images, and
# (to keep the rule simple) links in the text too. The site points at nothing outside itself.
FETCHING = re.compile(r"\b(src|href)=[\"']?(https?:)?//", re.I)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_every_page_of_docs_is_in_the_navigation(site):
    # --strict already fails on pages left out of nav; this holds the two lists equal as well.
    pages = {p.relative_to(ROOT / "docs").with_suffix(".html").as_posix()
             for p in (ROOT / "docs").rglob("*.md")}
    built = {p.relative_to(site).as_posix() for p in site.rglob("*.html")} - {"404.html"}
    assert pages == built


def test_no_page_fetches_or_links_anything_from_elsewhere(site):
    offenders = {}
    for page in site.rglob("*.html"):
        found = [m.group(0) for m in FETCHING.finditer(page.read_text())]
        if found:
            offenders[page.relative_to(site).as_posix()] = found[:3]
    assert not offenders
    for css in site.rglob("*.css"):
        assert not re.search(r"@import\s+url\(\s*[\"']?https?:", css.read_text()), css


def test_the_api_reference_is_generated(site):
    html = (site / "reference" / "trainer.html").read_text()
    assert 'id="michelangelo.lib.trainer.torch.pytorch_lightning.LightningTrainer"' in html
    assert "doc-signature" in html or "doc-object" in html


def test_the_search_index_holds_every_page(site):
    index = json.loads((site / "search" / "search_index.json").read_text())
    locations = {doc["location"].split("#")[0] for doc in index["docs"]}
    assert {"index.html", "serving.html", "reference/trainer.html"} <= locations


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def served(site):
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("page", ["index.html", "reference/trainer.html"])
def test_navigation_and_search_render_in_a_browser(served, tmp_path, page):
    browser = Browser(tmp_path / "profile")
    try:
        browser.open(f"{served}/{page}")
        # The navigation, with its sections, as drawn after the page's scripts ran.
        titles = browser.evaluate(
            "[...document.querySelectorAll('nav.md-nav--primary .md-nav__link')]"
            ".map(a => a.textContent.trim())")
        for title in ("Getting started", "Workflows and tasks", "Serving", "API reference",
                      "LightningTrainer"):
            assert title in titles
        assert browser.evaluate("!!document.querySelector('input.md-search__input')")
        # Search for real: the query in the URL opens the search, whose worker answers it.
        browser.open(f"{served}/{page}?q=canary")
        browser.wait_for("document.querySelectorAll('.md-search-result__item').length > 0")
        found = browser.evaluate(
            "[...document.querySelectorAll('.md-search-result__item a')].map(a => a.href)")
        assert any(urllib.parse.urlsplit(href).path == "/serving.html" for href in found), found
        shot = tmp_path / "shot.png"
        browser.screenshot(shot)
        assert shot.stat().st_size > 10_000
    finally:
        browser.close()
