"""Attaching Guard to a training the user launches unmodified (issue 53): the environment that asks for it.

Three ways ask a Python process to attach Guard to its trainings (:mod:`mindguard.training.attach`):

* ``mindguard run -- COMMAND`` and every pass of ``mindguard hunt``/``verify`` export :data:`ENV_ATTACH` (the
  command as the user typed it, for the printed ``hunt --from`` line) and put :func:`site_dir` first on
  ``PYTHONPATH`` (a ``sitecustomize`` that starts the hook in every Python process of the command's tree: the
  fallback when the ``.pth`` below is not installed, e.g. an editable install);
* ``MINDGUARD=1`` (:data:`ENV_SWITCH`) in a job's environment: the ``mindguard_attach.pth`` file a non-editable
  ``pip install`` puts into site-packages starts the hook in every Python process that inherits it.

The ``.pth`` line only looks at these two variables (``os`` is imported by then); everything else is decided here,
by :func:`requested`, once the hook module is imported. Never imports MindSpore.
"""
from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Sequence

from ..errors import ArgumentError

ENV_SWITCH = "MINDGUARD"                  # "1" (true, yes, on): attach Guard to every training of the job
ENV_ATTACH = "MINDGUARD_ATTACH"          # set by `mindguard run`/`hunt`: the command as typed (shell words)
ENV_SEED = "MINDGUARD_SEED"              # "off": never seed; an integer: the seed used when the script sets none
DEFAULT_SEED = 0
_ON = ("1", "true", "yes", "on")
_OFF = ("off", "none", "no", "false")

#: the text the hook prints its notes with (the hunt finds them in a pass's output by it)
NOTE_PREFIX = "mindguard attach: "


def requested(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is asked to attach Guard to its trainings."""
    if env.get(ENV_ATTACH):
        return True
    return env.get(ENV_SWITCH, "").strip().lower() in _ON


def switch_value_ignored(env: Mapping[str, str] = os.environ) -> Optional[str]:
    """``MINDGUARD``'s value when it is set but means neither on nor off (said once, by the hook), else None."""
    value = env.get(ENV_SWITCH)
    if value is None or value.strip().lower() in _ON + ("", "0") + _OFF:
        return None
    return value


def original_command(env: Mapping[str, str] = os.environ) -> Optional[List[str]]:
    """The command ``mindguard run`` (or the hunt) was given, as words, or None (``MINDGUARD=1`` alone, or ``"1"``)."""
    value = env.get(ENV_ATTACH)
    if not value or value == "1":
        return None
    import shlex   # here: the hook imports this module at every start-up

    try:
        words = shlex.split(value)
    except ValueError:
        return None
    return words or None


def seed(env: Mapping[str, str] = os.environ) -> Optional[int]:
    """The seed the hook gives a script that sets none (:data:`DEFAULT_SEED` unless ``MINDGUARD_SEED`` says), or
    None: ``MINDGUARD_SEED=off``. A value that is neither is refused (:class:`~mindguard.errors.ArgumentError`, a
    ``ValueError``; said by the hook)."""
    value = env.get(ENV_SEED, "").strip()
    if not value:
        return DEFAULT_SEED
    if value.lower() in _OFF:
        return None
    if value.isascii() and value.isdigit() and int(value) < 2 ** 32:
        return int(value)
    raise ArgumentError(f"{ENV_SEED}={value!r}: expected an integer in [0, 2**32) or \"off\"")


def site_dir() -> str:
    """The folder holding the ``sitecustomize.py`` that starts the hook (put first on ``PYTHONPATH``)."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return os.path.join(package, "training", "attach", "startup")


def environment(env: Mapping[str, str], command: Sequence[str], *, seed_value: Optional[str] = None) -> Dict[str, str]:
    """The variables to set (over ``env``) so that every Python process ``command`` starts attaches Guard:
    :data:`ENV_ATTACH` (the command, for the printed line), ``PYTHONPATH`` with :func:`site_dir` first (once), and
    ``MINDGUARD_SEED`` when ``seed_value`` is given."""
    import shlex

    site = site_dir()
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    values = {ENV_ATTACH: shlex.join(command) if command else "1", "PYTHONPATH": os.pathsep.join([site, *paths])}
    if seed_value is not None:
        values[ENV_SEED] = seed_value
    return values


__all__ = ["DEFAULT_SEED", "ENV_ATTACH", "ENV_SEED", "ENV_SWITCH", "NOTE_PREFIX", "environment", "original_command",
           "requested", "seed", "site_dir", "switch_value_ignored"]
