"""Every error the README lists has its troubleshooting entry, and the site's own search finds it.

The README's error table says "Every message, with its fix": each row's first column (the text a
user sees) is the heading of one entry in docs/troubleshooting.md, whose Where, Why and Fix are
paragraphs of their own.  Then the built site is searched in a real browser (Debian's chromium,
headless, driven over the DevTools protocol on a pipe), the way a user pastes the message into the
search box: the first section it offers must be that entry.  Before, four rows had no entry, the
search found nothing for `InductorError` and sent `_builder.lock` to an unrelated PermissionError.
"""

from __future__ import annotations

import functools
import html
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.skips import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"
#: Debian's chromium (scripts/setup.sh installs it); the launcher script is not needed.
CHROMIUM = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome")


def readme_errors() -> list[str]:
    """The first column of each row of the README's "The errors this fixes" table, as written."""
    section = README.read_text().split("\n## The errors this fixes\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][2:]  # header, separator
    return [row.split(" | ", 1)[0][2:].strip() for row in rows]


def entries() -> dict[str, str]:
    """Troubleshooting headings (### ...) -> the entry's text."""
    found = {}
    for block in TROUBLESHOOTING.read_text().split("\n### ")[1:]:
        heading, _, body = block.partition("\n")
        found[heading.strip()] = body.split("\n## ", 1)[0]
    return found


def plain(markdown: str) -> str:
    """What a heading reads like on the page (and what a user would paste): no backticks."""
    return markdown.replace("`", "")


def test_the_readme_lists_its_errors() -> None:
    errors = readme_errors()
    assert len(errors) >= 15 and "`OSError: [Errno 37] No locks available`" in errors, errors


@pytest.mark.parametrize("error", readme_errors())
def test_each_readme_error_has_its_entry_with_where_why_and_fix(error: str) -> None:
    known = entries()
    assert error in known, f"no troubleshooting entry is headed by the README's text {error!r}"
    body = known[error]
    for label in ("**Where**", "**Why**", "**Fix**"):  # each its own paragraph, in that order
        assert f"\n\n{label}" in f"\n{body}", f"{error}: {label} does not start a paragraph of its own"
    assert body.index("**Where**") < body.index("**Why**") < body.index("**Fix**"), error


# -- the site's search, in a real browser -------------------------------------------------------------


def _chromium() -> str:
    for name in CHROMIUM:
        found = shutil.which(name) if "/" not in name else (name if os.access(name, os.X_OK) else None)
        if found:
            return found
    skip_or_fail("chromium is not installed (scripts/setup.sh installs it: apt-get install chromium)")


class Browser:
    """Headless chromium driven over ``--remote-debugging-pipe`` (the DevTools protocol, NUL-separated JSON)."""

    def __init__(self, binary: str, profile: Path) -> None:
        to_read, self._to = os.pipe()
        self._from, from_write = os.pipe()

        def pipes_at_3_and_4() -> None:  # the protocol's fixed descriptors
            read, write = os.dup(to_read), os.dup(from_write)
            os.dup2(read, 3)
            os.dup2(write, 4)

        self.proc = subprocess.Popen([binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                      "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
                                     preexec_fn=pipes_at_3_and_4, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(to_read)
        os.close(from_write)
        self._buffer = b""
        self._id = 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60) -> Any:
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        import select

        while True:
            while b"\0" not in self._buffer:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self._from], [], [], max(left, 0))
                if not ready:
                    raise TimeoutError(f"chromium did not answer {method} within {timeout} s")
                chunk = os.read(self._from, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"chromium exited (status {self.proc.poll()}) during {method}")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def search(self, site: str, query: str) -> list[str]:
        """Open the site with the query in its search box (Material reads ``?q=``); the results' links."""
        self.call("Page.navigate", {"url": f"{site}/?q={urllib.parse.quote(query)}"}, self.session)
        wait = """new Promise(done => { const start = Date.now(); (function look() {
            const links = [...document.querySelectorAll('.md-search-result__item a')].map(a => a.href);
            const meta = document.querySelector('.md-search-result__meta');
            const settled = meta && /matching/i.test(meta.textContent);  // "No matching documents", "3 matching ..."
            if (settled || Date.now() - start > 20000) done(JSON.stringify(links));
            else setTimeout(look, 100); })(); })"""
        time.sleep(0.3)  # let the navigation replace the previous page before looking
        value = self.call("Runtime.evaluate", {"expression": wait, "awaitPromise": True, "returnByValue": True},
                          self.session)["result"]["value"]
        return list(json.loads(value))

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to)
        os.close(self._from)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """The docs site built as users get it, served on localhost; with the anchor of each heading."""
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError as exc:
        skip_or_fail(f"the docs toolchain is not installed ({exc}): pip install -r docs/requirements.txt")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out)], capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"}, check=False)
    assert proc.returncode == 0, proc.stderr
    page = (out / "troubleshooting" / "index.html").read_text()
    anchors = {}
    for anchor, inner in re.findall(r'<h3 id="([^"]+)">(.*?)<a class="headerlink"', page, re.S):
        anchors[html.unescape(re.sub(r"<[^>]+>", "", inner)).strip()] = anchor
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", anchors
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    chrome = Browser(_chromium(), tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield chrome
    finally:
        chrome.close()


@pytest.mark.parametrize("error", readme_errors())
def test_the_sites_search_lands_on_each_readme_errors_entry(error: str, site: tuple[str, dict[str, str]],
                                                           browser: Browser) -> None:
    base, anchors = site
    text = plain(error)
    assert text in anchors, f"the built page has no heading {text!r}"
    links = browser.search(base, text)
    sections = [link for link in links if "#" in link]
    assert sections, f"the site's search found no section for {text!r}: {links}"
    first = urllib.parse.urlsplit(sections[0])
    assert (first.path, first.fragment) == ("/troubleshooting/", anchors[text]), (
        f"searching {text!r} leads first to {sections[0]}, not to its entry #{anchors[text]}")


@pytest.mark.parametrize("query", ["InductorError", "_builder.lock", "file too short",
                                   "PyTorch extensions root"])
def test_a_piece_of_a_message_finds_its_entry(query: str, site: tuple[str, dict[str, str]],
                                              browser: Browser) -> None:
    """What the issue tried: a piece of the message, as people search (the site found nothing, or the wrong one)."""
    base, anchors = site
    sections = [link for link in browser.search(base, query) if "#" in link]
    assert sections, f"the site's search found nothing for {query!r}"
    fragment = urllib.parse.urlsplit(sections[0]).fragment
    heading = next((text for text, anchor in anchors.items() if anchor == fragment), fragment)
    assert query.lower() in heading.lower(), f"{query!r} leads first to {heading!r}"


def test_the_error_page_lists_every_readme_error_linked_to_its_entry() -> None:
    """docs/errors.md was a table of threads only; now it is the README's table, each row linked to its fix."""
    page = (ROOT / "docs" / "errors.md").read_text()
    linked = re.findall(r"^\| \[(.+?)\]\(troubleshooting\.md#[^)]+\) \|", page, re.M)
    assert linked == readme_errors()


@pytest.mark.parametrize("page", ["cli", "troubleshooting"])
def test_code_blocks_are_not_clipped_at_laptop_width(page: str, site: tuple[str, dict[str, str]],
                                                   browser: Browser) -> None:
    """At 1366 px (a laptop), `sharedfs doctor`'s and `locks`' output ran off the right edge behind a scroll bar."""
    base, _ = site
    browser.call("Emulation.setDeviceMetricsOverride",
                 {"width": 1366, "height": 900, "deviceScaleFactor": 1, "mobile": False}, browser.session)
    browser.call("Page.navigate", {"url": f"{base}/{page}/"}, browser.session)
    wait = """new Promise(done => { const start = Date.now(); (function look() {
        const blocks = [...document.querySelectorAll('.md-typeset pre > code')];
        if ((document.readyState === 'complete' && blocks.length) || Date.now() - start > 20000)
            done(JSON.stringify(blocks.map(c => [c.scrollWidth, c.clientWidth])));
        else setTimeout(look, 100); })(); })"""
    time.sleep(0.3)
    sizes = json.loads(browser.call("Runtime.evaluate", {"expression": wait, "awaitPromise": True,
                                                         "returnByValue": True}, browser.session)["result"]["value"])
    assert sizes, f"no code blocks found on {page}"
    clipped = [size for size in sizes if size[0] > size[1] + 1]
    assert not clipped, f"{len(clipped)} of {len(sizes)} code blocks on {page} scroll sideways: {clipped[:5]}"
