"""No import cycle among mindguard's modules, counting the imports inside functions too (issue 29).

Pure Python (no MindSpore): the package's files are parsed, not imported.

What counts as module A importing module B (both mindguard modules), by A's source text:

* every ``import``/``from ... import`` statement anywhere in A -- at module level *and* inside functions and
  methods: a function-level import only delays the cycle to the first call, it does not remove it. Statements
  under ``if TYPE_CHECKING:`` never run and do not count; ``importlib.import_module`` (the root package's lazy
  names) is not an import statement and does not count;
* relative imports are resolved against A's package (``from . import x`` in ``mindguard/training/run.py`` is
  ``mindguard.x``; in a package's ``__init__.py`` the package is its own);
* ``from P import y`` imports ``P.y`` when ``y`` is a submodule of package ``P`` (a file or folder), else
  ``P`` itself (``y`` is a name defined in ``P``);
* importing ``mindguard.a.b`` also runs the ``__init__`` of every package on the way (``mindguard.a``) --
  except the packages A itself lies in: those were initialised (or are being initialised) before A's code
  ran, so reaching them adds no edge. Naming a name of such a package (``from .. import name``) still does.

The strongly connected components of that graph (Tarjan) must each hold one module.

Function-level imports that remain in the package hide no cycle (this test would see one); those that defer
``import mindspore`` or a heavy module (the analysis, the replay) so that ``import mindguard`` and the CLI start
fast have their reason to stay.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parents[1] / "mindguard"
ROOT = "mindguard"


def _module_files() -> Dict[str, Path]:
    """``{dotted module name: file}`` of every module of the package (a package as its ``__init__.py``)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = (ROOT, *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _module_files()
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _statements(tree: ast.AST) -> Iterator[ast.stmt]:
    """Every import statement of ``tree``, at any depth, but not those under ``if TYPE_CHECKING:``."""
    stack: List[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _ancestors(name: str) -> List[str]:
    """The packages ``name`` lies in, outermost first (``mindguard.a.b`` -> ``mindguard``, ``mindguard.a``)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _targets(importer: str, node: ast.stmt) -> Iterator[str]:
    """The mindguard modules statement ``node`` of module ``importer`` names (before the implicit packages)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] == ROOT:
                yield alias.name
        return
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        package = importer if importer in PACKAGES else importer.rsplit(".", 1)[0]
        for _ in range(node.level - 1):
            package = package.rsplit(".", 1)[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base.split(".")[0] != ROOT:
        return
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in MODULES else base


def import_graph() -> Dict[str, Dict[str, List[str]]]:
    """``{importer: {imported: ["file:line: statement", ...]}}`` among mindguard's modules (module docstring)."""
    graph: Dict[str, Dict[str, List[str]]] = {name: {} for name in MODULES}
    for importer, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        own = set(_ancestors(importer))
        for node in _statements(tree):
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}"
            for target in _targets(importer, node):
                reached = [target] + [p for p in _ancestors(target) if p not in own]
                for module in reached:
                    if module in MODULES and module != importer:
                        graph[importer].setdefault(module, []).append(where)
    return graph


def strongly_connected(graph: Dict[str, Dict[str, List[str]]]) -> List[List[str]]:
    """Tarjan's strongly connected components of ``graph`` (iterative: no recursion limit)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    components: List[List[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: List[Tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def test_the_graph_sees_function_level_and_relative_imports():
    graph = import_graph()
    assert "mindguard.analysis.files" in graph["mindguard.hunt.examine"]    # from ..analysis.files import ...
    assert "mindguard.analysis" in graph["mindguard.hunt.examine"]          # ... which runs analysis/__init__
    assert "mindguard.hunt.passes" in graph["mindguard.hunt.entry"]         # inside hunt(): from .passes import ...
    assert "mindguard.training.examine.replay" in graph["mindguard.training.guard"]   # inside a method
    # inside run_state.fast_forward
    assert "mindguard.training.state.dataset_skip" in graph["mindguard.training.state.run_state"]
    assert "mindguard.training" not in graph["mindguard.training.run"]           # its own package: already running


def test_tarjan_finds_a_cycle_and_leaves_a_chain_alone():
    graph = {"a": {"b": []}, "b": {"c": []}, "c": {"a": []}, "d": {"a": []}}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d"]]


def test_no_import_cycle_among_mindguard_modules():
    graph = import_graph()
    cycles = [component for component in strongly_connected(graph) if len(component) > 1]
    told = []
    for component in cycles:
        told.append("cycle: " + ", ".join(component))
        for importer in component:
            for imported in component:
                for line in graph[importer].get(imported, []):
                    told.append(f"    {importer} -> {imported}: {line}")
    assert not cycles, "import cycles among mindguard's modules:\n" + "\n".join(told)
