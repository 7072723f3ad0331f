"""How a training process run by ``mindguard hunt`` ends itself: :class:`HuntStop` (the hunt has what it came for)
and :class:`HuntCannotContinue` (the pass cannot do its work, said on stderr first).

Their own module, importing nothing of mindguard, so that :mod:`mindguard.training.run` (which raises them) and
:mod:`mindguard.training.record.classify` (which tells them from a failure) both import them without importing each
other.
"""
from __future__ import annotations


class HuntStop(SystemExit):
    """Ends the process when ``mindguard hunt`` has what it came for (a failure recorded, or the step examined)
    and the script starts another training call: training on from poisoned weights only wastes time.
    A ``SystemExit`` (exit status 0), so ``except Exception`` in the script does not swallow it."""

    def __init__(self, message: str):
        super().__init__(0)
        self.message = message


#: How a training process under the hunt says it cannot do what the pass asks (a line on stderr; the hunt reads it
#: from the pass's output and ends with that message, exit 2, instead of a verdict).
CANNOT_CONTINUE = "mindguard hunt: cannot continue: "


class HuntCannotContinue(HuntStop):
    """Ends a process under the hunt that cannot do what its pass asks -- its record cannot be written (a full
    disk, a removed run folder), the script replaced the hunt's dump config -- after saying so on stderr
    (:data:`CANNOT_CONTINUE`). Exit status 2."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2
