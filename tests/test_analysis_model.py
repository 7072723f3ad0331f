"""The report model (Finding, DumpReport), its one renderer, and the analysis package's module structure."""
from __future__ import annotations

import ast
import csv
import json
from pathlib import Path

import numpy as np

import mindguard
from mindguard.report import model, render
from mindguard.report.model import DumpReport, Finding, has_culprit
from mindguard.analysis.stats import tensor_stats

ANALYSIS = Path(model.__file__).parents[1] / "analysis"

# the keys today's origin dicts carry (DESIGN.md "Report schemas" plus index/received/via_backend_cast)
ORIGIN_KEYS = ["op_type", "name", "direction", "forward_op", "source", "stack", "inputs", "outputs", "index",
               "received", "via_backend_cast", "hint", "reached"]


def _cell_finding() -> Finding:
    """A replay answer: a cell and its class, no op name, no forward op."""
    zero = dict(tensor_stats(np.array([[0.0, 0.0], [1.0, 2.0]], np.float32)), slot=0)
    inf = dict(tensor_stats(np.array([np.inf, 2.2], np.float32)), slot=0)
    return Finding(cell="encoder.norm", cell_type="Norm", direction="backward",
                   source={"file": "/home/u/train.py", "line": 41, "code": "d = self.norm(h - t)"},
                   stack=[{"file": "/home/u/train.py", "line": 40, "code": "def construct(self, h, t):"},
                          {"file": "/home/u/train.py", "line": 41, "code": "d = self.norm(h - t)"}],
                   inputs=[zero], outputs=[inf], hint="Norm (backward): use mindguard.SafeNorm\n    fix: ...")


def test_a_cell_level_finding_renders_as_the_cell_and_its_line():
    finding = _cell_finding()
    lines = render.render_finding(finding, "replay of step 11")
    text = "\n".join(lines)
    assert lines[0] == "error: Norm cell `encoder.norm` (backward) turned finite inputs into Inf/NaN: 1 +Inf " \
                       "(replay of step 11)", lines[0]
    assert "  --> /home/u/train.py:41" in text and "41 | d = self.norm(h - t)" in text, text
    assert "   = cell: encoder.norm (Norm)" in text and "= op:" not in text and "None" not in text, text
    assert "reached" not in text, text                     # not counted by a replay: not claimed
    assert any(row.strip().startswith("input 0") and " 2 " in row for row in lines), lines      # two zeros
    no_source = Finding(cell_type="Dense", direction="forward", outputs=[dict(slot=0, nan=3)])
    head = render.render_finding(no_source, "replay")
    assert head[0].startswith("error: Dense cell (forward) turned finite inputs into Inf/NaN: 3 NaN"), head
    assert head[1] == "  --> (source line unknown: no frame recorded for this cell)", head


def test_finding_reads_like_todays_origin_dict():
    finding = Finding(op_type="Log", name="Default/net/Log-op0", direction="forward", index=3, hint="h", reached=2)
    data = finding.to_dict()
    assert list(data) == ORIGIN_KEYS, list(data)
    assert finding["op_type"] == "Log" and finding.get("hint") == "h" and finding.get("missing", 7) == 7
    assert "reached" in finding and "cell" not in finding, list(finding)
    finding["reached"] = 5
    finding["custom"] = "kept"
    assert finding.reached == 5 and finding.to_dict()["custom"] == "kept"
    assert Finding.from_dict(json.loads(json.dumps(finding.to_dict()))) == finding
    cell = _cell_finding().to_dict()
    assert cell["cell"] == "encoder.norm" and cell["cell_type"] == "Norm" and cell["op_type"] is None, cell


STAT_HEADER = ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size", "Data Type",
               "Shape", "Max Value", "Min Value", "L2Norm Value", "NaN Count", "Negative Inf Count",
               "Positive Inf Count", "Zero Count"]


def _statistic_dump(root: Path, rows) -> Path:
    directory = root / "rank_0" / "Net" / "0" / "0"
    directory.mkdir(parents=True)
    with open(directory / "statistic.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(STAT_HEADER)
        writer.writerows([op, f"Default_net_{op}-op0", 0, 0, ts, io, 0, 16, "float32", "(2,2)", hi, lo, 1.0, nan,
                          ninf, 0, zeros] for op, ts, io, hi, lo, nan, ninf, zeros in rows)
    return root


def test_report_origin_is_a_finding_and_explains_failure_decides_found(tmp_path):
    bad = _statistic_dump(tmp_path / "bad", [("Log", 1, "input", 2.0, 0.0, 0, 0, 1),
                                             ("Log", 2, "output", 0.7, "-inf", 0, 1, 0)])
    report = mindguard.analyze_dump(bad, progress=False)
    assert isinstance(report.origin, Finding) and report.origin["op_type"] == "Log", report.origin
    assert report.explains_failure and has_culprit(report) and mindguard.analysis.has_culprit(report)
    data = report.to_dict()
    assert list(data["origin"])[:len(ORIGIN_KEYS)] == ORIGIN_KEYS, list(data["origin"])
    assert json.loads(json.dumps(data))["origin"]["reached"] == 0, data["origin"]
    clean = _statistic_dump(tmp_path / "clean", [("Log", 1, "input", 2.0, 1.0, 0, 0, 0),
                                                 ("Log", 2, "output", 0.7, 0.0, 0, 0, 1)])
    healthy = mindguard.analyze_dump(clean, progress=False)
    assert not healthy.explains_failure and not has_culprit(healthy) and healthy.origin is None
    assert isinstance(healthy, DumpReport) and str(healthy).startswith("ok: no Inf/NaN found"), str(healthy)


def _imports(path: Path) -> set:
    """Sibling modules of analysis/ that ``path`` imports anywhere (module level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                out.add(node.module.split(".")[0])
            else:
                out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mindguard.analysis."):
            out.add(node.module.split(".")[2])
    return out


def test_no_import_cycles_in_the_analysis_package():
    modules = {p.stem: _imports(p) & {q.stem for q in ANALYSIS.glob("*.py")} for p in ANALYSIS.glob("*.py")
               if p.stem != "__init__"}
    state: dict = {}

    def visit(name, path):
        state[name] = "open"
        for dep in sorted(modules.get(name, ())):
            if dep == "__init__":
                continue
            assert state.get(dep) != "open", f"import cycle: {' -> '.join(path + [dep])}"
            if dep not in state:
                visit(dep, path + [dep])
        state[name] = "done"

    for name in sorted(modules):
        if name not in state:
            visit(name, [name])
    assert "rewrite" in modules["hints"] and "hints" not in modules["rewrite"], modules
