"""``mindguard`` command line: every subcommand's argparse front, nothing else.

Each subcommand's handler lives in a module of this package (``cli/hunt.py``, ``cli/record.py``, ...) and is
imported only when it runs, so ``mindguard iteration`` answers instantly and ``mindguard hunt`` never
imports MindSpore in the wrapper process.
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import re
import sys
from typing import Callable, List, Optional

from .._util.io import console_write, finish_console
from .._version import __version__
from ..dump.config import ITERATION_MAX   # the dump's 32-bit iteration counter (no MindSpore import)


_DIGITS = frozenset("0123456789")


def ascii_int(minimum: Optional[int] = 0, maximum: Optional[int] = None) -> Callable[[str], int]:
    """An argparse ``type``: a decimal integer written in ASCII digits (``int()`` would also take ``"３"``,
    ``"²"`` raises late, ``"1_000"`` and ``" 7"``), within ``[minimum, maximum]``."""
    def parse(text: str) -> int:
        body = text[1:] if text[:1] == "-" else text
        # at most 20 digits: a wider number is out of every range here, and Python refuses > 4300 digits
        if not body or not set(body) <= _DIGITS or len(body.lstrip("0")) > 20:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer written with the ASCII digits 0-9"
                                             + (f" (must be {minimum} or more)" if minimum is not None else ""))
        value = int(text)
        if minimum is not None and value < minimum or maximum is not None and value > maximum:
            bound = (f"between {minimum} and {maximum}" if minimum is not None and maximum is not None
                     else f"at least {minimum}" if minimum is not None else f"at most {maximum}")
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {bound}")
        return value
    parse.__name__ = "integer"
    return parse


_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?")


def ascii_seconds(text: str) -> float:
    """An argparse ``type`` for a duration: a positive, finite number of seconds in ASCII (``float()`` would
    also take ``"inf"``, ``"nan"``, ``"1e999"`` and ``"１"``)."""
    value = float(text) if _NUMBER.fullmatch(text) else None
    if value is None or not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive, finite number of seconds (e.g. 600)")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``mindguard <cmd>: error: <what>; see mindguard <cmd> --help``, exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def _handler(module: str, name: str) -> Callable:
    def run(args):
        return getattr(importlib.import_module(f"mindguard.cli.{module}"), name)(args)
    return run


def _handler_type(module: str, name: str) -> Callable[[str], str]:
    """An argparse ``type`` defined in a subcommand's module (imported when an argument is parsed)."""
    def parse(text: str) -> str:
        return getattr(importlib.import_module(f"mindguard.cli.{module}"), name)(text)
    parse.__name__ = name
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="mindguard",
        description="Find the operator, source line and step that made a MindSpore training go Inf/NaN.")
    parser.add_argument("--version", action="version", version=f"mindguard {__version__}")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    _add_training_commands(sub)
    _add_reading_commands(sub)
    return parser


def _add_training_commands(sub) -> None:
    """The commands that run a training: ``demo``, ``hunt``, ``run``, ``verify``."""
    p = sub.add_parser("demo", help="a real training that goes NaN, hunted down and fixed (under a minute on CPU)")
    p.add_argument("--run-dir", help="run folder (default: a new folder under ./mindguard_runs)")
    p.add_argument("--mode", choices=("graph", "pynative"), default="graph", help="MindSpore execution mode")
    p.set_defaults(func=_handler("demo", "cli_demo"))

    p = sub.add_parser("hunt", help="run a training twice: find the failing step, dump it, name the culprit",
                       usage="mindguard hunt [--from RECORD] [options] -- COMMAND [ARGS...]")
    p.add_argument("--run-dir", help="run folder for every artefact (default: a new folder under ./mindguard_runs)")
    p.add_argument("--from", dest="from_record", default=None, metavar="RECORD",
                   help="start from the record of the run that failed (the path Guard printed) and the training state "
                        "it kept: no re-training from step 1")
    p.add_argument("--timeout", type=ascii_seconds, default=None, help="stop a pass after this many seconds")
    p.add_argument("--net-name", default="Net", help="net_name of the dump (default: Net)")
    p.add_argument("--resume", choices=("auto", "always", "never"), default="auto",
                   help="start pass 2 from the training state pass 1 kept before the failure: when quicker than "
                        "from step 1 (auto, the default), whenever one was kept (always), or never")
    p.add_argument("--keep-every", type=ascii_int(1), default=None, metavar="STEPS",
                   help="pass 1 keeps the training state every STEPS steps (default: by time, costing <= 0.5%%)")
    p.add_argument("--dump-scope", choices=("outputs", "all_outputs", "full"), default=None,
                   help="what pass 2 dumps first: outputs (the default; no optimizer, weight gradients, copies or "
                        "weights), all_outputs (every op's outputs), full (every op's inputs and outputs); a dump "
                        "that explains nothing is widened")
    p.add_argument("--join-timeout", type=ascii_seconds, default=None, metavar="SECONDS",
                   help="several msrun nodes: how long each node's hunt waits for the others' (default 120); a node "
                        "that does not come is named, with what to run there")
    p.add_argument("--cluster-port", type=ascii_int(1024, 65535), default=None, metavar="PORT",
                   help="several msrun nodes: the port on the master address where the nodes' hunts meet "
                        "(default: msrun's --master_port + 1)")
    p.add_argument("--no-check-fix", action="store_true",
                   help="do not check the hint's fix: by default, once the culprit is found, the first hint's edit "
                        "is applied to a scratch copy of the project and run from the kept state through the failing "
                        "steps, as `mindguard verify` would (never your files; never changes the exit code)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")
    p.set_defaults(func=_handler("hunt", "cli_hunt"))

    p = sub.add_parser("run", help="run a training command unmodified, with Guard attached to every training in its "
                                   "process tree (python, bash scripts, msrun); exits with the command's own code",
                       usage="mindguard run [--seed N|off] -- COMMAND [ARGS...]")
    p.add_argument("--seed", default=None, metavar="N|off", type=_handler_type("run", "seed_argument"),
                   help="the seed given to a script that sets none (before its first cell is built), so that its "
                        "run repeats (default 0; a script that seeds itself keeps its own seed); off: never seed")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")
    p.set_defaults(func=_handler("run", "cli_run"))

    p = sub.add_parser("verify", help="check a fix: run the edited command from the failing run's kept state "
                                      "through the failing steps (no re-training from step 1)",
                       usage="mindguard verify --from RECORD [--steps K] [--from-start] [options] -- COMMAND [ARGS...]")
    p.add_argument("--from", dest="from_record", required=True, metavar="RECORD",
                   help="the record of the run that failed (the path Guard printed)")
    p.add_argument("--steps", type=ascii_int(0), default=None, metavar="K",
                   help="steps to train after the failing step or window (default: 5)")
    p.add_argument("--from-start", action="store_true",
                   help="train from step 1 instead of the kept state (when the state does not load into the edit)")
    p.add_argument("--run-dir", help="run folder for every artefact (default: a new folder under ./mindguard_runs)")
    p.add_argument("--timeout", type=ascii_seconds, default=None, help="stop a pass after this many seconds")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the edited training command, after --")
    p.set_defaults(func=_handler("verify", "cli_verify"))


def _add_reading_commands(sub) -> None:
    """The commands that read what a training left: ``iteration``, ``record``, ``dump-config``,
    ``analyze``, ``replay``."""
    p = sub.add_parser("iteration", help="the 0-based dump iteration of a 1-based epoch and step")
    p.add_argument("--epoch", type=ascii_int(1), required=True, help="1-based epoch")
    p.add_argument("--step", type=ascii_int(1), required=True, help="1-based step within the epoch")
    p.add_argument("--steps-per-epoch", type=ascii_int(1), required=True, help="batches per epoch")
    p.add_argument("--initial-iteration", type=ascii_int(0, ITERATION_MAX), default=0,
                   help="dump config's initial_iteration (default 0)")
    p.set_defaults(func=_handler("record", "cli_iteration"))

    p = sub.add_parser("record", help="pretty-print a failure record")
    p.add_argument("path", help="failure record JSON (e.g. mindguard_failure.json); per-rank name.rankN.json files are "
                                "found too")
    p.add_argument("--json", action="store_true", help="print the record(s) as JSON")
    p.set_defaults(func=_handler("record", "cli_record"))

    p = sub.add_parser("dump-config", help="write a validated dump.json for MINDSPORE_DUMP_CONFIG")
    p.add_argument("--path", required=True, help="dump directory (absolute, or resolved to absolute)")
    p.add_argument("--iteration", required=True, help='0-based iteration(s): "5", "0|5-8", or "all"')
    p.add_argument("--net-name", default="Net")
    p.add_argument("--kernels", nargs="*", default=[], help="op types, full names or name-regex(...)")
    p.add_argument("--saved-data", default="tensor", choices=("tensor", "statistic", "full"))
    p.add_argument("--input-output", type=ascii_int(0, 2), default=0, help="0 both, 1 inputs, 2 outputs")
    p.add_argument("--op-debug-mode", type=ascii_int(0, 4), default=0, help="0 normal, 3 overflow only, 4 exception "
                                                                            "(Ascend)")
    p.add_argument("--device-target", choices=("CPU", "GPU", "Ascend"), default=None,
                   help="device the training runs on (default: this machine's MindSpore context)")
    p.add_argument("--overwrite", action="store_true", help="allow a non-empty dump directory")
    p.add_argument("-o", "--output", required=True, help="where to write dump.json")
    p.set_defaults(func=_handler("dump", "cli_dump_config"))

    p = sub.add_parser("analyze", help="find the first operator that made Inf/NaN in a dump")
    p.add_argument("dump_dir", help="dump root (with rank_*), a rank directory or an iteration directory")
    p.add_argument("--iteration", type=ascii_int(0, ITERATION_MAX), default=None,
                   help="0-based dump iteration (default: the one dumped)")
    p.add_argument("--rank", type=ascii_int(0), default=None, help="only this rank (default: all)")
    p.add_argument("--state", default=None, metavar="DIR",
                   help="the training state kept at the dumped step (a hunt pass's state/ folder): Parameter inputs "
                        "are read as the step began")
    p.add_argument("--json", action="store_true", help="print the report as JSON (stable schema)")
    p.add_argument("--plot", default=None, metavar="PNG", help="save max|x| per op along execution order (needs "
                                                               "matplotlib)")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="also write the answer as a self-contained page (the report.html a hunt writes); refuses an "
                        "existing file")
    p.set_defaults(func=_handler("analyze", "cli_analyze"))

    p = sub.add_parser("replay", help="re-run one captured step eagerly and name the first cell that went non-finite")
    p.add_argument("capture", metavar="CAPTURE_DIR", help="directory written by "
                                                          "mindguard.training.examine.capture.StepCapture")
    p.add_argument("--net", required=True, metavar="MODULE:FACTORY",
                   help="a function (no arguments) returning the network with loss; MODULE is a dotted module or a .py "
                        "path")
    p.add_argument("--optimizer", default=None, metavar="MODULE:FACTORY",
                   help="a function taking the network with loss and returning its optimizer")
    p.add_argument("--json", action="store_true")
    p.add_argument("--html", default=None, metavar="FILE",
                   help="also write the answer as a self-contained page (the report.html a hunt writes); refuses an "
                        "existing file")
    p.set_defaults(func=_handler("replay", "cli_replay"))


def main(argv: Optional[List[str]] = None) -> int:
    """Run one subcommand; returns its exit code. Errors are one line on stderr and exit 2, never a traceback
    (a ``MindguardError`` a handler did not catch, an ``OSError``, or a bug, which the line says to report)."""
    _tolerant_console()
    try:
        return _main(argv)
    finally:
        finish_console()   # a closed pipe or a full disk behind the console never changes the exit code


def _main(argv: Optional[List[str]]) -> int:
    args = build_parser().parse_args(argv)
    from ..errors import MindguardError

    prog = f"mindguard {args.subcommand}"
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:   # `mindguard record x | head`: the reader left
        return 0
    except MindguardError as exc:
        console_write(f"{prog}: error: {exc}\n", sys.stderr)
        return 2
    except OSError as exc:
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        if not where and isinstance(exc, FileNotFoundError) and _cwd_gone():
            where = f" (the working directory {os.environ.get('PWD') or ''} no longer exists: cd to one that does)"
        console_write(f"{prog}: error: {exc.strerror or exc}{where}\n", sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - no traceback for a CLI user; exit 2 is "could not run"
        console_write(f"{prog}: error: internal error {type(exc).__name__}: {exc} (a mindguard bug; please report "
                      f"it with this line)\n", sys.stderr)
        return 2
    return int(code or 0)


def _tolerant_console() -> None:
    """Text the console's encoding cannot show (``PYTHONIOENCODING=ascii`` and a non-ASCII source line) is
    written escaped, never an ``UnicodeEncodeError``."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError, TypeError):
                pass


def _cwd_gone() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


if __name__ == "__main__":
    sys.exit(main())
