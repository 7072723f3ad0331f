"""Where the divergence began: from the losses Guard saw every step, when the loss started to grow toward the failure,
what grew, and what the learning rate was doing then. Pure functions, no MindSpore, no processes.

:func:`find_onset` reads a loss series (1-based global step -> loss; ``None`` where a step's output held no loss)
that ends at the failing step, and says which of three shapes led to the failure (:class:`Onset`):

* ``"growth"`` -- the loss climbed for several steps before it went non-finite: a training that diverged (a learning
  rate too high for the model, a schedule that rose too far, an init too large). ``onset`` is the step the climb
  started from (the foot: the last step at the healthy level, walked back to the local minimum before the climb);
* ``"spike"`` -- the loss was at its healthy level and one or two last finite steps jumped far above it before the
  failure (a bad batch): no divergence before it;
* ``"sudden"`` -- the loss was at its healthy level up to the failing step (an operator that made Inf/NaN from a
  healthy state: a log of 0, a sqrt's backward at 0).

The rule works on ``log|loss|`` and on medians, so that noise does not make or hide a divergence:

* the **healthy level** ``base`` is the lowest median of :data:`WINDOW` consecutive finite losses before the end
  (a training's loss goes down, then diverges: its best level is where it was healthy);
* the **end level** is the median of the last :data:`WINDOW` finite losses (one lucky or unlucky batch moves it
  little);
* it is a **growth** when the end level is at least :data:`GROWTH` x the healthy level and at least the level the
  series began at (the median of its first :data:`WINDOW` losses: a converged loss near 0 wobbles by orders of
  magnitude without diverging), the climb lasted at least :data:`MIN_CLIMB` steps, and at least :data:`SUSTAINED`
  of the steps of the climb stayed above :data:`NORMAL` x the healthy level (a steady climb, not a few spikes on a
  flat loss);
* otherwise, a last finite loss more than :data:`SPIKE` x the healthy level is a **spike**; else **sudden**.

:func:`describe_rate` says what the learning rate did over the same steps (its per-step values, read from the
optimizer's ``learning_rate`` Parameter or its schedule array), and whether it is the likely origin: it rose to its
level at or before the onset, or was constant through a growth.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

#: Losses a median is taken over (the healthy level, the end level).
WINDOW = 5
#: The end level must be at least this many times the healthy level for a growth.
GROWTH = 3.0
#: A climb shorter than this (steps from the onset to the last finite loss) is not a divergence.
MIN_CLIMB = 4
#: A step of the climb is "above normal" when its loss is more than this many times the healthy level ...
NORMAL = 1.25
#: ... and at least this share of the climb's steps must be.
SUSTAINED = 0.75
#: A last finite loss this many times the healthy level, on a loss otherwise at it, is a spike.
SPIKE = 10.0
#: The loss series a record keeps: the last this many steps exactly, older steps thinned (:class:`LossHistory`).
EXACT_STEPS = 1024


@dataclasses.dataclass(frozen=True)
class Onset:
    """The shape of the losses up to the failure (module docstring). ``onset``/``onset_loss``: the step the climb
    started from and its loss (a growth), or the spiking step (a spike); ``end``/``end_loss``: the last finite step
    and its loss; ``base``: the healthy level; ``failed``/``failed_loss``: the first non-finite step after the
    climb, when the series has one; ``factor``: ``end_loss / onset_loss``."""

    kind: str
    onset: Optional[int] = None
    onset_loss: Optional[float] = None
    end: Optional[int] = None
    end_loss: Optional[float] = None
    base: Optional[float] = None
    failed: Optional[int] = None
    failed_loss: Optional[float] = None
    factor: Optional[float] = None
    steps: int = 0

    def words(self) -> str:
        """One sentence: "the loss grew from 0.69 at global step 4 to 30.1 at global step 49 (x43), then +inf at
        global step 50"."""
        then = f", then {_loss_text(self.failed_loss)} at global step {self.failed}" if self.failed else ""
        if self.kind == "growth":
            return (f"the loss grew from {_num(self.onset_loss)} at global step {self.onset} to {_num(self.end_loss)} "
                    f"at global step {self.end} (x{_num(self.factor, 2)}){then}")
        if self.kind == "spike":
            return (f"the loss was steady (about {_num(self.base)}) until global step {self.onset}, where it jumped "
                    f"to {_num(self.onset_loss)}{then}: one batch, not a divergence")
        if self.kind == "sudden":
            return (f"the loss was steady (about {_num(self.base)}) up to global step {self.end}{then}: no divergence "
                    f"before the failure")
        return "too few losses to tell whether the training diverged"

    def to_dict(self) -> Dict[str, Any]:
        data = {k: _json_number(v) if isinstance(v, float) else v for k, v in dataclasses.asdict(self).items()}
        data["words"] = self.words()
        return data


def _num(value: Optional[float], digits: int = 3) -> str:
    if value is None:
        return "?"
    return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:.{digits}g}".replace("+", "")


def _loss_text(value: Optional[float]) -> str:
    if value is None:
        return "no loss"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+inf" if value > 0 else "-inf"
    return _num(value)


def _json_number(value: float) -> Any:
    return value if math.isfinite(value) else ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf"))


def _level(value: float) -> float:
    return math.log(abs(value)) if value != 0 else -745.0


def find_onset(losses: Mapping[int, Optional[float]]) -> Onset:
    """The shape of ``losses`` (1-based global step -> loss, ``None``: no loss) up to the first non-finite loss (or
    the series' end): see the module docstring."""
    series = sorted((s, v) for s, v in losses.items() if v is not None)
    failed = next(((s, v) for s, v in series if not math.isfinite(v)), None)
    finite = [(s, v) for s, v in series if math.isfinite(v) and (failed is None or s < failed[0])]
    failed_step, failed_loss = (failed[0], failed[1]) if failed is not None else (None, None)
    if len(finite) < WINDOW + 1:
        return Onset("unknown", steps=len(finite), failed=failed_step, failed_loss=failed_loss)
    levels = [_level(v) for _, v in finite]
    medians = [statistics.median(levels[i:i + WINDOW]) for i in range(len(levels) - WINDOW + 1)]
    end_level = medians[-1]
    best = min(range(len(medians)), key=lambda i: (medians[i], i))
    base = medians[best]
    end_step, end_loss = finite[-1]
    common: Dict[str, Any] = {"end": end_step, "end_loss": end_loss, "base": math.exp(base), "steps": len(finite),
                              "failed": failed_step, "failed_loss": failed_loss}
    normal = base + math.log(NORMAL)
    start_level = statistics.median(levels[:WINDOW])
    if end_level - base >= math.log(GROWTH) and end_level >= start_level:
        # the foot of the climb: the last step at the healthy level after the best window, walked back while the
        # loss keeps going down (the local minimum the climb starts from)
        last_normal = max((i for i in range(best, len(levels)) if levels[i] <= normal), default=best)
        foot = last_normal
        while foot > 0 and levels[foot - 1] < levels[foot]:
            foot -= 1
        climb = levels[last_normal + 1:]
        above = sum(1 for v in climb if v > normal)
        if len(finite) - 1 - foot >= MIN_CLIMB and climb and above >= SUSTAINED * len(climb):
            onset_step, onset_loss = finite[foot]
            return Onset("growth", onset_step, onset_loss, factor=end_loss / onset_loss if onset_loss else None,
                         **common)
    tail = [(s, v) for s, v in finite[-2:] if _level(v) - base >= math.log(SPIKE)]
    if tail and end_level - base < math.log(GROWTH):
        step, value = tail[0]
        return Onset("spike", step, value, **common)
    return Onset("sudden", **common)


# -------------------------------------------------------------------------------------------------------------
# the learning rate over the same steps
# -------------------------------------------------------------------------------------------------------------

def rate_at(rate: Mapping[str, Any], step: int) -> Optional[float]:
    """The learning rate of global step ``step`` from a record's ``learning_rate`` entry: a schedule's value at
    that step (``values[step - 1 + offset]``), else the last value noted at or before it (``changes``)."""
    values = rate.get("schedule")
    if isinstance(values, list) and values:
        index = step - 1 + int(rate.get("offset") or 0)
        return float(values[min(max(index, 0), len(values) - 1)])
    changes = rate.get("changes")
    if isinstance(changes, list):
        out = None
        for at, value in changes:
            if int(at) <= step:
                out = float(value)
        return out
    return None


def describe_rate(rate: Optional[Mapping[str, Any]], onset: Onset) -> Optional[Dict[str, Any]]:
    """What the learning rate (a record's ``learning_rate`` entry: ``name``, and ``schedule`` -- the per-step array
    the optimizer indexes, with ``offset`` -- or ``changes``, ``[[step, value], ...]`` of a scalar rate) did up to
    the failure, and whether it is the likely origin of ``onset``: ``{"name", "kind", "at_start", "at_onset",
    "at_end", "peak", "peak_step", "origin", "words"}``; ``None`` without a rate."""
    if not rate or onset.end is None:
        return None
    name = str(rate.get("name") or "learning_rate")
    last = onset.failed or onset.end
    values = [(s, rate_at(rate, s)) for s in range(1, last + 1)]
    known = [(s, v) for s, v in values if v is not None]
    if not known:
        return None
    start = known[0][1]
    peak_step, peak = max(known, key=lambda sv: (sv[1], -sv[0]))
    at_onset = rate_at(rate, onset.onset) if onset.onset else None
    at_end = rate_at(rate, last)
    kind = "schedule" if isinstance(rate.get("schedule"), list) else "set by the script"
    origin = False
    if onset.kind == "growth" and at_onset is not None and onset.onset is not None:
        reached = next((s for s, v in known if v >= 0.9 * peak), peak_step)
        # a rate that reached (about) its peak before the climb began, or one held constant through it
        origin = reached <= onset.onset + 1 or all(abs(v - start) <= 1e-12 * max(1.0, abs(start)) for _, v in known)
    if start == peak and all(v == peak for _, v in known):
        shape = f"constant {_num(peak, 4)}"
    else:
        rise = f"{_num(start, 4)} at global step {known[0][0]}, rising to {_num(peak, 4)} at global step {peak_step}"
        shape = f"{rise}, {_num(at_end, 4)} at global step {last}" if at_end is not None and peak_step != last \
            else rise
    words = f"learning rate {name} ({kind}): {shape}"
    if origin:
        words += (f"; the climb began at global step {onset.onset} with the rate at {_num(at_onset, 4)} -- a rate too "
                  f"high for this model makes the loss grow step after step: lower it (its peak, or a longer "
                  f"warm-up), then check the fix from step 1")
    return {"name": name, "kind": kind, "at_start": start, "at_onset": at_onset, "at_end": at_end, "peak": peak,
            "peak_step": peak_step, "origin": origin, "words": words}


def divergence(record: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The divergence a failure record shows: its ``divergence`` entry when Guard wrote one, else computed from its
    ``loss_history`` and ``learning_rate``; ``None`` when it holds no losses."""
    written = record.get("divergence")
    if isinstance(written, dict) and written.get("kind"):
        return dict(written)
    losses = history_losses(record.get("loss_history"))
    if not losses:
        return None
    return summarize(losses, record.get("learning_rate") if isinstance(record.get("learning_rate"), dict) else None)


def summarize(losses: Mapping[int, Optional[float]], rate: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The record's ``divergence`` entry: :class:`Onset` as a dict, with ``rate`` (:func:`describe_rate`)."""
    onset = find_onset(losses)
    out = onset.to_dict()
    described = describe_rate(rate, onset)
    if described is not None:
        out["rate"] = described
    return out


def words(entry: Mapping[str, Any]) -> List[str]:
    """The lines the hunt's answer gives a record's ``divergence`` entry."""
    lines = [f"divergence: {entry.get('words')}"] if entry.get("words") else []
    rate = entry.get("rate")
    if isinstance(rate, dict) and rate.get("words") and entry.get("kind") == "growth":
        lines.append(f"  {rate['words']}")
    return lines


def resume_blind(entry: Optional[Mapping[str, Any]], kept_step: Optional[int]) -> Optional[int]:
    """The step a fix must be verified from when the training was already diverging at ``kept_step`` (the loss
    climbing since an onset before it): that onset; ``None`` when the kept state lies before the climb (or nothing
    diverged)."""
    if not entry or entry.get("kind") != "growth" or kept_step is None:
        return None
    onset = entry.get("onset")
    if isinstance(onset, int) and onset < kept_step:
        return onset
    return None


# -------------------------------------------------------------------------------------------------------------
# the history the training keeps
# -------------------------------------------------------------------------------------------------------------

class LossHistory:
    """The loss of every step, kept cheaply for the record: the last :data:`EXACT_STEPS` steps exactly, older steps
    thinned to every other one each time the list doubles (bounded memory, the shape of a long run kept)."""

    def __init__(self, exact: int = EXACT_STEPS) -> None:
        self.exact = exact
        self.steps: List[int] = []
        self.losses: List[Optional[float]] = []

    def note(self, step: int, loss: Optional[float]) -> None:
        if self.steps and step <= self.steps[-1]:   # a step noted again (a resumed pass): the later value
            while self.steps and self.steps[-1] >= step:
                self.steps.pop()
                self.losses.pop()
        self.steps.append(step)
        self.losses.append(loss)
        if len(self.steps) > 2 * self.exact:
            old = len(self.steps) - self.exact
            self.steps = self.steps[:old:2] + self.steps[old:]
            self.losses = self.losses[:old:2] + self.losses[old:]

    def to_dict(self) -> Dict[str, Any]:
        return {"steps": list(self.steps), "loss": [None if v is None else _json_number(float(v))
                                                    for v in self.losses]}

    def as_losses(self) -> Dict[int, Optional[float]]:
        return dict(zip(self.steps, self.losses))


def history_losses(history: Any) -> Dict[int, Optional[float]]:
    """A record's ``loss_history`` (``{"steps": [...], "loss": [...]}``) as step -> loss."""
    if not isinstance(history, dict):
        return {}
    steps, values = history.get("steps"), history.get("loss")
    if not isinstance(steps, list) or not isinstance(values, list):
        return {}
    out: Dict[int, Optional[float]] = {}
    for step, value in zip(steps, values):
        try:
            out[int(step)] = None if value is None else float(value)
        except (TypeError, ValueError):
            continue
    return out


def schedule_from(values: Sequence[float], offset: int) -> Tuple[List[float], int]:
    """A schedule array as the record keeps it: every value (a schedule is one float per step), ``offset``."""
    return [float(v) for v in values], int(offset)
