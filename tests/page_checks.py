"""Checks of a hunt's ``report.html``, shared by the tests that already run each hunt (one hunt per scenario):
the page on disk (one file, nothing it would fetch, small), then -- where a Chromium is installed -- the page as a
real headless Chromium shows it (:mod:`browser`): no console error, no request but the page itself, the culprit
node with its statistics and source line in the DOM, and a graph that is not blank in a screenshot."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional

import pytest

from browser import chromium_problem, ink, open_page

MAX_PAGE_BYTES = 2_000_000

# what the graph's highlighted nodes hold once the page's script ran
_PROBE = """(() => {
  const pick = sel => Array.from(document.querySelectorAll(sel)).map(n => ({
      id: n.getAttribute('data-id'), role: n.getAttribute('data-role'), text: n.textContent}));
  return {culprit: pick('#graph svg g.node.culprit'), stop: pick('#graph svg g.node.stop'),
          received: pick('#graph svg g.node.received'),
          nodes: document.querySelectorAll('#graph svg g.node').length,
          edges: document.querySelectorAll('#graph svg g.edge').length,
          bad_edges: document.querySelectorAll('#graph svg g.edge.bad').length,
          verdict: (document.querySelector('#verdict') || {}).textContent || ''};
})()"""


def check_page_file(run: Path) -> str:
    """The page on disk: written, small, self-contained. Returns its text."""
    page = run / "report.html"
    assert page.is_file(), f"no report.html in {run}: {sorted(p.name for p in run.iterdir())}"
    size = page.stat().st_size
    assert size < MAX_PAGE_BYTES, f"report.html is {size} bytes"
    text = page.read_text(encoding="utf-8")
    # nothing to fetch: no src/href to another origin, no @import or url() in the styles
    fetched = re.findall(r"""(?:src|href)\s*=\s*["'](?!#|file:)([^"']+)""", text)
    assert not fetched, fetched[:5]
    assert "@import" not in text and "url(" not in text.replace("url(#arrow", ""), "the styles fetch something"
    assert "dagre" in text and 'id="mg-data"' in text, "the layout library or the graph's data is missing"
    return text


def check_in_browser(run: Path, *, culprit_texts: Iterable[str] = (), stop_texts: Iterable[str] = (),
                     received_texts: Iterable[str] = (), source_line: Optional[str] = None,
                     shot: Optional[Path] = None, min_nodes: int = 2) -> None:
    """Open ``run/report.html`` in Chromium and check it (module docstring); ``culprit_texts``/``stop_texts``/
    ``received_texts`` must all be in one highlighted culprit / stop / received node, ``source_line``
    (``"file.py:41"``) in the DOM. Skips with the reason when there is no Chromium (after :func:`check_page_file`
    passed)."""
    check_page_file(run)
    problem = chromium_problem()
    if problem:
        pytest.skip(f"report.html checked on disk only; {problem}")
    page = (run / "report.html").resolve()
    view = open_page(page, probe=_PROBE)
    assert not view.errors, view.errors
    assert view.requests == [page.as_uri()], f"the page made requests: {view.requests}"
    found = view.probe
    assert found and found["nodes"] >= min_nodes and found["edges"] >= 1, found
    for role, texts in (("culprit", culprit_texts), ("stop", stop_texts), ("received", received_texts)):
        texts = list(texts)
        if texts:
            assert any(all(t in node["text"] for t in texts) for node in found[role]), (role, texts, found[role])
    if source_line:
        assert source_line in view.dom, f"{source_line} is not in the DOM"
    assert view.graph_png, "no graph in the screenshot"
    share, colours = ink(view.graph_png)
    assert share > 0.03 and colours > 20, f"the graph looks blank: {share:.3f} of its pixels drawn, {colours} colours"
    if shot is not None:
        shot.write_bytes(view.screenshot)
