"""Every exception mindguard raises on purpose is a mindguard.MindguardError; the package has no import cycles."""
from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import mindguard
from mindguard import errors

PACKAGE = Path(mindguard.__file__).parent
# raise sites that must use a built-in type, each with the reason
BUILTIN_ALLOWED = {
    # safe_norm also runs inside compiled construct code, where MindSpore accepts only built-in exception types
    ("nn/safe.py", "ValueError"), ("nn/safe.py", "TypeError"),
    # module __getattr__ protocol
    ("__init__.py", "AttributeError"), ("dump/__init__.py", "AttributeError"), ("analysis/__init__.py",
                                                                                "AttributeError"),
    ("training/__init__.py", "AttributeError"), ("_util/lazy.py", "AttributeError"),
    # check_plot_destination's OSErrors are caught by cli_analyze, which prints them with their errno text
    ("cli/analyze.py", "IsADirectoryError"), ("cli/analyze.py", "NotADirectoryError"),
}


def _raise_sites():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                yield path.relative_to(PACKAGE).as_posix(), node.exc.func.id, node.lineno


def test_every_raised_builtin_exception_is_an_allowed_exception():
    offenders = []
    for rel, name, line in _raise_sites():
        builtin = getattr(builtins, name, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException) and (rel, name) not in BUILTIN_ALLOWED:
            offenders.append(f"{rel}:{line}: raise {name}(...)")
    assert not offenders, "raise a mindguard.errors class instead:\n" + "\n".join(offenders)


def test_every_exception_class_raised_is_a_mindguard_error():
    classes = {name: obj for name, obj in vars(errors).items() if isinstance(obj, type)}
    raised = {name for _, name, _ in _raise_sites() if name in classes}
    assert raised, "no mindguard error raised anywhere?"
    for name in raised:
        assert issubclass(classes[name], errors.MindguardError), name
    for name, cls in classes.items():
        if issubclass(cls, Warning):
            assert issubclass(cls, errors.MindguardWarning), name
        elif issubclass(cls, BaseException):
            assert issubclass(cls, errors.MindguardError), name


def test_no_import_cycles_inside_the_package():
    """Module-level relative imports only (imports inside functions are deferred on purpose)."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        package = module if rel.name == "__init__" else module.rsplit(".", 1)[0]
        deps = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                deps.add(target)
                for alias in node.names:
                    deps.add(f"{target}.{alias.name}")
            elif isinstance(node, ast.If):  # TYPE_CHECKING blocks do not run
                continue
        graph[module] = deps
    modules = set(graph)
    edges = {m: {d for d in deps if d in modules and d != m} for m, deps in graph.items()}
    # a package's __init__ importing its own submodules is not a cycle through them
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for dep in edges[node]:
            if dep.startswith(node + ".") or node.startswith(dep + ".") and dep == node.rsplit(".", 1)[0]:
                continue
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep] if dep in stack else [node, dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_errors_carry_their_builtin_meaning():
    assert issubclass(errors.ArgumentError, ValueError) and issubclass(errors.ArgumentTypeError, TypeError)
    assert issubclass(errors.DumpNotFoundError, FileNotFoundError)
    with pytest.raises(mindguard.MindguardError):
        mindguard.watch("not a function", None)
