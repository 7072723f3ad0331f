#!/usr/bin/env python3
"""Compatibility matrix: run the real test suite and the demo against real MindSpore wheels.

Not collected by pytest (no ``test_`` prefix). For each (Python, MindSpore) pair it

1. copies this checkout (working tree, without ``.git``/venvs/run folders) to a temp directory,
2. creates a fresh venv with that Python and installs, in one resolver run,
   ``mindspore==X``, the project with its test extra (``'.[test]'``) and ``numpy<2``,
3. runs ``python -m pytest -n 2 tests -q`` in the copy (counts and failing test ids read from a JUnit XML
   report) and ``mindguard demo`` (its exit code),
4. deletes the venv and the copy (unless ``--keep``),

and prints one table at the end. A pair whose install fails is a row saying so; the matrix goes on.

    python tests/compat.py                                   # the default pairs, full suite
    python tests/compat.py --pairs 3.10:2.7.2,3.9:2.8.0 --quick
    python tests/compat.py --output compat.json --output compat.md
    python tests/compat.py --docs                            # and update the docs' compatibility page

``--quick`` deselects the ``slow`` and ``distributed`` tests (whole-script hunts, msrun launches).
Run it under ``nice`` on a shared machine; pairs always run one after another. Python ``3.X`` is looked
up as ``$PYENV_ROOT/versions/3.X.*/bin/python3`` (newest patch first), then ``python3.X`` on ``PATH``;
``--python 3.X=/path/to/python`` overrides.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PAIRS = "3.10:2.7.2,3.9:2.8.0,3.11:2.9.0,3.11:2.10.0,3.12:2.10.0"
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "venv", "mindguard_runs", "mindguard_dump", "__pycache__",
                                     "*.egg-info", "build", "dist", ".pytest_cache", "compat-logs")
INSTALL_TIMEOUT = 1800
TESTS_TIMEOUT = 3600
DEMO_TIMEOUT = 900


def parse_pairs(text: str) -> List[Tuple[str, str]]:
    pairs = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        py, sep, ms = item.partition(":")
        if not sep or not re.fullmatch(r"3\.\d+", py) or not re.fullmatch(r"\d+\.\d+\.\d+(\.\w+)?", ms):
            raise SystemExit(f"compat.py: bad pair {item!r}; write PYTHON:MINDSPORE, e.g. 3.10:2.7.2")
        pairs.append((py, ms))
    if not pairs:
        raise SystemExit("compat.py: --pairs is empty")
    return pairs


def find_python(version: str, overrides: Dict[str, str]) -> Optional[str]:
    if version in overrides:
        return overrides[version]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))

    def patch(path: str) -> int:
        m = re.search(rf"/{re.escape(version)}\.(\d+)/", path)
        return int(m.group(1)) if m else -1

    found = sorted((p for p in glob.glob(f"{root}/versions/{version}.*/bin/python3") if patch(p) >= 0),
                   key=patch, reverse=True)
    return found[0] if found else shutil.which(f"python{version}")


def git_state() -> Dict[str, object]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    return {"commit": git("rev-parse", "--short", "HEAD") or "unknown",
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def clean_env(venv: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MINDSPORE_DUMP_CONFIG", "PYTHONHASHSEED")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"   # msrun runs `python` from PATH
    env["VIRTUAL_ENV"] = str(venv)
    env.setdefault("GLOG_v", "3")
    return env


def run(cmd: List[str], *, cwd: Path, env: Dict[str, str], log: Path, timeout: float) -> Tuple[Optional[int], float]:
    """Run ``cmd``, output to ``log``; return (exit code or None on timeout, seconds)."""
    start = time.monotonic()
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(cmd)}   (cwd {cwd})\n".encode())
        out.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: Optional[int] = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)   # the whole session: pytest-xdist workers, msrun children
            proc.wait()
            code = None
            out.write(f"\n[compat.py] timed out after {timeout:.0f} s; killed\n".encode())
    return code, time.monotonic() - start


def tail(path: Path, lines: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def junit_results(path: Path) -> Optional[Dict[str, object]]:
    """Counts and failing ids from pytest's JUnit XML (one testcase per collected test)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    passed, skipped, failed, errors, skips = 0, 0, [], [], []
    for case in root.iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        test_id = f"{cls.replace('.', '/')}.py::{name}" if cls else name
        kinds = {child.tag for child in case}
        if "failure" in kinds:
            failed.append(test_id)
        elif "error" in kinds:
            errors.append(test_id)
        elif "skipped" in kinds:
            skipped += 1
            skips.append(f"{test_id}: {case.find('skipped').get('message', '')}")
        else:
            passed += 1
    return {"passed": passed, "failed": len(failed), "errors": len(errors), "skipped": skipped,
            "failures": failed + [f"{t} (error)" for t in errors], "skips": skips}


def summary_counts(log: Path) -> Dict[str, int]:
    """Fallback: the counts of pytest's last summary line (``3 failed, 120 passed, 2 skipped in 99s``)."""
    counts: Dict[str, int] = {}
    for line in reversed(log.read_text(errors="replace").splitlines()):
        found = re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", line)
        if found and " in " in line:
            for n, kind in found:
                counts["errors" if kind.startswith("error") else kind] = int(n)
            break
    return counts


def run_pair(py: str, ms: str, args, work_root: Path, log_dir: Path, overrides: Dict[str, str]) -> Dict[str, object]:
    row: Dict[str, object] = {"python": py, "mindspore": ms, "python_full": None, "mindspore_installed": None,
                              "numpy": None, "status": "", "passed": None, "failed": None, "skipped": None,
                              "errors": None, "failures": [], "skips": [], "demo_exit": None, "install_s": None,
                              "tests_s": None, "demo_s": None, "wall_s": None, "log": None}
    start = time.monotonic()
    tag = f"py{py}-ms{ms}".replace(".", "_")   # no '.' in paths: MindSpore's dump refuses them
    log = log_dir / f"{tag}.log"
    log.write_text("")
    row["log"] = str(log)
    python = find_python(py, overrides)
    if python is None:
        row["status"] = f"no Python {py} found (pass --python {py}=/path/to/python)"
        row["wall_s"] = round(time.monotonic() - start, 1)
        return row
    pair_dir = work_root / tag
    try:
        src, venv = pair_dir / "src", pair_dir / "venv"
        shutil.copytree(REPO, src, ignore=COPY_IGNORE)
        subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True)
        env = clean_env(venv)
        vpy = str(venv / "bin" / "python")
        code, row["install_s"] = run([vpy, "-m", "pip", "install", "--quiet", f"mindspore=={ms}", ".[test]", "numpy<2"],
                                     cwd=src, env=env, log=log, timeout=INSTALL_TIMEOUT)
        row["install_s"] = round(row["install_s"], 1)
        if code != 0:
            reason = "timed out" if code is None else f"exit {code}"
            lines = [ln for ln in tail(log, 40).splitlines() if ln.startswith("ERROR")]
            row["status"] = f"install failed ({reason}): " + (" | ".join(lines[:2]) or tail(log, 2))
            return row
        probe = ("import importlib.metadata as m, json, platform; "
                 "print(json.dumps([platform.python_version(), m.version('mindspore'), m.version('numpy')]))")
        out = subprocess.run([vpy, "-c", probe], capture_output=True, text=True, env=env, check=True).stdout
        row["python_full"], row["mindspore_installed"], row["numpy"] = json.loads(out.strip().splitlines()[-1])

        junit = pair_dir / "junit.xml"
        cmd = [vpy, "-m", "pytest", "-n", "2", "tests", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        if args.quick:
            cmd += ["-m", "not slow and not distributed"]
        code, tests_s = run(cmd, cwd=src, env=env, log=log, timeout=TESTS_TIMEOUT)
        row["tests_s"] = round(tests_s, 1)
        results = junit_results(junit) or {**{"passed": None, "failed": None, "errors": None, "skipped": None},
                                           **summary_counts(log), "failures": [], "skips": []}
        row.update(results)
        row["status"] = {0: "ok", 1: "tests failed", None: "tests timed out"}.get(code, f"pytest exit {code}")

        demo_cwd = pair_dir / "demo"
        demo_cwd.mkdir()
        code, demo_s = run([str(venv / "bin" / "mindguard"), "demo"], cwd=demo_cwd, env=env, log=log,
                           timeout=DEMO_TIMEOUT)
        row["demo_exit"], row["demo_s"] = ("timeout" if code is None else code), round(demo_s, 1)
        if code != 0 and row["status"] == "ok":
            row["status"] = "demo failed"
    except Exception as exc:  # noqa: BLE001 - one broken pair must not stop the matrix
        row["status"] = f"harness error: {type(exc).__name__}: {exc}"
    finally:
        row["wall_s"] = round(time.monotonic() - start, 1)
        if not args.keep:
            shutil.rmtree(pair_dir, ignore_errors=True)
    return row


def _cell(value) -> str:
    return "–" if value is None else str(value)


def markdown(report: Dict[str, object]) -> str:
    lines = [f"Measured {report['date']} on commit "
             f"`{report['commit']}`{' (uncommitted changes)' if report['dirty'] else ''}, "
             f"{report['platform']}, suite: {'quick (no slow/distributed tests)' if report['quick'] else 'full'}."
             + (f" {report['note']}" if report.get("note") else ""), "",
             "| Python | MindSpore | numpy | passed | failed | skipped | demo exit | wall time | result |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        failed = r["failed"] if not r.get("errors") else f"{r['failed']} (+{r['errors']} errors)"
        wall = f"{r['wall_s'] / 60:.1f} min" if r["wall_s"] is not None else "–"
        lines.append(f"| {_cell(r['python_full'] or r['python'])} | "
                     f"{_cell(r['mindspore_installed'] or r['mindspore'])} "
                     f"| {_cell(r['numpy'])} | {_cell(r['passed'])} | {_cell(failed)} | {_cell(r['skipped'])} "
                     f"| {_cell(r['demo_exit'])} | {wall} | {r['status']} |")
    failing = [r for r in report["rows"] if r["failures"]]
    if failing:
        lines += ["", "Failures:"]
        for r in failing:
            failures = ", ".join(f"`{t}`" for t in r["failures"])
            lines.append(f"- Python {r['python']}, MindSpore {r['mindspore']}: {failures}")
    skipping = [r for r in report["rows"] if r.get("skips")]
    if skipping:
        lines += ["", "Skipped:"]
        for r in skipping:
            lines.append(f"- Python {r['python']}, MindSpore {r['mindspore']}: " + "; ".join(r["skips"]))
    return "\n".join(lines) + "\n"


DOCS_DATA = REPO / "docs" / "data" / "compat"
DOCS_PAGE = REPO / "docs" / "snippets" / "compat" / "runs.md"


def render_runs(paths: List[Path]) -> str:
    """Saved reports (``--output X.json``) as the Markdown the docs' compatibility page includes, newest first."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    reports.sort(key=lambda r: (r["date"], r.get("time", "")), reverse=True)
    return "\n".join(markdown(r) for r in reports)


def write_docs(report: Optional[Dict[str, object]] = None) -> None:
    """Save ``report`` into docs/data/compat/ and re-render docs/snippets/compat/runs.md from every saved run."""
    DOCS_DATA.mkdir(parents=True, exist_ok=True)
    if report is not None:
        target = DOCS_DATA / f"{report['date']}-{report['commit']}.json"
        target.write_text(json.dumps(report, indent=2) + "\n")
        print(f"[compat] wrote {target}", file=sys.stderr)
    DOCS_PAGE.parent.mkdir(parents=True, exist_ok=True)
    DOCS_PAGE.write_text(render_runs(sorted(DOCS_DATA.glob("*.json"))))
    print(f"[compat] wrote {DOCS_PAGE}", file=sys.stderr)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default=DEFAULT_PAIRS, help=f"PY:MS,... (default {DEFAULT_PAIRS})")
    parser.add_argument("--quick", action="store_true", help="deselect slow and distributed tests")
    parser.add_argument("--keep", action="store_true", help="keep each pair's venv and checkout copy")
    parser.add_argument("--output", action="append", default=[],
                        help="write the table to this path: .json -> JSON, .md -> markdown, else both "
                             "PATH.json and PATH.md (repeatable)")
    parser.add_argument("--python", action="append", default=[], metavar="3.X=PATH", help="interpreter for 3.X")
    parser.add_argument("--log-dir", help="per-pair logs (pip, pytest, demo); default: a kept temp directory")
    parser.add_argument("--docs", action="store_true",
                        help="save the run in docs/data/compat/ and re-render the docs' tables "
                             "(docs/snippets/compat/runs.md) from every run saved there")
    parser.add_argument("--render-docs", action="store_true",
                        help="run nothing: re-render docs/snippets/compat/runs.md from docs/data/compat/*.json")
    args = parser.parse_args(argv)
    if args.render_docs:
        write_docs()
        return 0
    pairs = parse_pairs(args.pairs)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # started in the background (`cmd &`): SIGINT is ignored, and exec'd children would inherit that
        # (the suite's Ctrl-C test would hang). A handler, unlike SIG_IGN, is reset to the default on exec.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    overrides = dict(item.split("=", 1) for item in args.python)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="mindguard_compat_logs_")).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    work_root = Path(tempfile.mkdtemp(prefix="mindguard_compat_"))
    report: Dict[str, object] = {"date": _dt.date.today().isoformat(),
                                 "time": _dt.datetime.now().strftime("%H:%M:%S"), **git_state(),
                                 "platform": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPU",
                                 "quick": args.quick, "rows": []}
    print(f"[compat] {len(pairs)} pair(s) on commit {report['commit']}{' (dirty)' if report['dirty'] else ''}; "
          f"logs in {log_dir}", file=sys.stderr, flush=True)
    try:
        for py, ms in pairs:
            print(f"[compat] Python {py} + MindSpore {ms} ...", file=sys.stderr, flush=True)
            row = run_pair(py, ms, args, work_root, log_dir, overrides)
            report["rows"].append(row)
            print(f"[compat]   {row['status']}: passed {_cell(row['passed'])}, failed {_cell(row['failed'])}, "
                  f"skipped {_cell(row['skipped'])}, demo exit {_cell(row['demo_exit'])}, {row['wall_s']} s",
                  file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work_root, ignore_errors=True)
        table = markdown(report)
        print(table)
        for out in args.output:
            path = Path(out)
            targets = [path] if path.suffix in (".json", ".md") else [path.with_name(path.name + ".json"),
                                                                     path.with_name(path.name + ".md")]
            for target in targets:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(json.dumps(report, indent=2) + "\n" if target.suffix == ".json" else table)
                print(f"[compat] wrote {target}", file=sys.stderr)
        if args.docs:
            write_docs(report)
    ok = all(r["status"] == "ok" for r in report["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
