"""The process boundary carries facts, not prose (issue 40): no module of the hunt (``mindguard/hunt/``) or of the
report (``mindguard/report/``; before the re-layout ``mindguard/analysis/{model,page,pagedata,render}.py``) decides
on a pass's output, an exception's text or a warning by a regular expression or a substring test. The hunt reads
``pass_status.json`` and the records (mindguard.protocol); the page renders the structured report.

A source test (no MindSpore): each ``re`` call, substring ``in`` test on a string constant and
``startswith``/``endswith``/``find`` call in those modules must be in :data:`ALLOWED`, with the reason it is not a
decision on a pass's output; a pass's output (``PassResult.tail``) may only be shown (``messages.last_lines``).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1] / "mindguard"
REPORT_FILES = ("model.py", "page.py", "pagedata.py", "render.py")

#: (file name, function) -> why its text test is not a decision on a pass's output
ALLOWED: Dict[Tuple[str, str], str] = {
    ("entry.py", "dump_path_problem"): "the run folder's path, checked against what MindSpore's dump accepts",
    ("entry.py", "_refuse_undumpable"): "the run folder's path, a suggested replacement",
    ("passes.py", "<module>"): "_OWN_NOISE: mindguard's own observing dump's MindSpore warning left out of the "
                               "console copy (display, decides nothing)",
    ("passes.py", "run"): "_Copier.run: the same display filter, applied to the copied chunk",
    ("passes.py", "_shown"): "display: whether the one line saying where the held-back stderr is says \"its "
                             "traceback\" (the console copy; the log has every line)",
    ("scratch.py", "project_of"): "the user's command line: which interpreter, script or module (the fix check)",
    ("scratch.py", "copy_project"): "the user's folder names: hidden folders are not copied for the fix check",
    ("scratch.py", "scratch_command"): "the user's command line: an option is not a path to move into the copy",
    ("console.py", "console"): "a newline added to the hunt's own answer",
    ("fix_check.py", "under"): "display: the analysis' own hint (its `or:` lines) marked unchecked under the checked "
                               "`fix:` line",
    ("explain.py", "input_origin"): "a tensor name of the analysed dump (the batch is 'inputs...'), not output",
    ("verify_plan.py", "parse_losses"): "a loss written as a float.hex string by the training process (data)",
    ("page.py", "_graph_section"): "a graph title the page data itself made (\"rank N\")",
    ("page.py", "brief"): "display: the first paragraph of a message, shown shortened",
    ("page.py", "_code"): "display: `code` spans of a sentence rendered as <code>",
    ("page.py", "_hint_block"): "the analysis' own hint (now/fix lines it wrote), laid out as a table",
    ("pagedata.py", "<module>"): "_LOSS_MONITOR: the loss chart from the user's own LossMonitor lines (display)",
    ("pagedata.py", "_passes"): "the kernel list of the dump config the hunt itself armed for the pass",
    ("render.py", "short_op_name"): "an op name of the dump's data flow (the report's one shortener)",
}
_TEXT_METHODS = {"startswith", "endswith", "find", "rfind", "index", "rindex", "count"}


def _modules() -> List[Path]:
    found = sorted((ROOT / "hunt").glob("*.py"))
    report = ROOT / "report"
    if report.is_dir():
        found += sorted(report.glob("*.py"))
    else:
        found += [ROOT / "analysis" / name for name in REPORT_FILES]
    return [path for path in found if path.exists()]


def _functions(tree: ast.AST) -> Iterator[Tuple[str, ast.AST]]:
    """Every node with the name of the innermost function (or ``<module>``) it is in."""
    def walk(node: ast.AST, where: str) -> Iterator[Tuple[str, ast.AST]]:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            yield name, child
            yield from walk(child, name)
    yield from walk(tree, "<module>")


def _string_constants(tree: ast.Module) -> Set[str]:
    """Module-level names bound to a string constant (``_SINK_REFUSED = "..."``)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _text_tests(path: Path) -> List[Tuple[str, int, str]]:
    """``(function, line, what)`` for each regex call, substring test and text-search method in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = _string_constants(tree)
    found = []
    for where, node in _functions(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "re":
                found.append((where, node.lineno, f"re.{node.func.attr}"))
            elif node.func.attr in _TEXT_METHODS and node.args and (
                    isinstance(node.args[0], (ast.Constant, ast.Tuple))
                    or isinstance(node.args[0], ast.Name) and node.args[0].id in constants):
                found.append((where, node.lineno, f".{node.func.attr}(...)"))
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            left = node.left
            if isinstance(left, ast.Constant) and isinstance(left.value, (str, bytes)) \
                    or isinstance(left, ast.Name) and left.id in constants:
                found.append((where, node.lineno, "substring `in`"))
    return found


@pytest.mark.fast
def test_no_module_of_the_hunt_or_the_report_decides_on_text():
    told = []
    for path in _modules():
        for where, line, what in _text_tests(path):
            if (path.name, where) not in ALLOWED:
                told.append(f"{path.relative_to(ROOT.parent)}:{line} ({where}): {what}")
    unused = set(ALLOWED) - {(path.name, where) for path in _modules() for where, _, _ in _text_tests(path)}
    assert not unused, f"allowed, but no longer there: {sorted(unused)}"
    assert not told, ("decide on typed facts (mindguard.protocol.pass_status, the records, the structured report), "
                      "not on text:\n" + "\n".join(told))


@pytest.mark.fast
def test_a_pass_output_is_only_shown():
    """``PassResult.tail`` (the end of a pass's output) and the pass's log are only ever shown to the user."""
    told = []
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        shown: Set[int] = set()
        for node in ast.walk(tree):
            called = getattr(node.func, "attr", getattr(node.func, "id", None)) if isinstance(node, ast.Call) else None
            if called == "last_lines":
                shown.update(id(n) for arg in node.args for n in ast.walk(arg))
        for where, node in _functions(tree):
            if isinstance(node, ast.Attribute) and node.attr == "tail" and id(node) not in shown \
                    and path.name not in ("passes.py", "runner.py", "result.py"):   # where the output is kept
                told.append(f"{path.name}:{node.lineno} ({where}) reads a pass's output")
            if isinstance(node, ast.Attribute) and node.attr in ("read_text", "read_bytes") and \
                    "log" in ast.unparse(node.value):
                told.append(f"{path.name}:{node.lineno} ({where}) reads a pass's log")
    assert not told, "\n".join(told)


@pytest.mark.fast
def test_the_scan_finds_what_it_forbids(tmp_path):
    """The scan itself: each form of text test that the hunt used to apply to a pass's output is found."""
    source = tmp_path / "sample.py"
    source.write_text('import re\n_SAID = "cannot continue: "\n'
                      'def a(tail):\n    return "mindguard: cannot replay" in tail\n'
                      'def b(message):\n    return re.match(r"killed by signal (\\d+)", message)\n'
                      'def c(line):\n    return line.startswith(_SAID)\n'
                      'def d(text):\n    return _SAID in text\n')
    found = {(where, what) for where, _, what in _text_tests(source)}
    assert found == {("a", "substring `in`"), ("b", "re.match"), ("c", ".startswith(...)"),
                     ("d", "substring `in`")}, found
