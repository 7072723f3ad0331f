"""A resumed pass's *warm-up*: the last skipped steps before the kept one run for real, so that MindSpore's CPU
kernels are launched as often as they were in the failing run when the kept step begins.

Why (measured, docs/mindspore-facts.md, "warm-up"): a MindSpore CPU kernel splits its work between threads by a
search over its own launches (``ParallelLaunchAutoSearch``: 5 launches with one block, 5 with two, 5 with four, ...,
then the fastest), and an elementwise kernel whose blocks are not a multiple of its SIMD width computes their tails
by the scalar path, a few ulps from the vector one. A graph compiled anew in a resumed pass starts that search at
the kept step, so its first steps can compute a few ulps from the failing run's (mindcv's per-epoch ``jit`` step:
``log`` of 4 classes). The first :data:`WARM_UP_STEPS` launches' splits are fixed by their count alone: when the kept
step is fewer steps than that into its training call, running the call's steps before it for real puts every
kernel's search where it stood, and the kept state is then loaded over whatever those steps trained. Later in a call
the failing run's kernels split as their timing chose, which no replay fixes (two bare runs alike): none runs.

The count is decided where the state is kept (:func:`warm_up_steps`, ``state.json``'s ``warm_up``) and read, as
:class:`~mindguard.protocol.kept_state.StateMeta`'s, by both the resumed pass (which steps to run) and the hunt
(those launches number the train graph's dump iterations first: the kept step is iteration ``warm_up`` of a resumed
process). Steps are 1-based global steps. Imports nothing of
MindSpore.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Sequence

#: 5 launches as one block, 5 as two, 5 as four: the search always runs these (later ones follow its timings).
WARM_UP_STEPS = 15


def warm_up_steps(step: int, call_first_step: Optional[int]) -> int:
    """How many steps before 1-based global step ``step`` a pass resumed there runs for real: the steps of its
    training call (which began at global step ``call_first_step``) before it, when fewer than
    :data:`WARM_UP_STEPS`; else none (the failing run's kernels split by their timing by then)."""
    if call_first_step is None or not 0 < step - call_first_step < WARM_UP_STEPS:
        return 0
    return step - call_first_step


def warm_up_kept(count: int, unrestorable: Sequence[str]) -> int:
    """The warm-up a state kept with ``count`` warm-up steps records: none when some of its step's random sources
    are ``unrestorable`` (:mod:`mindguard.training.state.rng`). A pass resumed from it draws other masks than the
    failing run did and is judged by whether the failure repeats, never by a bit-exact trace, so launching the
    kernels as often as the failing run had buys nothing (a PyNative transformer's 13 warm-up steps took 8.7 s)."""
    return 0 if unrestorable else count


class WarmUp:
    """Which skipped steps of a resumed pass run for real: the ``count`` before global step ``kept``."""

    def __init__(self, kept: int, count: int) -> None:
        self.kept, self.count = kept, count
        self.now = False      # the step in progress is a warm-up step
        self.ran = 0          # warm-up steps run
        self.failed: Optional[str] = None   # why the warm-up stopped (a step raised)

    def note_step(self, global_step: int) -> None:
        """Step ``global_step`` begins (skipped or not)."""
        self.now = self.failed is None and self.kept - self.count <= global_step < self.kept

    def run(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run one warm-up step ``call(*args, **kwargs)``; its output is dropped (the loop gets the placeholder, as
        for any skipped step). An exception stops the warm-up (said once): the pass goes on as before it."""
        try:
            call(*args, **kwargs)
            self.ran += 1
        except Exception as exc:  # noqa: BLE001 - a skipped step never ends the pass; the trace check still judges it
            self.failed = f"{type(exc).__name__}: {str(exc)[:200]}"
            self.now = False
            print(f"mindguard hunt: a warm-up step before the kept state's raised ({self.failed}); the rest are "
                  f"skipped", file=sys.stderr, flush=True)

    def said(self) -> str:
        """``"; the last 14 ran, to launch the kernels as often as the failing run had"`` (empty: none ran)."""
        return (f"; the last {self.ran} ran first, to launch MindSpore's kernels as often as the failing run had"
                if self.ran else "")
