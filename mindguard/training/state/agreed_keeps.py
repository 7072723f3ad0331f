"""Which steps every rank of a multi-rank run checks its Parameters at and keeps its training state at -- the same
steps on every rank, decided by rank 0 (:class:`AgreedKeeps`). Pure: no MindSpore, no I/O.

A state of rank 0 kept at step 7 and one of rank 1 kept at step 9 resume nothing together, and an always-on
Guard's checks and keeps are on time budgets that each rank's clock would set differently. So the ranks agree,
through the one small collective Guard already makes at each step's end
(:func:`mindguard.training.checks.consensus.exchange`): each rank adds a few flag bits to its verdict code.

* At the end of global step N, rank 0 says whether its own budgets want a Parameter check (``CHECK``) and a kept
  state (``KEEP``; ``TO_DISK``: also written to disk) -- every rank then checks its Parameters at the end of step
  N + 1 (the next step to begin).
* At the end of that step every rank says whether it can keep (``READY``: its Parameters were just checked finite,
  its copy is not being written, its memory allows it). When rank 0 asked for a keep and every rank is ready, every
  rank keeps its state at the beginning of step N + 2; otherwise no rank does.

Steps are 1-based, process-wide global steps (every rank counts the same steps).
"""
from __future__ import annotations

from typing import Optional, Sequence

#: flag bits a rank adds to its code (:func:`mindguard.training.checks.consensus.exchange` shifts them past the verdict)
CHECK, KEEP, TO_DISK, READY = 1, 2, 4, 8
FLAG_BITS = 4


class AgreedKeeps:
    """One rank's side of the agreement (module docstring). ``rank``: this process's 0-based rank."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.check_at: Optional[int] = None   # the global step every rank checks its Parameters at the end of
        self.keep_asked = False               # rank 0 asked for a keep after that check
        self.to_disk = False                  # ... written to disk too
        self.keep_at: Optional[int] = None    # the global step every rank keeps its state at the beginning of
        self.keep_to_disk = False

    def flags(self, concluded: int, *, wants_check: bool, wants_keep: bool, to_disk: bool, ready: bool) -> int:
        """This rank's flags for the exchange at the end of global step ``concluded``. ``wants_check`` /
        ``wants_keep`` / ``to_disk``: what rank 0's budgets want now (ignored on the other ranks); ``ready``: this
        rank's Parameters were checked finite after ``concluded`` and a copy can be taken."""
        out = READY if ready and self.check_at == concluded else 0
        if self.rank == 0 and self.check_at is None and self.keep_at is None and (wants_check or wants_keep):
            out |= CHECK | (KEEP if wants_keep else 0) | (TO_DISK if wants_keep and to_disk else 0)
        return out

    def agree(self, flags: Sequence[int], concluded: int, next_step: int) -> None:
        """Every rank's ``flags`` (indexed by rank) from the exchange at the end of ``concluded``; ``next_step``: the
        global step that begins next (``concluded + 1`` unless the verdict was read a step late: then no state is
        kept, as the Parameters checked are no longer those the next step begins from). The same call on every
        rank leaves every rank with the same schedule."""
        if self.check_at is not None and self.check_at <= concluded:
            if self.check_at == concluded and self.keep_asked and next_step == concluded + 1 \
                    and all(f & READY for f in flags):
                self.keep_at, self.keep_to_disk = concluded + 1, self.to_disk
            self.check_at, self.keep_asked = None, False
        if flags and flags[0] & CHECK:
            self.check_at, self.keep_asked, self.to_disk = next_step, bool(flags[0] & KEEP), bool(flags[0] & TO_DISK)

    def check_due(self, step: int) -> bool:
        """Every rank checks its Parameters at the end of global step ``step``."""
        return self.check_at == step

    def keep_due(self, step: int) -> Optional[bool]:
        """At the beginning of global step ``step``: ``None`` -- no rank keeps; else every rank keeps its state now,
        and ``True`` when it also goes to disk. Consumes the agreement (past or present)."""
        if self.keep_at is None or step < self.keep_at:
            return None
        due, self.keep_at = step == self.keep_at, None
        return self.keep_to_disk if due else None

