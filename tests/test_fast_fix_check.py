"""The hunt's check of the fix a hint prints (issue 52; mindguard.hunt.scratch, mindguard.hunt.fix_check) and the
pass's stderr kept to mindguard's own lines (mindguard.hunt.passes._Shown), without MindSpore: which edit a hint
carries, how it is applied to a scratch copy (never the user's files), what the check says for each verdict.
tests/test_fix_check.py runs real ones."""
from __future__ import annotations

import os
import sys

import pytest

from mindguard.hunt import fix_check, scratch
from mindguard.hunt.context import HuntContext, Options
from mindguard.hunt.passes import _Shown
from mindguard.analysis.fix_edit import Edit, Unchecked, apply_edit, edit_of
from mindguard.hunt.scratch import copy_project, project_of, scratch_command
from mindguard.hunt.verify_plan import Verdict
from mindguard.protocol.summary import FixCheck, HuntSummary, Outcome

pytestmark = pytest.mark.fast

NORM_HINT = ("SqrtGrad divides by its forward output sqrt(x).\n"
             "Fix: create `self.norm` as a mindguard.SafeNorm (drop-in for nn.Norm):\n"
             "    now:    self.norm = nn.Norm(axis=-1)    (net.py:5)\n"
             "    fix:    self.norm = mindguard.SafeNorm(axis=-1)\n"
             "or call `mindguard.make_safe(net)` once after building the network (swaps every nn.Norm).")
LOG_HINT = ("Log (forward) got 10 zero input(s). Fix: add an epsilon inside the log:\n"
            "    now:    return -ops.log(picked).mean()\n"
            "    fix:    return -ops.log(picked + 1e-6).mean()\n"
            "    or:     return -ops.log(ops.clamp(picked, min=1e-6)).mean()")
NET = '''"""A net."""
from __future__ import annotations
import numpy as np
from mindspore import nn
class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.norm = nn.Norm(axis=-1)
'''


def test_the_edit_is_the_first_now_fix_pair_at_the_line_it_names_or_the_culprits():
    source = {"file": "/p/net.py", "line": 9, "code": "x = self.norm(x)"}
    assert edit_of(NORM_HINT, source) == Edit("/p/net.py", 5, "self.norm = nn.Norm(axis=-1)",
                                              "self.norm = mindguard.SafeNorm(axis=-1)")
    log = edit_of(LOG_HINT, {"file": "/p/train.py", "line": 72})
    assert log == Edit("/p/train.py", 72, "return -ops.log(picked).mean()", "return -ops.log(picked + 1e-6).mean()")
    assert log.where == "train.py:72"
    assert edit_of("Fix: lower the learning rate.\n    line:   x = y", source) is None   # no edit to apply
    assert edit_of(NORM_HINT, None) is None                                              # no source file
    assert edit_of(NORM_HINT, {"file": "/p/other.py", "line": 3}) is None                # a line of another file


def test_the_edit_changes_the_copied_line_keeps_its_indentation_and_imports_mindguard_after_future(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(NET)
    done = apply_edit(Edit(str(path), 8, "self.norm = nn.Norm(axis=-1)", "self.norm = mindguard.SafeNorm(axis=-1)"),
                      path)
    lines = path.read_text().splitlines()
    assert done == {"line": 8, "import_added": True}
    assert lines[2] == "import mindguard" and lines[1].startswith("from __future__"), lines
    assert lines[8] == "        self.norm = mindguard.SafeNorm(axis=-1)", lines
    with pytest.raises(Unchecked, match="does not hold `self.head = nn.Dense"):
        apply_edit(Edit(str(path), 8, "self.head = nn.Dense(4, 2)", "x"), path)
    again = tmp_path / "again.py"
    again.write_text("import mindguard\nx = ops.sqrt(y)\n")
    assert apply_edit(Edit(str(again), 5, "x = ops.sqrt(y)", "x = ops.sqrt(y + 1e-6)"), again) == \
        {"line": 2, "import_added": False}   # the nearest line holding it: the file moved on since the trace
    assert again.read_text() == "import mindguard\nx = ops.sqrt(y + 1e-6)\n"


def test_the_project_is_the_scripts_folder_or_the_modules_package(tmp_path):
    (tmp_path / "proj" / "pkg" / "sub").mkdir(parents=True)
    script = tmp_path / "proj" / "train.py"
    script.write_text("")
    for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/mod.py"):
        (tmp_path / "proj" / name).write_text("")
    python = sys.executable
    found = project_of([python, "-u", "train.py"], tmp_path / "proj", script)
    assert (found.roots, found.python_path) == ([tmp_path / "proj"], False)
    edited = tmp_path / "proj" / "pkg" / "sub" / "mod.py"
    assert project_of([python, "-m", "pkg.sub.mod"], tmp_path / "proj", edited).roots == [tmp_path / "proj"]
    outside = project_of([python, "-m", "pkg.sub.mod"], tmp_path, edited)   # run from elsewhere: the package
    assert (outside.roots, outside.python_path) == ([tmp_path / "proj" / "pkg"], True)
    with pytest.raises(Unchecked, match="not `python SCRIPT`"):
        project_of(["msrun", "--worker_num", "2", "train.py"], tmp_path / "proj", script)
    with pytest.raises(Unchecked, match="outside the project folder"):
        project_of([python, "train.py"], tmp_path / "proj", tmp_path / "elsewhere.py")


def test_the_copy_copies_sources_links_big_files_skips_run_folders_and_maps_the_command(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "mindguard_runs" / "r1").mkdir(parents=True)
    (proj / "train.py").write_text("print(1)\n")
    (proj / "data" / "big.bin").write_bytes(b"x" * 4096)
    (proj / "mindguard_runs" / "r1" / "summary.json").write_text("{}")
    monkeypatch.setattr(scratch, "COPY_BYTES", 1024)
    out = tmp_path / "scratch"
    out.mkdir()
    mapping = copy_project(scratch.Project([proj]), out)
    copy = out / "proj"
    assert mapping == {proj.resolve(): copy}
    assert (copy / "train.py").read_text() == "print(1)\n" and not (copy / "train.py").is_symlink()
    assert (copy / "data" / "big.bin").is_symlink() and not (copy / "mindguard_runs").exists()
    command, cwd = scratch_command([sys.executable, "train.py", "--data", "data/big.bin", "--lr", "0.1"], proj,
                                   mapping)
    assert cwd == copy and command == [sys.executable, str(copy / "train.py"), "--data",
                                       str(copy / "data" / "big.bin"), "--lr", "0.1"]
    command, cwd = scratch_command([sys.executable, str(proj / "train.py")], tmp_path, mapping)
    assert cwd == tmp_path and command[1] == str(copy / "train.py")
    assert (proj / "train.py").read_text() == "print(1)\n"


def test_the_pass_shows_mindguards_stderr_lines_and_keeps_the_traceback_for_the_log():
    shown = _Shown()
    out = shown.add(b"mindguard: training failed at global step 4. To find it, run:\n    python -m mindguard hunt")
    out += shown.add(b" --from r.json\nTraceback (most recent call last):\n  File \"train.py\", line 3\n")
    out += shown.add(b"mindguard.errors.NonFiniteError: mindguard: training went non-finite\n[WARNING] ME(1) x\n")
    out += shown.add(b"[mindguard hunt] a line\n/t.py:3: MindguardWarning: no shuffle\n  warnings.warn(x)\n")
    out += shown.add(b"mindguard stopped the training")
    out += shown.end()
    assert out == (b"mindguard: training failed at global step 4. To find it, run:\n"
                   b"    python -m mindguard hunt --from r.json\n[mindguard hunt] a line\n"
                   b"/t.py:3: MindguardWarning: no shuffle\n  warnings.warn(x)\nmindguard stopped the training")
    assert (shown.held, shown.traceback) == (4, True)
    quiet = _Shown(quiet=True)
    assert quiet.add(b"mindguard: x\nloss 1\n") == b"" and quiet.held == 2


def _verdict(outcome, **fields):
    return Verdict(outcome, {"holds": 0, "fails": 1}.get(outcome, 2), fields.pop("headline", "h"), **fields)


def test_each_verdict_is_said_in_one_line_and_a_fix_that_leaves_the_origin_is_a_guard_only():
    judged = fix_check._judged
    holds = judged(_verdict("holds", through=9), Outcome.HEALTHY, 60, {})
    assert (holds.verdict, holds.printed, holds.through_step) == (
        "trains_finite", "checked: trains finite through global step 9", 9)
    far = judged(_verdict("holds", through=9, far=[4, 7]), Outcome.HEALTHY, 60, {}, window=[4, 4])
    assert far.printed == ("checked: trains finite through global step 9, but the loss at global step 7 is far "
                           "above the failing run's: check what it learns")
    data = {"traced_to": [{"kind": "batch", "name": "inputs1", "argument": "input_mask", "rows": [2],
                           "values": [199]}]}
    guard = judged(_verdict("holds", through=10), Outcome.HEALTHY, 60, data)
    assert (guard.verdict, guard.printed) == ("guard_only", "guard only: trains finite through global step 10, but "
                                              "the data still holds 199 (`input_mask` row 2): fix the data, as the "
                                              "hint says first")
    lr = judged(_verdict("holds", through=22), Outcome.HEALTHY, 60,
                {"traced_to": [{"kind": "hyper_parameter", "rule": "learning_rate_jump", "value": 1.5, "step": 17}]})
    assert lr.printed.endswith("but the learning rate is still 1.5 at global step 17: fix the schedule, as the "
                               "hint says first"), lr.printed
    plain = judged(_verdict("holds", through=22), Outcome.HEALTHY, 60,   # a learning rate named, no jump in it
                   {"traced_to": [{"kind": "hyper_parameter", "rule": "learning_rate", "value": 0.01, "step": 17}]})
    assert plain.verdict == "trains_finite", plain.printed
    fails = judged(_verdict("fails", headline="the loss still grows with the change: ..."), Outcome.FOUND, 60, {})
    assert (fails.verdict, fails.printed) == ("still_fails",
                                              "checked: does not hold -- the loss still grows with the change: ...")
    cannot = judged(_verdict("cannot", headline="cannot verify the fix: the state does not load",
                             why="the state does not load"), Outcome.ERROR, 60, {})
    assert (cannot.verdict, cannot.printed) == ("unchecked", "unchecked (the state does not load)")
    late = judged(None, Outcome.TIMED_OUT, 75, {})
    assert late.printed == "unchecked (the check did not end within 75 s, 2x the hunt's longest pass)"


class _NoRunner:
    def run(self, spec):   # pragma: no cover - the check must not run a pass here
        raise AssertionError("no pass expected")


def test_a_check_that_cannot_run_says_why_under_the_hint_and_in_the_summary_and_never_raises(tmp_path):
    run = tmp_path / "run"
    (run / "pass1").mkdir(parents=True)
    ctx = HuntContext(["msrun", "train.py"], run, _NoRunner(), Options())
    ctx.summary.origin = {"hint": NORM_HINT, "source": {"file": str(tmp_path / "net.py"), "line": 9}}
    ctx.answer.append("error: SqrtGrad ...\nhelp: ...\n          now:    self.norm = nn.Norm(axis=-1)    (net.py:5)\n"
                      "          fix:    self.norm = mindguard.SafeNorm(axis=-1)\n      or call it")
    (run / "pass1" / "failure.json").write_text('{"status": "failed", "global_step": 4}')
    fix_check.check_fix(ctx)
    check = ctx.summary.fix_check
    assert isinstance(check, FixCheck) and check.verdict == "unchecked" and check.hint == "origin", check
    assert check.printed.startswith("unchecked (the command runs msrun, not `python SCRIPT`"), check.printed
    assert ("          fix:    self.norm = mindguard.SafeNorm(axis=-1)\n          unchecked (the command runs msrun"
            in ctx.answer[0]), ctx.answer[0]
    written = ctx.summary.to_dict()["fix_check"]
    assert written["verdict"] == "unchecked" and written["edit"]["line"] == 5 and "through_step" not in written


def test_an_or_alternative_under_a_checked_fix_is_said_unchecked(tmp_path):
    ctx = HuntContext(["python", "t.py"], tmp_path, _NoRunner(), Options())
    ctx.answer.append("help: " + LOG_HINT.replace("\n", "\n  ") + "\nnext line")
    edit = edit_of(LOG_HINT, {"file": str(tmp_path / "t.py"), "line": 72})
    fix_check.annotate(ctx, edit, "checked: trains finite through global step 9")
    lines = ctx.answer[0].split("\n")
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("fix:"))
    assert [line.strip() for line in lines[at:]] == [
        "fix:    return -ops.log(picked + 1e-6).mean()", "checked: trains finite through global step 9",
        "or:     return -ops.log(ops.clamp(picked, min=1e-6)).mean()", fix_check.ALTERNATIVE_UNCHECKED,
        "next line"], lines
    assert lines[at + 3].startswith("      unchecked (an alternative"), lines   # at the fix: line's indentation


def test_no_hint_with_an_edit_means_no_check_and_no_key():
    summary = HuntSummary(command=["python", "t.py"], run_dir="/r")
    summary.origin = {"hint": "Fix: lower the learning rate.", "source": {"file": "/p/t.py", "line": 3}}
    assert fix_check.first_edit(summary) is None
    assert "fix_check" not in summary.to_dict()
    summary.stopped_at = {"hint": LOG_HINT, "op": {"source": {"file": "/p/t.py", "line": 72}}}
    edit, which, _ = fix_check.first_edit(summary)
    assert (which, edit.line) == ("stopped_at", 72)


def test_the_time_limit_scales_with_the_hunts_longest_pass(tmp_path):
    ctx = HuntContext(["python", "t.py"], tmp_path, _NoRunner(), Options())
    assert fix_check.time_limit(ctx, {}, from_start=False) == fix_check.TIME_FLOOR_S
    ctx.pass_seconds = {"pass1": 50.0, "pass2": 12.0}
    assert fix_check.time_limit(ctx, {}, from_start=False) == 100.0
    record = {"global_step": 95, "param_checks": {"step_ms": 1000}}   # from step 1: 30 s + 100 steps of 1 s
    assert fix_check.time_limit(ctx, record, from_start=True) == 260.0
    assert os.environ.get("MINDGUARD_FIX_CHECK") is None


def test_no_check_fix_on_the_command_line_turns_the_check_off(monkeypatch):
    import mindguard.hunt as hunt_package
    from mindguard.cli import build_parser

    seen = {}
    monkeypatch.setattr(hunt_package, "hunt", lambda command, **kw: seen.update(kw) or 1)
    for argv, wanted in ((["hunt", "--", "python", "t.py"], True),
                         (["hunt", "--no-check-fix", "--", "python", "t.py"], False)):
        args = build_parser().parse_args(argv)
        assert args.func(args) == 1
        assert seen["check_fix"] is wanted


def test_a_folder_of_many_data_files_is_linked_whole(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    (proj / "images").mkdir(parents=True)
    (proj / "train.py").write_text("")
    for i in range(6):
        (proj / "images" / f"{i}.jpg").write_bytes(b"j")
    monkeypatch.setattr(scratch, "DATA_FOLDER_FILES", 5)
    out = tmp_path / "scratch"
    out.mkdir()
    copy_project(scratch.Project([proj]), out)
    assert (out / "proj" / "images").is_symlink() and (out / "proj" / "train.py").is_file()
