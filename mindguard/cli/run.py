"""``mindguard run [--seed N|off] -- COMMAND...``: run the command as it is, with Guard attached to every training in
its process tree (:mod:`mindguard.training.attach`; issue 53).

The command replaces this process (``exec``): its exit code, its signals and its output are its own. The
environment it gets differs in two variables (:func:`mindguard.protocol.attach.environment`): ``MINDGUARD_ATTACH``
(the command, for the ``hunt --from`` line Guard prints) and ``PYTHONPATH`` (the start-up hook's folder first).
Never imports MindSpore.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from .._util.io import console_write
from ..protocol import attach
from .hunt import command_of

#: a command that cannot be started (the shell's codes: not found, found but not runnable)
NOT_FOUND, NOT_RUNNABLE = 127, 126


def seed_argument(text: str) -> str:
    """An argparse ``type`` for ``--seed``: an integer in [0, 2**32) or ``off``."""
    try:
        attach.seed({attach.ENV_SEED: text})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer in [0, 2**32) or \"off\"") from None
    return text


def cli_run(args: argparse.Namespace) -> int:
    command = command_of(args)
    if not command:
        console_write("mindguard run: error: no command given: mindguard run -- python train.py ...\n", sys.stderr)
        return 2
    env = dict(os.environ)
    env.update(attach.environment(env, command, seed_value=getattr(args, "seed", None)))
    console_write(f"mindguard run: Guard attached to every training of: {shlex.join(command)}\n", sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        console_write(f"mindguard run: error: command not found: {command[0]}\n", sys.stderr)
        return NOT_FOUND
    except OSError as exc:   # a folder, no execute permission, a bad interpreter line
        console_write(f"mindguard run: error: cannot run {command[0]}: {exc.strerror or exc}\n", sys.stderr)
        return NOT_RUNNABLE
    return 0   # not reached: exec replaced this process
