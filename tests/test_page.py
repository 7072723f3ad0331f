"""The report page's renderer (``mindguard.report.page``) on the data of a real hunt of the demo
(``tests/data/page_demo.json``, made by ``tests/data/make_page_fixture.py``): fast, no MindSpore, no browser.
The page of each real hunt is opened in Chromium by the hunt tests themselves (tests/page_checks.py)."""
from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mindguard.report.page import render_page
from mindguard.report.pagedata import report_page_data, write_page

pytestmark = pytest.mark.fast

DEMO = json.loads((Path(__file__).parent / "data" / "page_demo.json").read_text())


def _payload(page: str) -> dict:
    blob = re.search(r'<script type="application/json" id="mg-data">(.*?)</script>', page, re.S).group(1)
    return json.loads(blob)


def test_the_demo_page_says_the_verdict_and_carries_its_graph():
    page = render_page(DEMO)
    origin = DEMO["report"]["origin"]
    verdict = page[page.index('id="verdict"'):page.index('id="graph"')]
    # the verdict: the step, the op and its pass, the user's line with its code, the hint's now/fix
    assert "epoch 2, step 3/8 (global step 11)" in verdict
    assert "SqrtGrad" in verdict and "backward of Sqrt" in verdict
    assert f"{origin['source']['file']}:{origin['source']['line']}" in verdict
    assert "return self.head(self.norm(self.embedding(tokens)))" in verdict
    assert '<tr class="now"><th>now</th><td><pre>self.norm = nn.Norm(axis=-1)' in verdict
    assert '<tr class="fix"><th>fix</th><td><pre>self.norm = mindguard.SafeNorm(axis=-1)' in verdict
    # the graph's data, as the analysis computed it: the culprit, its producers, the ops it reached
    flow = _payload(page)["graphs"][0]
    roles = {n["role"] for n in flow["nodes"]}
    assert flow["center"] == origin["name"] and {"culprit", "producer", "reached"} <= roles, roles
    assert any(e["nonfinite"] for e in flow["edges"]) and any(e["nonfinite"] is False for e in flow["edges"])
    # the timeline up to the failing step, marked
    assert "failing step 11" in page and "pass2: repeated the failure at global step 11" in page
    # sections in their order, details folded
    order = [page.index(f'id="{s}"') for s in ("verdict", "graph", "timeline", "details")]
    assert order == sorted(order)
    assert "<details open" not in page


def test_the_page_is_one_file_that_fetches_nothing():
    page = render_page(DEMO)
    assert "default-src 'none'" in page   # even a stray reference could load nothing
    assert not re.search(r"""(src|href)\s*=\s*["']https?:""", page)
    assert "sourceMappingURL" not in page and "@import" not in page
    assert page.count("<script") == 3 and "dagre" in page
    # the vendored library is in the package (and so in the wheel), licence beside it
    vendor = Path(__import__("mindguard.report.page", fromlist=["x"]).__file__).parent / "_vendor"
    assert (vendor / "dagre.min.js").is_file() and (vendor / "LICENSE.dagre").is_file()
    assert len(page.encode()) < 200_000, len(page.encode())


def test_text_from_the_run_cannot_break_the_page():
    data = copy.deepcopy(DEMO)
    data["report"]["origin"]["hint"] = "</script><script>alert(1)</script> `<b>x</b>`"
    data["report"]["origin"]["source"]["code"] = "a < b and c > d </script>"
    data["report"]["data_flow"]["nodes"][0]["name"] = "</script><img src=x onerror=alert(1)>"
    page = render_page(data)
    assert "<script>alert(1)" not in page and "<img src=x" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(1)" in page
    assert _payload(page)["graphs"][0]["nodes"][0]["name"].startswith("</script>")


def test_without_a_history_the_timeline_says_so():
    data = copy.deepcopy(DEMO)
    data["timeline"]["loss"] = []
    data["timeline"]["notes"] = ["loss per step: not recorded"]
    assert "loss per step: not recorded" in render_page(data)
    analyzed = report_page_data(DEMO["report"])
    page = render_page(analyzed)
    assert "mindguard analyze` reads one dump" in page.replace("<code>", "`").replace("</code>", "`")
    assert "dump iteration 10" in page and "SqrtGrad" in page


def test_healthy_and_unexplained_runs_have_a_page_too():
    healthy = copy.deepcopy(DEMO)
    healthy.update(report=None, failure=None, position=None)
    healthy["run"]["outcome"] = "healthy"
    healthy["timeline"]["failing_step"] = None
    page = render_page(healthy)
    assert "No failure" in page and "CULPRIT" not in page.split("<script")[0]
    unexplained = copy.deepcopy(DEMO)
    unexplained["report"]["origin"] = None
    unexplained["report"]["data_flow"] = None
    unexplained["run"]["outcome"] = "unexplained"
    assert "Hunt outcome: unexplained" in render_page(unexplained)


def test_html_refuses_an_existing_file_before_any_work(tmp_path):
    existing = tmp_path / "mine.html"
    existing.write_text("the user's own file")
    proc = subprocess.run([sys.executable, "-m", "mindguard", "analyze", str(tmp_path / "no_such_dump"), "--html",
                           str(existing)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert f"{existing} already exists" in proc.stderr and "mine-2.html" in proc.stderr, proc.stderr
    assert existing.read_text() == "the user's own file"
    written = write_page(tmp_path / "new.html", DEMO)
    assert written.read_text().startswith("<!DOCTYPE html>")


def test_excluded_evidence_and_a_dataset_error_come_from_the_structured_report():
    """The page lists the report's structured ``excluded`` (rule, what, why), not warnings that sound like it, and
    shows a dataset's error from the summary's origin (what the training process named), not from a message."""
    data = copy.deepcopy(DEMO)
    data["report"]["excluded"] = [{"rule": "files of another kernel", "what": "Add.Add-op3.0.1.output.0.npy",
                                   "reason": "its shape is not the kernel shape"}]
    data["report"]["warnings"] = ["this file was skipped and not read (a warning's words, no exclusion)"]
    section = render_page(data).split('id="excluded"')[1].split("</details>")[0]
    assert "Evidence excluded, and why (1)" in section, section
    assert "Add.Add-op3.0.1.output.0.npy: its shape is not the kernel shape (files of another kernel)" in section
    assert "skipped and not read" not in section
    dataset = copy.deepcopy(DEMO)
    dataset.update(report=None, replays=[])
    dataset["origin"] = {"op_type": "dataset", "direction": "input", "name": None, "hint": None,
                         "source": {"file": "/w/train.py", "line": 42, "function": "__getitem__", "code": "raise"},
                         "error": "ValueError: corrupt image 17"}
    dataset["failure"] = dict(dataset.get("failure") or {}, message="RuntimeError: Exception thrown from dataset "
                              "pipeline ... TypeError: not this line")
    page = render_page(dataset)
    assert "<code>ValueError: corrupt image 17</code>" in page and "TypeError: not this line</code>" not in page
