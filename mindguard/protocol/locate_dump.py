"""What both sides of the hunt know of a locate pass that dumps as it goes (``mindguard hunt --from``): the training
side prunes the dump of the steps checked clean (:class:`mindguard.training.child.window_dump.DumpPruner`), the hunt
weighs the dump on disk (:mod:`mindguard.hunt.plan`). Steps are 1-based global steps. Imports nothing."""
from __future__ import annotations

#: Steps whose dump stays on disk behind the current one: a failure is recorded by the end of the step after the
#: failing one at the latest (a deferred check), so the files of the step before that are safe to remove.
KEPT_BEHIND = 2

__all__ = ["KEPT_BEHIND"]
