"""``mindguard verify``'s pass, inside the training process: load the kept state into the script *as edited*, note
each step's loss, and stop the training once the steps to verify are done.

The process runs under the hunt's protocol (:class:`~mindguard.protocol.request.HuntRequest` with ``verify_steps``):
a resumed pass (:mod:`mindguard.training.state.resume`) skips the steps before the kept state's, every step is checked
(loss and Parameters), and the first failure is recorded as in any hunt pass. What differs (:class:`VerifyPass`):

* the kept state is assigned **by Parameter name** (a swapped cell with the same Parameters -- ``SafeNorm`` for
  ``nn.Norm`` -- or a reordered one still loads); Parameters renamed, added, removed or reshaped make the pass say it
  *cannot continue* (one line naming them; the wrapper exits 2) instead of training from the wrong state;
* a learning rate held in a Parameter (``learning_rate``, ``lr``; a dynamic one's per-step array too) whose value in
  the edited script differs from the kept one is the edit's: the script's value is assigned back after the state
  (training never writes a fixed learning rate, so a difference is the edit). A loss scale that differs keeps the kept
value (the training's own
  at that step). Both are named in the steps file;
* the resumed run is not compared with the failing one (the edit is meant to change what it computes), so a
  ``Model.train`` dataset is reset to the kept step only when no map of it may depend on the rows before
  (:func:`reset_problem`), else iterated there;
* each step's loss from ``first`` on goes to ``verify_steps.json`` beside the pass's record (rewritten atomically:
  at once for a non-finite loss, else at most every second, and at exit; one file per rank with several), and the
  process ends (:class:`~mindguard.training.child.hunt_stop.HuntStop`) before step ``through + 1`` begins.

Steps are 1-based, process-wide global steps (:mod:`mindguard.training.run`).
"""
from __future__ import annotations

import atexit
import math
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ..state import dataset_skip as _dataset_skip, resume as _resume
from ..state.state_files import _as_numpy, small_state
from ..._util.dist import per_rank_path, rank_info
from ..._util.names import compare_by_name
from .hunt_stop import CANNOT_CONTINUE, HuntCannotContinue, HuntStop
from ..._util.io import atomic_write_json
from ...errors import HuntProtocolError
from ...protocol import verify as protocol

#: Seconds between two writes of the steps file while the steps stay finite.
WRITE_SECONDS = 1.0
#: A Parameter holding a learning rate (the optimizer's ``learning_rate``; a script's own ``lr``).
_LEARNING_RATE = re.compile(r"(^|[._])(learning_rate|lr)$", re.I)
#: A Parameter holding a loss scale (``scale_sense`` of a train cell with loss scaling; ``loss_scale``).
_LOSS_SCALE = re.compile(r"(scale_sense|loss_scale)$", re.I)


class VerifyPass:
    """The verify pass of this process (see the module docstring); ``record``: the pass's record path."""

    def __init__(self, record: Path, first: int, through: int):
        self.path = protocol.steps_beside(record)
        self.first, self.through = first, through
        self.losses: Dict[int, Optional[str]] = {}
        self.loaded: Optional[Dict[str, Any]] = None
        self._written_at = 0.0
        self._unwritten = False
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        if self._unwritten:
            try:
                self._write()
            except OSError as exc:   # the wrapper then says the steps are missing; never a traceback at exit
                print(f"mindguard verify: could not write {self.path}: {exc}", file=sys.stderr, flush=True)

    def note(self, step: int, loss: Optional[float]) -> None:
        """Step ``step`` (not skipped) ended with ``loss``. Written at once when the loss is not finite, else at most
        every :data:`WRITE_SECONDS` (a long window would rewrite a growing file every step); the rest at exit."""
        if step < self.first:
            return
        self.losses[step] = _resume.fingerprint(loss)
        now = time.monotonic()
        if (loss is not None and not math.isfinite(loss)) or now - self._written_at >= WRITE_SECONDS:
            self._write()
        else:
            self._unwritten = True

    @staticmethod
    def reset_problem(dataset: Any) -> Optional[str]:
        """See :func:`reset_problem`: ``None`` when the dataset may be reset to the kept step."""
        return reset_problem(dataset)

    def stop_before(self, step: int) -> None:
        """Step ``step`` is about to begin: past ``through``, end the process (:class:`HuntStop`)."""
        if step <= self.through:
            return
        self._write(stopped_before=step)
        message = (f"mindguard verify: global steps {self.first}-{self.through} are done; the training is stopped "
                   f"before global step {step}")
        print(message, file=sys.stderr, flush=True)
        raise HuntStop(message)

    def load(self, resumer: Any, params: Sequence[Any]) -> None:
        """Assign ``resumer``'s kept state to ``params`` (the edited script's Parameters) by name; the edit's learning
        rate wins. :class:`HuntCannotContinue` (after a line on stderr) when the state does not fit."""
        meta = resumer.meta
        names = meta.get("names") or []
        if "checkpoint" in meta:   # the training's own checkpoint: its shapes are checked when the Resumer assigns it
            here = {p.name: list(p.shape) for p in params}
            shapes = [here.get(name, []) for name in names]
        else:
            shapes = meta.get("shapes") or []
        problem = mismatch(names, shapes, [p.name for p in params], [list(p.shape) for p in params])
        if problem is not None:
            self._cannot(problem)
        by_name = {p.name: p for p in params}
        ordered = [by_name[name] for name in meta["names"]]
        before = {p.name: _small_values(p) for p in ordered if p.size <= 16 or _LEARNING_RATE.search(p.name)}
        initial = meta.get("initial") if isinstance(meta.get("initial"), dict) else {}
        script_text = {p.name: small_state([p])[0] for p in ordered if p.name in initial and p.size <= 16}
        try:
            resumer.load(ordered)
        except HuntProtocolError as exc:
            self._cannot(str(exc))
        overrides = []
        kept_step = _kept_counter(ordered)
        for param in ordered:
            if param.name not in before:
                continue
            script, kept = before[param.name], _small_values(param)
            if script == kept:
                continue
            if _LEARNING_RATE.search(param.name):
                if param.name in script_text and script_text[param.name] == initial.get(param.name):
                    continue   # the script gives the rate the failing run began with: the training (a callback) set it
                _assign(param, script)
                overrides.append({"name": param.name, "kind": "learning rate", "kept": kept, "script": script,
                                  "used": "script",
                                  "from_step": edit_begins(kept, script, resumer.step, kept_step)})
            elif _LOSS_SCALE.search(param.name):
                overrides.append({"name": param.name, "kind": "loss scale", "kept": kept, "script": script,
                                  "used": "kept"})
        self.loaded = {"step": resumer.step, "overrides": overrides}
        earlier = [o for o in overrides if o.get("from_step") is not None and o["from_step"] < resumer.step]
        if earlier:   # the edit acts before the kept state: from it, the pass cannot test the edit (issue 52)
            begins = min(int(o["from_step"]) for o in earlier)
            what = "; ".join(f"{o['kind']} {o['name']} differs from global step {o['from_step']} on" for o in earlier)
            self._write(earlier={"from_step": begins, "what": what})
            message = (f"the edit changes what the training did before the kept state of global step "
                       f"{resumer.step} ({what}): from that state it cannot be tested")
            print(CANNOT_CONTINUE + message, file=sys.stderr, flush=True)
            raise HuntCannotContinue(message)
        self._write()

    def _cannot(self, problem: str) -> None:
        self._write(cannot_load=problem)
        message = f"the kept training state does not load into the edited script: {problem}"
        print(CANNOT_CONTINUE + message, file=sys.stderr, flush=True)
        raise HuntCannotContinue(message)

    def _write(self, **extra: Any) -> None:
        path = per_rank_path(self.path, *rank_info())   # several ranks: each its own (verify_steps.rank1.json)
        self._written_at, self._unwritten = time.monotonic(), False
        atomic_write_json(path, {"schema": protocol.SCHEMA, "first": self.first, "through": self.through,
                                      "loaded": self.loaded,
                                      "losses": {str(k): v for k, v in sorted(self.losses.items())}, **extra})


def reset_problem(dataset: Any) -> Optional[str]:
    """Why a fast reset of ``dataset`` to the kept step (:mod:`mindguard.training.state.dataset_skip`) may not deliver
    the batches the failing run trained on, or ``None``. A reset skips the map operations of the steps before it, so a
    map whose output depends on the rows it saw before -- a random transform, or a Python callable (it may draw from a
    generator of its own) -- gives other batches. A hunt's pass finds that out by comparing its steps with the failing
    run's; the verify pass cannot (the edit changes them), so it iterates the dataset instead."""
    for node in _dataset_skip.pipeline_nodes(dataset):
        if type(node).__name__ == "MapDataset":
            for op in getattr(node, "operations", None) or []:
                kind = type(op).__name__
                if _dataset_skip.runs_python(op):   # a plain callable, or one inside Compose / RandomApply
                    name = getattr(op, "__qualname__", None) or kind
                    return f"its map runs {name}, a Python callable that may keep state between rows"
                if "Random" in kind:
                    return f"its map runs {kind}, a random transform"
    return None


def mismatch(kept_names: Sequence[str], kept_shapes: Sequence[Sequence[int]], names: Sequence[str],
             shapes: Sequence[Sequence[int]]) -> Optional[str]:
    """Why the kept state (``kept_names``/``kept_shapes``) cannot be assigned by name to Parameters ``names`` of
    ``shapes``, or ``None`` when every kept Parameter has one of the same name and shape and no other is left."""
    here = dict(zip(names, (list(s) for s in shapes)))
    kept = dict(zip(kept_names, (list(s) for s in kept_shapes)))
    differ = compare_by_name(kept, here)
    gone, new = differ.only_before, differ.only_after
    reshaped = [f"{n} {kept[n]} -> {here[n]}" for n in differ.changed]

    def some(items: List[str]) -> str:
        return ", ".join(items[:4]) + (f" (+{len(items) - 4} more)" if len(items) > 4 else "")

    if not differ:
        return None
    parts = [f"{label}: {some(items)}" for label, items in (
        ("kept but not in the edited script", gone), ("in the edited script but not kept", new),
        ("reshaped", reshaped)) if items]
    what = "renamed" if gone and new and len(gone) == len(new) and not reshaped else \
        "reshaped" if reshaped and not gone and not new else "renamed, added, removed or reshaped"
    return f"Parameters {what} ({'; '.join(parts)})"


def edit_begins(kept: Sequence[float], script: Sequence[float], state_step: int,
                counter: Optional[int]) -> int:
    """The first global step whose learning rate differs between the failing run (``kept``: its rate in the state
    kept at the beginning of ``state_step``) and the edited script (``script``). A per-step schedule (several values,
    indexed by the optimizer's step counter, ``counter`` in the kept state: ``state_step - 1`` for one training call)
    differs from the step of its first differing value; a single rate the training never writes, from step 1."""
    if len(kept) <= 1 or len(kept) != len(script):
        return 1
    first = next((i for i, (a, b) in enumerate(zip(kept, script)) if a != b), None)
    if first is None:
        return state_step
    offset = (counter - (state_step - 1)) if counter is not None else 0
    return max(1, first + 1 - offset)


def _kept_counter(params: Sequence[Any]) -> Optional[int]:
    """The optimizer's step counter (``global_step``) as the kept state set it, or ``None``."""
    param = next((p for p in params if p.name == "global_step" and p.size == 1), None)
    try:
        return int(param.item()) if param is not None else None
    except (TypeError, ValueError):
        return None


def _small_values(param: Any) -> List[float]:
    return [float(v) for v in np.asarray(_as_numpy(param), dtype=np.float64).reshape(-1)]


def _assign(param: Any, values: List[float]) -> None:
    import mindspore as ms

    array = np.asarray(values, dtype=np.float64).reshape(param.shape)
    ms.ops.assign(param, ms.Tensor(array, dtype=param.dtype))
