"""The failure record's closed vocabularies: its schema numbers and the ``str`` enums of its ``status``, ``kind``,
``phase`` and ``examine`` fields (a member equals the string JSON holds), with their values as tuples.
:mod:`.record` re-exports every name."""
from __future__ import annotations

import enum

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)


class Status(str, enum.Enum):
    """Where the run is: ``running`` (a step in progress, or killed in one), ``failed``, ``finished``."""

    RUNNING = "running"
    FAILED = "failed"
    FINISHED = "finished"


class Kind(str, enum.Enum):
    """What failed. The members are ``str``: ``Kind.EXCEPTION == "exception"``, as JSON writes them."""

    NONFINITE_LOSS = "nonfinite_loss"
    NONFINITE_GRADS = "nonfinite_grads"
    NONFINITE_PARAMS = "nonfinite_params"
    LOSS_SCALE_COLLAPSE = "loss_scale_collapse"
    EXCEPTION = "exception"
    INTERRUPTED = "interrupted"


class Phase(str, enum.Enum):
    """Where an exception came from: inside a ``step``, ``between_steps`` (the dataset pipeline), the script's own
    data ``loader`` (a generator or iterator its loop iterates, producing the next step's batch), the ``script``'s
    own code, or ``mindguard``'s own bug."""

    STEP = "step"
    BETWEEN_STEPS = "between_steps"
    LOADER = "loader"
    SCRIPT = "script"
    MINDGUARD = "mindguard"


class Examiner(str, enum.Enum):
    """How the failing step is examined: MindSpore's ``dump`` of the compiled step, or an eager ``replay``."""

    DUMP = "dump"
    REPLAY = "replay"


STATUSES = tuple(s.value for s in Status)
KINDS = tuple(k.value for k in Kind)
CALL_KINDS = ("train", "watch")
PHASES = tuple(p.value for p in Phase)
EXAMINERS = tuple(e.value for e in Examiner)
