"""The protocol between the hunt and the training process has one home (issue 29), checked on the source text.

Pure Python (no MindSpore): the package's files are parsed, not imported."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parents[1] / "mindguard"


def _string_constants(tree: ast.AST):
    """String literals that are not docstrings (a docstring may name a variable; code may not read one)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_only_the_protocol_package_names_the_hunts_environment_variables():
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "protocol" in path.relative_to(PACKAGE).parts:
            continue
        for node in _string_constants(ast.parse(path.read_text(encoding="utf-8"))):
            if "MINDGUARD_" in node.value:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value[:60]!r}")
    assert not found, "read or write MINDGUARD_* through mindguard.protocol.request:\n" + "\n".join(found)


def test_the_protocol_package_never_imports_mindspore():
    for path in (PACKAGE / "protocol").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            assert not any(n.split(".")[0] == "mindspore" for n in names), f"{path}:{node.lineno} imports {names}"


# the kernel catalogues of mindguard.protocol.kernels (issue 29: one list each)
_CATALOGUES = ("OPTIMIZER_KERNELS", "OPTIMIZER_WRITTEN_SLOTS", "IN_PLACE_WRITERS", "IN_PLACE_INPUT_SLOTS",
               "COPY_KERNELS", "WEIGHT_GRADIENT_KERNELS", "INTENDED_INFINITY_KERNELS", "UNWRITTEN_OUTPUT_SLOTS",
               "COLLECTIVE_KERNELS")
# lower-case forms that are also ordinary words (a dump scope "full", an "assign" in a message): only their
# kernel spelling counts
_WORDS = {"full", "fill", "select", "broadcast", "receive", "assign"}
# hints.py knows op types by the numerical trouble they can make (overflowing contractions, norm layers): a
# catalogue of another question, not a copy of a kernel role
_HINT_KINDS = {("analysis/hints.py", name) for name in ("conv2dbackpropfilter", "conv3dbackpropfilter", "batchnorm")}


def _catalogued_kernel_names():
    from mindguard.protocol import kernels

    names = set()
    for catalogue in _CATALOGUES:
        names.update(getattr(kernels, catalogue))
    return names


def test_kernel_types_are_catalogued_only_in_protocol_kernels():
    names = _catalogued_kernel_names()
    spellings = {name: name for name in names}
    spellings.update({name.lower(): name for name in names if name.lower() not in _WORDS})
    found = []
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if where == "protocol/kernels.py":
            continue
        for node in _string_constants(ast.parse(path.read_text(encoding="utf-8"))):
            if node.value in spellings and (where, node.value) not in _HINT_KINDS:
                found.append(f"{where}:{node.lineno}: {node.value!r} (catalogued as {spellings[node.value]!r})")
    assert {"ApplyAdam", "FusedAdam", "TensorMove", "BatchNorm", "MaskedFill", "AllReduce"} <= names, sorted(names)
    assert not found, "name kernel types through mindguard.protocol.kernels:\n" + "\n".join(found)

def _spells(literal: str, name: str) -> bool:
    """Whether ``literal`` names the file or folder ``name`` as a path does: the whole literal, or a part of a
    path or glob without spaces (``*/state/state.json``, ``.command.json.*.tmp``). Prose that mentions a file in a
    message is not a path."""
    if literal == name:
        return True
    return " " not in literal and re.search(rf"(^|[/.*]){re.escape(name)}($|[/.*])", literal) is not None


def test_only_the_protocol_package_spells_the_run_folders_names():
    from mindguard.protocol import folder

    names = folder.FILE_NAMES + folder.FOLDER_NAMES
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "protocol" in path.relative_to(PACKAGE).parts:
            continue
        for node in _string_constants(ast.parse(path.read_text(encoding="utf-8"))):
            found += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value[:60]!r}"
                      for name in names if _spells(node.value, name)]
    assert not found, "name the run folder's files through mindguard.protocol.folder:\n" + "\n".join(found)


def test_a_pass_carries_its_family_and_its_folder_names_it():
    from mindguard.protocol import folder

    assert folder.RESUMED_AT_STEP.folder == "resumed-at-step"
    assert folder.RESUMED_AT_STEP.wider("full").folder == "resumed-full"
    assert folder.EVERY_ITERATION.wider("outputs").folder == "pass2-outputs"
    assert folder.from_step_1("full").folder == "pass2-full-from-step-1"
    assert folder.from_step_1("full").wider("all_outputs").folder == "pass2-all_outputs"
    run = folder.RunFolder(Path("/r"))
    assert run.pass_folder(folder.PASS1).state / folder.STATE_META == Path("/r/pass1/state/state.json")
    assert folder.pass_status_beside(run.pass_folder(folder.LOCATE).record) == Path("/r/locate/pass_status.json")
    assert folder.pass_status_beside(Path("/r/pass2/failure.rank1.json")) == Path("/r/pass2/pass_status.rank1.json")
    assert folder.replay_text(Path("/r/pass2/replay.rank1.json")) == Path("/r/pass2/replay.rank1.txt")
    assert folder.kept_step(folder.kept_states(Path("/w/mindguard_failure.json")), 7) == \
        Path("/w/mindguard_failure.state/step-7")


def test_the_summary_writes_what_was_set_and_each_pass_under_its_folder():
    from mindguard.protocol import folder
    from mindguard.protocol.summary import Outcome, PassSummary, ResumeSummary, HuntSummary

    summary = HuntSummary(command=["python", "train.py"], run_dir="/r")
    summary.set_pass(folder.PASS1.folder, PassSummary(1, [{"status": "failed"}]))
    summary.resume = ResumeSummary(kept_step=3)
    summary.set_pass(folder.RESUMED_AT_STEP.folder, PassSummary(1, [], examine="dump"))
    summary.origin = None      # set to None: written as null; never set: not written
    summary.end(Outcome.UNEXPLAINED, finished="2026-01-01T00:00:00")
    assert summary.to_dict() == {
        "schema": 2, "command": ["python", "train.py"], "run_dir": "/r",
        "pass1": {"returncode": 1, "records": [{"status": "failed"}]},
        "resumed-at-step": {"returncode": 1, "records": [], "examine": "dump"},
        "resume": {"kept_step": 3}, "origin": None, "outcome": "unexplained", "exit_code": 3,
        "finished": "2026-01-01T00:00:00"}
    assert list(summary.to_dict())[:3] == ["schema", "command", "run_dir"]


def test_the_hunt_reads_a_record_as_written_through_its_fields():
    from mindguard.protocol.record import FailureRecord

    written = {"schema": 2, "status": "failed", "kind": "exception", "global_step": 7, "loss": "nan",
               "from_a_newer_minor": 1, "dump_graphs": {"0": "not validated"}}
    record = FailureRecord.as_written(written)
    assert (record.status, record.kind, record.global_step, record.loss) == ("failed", "exception", 7, "nan")
    assert record.dump_graphs == {"0": "not validated"} and record.seed is None and record.iteration_observed is False

