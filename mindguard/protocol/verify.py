"""``mindguard verify`` <-> its training process: the steps file the pass writes beside its record; the names
``mindguard verify`` adds to a run folder (the pass's folder, the verdict).

``verify_steps.json`` (rewritten atomically after each step): ``first``/``through`` (1-based global steps the pass
verifies), ``losses`` (global step -> the loss as exact text, ``float.hex`` or ``"nan"``/``"inf"``; ``null``
when the step's output held no loss), ``loaded`` (``{"step": the kept state's step, "overrides": [...]}`` once
the kept state is assigned; each override names a Parameter whose kept value and script value differ, and which
is ``used``), ``cannot_load`` (why the kept state does not fit the edited script), ``stopped_before`` (the step
the process ended before). Never imports MindSpore.
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

from .folder import PassName

SCHEMA = 1
STEPS = "verify_steps.json"
#: The verify pass's folder in the run folder.
VERIFY = PassName("verify")
#: The verdict, in the run folder (``mindguard.hunt.verify_plan.Verdict`` with what the pass did).
VERDICT = "verify.json"


def steps_beside(record: Union[str, Path]) -> Path:
    """The steps file of the verify pass whose record is ``record``: beside it."""
    return Path(record).parent / STEPS
