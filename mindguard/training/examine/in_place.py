"""Examining one step in place (:class:`InPlaceRecording`): the real training step, run eagerly in the examining
process with every operator call on tape -- no capture, no rebuilt network."""
from __future__ import annotations

from typing import Any, ContextManager, Dict, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import nn

from .api_hooks import OpTape
from ...errors import ReplayError
from .replay_report import ReplayReport
from .step_context import display_name, pynative
from .tape_answer import (array_stats, culprit, finite_array, input_finding, stop_finding, tape_flow,
                          without_masks)


class InPlaceRecording:
    """Record one real training step as it runs, eagerly, with every operator call on tape -- the examination
    of an eager step when the step itself can run again in the examining process (``mindguard hunt``'s examine
    pass): no capture, no rebuilt network, the user's own train cell or step function, optimizer included.

    ``start(network)`` before the step (saves the Parameters' values the step starts from and opens the tape),
    ``finish(batch, written)`` after it (closes the tape; ``written``: the Parameters to list when the update made
    them non-finite) -> :class:`ReplayReport`; ``close()`` closes the tape if the step raised. The step must run
    in PyNative mode (:func:`~mindguard.training.examine.step_context.pynative` switches while it is open).
    """

    def __init__(self, network: nn.Cell, optimizer: Optional[nn.Cell] = None) -> None:
        self.network = network
        self.optimizer = optimizer
        self.tape: Optional[OpTape] = None
        self._mode: Optional[ContextManager[None]] = None
        self._values: Dict[int, Any] = {}
        self._optimizer_scalars: Dict[str, np.ndarray] = {}
        self._error: Optional[str] = None
        self._last: Optional[OpTape] = None

    def start(self) -> None:
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001 - mindguard's own failure: the step runs unrecorded, finish says why
            self._error = f"starting the recording: {type(exc).__name__}: {exc}"
            if self.tape is not None:
                self.tape.restore()
                self.tape = None
            if self._mode is not None:
                self._mode.__exit__(None, None, None)
                self._mode = None

    def _start(self) -> None:
        self._values = {id(p): ms.Tensor(p.asnumpy().copy(), dtype=p.dtype) for p in self.network.get_parameters()}
        # the optimizer's own small Parameters (learning rate, step counters) as the step begins: a schedule that
        # made the learning rate Inf/NaN is the cause then, not an operator of the step
        own = {id(p) for p in self.network.get_parameters()}
        self._optimizer_scalars = {p.name: p.asnumpy().copy() for p in (
            self.optimizer.get_parameters() if self.optimizer is not None else ()) if id(p) not in own and p.size <= 64}
        mode = self._mode = pynative()
        mode.__enter__()
        self.tape = OpTape(self.network, display=lambda n: display_name(self.network, n))
        self.tape.__enter__()

    def close(self, *exc_info) -> None:
        if self.tape is not None and self._mode is not None:
            tape, self.tape = self.tape, None
            try:
                tape.__exit__(*(exc_info or (None, None, None)))
            finally:
                self._mode.__exit__(None, None, None)
            self._last = tape

    def finish(self, batch: Sequence[Any], written: Sequence[ms.Parameter], iteration: int) -> ReplayReport:
        """The report of the recorded step; when mindguard itself failed to record or analyse it, a report whose
        ``error`` says so (never an answer about the user's training)."""
        self.close()
        error = self._error or (self._last.error if self._last is not None else "nothing was recorded")
        if error is None:
            try:
                return self._report(batch, written, iteration)
            except Exception as exc:  # noqa: BLE001 - mindguard's own failure
                import traceback

                error = (f"analysing the recorded step: {type(exc).__name__}: {exc}\n"
                         + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:]))
        return ReplayReport(iteration=iteration, error=error,
                            warnings=["mindguard failed to examine the step (its own error, not the training's)"])

    def stopped(self, iteration: int) -> Optional[ReplayReport]:
        """After the recorded step raised: the report naming the op it raised in (None when no recorded op did, or
        the recording itself failed)."""
        tape = self._last
        if tape is None or tape.raised is None or tape.error is not None or self._error is not None:
            return None
        return ReplayReport(iteration=iteration, first=stop_finding(*tape.raised), ops_recorded=len(tape.records),
                            warnings=["examined in place: the step ran eagerly with every operator recorded"])

    def _report(self, batch: Sequence[Any], written: Sequence[ms.Parameter], iteration: int) -> ReplayReport:
        tape = self._last
        if tape is None:   # (finish() reports "nothing was recorded" before it gets here)
            raise ReplayError("no recorded step to report on")
        nonfinite = []
        for i, value in enumerate(v for v in batch if hasattr(v, "asnumpy")):
            array = value.asnumpy()
            if np.issubdtype(array.dtype, np.floating) and not finite_array(array):
                nonfinite.append(dict(array_stats(array), name=f"inputs{i}", source="batch"))
        for p in self.network.get_parameters():
            array = self._values[id(p)].asnumpy()
            if np.issubdtype(array.dtype, np.floating) and not finite_array(array):
                nonfinite.append(dict(array_stats(array), name=p.name, source="parameter"))
        for name, array in self._optimizer_scalars.items():
            if np.issubdtype(array.dtype, np.floating) and not finite_array(array):
                nonfinite.append(dict(array_stats(array), name=name, source="parameter"))
        nonfinite, masks = without_masks(nonfinite)
        first = input_finding(nonfinite) if nonfinite else culprit(tape, [], [], self._values, masks=masks)
        after = [p.name for p in written if not finite_array(p.asnumpy())]
        return ReplayReport(iteration=iteration, first=first, parameters_nonfinite_after_update=after,
                            warnings=["examined in place: the step ran eagerly with every operator recorded"],
                            nonfinite_inputs=nonfinite, ops_recorded=len(tape.records),
                            data_flow=tape_flow(tape, first, [v for v in batch if hasattr(v, "asnumpy")]))
