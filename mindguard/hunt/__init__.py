"""``mindguard hunt -- <command>``: from "it failed somewhere" to the culprit, in one command.

record -> examine -> explain: pass 1 runs the command with :class:`mindguard.Guard` recording the first failing
step (1-based, over every training call) while MindSpore's dump, armed to write no tensors, lets the run observe
which kernel graph and dump iteration each step ran as; the examine pass runs it again asking for exactly that step
-- dumped (compiled), captured and replayed (eager), or with the dataset pipeline synchronous -- and checks the
failure repeated; the answer is explained from the step's files. ``--from RECORD`` starts from the training state
a failing run kept (:mod:`mindguard.hunt.plan`).

The package: :mod:`.entry` (arguments, run folder, the hunt run to its end), :mod:`.executor` (the route through
the passes, on typed :mod:`.result`\\ s), :mod:`.examine` and :mod:`.explain`, :mod:`.runner` and :mod:`.passes`
(the process tree), :mod:`.messages` (every sentence printed, reason codes mapped to words), :mod:`.plan` and
:mod:`.rules` (pure decisions, returning the reason codes of :mod:`.verdicts`). The wrapper process never imports
MindSpore, nor the training side (:mod:`mindguard.training`): what both read of a run folder is
:mod:`mindguard.protocol`'s (tests/test_fast_hunt_boundary.py checks it).
"""
from ..protocol.summary import Outcome
from .entry import dump_path_problem, hunt, new_run_dir
from .scopes import COMPILED_LOOK, COMPILED_LOOK_STEPS, DUMP_SCOPES

__all__ = ["hunt", "Outcome", "DUMP_SCOPES", "COMPILED_LOOK", "COMPILED_LOOK_STEPS", "new_run_dir",
           "dump_path_problem"]
