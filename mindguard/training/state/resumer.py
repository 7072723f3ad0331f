"""Resuming a hunt pass from a kept state (:class:`Resumer`). Choosing and checking the state to resume from
(:func:`choose_kept_state`, :func:`check_state`, :func:`last_complete_state`) is pure file reading both sides share:
it lives in :mod:`mindguard.protocol.kept_state` and is re-exported here.

A resumed pass skips the training calls of the steps before the kept state's -- the dataset still delivers every
batch and every callback runs, but the train network returns zeros shaped like its real output -- and at its step
assigns the state (Parameters and random state) and trains for real. The keeping side is
:mod:`mindguard.training.state.keeper`. Steps are 1-based, process-wide global steps.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import rng as _rng
from ..._util.io import file_sha256
from ...errors import HuntProtocolError
from ...protocol import folder as layout
from ...protocol.kept_state import (
    check_state,
    choose_kept_state,
    damaged_file,
    last_complete_state,
    read_state_meta,
    StateMeta,
    unrestorable_note,
)
from .warm_up import WarmUp
from .state_files import (
    _as_numpy,
    checkpoint_callbacks,
    placeholder,
    restore_random_state,
    small_parameters,
    small_state,
)


#: how many float32 ulps a resumed step's traced value (loss, Parameter sum) may lie from the failing run's and still
#: be the same computation: MindSpore 2.10's CPU kernels return the same step's loss a few ulps apart in a fresh
#: process from the same Parameters and batch (measured 2-4 ulps, docs/mindspore-facts.md "resume"); a schedule, a
#: random draw or data that differ move it by far more
ROUNDING_ULPS = 64


def rounding_ulps(want: str, got: str) -> Optional[int]:
    """How many float32 ulps apart two traced values (:func:`~mindguard.training.state.state_files.fingerprint`
    text) are, when both are finite and at most :data:`ROUNDING_ULPS` apart; ``None`` otherwise (or unreadable)."""
    try:
        a, b = float.fromhex(want), float.fromhex(got)
    except (ValueError, TypeError):
        return None   # nan, inf, or not a float: compared exactly
    if not (np.isfinite(a) and np.isfinite(b)) or (a < 0) != (b < 0):
        return None
    ulps = abs(a - b) / float(np.spacing(np.float32(max(abs(a), abs(b)))))
    return int(round(ulps)) if ulps <= ROUNDING_ULPS else None


def hold_checkpoints(call_key: Any, cur_step_num: int) -> None:
    """A skipped step of a resumed pass (the weights are not the training's): its ``ModelCheckpoint`` callbacks
    save nothing at its end (a file of untrained weights beside the user's own). Each counts the step as the one
    it last saved at (MindSpore's ``_save_ckpt`` returns early at that step; the next save is its period later)."""
    for callback in checkpoint_callbacks(call_key):
        callback._last_triggered_step = int(cur_step_num)


class Resumer:
    """A resumed pass: skip the training calls of the steps before the kept state's, then assign it.

    ``step`` is the 1-based global step the state was kept at (the first step whose outputs count); the
    ``warm_up.count`` steps before it run for real first, their outputs dropped (:mod:`.warm_up`).
    """

    def __init__(self, directory: Path, *, fast_forward: bool = True, warm_up: bool = True) -> None:
        """``warm_up``: run the state's ``warm_up`` steps before it (off in `mindguard verify`'s pass, which runs the
        edited script and compares no kernel's rounding)."""
        self.directory = Path(directory)
        # a Model.train call's dataset may be reset to the kept step (Run.fast_forward)
        self.fast_forward = fast_forward
        self.fast_forwarded: Optional[int] = None   # steps it was reset past
        meta = read_state_meta(self.directory)
        if meta is None:
            raise HuntProtocolError(f"no kept training state in {str(self.directory)!r} (state.json missing or "
                                    f"of another schema): the hunt's resume request is stale")
        self.meta = meta
        self.step = int(meta["step"])
        self.loaded = False
        self._values: Optional[List[np.ndarray]] = None   # the state's arrays as loaded (take_values)
        self.started: Optional[float] = None   # time.monotonic() of the first step (skipped or not)
        self.trace: Dict[str, List[Optional[str]]] = meta.get("trace") or {}
        self._outputs = placeholder(meta.get("outputs"))
        self._swapped: List[Tuple[Any, type]] = []
        self.random_restored: List[str] = []   # the random sources load() restored (mindguard.training.state.rng)
        self._rounded = False   # a traced value differed by float rounding alone (said once)
        self.warm_up = WarmUp(self.step, StateMeta.from_json(meta).warm_up if warm_up else 0)
        self._edits: Optional[List[str]] = None   # overridden_edits before the first warm-up step ran (edits)

    def diverges(self, step: int, trace: List[Optional[str]]) -> Optional[str]:
        """Why step ``step`` (1-based, global) of this run differs from the run that kept the state, or ``None``
        (same, or unknown); with the random sources the kept state could not hold, and their fix, when it names
        any."""
        why = self._differs(step, trace)
        note = unrestorable_note(self.meta) if why is not None else None
        return f"{why}; {note}" if note else why

    def _differs(self, step: int, trace: List[Optional[str]]) -> Optional[str]:
        expected = self.trace.get(str(step))
        if expected is None or expected == trace:
            return None
        what = ["loss", "sum of squares of the Parameters after it"] + ["a small Parameter"] * max(len(expected) - 2, 0)
        for name, want, got in zip(what, expected, trace):
            if want is not None and got is not None and want != got:   # None: not computed in one of the runs
                ulps = rounding_ulps(want, got)
                if ulps is None:
                    return f"global step {step}: {name} is {got}, was {want} when the state was kept"
                if not self._rounded:   # said once, on stderr (the hunt shows it)
                    self._rounded = True
                    print(f"mindguard hunt: global step {step}: {name} is {got}, was {want} when the state was "
                          f"kept: {ulps} float32 ulp(s) apart, the rounding of a fresh process (docs/mindspore-"
                          f"facts.md, \"resume\"); resuming: the failure must repeat for the answer to count",
                          file=sys.stderr, flush=True)
        if len(trace) == len(expected) or len(expected) <= 2:   # an always-on Guard kept the loss (and sum) only
            return None
        return f"global step {step}: {len(trace)} traced values, {len(expected)} when the state was kept"

    def skips(self, global_step: int, params: Optional[Callable[[], Sequence[Any]]] = None) -> bool:
        """True while ``global_step`` comes before the kept state's step. ``params``: the call's state Parameters,
        read for :meth:`edits` before a warm-up step trains them."""
        if self.started is None:
            self.started = time.monotonic()
        self.warm_up.note_step(global_step)
        if self.warm_up.now and self._edits is None and params is not None:
            self._edits = overridden_edits(self.meta, params())
        return global_step < self.step

    def edits(self, params: Sequence[Any]) -> List[str]:
        """The script's edits the kept state overrides (:func:`overridden_edits`), read from ``params`` before any
        warm-up step trained them."""
        return self._edits if self._edits is not None else overridden_edits(self.meta, params)

    def placeholder(self) -> Any:
        return self._outputs

    def skip_calls(self, network: Any) -> None:
        """Make calling ``network`` (a ``Model``'s train network) return the placeholder until :meth:`load`.
        Its class is swapped for a subclass whose ``__call__`` does nothing but at a warm-up step, which runs the
        network as its own class (:mod:`.warm_up`); :meth:`load` swaps it back."""
        if network is None or any(net is network for net, _ in self._swapped):
            return
        original = type(network)
        outputs, warm_up = self._outputs, self.warm_up

        def skipped_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if warm_up.now:
                swapped, self.__class__ = self.__class__, original
                try:
                    warm_up.run(self, *args, **kwargs)
                finally:
                    self.__class__ = swapped
            return outputs

        network.__class__ = type(original.__name__, (original,), {"__call__": skipped_call,
                                                                  "__module__": original.__module__})
        self._swapped.append((network, original))

    def restore_calls(self) -> None:
        for network, original in self._swapped:
            network.__class__ = original
        self._swapped.clear()

    def load(self, params: Sequence[Any]) -> None:
        """Assign the kept state to ``params`` (the same script's Parameters, same names and shapes) in place,
        and stop skipping. :class:`HuntProtocolError` names the first Parameter that differs."""
        import mindspore as ms

        self.restore_calls()
        names, shapes = self.meta["names"], self.meta.get("shapes")
        if [p.name for p in params] != names:
            theirs = [p.name for p in params]
            diff = next((i for i, (a, b) in enumerate(zip(names, theirs)) if a != b), min(len(names), len(theirs)))
            raise HuntProtocolError(f"the kept training state does not fit this run: Parameter {diff} is "
                                    f"{theirs[diff] if diff < len(theirs) else '(none)'!r} here, "
                                    f"{names[diff] if diff < len(names) else '(none)'!r} when it was kept "
                                    f"({len(theirs)} vs {len(names)} Parameters)")
        if self.meta.get("summarized"):
            raise HuntProtocolError(f"the kept training state in {str(self.directory)!r} holds "
                                    f"{len(self.meta['summarized'])} Parameter(s) as statistics only (written for its "
                                    f"dumped step's analysis): it is not a state to resume from")
        expected = self.meta.get("sha256")
        if expected is not None and file_sha256(layout.state_arrays(self.directory)) != expected:
            arrays = layout.state_arrays(self.directory)
            raise HuntProtocolError(f"{str(arrays)!r} is not the file state.json (global step "
                                    f"{self.step}) was written with (its checksum differs: replaced by another "
                                    f"state, or damaged); run the hunt again, or with --resume never")
        bad = damaged_file(self.directory, self.meta)
        if bad is not None:
            raise HuntProtocolError(f"{bad}; run the hunt again, or with --resume never")
        files = self.meta.get("files") or {}
        with np.load(layout.state_arrays(self.directory), allow_pickle=False) as arrays:
            stored_rng = {name: arrays[name] for name in arrays.files if name.startswith(_rng.ARRAY_PREFIX)}
            # a big array's own file is mapped copy-on-write: read from the page cache as it is copied into the
            # Parameter, and writable as the keeper's copy of this step (take_values)
            values = (_checkpoint_values(self.meta, names) if self.meta.get("checkpoint")
                      else [np.load(layout.state_array_file(self.directory, i), mmap_mode="c", allow_pickle=False)
                            if str(i) in files else arrays[f"p{i}"] for i in range(len(names))])
        shapes = shapes if shapes is not None else [list(v.shape) for v in values]
        for param, _value, shape in zip(params, values, shapes):
            if list(param.shape) != list(shape):
                raise HuntProtocolError(f"the kept training state does not fit this run: {param.name} has shape "
                                        f"{list(param.shape)} here, {shape} when it was kept")
        on_cpu = ms.get_context("device_target") == "CPU"
        for param, value in zip(params, values):
            if on_cpu and copy_into(param, value):
                continue
            # not a view of its own memory (bfloat16, another device): the data is replaced as MindSpore's
            # load_param_into_net does -- 2.5x quicker than an eager Assign (0.24 s against 0.62 s for 0.5 GB), which
            # also has no bfloat16 kernel on CPU. Exact before any graph ran; after a warm-up, the graph of an eager
            # step's optimizer may not follow it (docs/mindspore-facts.md, "warm-up"): the trace check then tells
            param.set_data(ms.Tensor(value, dtype=param.dtype))   # (a copy: ``value`` stays the state as loaded)
        self.random_restored = restore_random_state(self.meta, stored_rng)
        self.loaded = True
        self._values = list(values)

    def take_values(self) -> Optional[List[np.ndarray]]:
        """The host arrays the state was loaded from (in the Parameters' order; ``None`` when taken before, or
        never loaded): a keeper due at the kept step holds them as its copy of that step's state instead of copying the
        Parameters again (:meth:`mindguard.training.state.keeper.StateKeeper.keep`'s ``loaded``). Handed over once."""
        values, self._values = self._values, None
        return values


def copy_into(param: Any, value: np.ndarray) -> bool:
    """Copy ``value`` into ``param``'s own memory, which ``asnumpy()`` views on CPU (the caller's check): no new memory
    for the Parameter (measured, 0.5 GB: 0.05 s, against 0.24 s for ``set_data`` of a new tensor, and seconds while
    a fresh allocation's pages fault in slowly). ``False`` (nothing done) when it is no such view: a copy of its own,
    read-only, or another shape or dtype (bfloat16, which numpy lacks)."""
    view = param.asnumpy()
    if view.flags.owndata or not view.flags.writeable or view.shape != value.shape or view.dtype != value.dtype:
        return False
    np.copyto(view, value)
    return True


def _checkpoint_values(meta: Dict[str, Any], names: Sequence[str]) -> List[np.ndarray]:
    """The values of the Parameters ``names`` in the training's own checkpoint a kept state names (``meta``), in
    that order. :class:`HuntProtocolError` when the file is gone, was replaced since, or lacks one of them."""
    import mindspore as ms

    checkpoint = meta["checkpoint"]
    path = checkpoint["path"]
    held = checkpoint.get("held")
    if isinstance(held, str) and os.path.isfile(held):   # the bytes the failing run wrote, whatever its name now
        path = held
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise HuntProtocolError(f"the training's checkpoint {path!r} the kept state of global step {meta['step']} "
                                f"resumes from is gone ({exc.strerror}); run the hunt with --resume never") from None
    if stat.st_size != checkpoint.get("bytes") or stat.st_mtime_ns != checkpoint.get("mtime_ns"):
        raise HuntProtocolError(f"the training's checkpoint {path!r} was written again since the failure (its size or "
                                f"time differs): it no longer holds global step {meta['step']}'s state; run the "
                                f"hunt with --resume never")
    loaded = ms.load_checkpoint(path)
    missing = [name for name in names if name not in loaded]
    if missing:
        raise HuntProtocolError(f"the training's checkpoint {path!r} lacks {len(missing)} Parameter(s) of the "
                                f"training state ({missing[0]!r} first): it is not the train network's")
    return [_as_numpy(loaded[name]) for name in names]


def overridden_edits(meta: Dict[str, Any], params: Sequence[Any]) -> List[str]:
    """The small Parameters of ``params`` (this run's, before the kept state is assigned) whose value the script now
    gives differs from the one the failing run's script gave (``meta["initial"]``): edits the kept state undoes, one
    phrase each (``"learning_rate: 0.001 in the script now, 0.01 in the failing run"``)."""
    initial = meta.get("initial") or {}
    if not isinstance(initial, dict):
        return []
    small = small_parameters(params)
    out = []
    for param, now in zip(small, small_state(small)):
        then = initial.get(param.name)
        if then is not None and then != now:
            out.append(f"{param.name}: {_readable(now)} in the script now, {_readable(then)} in the failing run")
    return out


def _readable(text: Optional[str]) -> str:
    """A fingerprint (:func:`fingerprint`, comma-joined for several values) as plain numbers."""
    def one(word: str) -> str:
        try:
            return f"{float.fromhex(word):.6g}"
        except ValueError:
            return word
    return ",".join(one(w) for w in (text or "").split(","))


__all__ = ["Resumer", "check_state", "choose_kept_state", "hold_checkpoints", "last_complete_state",
           "overridden_edits"]
