"""What the attach hook attached in this process (one :data:`STATE`), and how it says so."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from .notes import say

#: set on every function the hook made, so that it is never wrapped twice
MARK = "__mindguard_attached__"


class _State:
    """What the process attached (one per process)."""

    def __init__(self) -> None:
        self.installed = False
        self.model_depth = 0            # inside a patched Model.train/fit call
        self.inside_cell = False        # inside an attached train cell's step
        self.guard: Any = None          # the process's attached Guard
        self.watched: Dict[int, Tuple[Any, Any]] = {}   # id(train cell) -> (cell, its watched step)
        self.attached: List[str] = []   # what was attached, in words
        self.seed: Optional[int] = None   # the seed given at import (None: none)
        self.script_seeded = False
        self.seed_said = False
        self.functional: Optional[str] = None   # the advice given for a value_and_grad step
        self.optimizer: Optional[str] = None    # the first optimizer built: "nn.SGD at train.py:40"
        self.refused: set = set()       # ids of train cells (code of step functions) not watched (said once)
        self.optimizers: List[Any] = []  # weak references to the optimizers built


STATE = _State()


def _seed_note() -> Optional[str]:
    """Said once, at the first attached training: the seed given to a script that sets none."""
    if STATE.seed_said or STATE.script_seeded or STATE.seed is None:
        return None
    STATE.seed_said = True
    from ...protocol.attach import ENV_SEED

    return (f"the script sets no seed: mindguard seeded Python's random, numpy and MindSpore with {STATE.seed} before "
            f"its first cell was built, so that the run repeats (the hunt needs it; {ENV_SEED}=N picks another seed, "
            f"{ENV_SEED}=off none)")


def attached(what: str) -> None:
    STATE.attached.append(what)
    if len(STATE.attached) == 1:
        say(what)
        note = _seed_note()
        if note is not None:
            say(note)


def tell_hunt(text: str) -> None:
    """Under ``mindguard hunt``: the pass's status says what could not be attached (the hunt shows it as it is)."""
    try:
        from ...protocol.request import HuntRequest
        from ..child.pass_end import note

        note(HuntRequest.from_environ(), not_attached=text)
    except Exception:  # noqa: BLE001 - a malformed request is the run's to report, when it trains
        pass


def outside_steps() -> bool:
    """No training step is in progress: the call is not inside a step the script's own Guard or watch counts."""
    from ..run import current_run

    return current_run().step_begun() is None
