#!/usr/bin/env python3
"""Regenerate the "real output" snippets the docs include (``docs/snippets/output/*.txt``).

Every block of the docs that shows what mindguard printed is one of these files, included with
``--8<-- "output/NAME.txt"``; none is pasted by hand. Each producer below runs real commands (real MindSpore
trainings, real hunts) in a scratch copy of ``samples/`` and ``tests/zoo/``, and writes what they printed
(stdout and stderr, in order), abridged only by the rules written next to it; an abridged file says so on its
first line, and every left-out stretch is one ``...`` line.

    python docs/regen.py                      # every snippet (several minutes on 2 cores)
    python docs/regen.py iteration record      # only these
    python docs/regen.py --list

Run it from a checkout with the mindguard to document importable (``PYTHONPATH=$PWD``, or installed). The
cheap producers (``iteration``, ``dump_config_error``) are also compared with a real run in
``tests/test_docs.py``.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "snippets" / "output"

# MindSpore's own log lines and the loss printouts of the (long) healthy stretches
_NOISE = re.compile(r"^\[(WARNING|ERROR|INFO|DEBUG)\] |^\s*warnings\.warn\(|^.*UserWarning: ")
_LOSS = re.compile(r"^epoch: \d+ step: \d+, loss is ")
_TIME = re.compile(r"^(Train epoch time|epoch time|per step time)")


def run(argv: Sequence[str], cwd: Path, env: Optional[Dict[str, str]] = None, timeout: float = 900) -> "Ran":
    full_env = dict(os.environ)
    full_env.pop("MINDSPORE_DUMP_CONFIG", None)
    full_env.update({"GLOG_v": "3", "PYTHONUNBUFFERED": "1",
                     "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)})
    full_env.update(env or {})
    proc = subprocess.run(list(argv), cwd=cwd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    return Ran(proc.returncode, proc.stdout)


@dataclass
class Ran:
    code: int
    output: str


def mindguard(*args: str) -> List[str]:
    """``python -m mindguard ARGS`` with this interpreter (shown as ``mindguard ARGS``)."""
    return [sys.executable, "-m", "mindguard", *args]


def python(*args: str) -> List[str]:
    return [sys.executable, *args]


def clean(text: str, scratch: Path) -> List[str]:
    """The output as a user sees it: the scratch folder shown as the project folder, this checkout's path left
    out (``mindguard/demos/norm_nan.py``, not ``/home/.../mindguard/demos/norm_nan.py``), no trailing blanks,
    MindSpore's log lines dropped."""
    text = text.replace(sys.executable, "python")   # (first: a virtual environment inside the checkout)
    text = text.replace(str(scratch) + "/", "").replace(str(scratch), ".").replace(str(REPO) + "/", "")
    text = re.sub(r"(mindguard_failure(?:\.rank\d+)?)\.\d{8}-\d{6}-\d+\.json", r"\1.<run id>.json", text)
    return [ln.rstrip() for ln in text.splitlines() if not _NOISE.search(ln)]


def abridge(lines: List[str], keep: Callable[[int, str, List[str]], bool]) -> List[str]:
    """Keep the lines ``keep`` accepts; each run of left-out lines becomes one ``...`` line."""
    _BLOCKS.clear()   # keyed by the list's id: computed afresh for every output
    out: List[str] = []
    for i, line in enumerate(lines):
        if keep(i, line, lines):
            out.append(line)
        elif not out or out[-1] != "...":
            out.append("...")
    while out and out[-1] == "...":
        out.pop()
    return out


_BLOCKS: Dict[int, set] = {}


def _framework_frames(lines: List[str]) -> set:
    """Indices of a Python traceback's frames (its first and last line are kept) and of MindSpore's
    "C++ Call Stack: (For framework developers)" blocks."""
    key = id(lines)
    if key not in _BLOCKS:
        drop, i = set(), 0
        while i < len(lines):
            if lines[i].startswith("Traceback (most recent call last):"):
                j = i + 1
                while j < len(lines) and lines[j].startswith(" "):
                    drop.add(j)
                    j += 1
                i = j
            elif lines[i].startswith("- C++ Call Stack"):
                drop.update(k for k in (i - 1, i, i + 1) if 0 <= k < len(lines))
                j = i + 2
                while j < len(lines) and lines[j] and not lines[j].startswith("["):
                    drop.add(j)
                    j += 1
                i = j
            else:
                i += 1
        _BLOCKS[key] = drop
    return _BLOCKS[key]


def last_loss_line_only(i: int, line: str, lines: List[str]) -> bool:
    """Of each run of ``epoch: E step: S, loss is`` lines keep the last; drop timing lines; of a run of
    ``warning:`` lines keep the first two; of a traceback its first and last line."""
    if _TIME.match(line) or i in _framework_frames(lines):
        return False
    if line.startswith("warning: ") and i >= 2 and lines[i - 1].startswith("warning: ") \
            and lines[i - 2].startswith("warning: "):
        return False
    if _LOSS.match(line):
        nxt = next((ln for ln in lines[i + 1:] if not _TIME.match(ln)), "")
        return not _LOSS.match(nxt)
    return True


_LEFT_OUT = ("the healthy steps' loss lines, tracebacks' frames, MindSpore's C++ stacks and warning: lines after "
             "the first two of a run left out")


@dataclass
class Producer:
    name: str
    shown: List[str]                     # the commands as a user types them (one "$ ..." line each)
    argv: List[List[str]]                # what runs (same commands, with this interpreter)
    expect: Sequence[int]                # exit codes that mean "the example did what the docs say"
    keep: Optional[Callable] = None      # abridging rule (None: the whole output)
    note: str = ""
    env: Dict[str, str] = field(default_factory=dict)
    setup: Optional[Callable[[Path], None]] = None


def _copy_scripts(scratch: Path) -> None:
    shutil.copytree(REPO / "samples", scratch / "samples", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tests" / "zoo", scratch / "tests" / "zoo", ignore=shutil.ignore_patterns("__pycache__"))


def _msrun_env() -> Dict[str, str]:
    return {"PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")}


def _demo_keep(i: int, line: str, lines: List[str]) -> bool:
    # the intro paragraph the demo prints first is kept out (the tutorial says it in its own words)
    first_cmd = next((k for k, ln in enumerate(lines) if ln.startswith("$ ")), 0)
    return i >= first_cmd and last_loss_line_only(i, line, lines)


def _headlines(i: int, line: str, lines: List[str]) -> bool:
    """Each record's first line (what it says), not its field table."""
    return not line.startswith("  ")


def _msrun_cmd(*extra: str) -> List[str]:
    return ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1", "--master_port=8118",
            "--join=True", "--log_dir=msrun_logs", "samples/distributed_train.py", *extra]


PRODUCERS: Dict[str, Producer] = {p.name: p for p in [
    Producer("demo", ["mindguard demo --run-dir /tmp/demo_run"],
             [mindguard("demo", "--run-dir", "/tmp/demo_run")], expect=(0,), keep=_demo_keep,
             note="the intro paragraph, " + _LEFT_OUT),
    Producer("two_phase", ["mindguard hunt -- python tests/zoo/kg_two_phase.py --bad_phase head --bad_step 5"],
             [mindguard("hunt", "--", sys.executable, "tests/zoo/kg_two_phase.py", "--bad_phase", "head",
                        "--bad_step", "5")], expect=(1,), keep=last_loss_line_only,
             note=_LEFT_OUT),
    Producer("per_epoch_pynative", ["mindguard hunt -- python tests/zoo/per_epoch_loop.py --mode pynative"],
             [mindguard("hunt", "--", sys.executable, "tests/zoo/per_epoch_loop.py", "--mode", "pynative")],
             expect=(1,), keep=last_loss_line_only, note=_LEFT_OUT),
    Producer("functional_loop", ["mindguard hunt -- python samples/functional_loop.py"],
             [mindguard("hunt", "--", sys.executable, "samples/functional_loop.py")], expect=(1,),
             keep=last_loss_line_only, note=_LEFT_OUT),
    Producer("functional_loop_jit", ["mindguard hunt -- python samples/functional_loop.py --jit"],
             [mindguard("hunt", "--", sys.executable, "samples/functional_loop.py", "--jit")], expect=(1,),
             keep=last_loss_line_only, note=_LEFT_OUT),
    Producer("crash", ["mindguard hunt -- python samples/crash_out_of_range.py"],
             [mindguard("hunt", "--", sys.executable, "samples/crash_out_of_range.py")], expect=(1,),
             keep=last_loss_line_only, note=_LEFT_OUT),
    Producer("iteration", ["mindguard iteration --epoch 3 --step 50 --steps-per-epoch 100"],
             [mindguard("iteration", "--epoch", "3", "--step", "50", "--steps-per-epoch", "100")], expect=(0,)),
    Producer("dump_config_error", ["mindguard dump-config --path run.2/dump --iteration 10 -o x.json"],
             [mindguard("dump-config", "--path", "run.2/dump", "--iteration", "10", "-o", "x.json")], expect=(2,)),
    Producer("record", ["python tests/zoo/per_epoch_loop.py > /dev/null",
                        "mindguard record mindguard_failure.json"],
             [python("tests/zoo/per_epoch_loop.py"), mindguard("record", "mindguard_failure.json")],
             expect=(0, 1), keep=lambda i, line, lines: i < 5,
             note="the first command's output not shown; the record's fields after the first four"),
    Producer("msrun_record", ["msrun --worker_num=2 ... samples/distributed_train.py --poison-rank 1 > /dev/null",
                              "mindguard record mindguard_failure.json"],
             [_msrun_cmd("--poison-rank", "1"), mindguard("record", "mindguard_failure.json")],
             expect=(0, 1), env=_msrun_env(), keep=_headlines,
             note="the first command's output not shown; each record's field table"),
    Producer("msrun_hunt", ["export PATH=$(dirname $(which python)):$PATH",
                            "mindguard hunt -- msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 "
                            "--master_port=8118 \\\n      --join=True --log_dir=msrun_logs "
                            "samples/distributed_train.py --poison-rank 1"],
             [[], mindguard("hunt", "--", *_msrun_cmd("--poison-rank", "1"))], expect=(1,),
             keep=last_loss_line_only, env=_msrun_env(), note=_LEFT_OUT),
]}


def produce(producer: Producer, scratch: Path) -> List[str]:
    """Run ``producer``'s commands in ``scratch``; return the snippet's lines."""
    lines: List[str] = []
    for index, (shown, argv) in enumerate(zip(producer.shown, producer.argv)):
        lines.append(f"$ {shown}")
        if not argv:
            continue
        ran = run(argv, scratch, producer.env)
        if ran.code not in producer.expect:
            raise SystemExit(f"regen.py {producer.name}: `{shown}` exited {ran.code}, expected one of "
                             f"{list(producer.expect)}:\n{ran.output[-4000:]}")
        if "> /dev/null" in shown:
            continue
        out = clean(ran.output, scratch)
        lines += abridge(out, producer.keep) if producer.keep else out
        if index < len(producer.argv) - 1:
            lines.append("")
    header = f"# abridged by docs/regen.py: {producer.note}" if producer.keep and producer.note else None
    return ([header] if header else []) + lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"snippets to regenerate (default all): {', '.join(PRODUCERS)}")
    parser.add_argument("--list", action="store_true", help="list the snippets and their commands")
    parser.add_argument("--out", default=str(OUT), help="where to write NAME.txt (default docs/snippets/output)")
    args = parser.parse_args(argv)
    if args.list:
        for p in PRODUCERS.values():
            print(f"{p.name:20s} {' && '.join(p.shown)}")
        return 0
    unknown = [n for n in args.names if n not in PRODUCERS]
    if unknown:
        parser.error(f"unknown snippet(s) {unknown}; choose from {list(PRODUCERS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(PRODUCERS):
        scratch = Path(tempfile.mkdtemp(prefix="mg_docs_"))
        shutil.rmtree("/tmp/demo_run", ignore_errors=True)   # the demo's run folder, named in its snippet
        try:
            _copy_scripts(scratch)
            print(f"[regen] {name} ...", file=sys.stderr, flush=True)
            text = "\n".join(produce(PRODUCERS[name], scratch)) + "\n"
            (out / f"{name}.txt").write_text(text)
            print(f"[regen] wrote {out / (name + '.txt')}", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
