"""The rules by which the origin search (:func:`.origin.search`) does not take a value as evidence, one unit each.

Each rule says what it leaves out and why; a rule that leaves files out gives :class:`Exclusion` entries (the
report's ``excluded``: rule, what, reason). The kernel types each rule knows come from
:mod:`mindguard.protocol.kernels` only. Slots are 0-based. No MindSpore imports.

- :class:`IntendedInfinities` -- +-Inf a program asked for (a mask) is not the failure; NaN made from it is.
- :func:`unwritten_outputs` -- outputs a kernel leaves unwritten hold stale memory.
- :func:`mislabelled_float16` -- a file labelled float16 holding float32 bytes.
- :func:`misjoined_files` -- files whose element counts are another kernel's.
- :func:`written_slots` / :func:`post_update_slots` / :func:`parameters_written_by` -- inputs a kernel writes in
  place are dumped after it wrote them (not the step's starting state).
- :class:`LeftOutInputs` -- under a kernel filter, an op that made Inf/NaN from inputs the dump does not hold is
  not named, nor any op after it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np

from ..protocol import kernels
from .files import TensorFile
from .order import OpLaunch
from .stats import is_nonfinite
from .trace import NodeTrace

#: lower-case kernel types of each catalogue, as the analysis compares ``op_type``
OPTIMIZER_WRITTEN_SLOTS: Dict[str, Tuple[int, ...]] = kernels.lower_keys(kernels.OPTIMIZER_WRITTEN_SLOTS)
IN_PLACE_INPUT_SLOTS: Dict[str, Tuple[int, ...]] = kernels.lower_keys(kernels.IN_PLACE_INPUT_SLOTS)
IN_PLACE_TYPES = kernels.lower(kernels.OPTIMIZER_KERNELS + kernels.IN_PLACE_WRITERS)
UNWRITTEN_OUTPUT_SLOTS: Dict[str, Tuple[int, ...]] = kernels.lower_keys(kernels.UNWRITTEN_OUTPUT_SLOTS)
DELIBERATE_INF_TYPES = kernels.lower(kernels.INTENDED_INFINITY_KERNELS)
COLLECTIVE_TYPES = kernels.lower(kernels.COLLECTIVE_KERNELS)

# the rule names of the report's ``excluded`` entries
UNWRITTEN_RULE = "outputs the kernel leaves unwritten"
MISLABELLED_RULE = "float16 label on float32 bytes"
MISJOINED_RULE = "files of another kernel"


@dataclass(frozen=True)
class Exclusion:
    """Evidence a rule left out: which rule, what (op and slots or files), and why."""

    rule: str
    what: str
    reason: str

    def as_dict(self) -> Dict[str, str]:
        return {"rule": self.rule, "what": self.what, "reason": self.reason}


def _launch(op: OpLaunch) -> str:
    return f"{op.op_type} ({op.name})"


def _has_nan(stats: Optional[dict]) -> bool:
    return bool(stats and stats.get("nan"))


# -- intended infinities ---------------------------------------------------------------------------------------

def additive_mask(stats: Optional[dict]) -> bool:
    """True for a batch tensor holding only 0 and -inf (an additive attention mask built on the host)."""
    if not stats or stats.get("nan") or stats.get("pos_inf") or not stats.get("neg_inf") or not stats.get("shape"):
        return False
    return int(stats.get("zeros") or 0) + int(stats["neg_inf"]) == int(np.prod(stats["shape"]))


@dataclass
class IntendedInfinities:
    """+-Inf the program asked for -- an op that writes a constant (:data:`DELIBERATE_INF_TYPES`: ``masked_fill(s,
    m, -inf)``) making +-Inf and no NaN, or a batch/Parameter tensor of 0 and -inf only (an additive mask) -- is not
    the failure. Once the step holds such infinities, ops passing them on (no NaN out, only infinite inputs) are not
    named either; the culprit is the first op making NaN from inputs with +-Inf and no NaN (``-inf - -inf`` of a fully
    masked row). ``sources``: where they came from, as shown in the warning."""

    sources: List[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.sources)

    def note_batch(self, name: str, stats: Optional[dict]) -> bool:
        """Whether batch tensor ``name`` is an additive mask (then noted as a source)."""
        if not additive_mask(stats):
            return False
        self.sources.append(f"{name} (the batch: 0 and -inf only, an additive mask)")
        return True

    def note_parameter(self, name: str, stats: Optional[dict]) -> bool:
        """Whether Parameter ``name`` read as an op's input is an additive mask (then noted as a source)."""
        if not additive_mask(stats):
            return False
        self.sources.append(f"{name} (0 and -inf only: an additive mask)")
        return True

    def writes_mask(self, op: OpLaunch, bad_out: List[int], nan_out: List[int], real_bad_in: List[int]) -> bool:
        """Whether ``op`` wrote a constant +-Inf (no NaN, from finite inputs): noted as a source, never the origin."""
        if bad_out and not nan_out and not real_bad_in and op.op_type.lower() in DELIBERATE_INF_TYPES:
            self.sources.append(_launch(op))
            return True
        return False

    def passed_on(self, nan_out: List[int], infinite_in: bool) -> bool:
        """Whether an op only carried the intended infinities on (scores + mask, max, ``exp(-inf) = 0``)."""
        return bool(self.sources) and not nan_out and infinite_in

    def made_nan(self, nan_out: List[int], infinite_in: bool, inputs_known: bool) -> bool:
        """Whether an op made NaN from the intended infinities (its inputs +-Inf, none NaN, all in the dump):
        where they became a failure, so it is the origin."""
        return bool(self.sources) and bool(nan_out) and infinite_in and inputs_known

    def warning(self, op: OpLaunch) -> str:
        return (f"the step holds intended infinities ({'; '.join(self.sources[:3])}); {op.op_type} made NaN from "
                f"them, which is where they became a failure")


# -- outputs a kernel leaves unwritten -------------------------------------------------------------------------

def unwritten_output_slots(op_type: str) -> Tuple[int, ...]:
    """Output slots of ``op_type`` whose values are not evidence: the kernel can leave them unwritten, so they hold
    whatever that memory held (:data:`mindguard.protocol.kernels.UNWRITTEN_OUTPUT_SLOTS`; measured on CPU: an
    Inf/NaN of BatchNorm's batch statistics shows in y too)."""
    return UNWRITTEN_OUTPUT_SLOTS.get(op_type.lower(), ())


def unwritten_outputs(op: OpLaunch, outputs: Mapping[int, Tuple[Optional[dict], Any]]) -> Optional[Exclusion]:
    """The non-finite ``outputs`` (slot -> (stats, fp16 counts)) of ``op`` that it leaves unwritten, or None."""
    ignored = unwritten_output_slots(op.op_type)
    slots = [slot for slot, (s, _) in outputs.items() if s is not None and is_nonfinite(s) and slot in ignored]
    if not slots:
        return None
    return Exclusion(UNWRITTEN_RULE, f"{_launch(op)} output(s) {slots}", "they hold whatever that memory held "
                     "(measured on CPU); their Inf/NaN is not the kernel's")


# -- float16 labels on float32 bytes ---------------------------------------------------------------------------

def mislabelled_float16(op: OpLaunch, node: Optional[NodeTrace]) -> List[Tuple[int, TensorFile, Exclusion]]:
    """``op``'s output files labelled float16 whose kernel computed float32 (.ir kernel types): ``(slot, file,
    exclusion)``. Measured on 2.10 CPU with AMP O2: such a file holds the first half of the float32 buffer read as
    float16 (NaN/Inf for ~1.6% of bit patterns), so only an Inf/NaN of that float32 half is the kernel's."""
    if node is None or not node.kernel_output_dtypes:
        return []
    out = []
    for slot, tensor in op.outputs.items():
        kernel = node.kernel_output_dtypes.get(slot)
        if kernel == "float32" and (tensor.dtype or "").lower() == "float16" and tensor.path is not None:
            out.append((slot, tensor, Exclusion(
                MISLABELLED_RULE, f"{_launch(op)} output {slot}", f"its kernel computed {kernel}: the file holds the "
                f"first half of the float32 values (read as such, only an Inf/NaN there counts)")))
    return out


# -- files of another kernel -----------------------------------------------------------------------------------

def sizes_contradict(node: Optional[NodeTrace], inputs: Dict[int, tuple], outputs: Dict[int, tuple],
                     own_inputs: Dict[int, TensorFile]) -> Optional[str]:
    """Why a file of this launch is not its kernel's -- it holds a different number of elements than the .ir kernel
    declares for that slot (inputs only when they are the launch's own files, not read through the data flow) --
    or None. ``inputs``/``outputs``: slot -> (stats, fp16 counts)."""
    if node is None:
        return None
    checks = [(node.kernel_output_sizes, outputs)]
    if own_inputs:
        # only inputs the graph types as tensors: a tuple argument (StridedSlice's begin/end/strides) is dumped as a
        # 1-d array while its kernel type says {} (one element), which says nothing about the join
        checks.append(({slot: size for slot, size in node.kernel_input_sizes.items() if slot in node.input_types},
                       inputs))
    for (declared, read), side in zip(checks, ("output", "input")):
        for slot, (stats, _) in read.items():
            size = declared.get(slot)
            if size is not None and stats is not None and stats.get("shape") is not None \
                    and int(np.prod(stats["shape"])) != size:
                return (f"its {side} {slot} file holds {int(np.prod(stats['shape']))} element(s) where the .ir kernel "
                        f"declares {size}")
    return None


def misjoined_files(op: OpLaunch, node: Optional[NodeTrace], inputs: Dict[int, tuple],
                    outputs: Dict[int, tuple]) -> Optional[Exclusion]:
    """All of ``op``'s own files, when their sizes say they are another kernel's (many kernels of one type in one
    scope: the ``-opN`` match joined the wrong files); else None."""
    contradiction = sizes_contradict(node, inputs, outputs, op.inputs)
    if contradiction is None:
        return None
    return Exclusion(MISJOINED_RULE, f"{_launch(op)}: {len(op.inputs) + len(op.outputs)} file(s)", contradiction)


# -- inputs written in place -----------------------------------------------------------------------------------

def written_slots(op_type: str, name: str) -> Optional[Tuple[int, ...]]:
    """Input slots a kernel of ``op_type`` (scope ``name``) writes in place; ``()`` none; ``None`` every Parameter
    input (an optimizer or in-place writer whose written inputs are not known)."""
    kind = op_type.lower()
    if kind in OPTIMIZER_WRITTEN_SLOTS:
        return OPTIMIZER_WRITTEN_SLOTS[kind]
    if kind in IN_PLACE_TYPES or "optimizer-" in name:
        return None
    return IN_PLACE_INPUT_SLOTS.get(kind, ())


def post_update_slots(op: OpLaunch, node: Optional[NodeTrace]) -> Set[int]:
    """Input slots of ``op`` whose dump files hold values written by ``op`` itself (after it ran): never the step's
    starting state, nor a reason to pass ``op`` over as the origin.

    Optimizer kernels: every Parameter input (every input when the .ir node is unknown) unless their written slots
    are known; BatchNorm-like kernels: their moving statistics; other kernels: none.
    """
    slots = written_slots(op.op_type, op.name)
    if slots is None:
        return set(node.input_params) if node is not None else set(op.inputs)
    return set(slots)


def parameters_written_by(node: NodeTrace) -> Set[str]:
    """Names of the Parameters the kernel of .ir ``node`` may write in place (not read from the kept state after
    it)."""
    slots = written_slots(node.primitive, node.full_name)
    return {name for slot, name in node.input_params.items() if slots is None or slot in slots}


# -- inputs a kernel filter left out ---------------------------------------------------------------------------

@dataclass
class LeftOutInputs:
    """Under a kernel filter, an op that made Inf/NaN from finite inputs while some input is not in the dump (its
    producer was left out, it cannot be traced to one kernel output, or a left-out kernel may have written the
    Parameter first) is not named the origin: what it read is unknown. Once one was seen no later op is named either:
    the first Inf/NaN may be the left-out kernel's. ``blind``: (op, missing input slots; -1: no .ir node)."""

    blind: List[Tuple[OpLaunch, List[int]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.blind)

    def keeps_from_origin(self, missing: Set[int]) -> bool:
        """Whether an op whose ``missing`` inputs are these cannot be the origin."""
        return bool(missing) or bool(self.blind)

    def note(self, op: OpLaunch, missing: Set[int]) -> None:
        self.blind.append((op, sorted(missing)))

    def warnings(self, limit: int = 3) -> List[str]:
        """Why each of the first ``limit`` such ops was not named, and what to dump instead."""
        out = []
        for op, slots in self.blind[:limit]:
            what = (f"its input(s) {[s for s in slots if s >= 0]} are not in this dump (made by a kernel or held by a "
                    f"Parameter the dump left out)" if any(s >= 0 for s in slots) else
                    "its inputs cannot be told (no .ir node)" if slots else
                    f"it ran after {_launch(self.blind[0][0])}, whose inputs this dump left out")
            out.append(f"{_launch(op)} output Inf/NaN, but {what}: it is not named the origin; "
                       f"dump the step in full (input_output 0, no kernel filter)")
        return out
