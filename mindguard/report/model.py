"""The report model: a :class:`Finding` (one operator or cell that made, received or stopped at Inf/NaN) and
the :class:`DumpReport` of one dump iteration. One renderer (:mod:`.render`) turns either into text.

A Finding reads like the dict it serialises to (``finding["op_type"]``, ``finding.get("hint")``), so code and
tests written against the JSON schema keep working on the objects.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, Iterator, List, Optional

from .render import render_report

SCHEMA = 1

# keys every serialised op finding has had since schema 1, in their order; then the optional ones
_CORE_KEYS = ("op_type", "name", "direction", "forward_op", "source", "stack", "inputs", "outputs", "index",
              "received", "via_backend_cast", "hint", "reached")
_CELL_KEYS = ("cell", "cell_type")


@dataclass
class Finding:
    """One operator (dump analysis) or cell (replay) and what it did to Inf/NaN.

    ``direction``: ``"forward"``, ``"backward"`` or ``"input"`` (non-finite from the start of the step).
    ``source``: ``{"file", "line" (1-based), "code"}`` of the deepest user frame, or None; ``stack`` every frame,
    outermost first. ``inputs``/``outputs``: one dict per slot (0-based ``slot``, ``shape``, ``dtype``, finite
    ``min``/``max``, counts ``zeros``, ``nan``, ``pos_inf``, ``neg_inf``, ...). ``reached``: how many later ops
    the values reached (None when not counted). ``index``: 0-based position among the iteration's launches.
    ``cell``/``cell_type``: the cell's dotted name and class (replay answers; ``op_type``/``name`` may be None).
    ``extra``: further keys, serialised as they are.
    """

    op_type: Optional[str] = None
    name: Optional[str] = None
    direction: str = "forward"
    forward_op: Optional[str] = None
    source: Optional[Dict[str, Any]] = None
    stack: List[Dict[str, Any]] = field(default_factory=list)
    inputs: List[Dict[str, Any]] = field(default_factory=list)
    outputs: List[Dict[str, Any]] = field(default_factory=list)
    index: Optional[int] = None
    received: bool = False
    via_backend_cast: Optional[str] = None
    hint: Optional[str] = None
    reached: Optional[int] = None
    cell: Optional[str] = None
    cell_type: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """What the hint catalogue and the text name it by: the op type, else the cell class."""
        return self.op_type or self.cell_type or "?"

    def to_dict(self) -> Dict[str, Any]:
        """Today's origin keys in their order (``cell``/``cell_type`` when set), then ``extra``."""
        out = {key: getattr(self, key) for key in _CORE_KEYS}
        out.update({key: getattr(self, key) for key in _CELL_KEYS if getattr(self, key) is not None})
        out.update(self.extra)
        return out

    # --- dict-style access (the JSON schema's view) ---------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        if key in _FIELD_NAMES and key != "extra":
            return getattr(self, key)
        return self.extra[key]

    def __setitem__(self, key: str, value: Any) -> None:
        if key in _FIELD_NAMES and key != "extra":
            setattr(self, key, value)
        else:
            self.extra[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def keys(self):
        return self.to_dict().keys()

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Finding":
        """A Finding from its serialised form (unknown keys go to ``extra``)."""
        known = {k: v for k, v in data.items() if k in _FIELD_NAMES and k != "extra"}
        return cls(**known, extra={k: v for k, v in data.items() if k not in _FIELD_NAMES})


_FIELD_NAMES = frozenset(f.name for f in fields(Finding))


def as_dict(value: Any) -> Any:
    """A Finding as its dict; anything else as it is."""
    return value.to_dict() if isinstance(value, Finding) else value


@dataclass
class DumpReport:
    """Result of :func:`~mindguard.analysis.report.analyze_dump`. ``origin`` is None when no operator turned finite
    inputs into Inf/NaN. ``iteration`` is MindSpore's 0-based dump iteration id. ``analysed`` is False when the
    dump held nothing that could be analysed (no readable tensor): then "no Inf/NaN" means nothing; with
    ``unusable_files`` > 0 it covers only part of the step (:attr:`complete`)."""

    dump: str
    rank: Optional[int]
    graph: Optional[int]
    iteration: Optional[int]
    origin: Optional[Finding] = None
    first_nonfinite: Optional[Finding] = None
    nonfinite_inputs: List[Dict[str, Any]] = field(default_factory=list)
    fp16_risk: List[Dict[str, Any]] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)            # informational, e.g. helper graphs not analysed
    graphs: List[int] = field(default_factory=list)
    iterations: List[int] = field(default_factory=list)       # iterations present in the dump for this rank
    overflow_records: List[str] = field(default_factory=list)
    ops_analyzed: int = 0
    ranks: List["DumpReport"] = field(default_factory=list)   # per-rank reports when the dump has several
    origin_rank: Optional[int] = None
    profile: List[Dict[str, Any]] = field(default_factory=list, repr=False)  # per op: largest |output| (not in to_dict)
    stopped_at: Optional[Dict[str, Any]] = None   # the op a step that raised did not complete (None: complete)
    computes_in_half: Optional[bool] = None       # the step computes in float16/bfloat16 (None: not known)
    analysed: bool = True          # False: nothing in the dump could be read
    unusable_files: int = 0        # tensor files that could not be used (unreadable, not regular, wrong dtype)
    data_flow: Optional[Dict[str, Any]] = None   # the culprit's neighbourhood in the data flow (analysis/flow.py)
    excluded: List[Dict[str, Any]] = field(default_factory=list)   # evidence a rule left out: rule, what, reason
    # the step in the failing run's terms (``"epoch 2, step 3/8 (global step 11), dump iteration 10"``, the hunt's
    # record): the headline says it instead of the examining pass's own dump iteration (issue 52)
    step: Optional[str] = None

    @property
    def complete(self) -> bool:
        """Every tensor file of the iteration was read: a clean answer covers the whole step."""
        return self.analysed and self.unusable_files == 0

    @property
    def explains_failure(self) -> bool:
        """Found anything that explains a failed step: an origin, the op a raising step stopped in, or Inf/NaN
        already in the step's inputs. The one place callers (CLI exit code, hunt) decide "found"."""
        return self.origin is not None or self.stopped_at is not None or bool(self.nonfinite_inputs)

    @property
    def holds_nonfinite(self) -> bool:
        """Any Inf/NaN in the iteration, explained or not."""
        return self.explains_failure or self.first_nonfinite is not None

    def rank_role(self) -> Dict[str, Any]:
        """How this rank's report relates to the failure (``role_of`` below)."""
        return role_of({"rank": self.rank, "nonfinite_inputs": self.nonfinite_inputs, "origin": self.origin,
                        "first_nonfinite": self.first_nonfinite, "stopped_at": self.stopped_at,
                        "analysed": self.analysed, "ops_analyzed": self.ops_analyzed})

    def bad_batch(self) -> List[Dict[str, Any]]:
        """The step's batch inputs that already held Inf/NaN."""
        return [item for item in self.nonfinite_inputs if item.get("source") == "batch"]

    def to_dict(self) -> Dict[str, Any]:
        """The stable JSON schema documented in docs/design.md and the README ("Report schemas"), plus additive keys."""
        out: Dict[str, Any] = {
            "schema": SCHEMA, "dump": self.dump, "rank": self.rank, "graph": self.graph,
            "iteration": self.iteration, "origin": as_dict(self.origin),
            "first_nonfinite": as_dict(self.first_nonfinite), "nonfinite_inputs": self.nonfinite_inputs,
            "fp16_risk": self.fp16_risk, "warnings": self.warnings, "notes": self.notes, "graphs": self.graphs,
            "iterations": self.iterations, "overflow_records": self.overflow_records,
            "ops_analyzed": self.ops_analyzed, "stopped_at": self.stopped_at, "analysed": self.analysed,
            "unusable_files": self.unusable_files, "excluded": self.excluded,
        }
        if self.computes_in_half is not None:   # additive: whether the fp16 range notes concern this run
            out["computes_in_half"] = self.computes_in_half
        if self.data_flow is not None:   # additive: the page's graph (schema in analysis/flow.py)
            out["data_flow"] = self.data_flow
        if self.step is not None:   # additive: the failing run's step, as the headline says it
            out["step"] = self.step
        if self.ranks:
            out["origin_rank"] = self.origin_rank
            out["rank_roles"] = [r.rank_role() for r in self.ranks]
            out["ranks"] = [r.to_dict() for r in self.ranks]
        return out

    def __str__(self) -> str:
        return render_report(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "DumpReport":
        """A report from its :meth:`to_dict` form (as another node's hunt sends it); keys it does not know are left
        out, missing ones take their defaults (``dump`` "", ``rank``/``graph``/``iteration`` None)."""
        names = {f.name for f in fields(cls)} - {"origin", "first_nonfinite", "ranks", "profile"}
        known = {k: v for k, v in data.items() if k in names}
        for key in ("dump", "rank", "graph", "iteration"):
            known.setdefault(key, "" if key == "dump" else None)
        return cls(**known,
                   origin=Finding.from_dict(data["origin"]) if data.get("origin") else None,
                   first_nonfinite=Finding.from_dict(data["first_nonfinite"]) if data.get("first_nonfinite") else None,
                   ranks=[cls.from_dict(r) for r in data.get("ranks") or []])


def role_of(report: Dict[str, Any]) -> Dict[str, Any]:
    """How one rank's report (its ``to_dict()``, or the same keys) relates to the failure: ``role`` is
    ``"batch"`` (its batch held Inf/NaN), ``"local"`` (an operator on this rank produced it), ``"received"`` (it
    arrived through a collective), ``"unexplained"`` (non-finite values, no producing operator found),
    ``"stopped"`` (no Inf/NaN, but the step raised and its dump ends before ``op``), ``"clean"`` (its files were
    read and hold no Inf/NaN) or ``"not_read"`` (nothing of this rank's step could be read here -- e.g. the
    ``rank_<r>`` folder another node's dump leaves on this one: never called clean); ``op`` the operator."""
    rank = report.get("rank")
    batch = [item for item in report.get("nonfinite_inputs") or [] if item.get("source") == "batch"]
    origin, stopped = report.get("origin"), report.get("stopped_at")
    if batch:
        return {"rank": rank, "role": "batch", "op": None, "inputs": [item["name"] for item in batch]}
    if origin:
        return {"rank": rank, "role": "received" if origin.get("received") else "local", "op": origin["name"]}
    if report.get("first_nonfinite") or report.get("nonfinite_inputs"):
        return {"rank": rank, "role": "unexplained", "op": None}
    if stopped:
        return {"rank": rank, "role": "stopped", "op": stopped["op"]["name"]}
    if report.get("analysed") is False or not report.get("ops_analyzed"):
        return {"rank": rank, "role": "not_read", "op": None}
    return {"rank": rank, "role": "clean", "op": None}


def has_culprit(report: DumpReport) -> bool:
    """``report.explains_failure``: an origin, a stop point or Inf/NaN in the step's inputs was found."""
    return report.explains_failure
