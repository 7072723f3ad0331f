"""One hunt's shared state (:class:`HuntContext`: its run folder, options, summary, the answer to print) and the
running of its passes (:meth:`HuntContext.run_pass`): a pass is run by the
:class:`~mindguard.hunt.result.PassRunner`, its result checked for what stops the hunt whatever the pass found
(:class:`CannotGoOn`).

Decides on typed facts only (:class:`~mindguard.hunt.result.PassResult`). Never imports MindSpore.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from .._util import dist as _dist
from .._util.io import atomic_write_json, atomic_write_text, os_reason, read_json, tree_size
from ..protocol.kept_state import read_state
from ..protocol import folder as layout
from ..protocol.folder import PassName, RunFolder
from ..protocol.request import HuntRequest
from ..protocol.summary import HuntSummary, Outcome, PassSummary
from ..dump.config import DumpConfig
from . import messages as say_
from .console import say
from ..protocol.signals import signal_name
from .result import PassResult, PassRunner, PassSpec
from .scopes import DUMP_SCOPES

if TYPE_CHECKING:   # (cluster.py talks to MindSpore's TCPStore; imported by the face when a hunt spans nodes)
    from .cluster import Cluster

#: errno values that mean a full disk
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class CannotGoOn(Exception):
    """A pass could not do its work for a reason the hunt can name (:meth:`HuntContext.check`)."""

    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


@dataclasses.dataclass
class Options:
    """What the user asked of the hunt (:func:`mindguard.hunt.hunt`'s arguments)."""

    net_name: str = "Net"
    analyze: bool = True
    resume: str = "auto"
    keep_every: Optional[int] = None
    first_scope: Optional[str] = None
    check_fix: bool = True   # run the first mechanical edit a hint prints (hunt/fix_check.py); --no-check-fix


class HuntContext:
    """One hunt: its command, run folder, options, summary (``summary.json``), the pass examined last and what
    its dump held, and the answer to print once the summary is on disk."""

    def __init__(self, command: Sequence[str], run: Path, runner: PassRunner, options: Options,
                 origin: Optional[Tuple[Path, Dict[str, Any]]] = None):
        self.command, self.run, self.runner, self.options = list(command), run, runner, options
        self.origin = origin              # (path, record) of the failing run `--from` starts from
        self.summary = HuntSummary(command=self.command, run_dir=str(run))
        self.folder = RunFolder(run)
        self.examined: PassName = layout.PASS2   # the pass whose dump or replay is explained
        self.locate_resumed_from: Optional[Path] = None   # the kept state the locate pass ran from (hunt --from)
        self.locate_name: PassName = layout.LOCATE   # its folder: LOCATE_FROM_STEP_1 once a resumed one diverged
        self.dump_scope = "full"          # what that pass dumped (DUMP_SCOPES)
        self.fast_forward = True          # resumed passes may reset a dataset to the kept step
        self.approximate = False          # `--from` a kept state that cannot hold every random source: resumed
        #                                   passes do not compare their trace (HuntRequest.approximate)
        self.answer: List[str] = []       # printed by the face once summary.json holds the result
        self.identity: Optional[Tuple[int, int]] = None   # (st_dev, st_ino) of the run folder the hunt created
        self.results: Dict[str, PassResult] = {}          # each pass run, by folder name
        self.cluster: Optional["Cluster"] = None   # several msrun nodes: this node's side of their hunts (cluster.py)
        self.pass_seconds: Dict[str, float] = {}   # each pass's wall time, by folder name (the fix check's limit)

    # -- passes ------------------------------------------------------------------------------------------
    def at(self, name: PassName) -> layout.PassFolder:
        """The folder of the pass ``name``."""
        return self.folder.pass_folder(name)

    def request(self, name: PassName, pass_name: str, **fields: Any) -> HuntRequest:
        """A request for the pass ``name`` (its folder created, empty)."""
        folder = self.at(name)
        folder.path.mkdir()
        if self.approximate and fields.get("resume_dir") is not None:
            fields.setdefault("approximate", True)
        return HuntRequest(pass_name=pass_name, record=folder.record, net_name=self.options.net_name,
                           capture_dir=folder.capture, replay_report=folder.replay_report, **fields)

    def run_pass(self, spec: PassSpec) -> PassResult:
        """Run the pass; a resumed pass whose dataset reset made it compute something else runs again iterating
        the dataset (and so do the later passes). Raises :class:`CannotGoOn` when the pass could not work."""
        request = spec.request
        if not self.fast_forward:
            spec = dataclasses.replace(spec, request=dataclasses.replace(request, fast_forward=False))
        if self.cluster is not None:   # every node launches the same pass, together
            self.cluster.agree(spec.label, self.cluster.plan_of(spec.name.folder, spec.request, spec.dump))
        began = time.monotonic()
        result = self.runner.run(spec)
        self.pass_seconds[spec.name.folder] = time.monotonic() - began
        diverged = result.diverged
        if spec.request.resume_dir is not None and spec.request.fast_forward and not result.stopped \
                and diverged is not None and diverged.fast_forwarded:
            aside = result.folder.fast_forward_attempt
            result.folder.path.rename(aside)
            result.folder.path.mkdir()
            say(say_.fast_forward_again(spec.label, diverged.why, aside))
            self.fast_forward = False
            return self.run_pass(spec)
        if self.cluster is not None:   # every node decides from every node's records
            result.records = self.cluster.all_records(spec.name.folder, result.records)
        self.results[spec.name.folder] = result
        self.check(result)
        return result

    @property
    def locate_pass(self) -> str:
        """``"pass 1"``, or ``"pass 2"`` for the locate pass from step 1 after a resumed one that could not be used
        (its folder :data:`~mindguard.protocol.folder.LOCATE_FROM_STEP_1`)."""
        return "pass 2" if self.locate_name == layout.LOCATE_FROM_STEP_1 else "pass 1"

    def locate(self, label: str, resume_dir: Optional[Path], steps: Tuple[int, int], scope: Optional[str] = None,
               iterations: str = "all") -> PassResult:
        """The locate pass: from the kept state at ``resume_dir`` (``None``: from step 1, ``hunt --from`` with no state
        worth resuming from), check every step through ``steps`` (first, last:
        1-based global steps) and keep the state at each of them (the failing one's is what the examine pass
        resumes from). ``scope``: also dump the dump ``iterations`` (0-based) at that scope (:data:`DUMP_SCOPES`),
        the process keeping only the last steps' files (:mod:`mindguard.training.child.window_dump`): the failing step's
        dump is then made by this pass."""
        name = self.locate_name
        folder = self.at(name)
        self.locate_resumed_from = resume_dir
        dump = self.dump_config(name, scope, iterations) if scope is not None else None
        request = self.request(name, "record", resume_dir=resume_dir, keep_dir=folder.state,
                               keep_steps=steps, dump_path=folder.dump if dump is not None else None)
        return self.run_pass(PassSpec(name, label, request, dump))

    def dump_config(self, name: PassName, scope: str, iterations: Union[str, Sequence[int]]) -> DumpConfig:
        """The dump the pass ``name`` arms: ``iterations`` (``"all"`` or dump iterations, 0-based) at ``scope``."""
        _, kernel_list, input_output = DUMP_SCOPES[scope]
        return DumpConfig(self.at(name).dump, self.options.net_name, iterations, device_target="CPU",
                          kernels=kernel_list, input_output=input_output)

    def check(self, result: PassResult) -> None:
        """Raise :class:`CannotGoOn` when the pass could not do its work for a reason of its own: the run folder
        was removed or its disk is full, or the training process said it cannot continue (a record it could not
        write, a dump config of the script's own). A stopped pass (interrupted, timed out) is left to the caller."""
        if result.stopped:
            return
        first = result.name == layout.PASS1
        what = "record the failing step" if first else "examine the failing step"
        outcome = Outcome.RECORD_FAILED if first and not result.any_failed else Outcome.EXAMINE_FAILED
        cause = self.run_folder_lost() or result.cannot_continue
        if cause is None:
            full = result.disk_full
            if full is None and result.log_error is not None and result.log_error.errno in NO_SPACE:
                full = f"its output log: {os_reason(result.log_error)}"
            if full is None and not first and result.no_space is not None:   # the disk may have room again now
                full = f"while it ran: {result.no_space}"
            if full is not None:
                cause = say_.disk_full(full) + (_drop_incomplete_dump(result.folder.dump) if not first else "")
        if cause is None:
            return
        self.summary.set_pass(result.name.folder, PassSummary(result.returncode, result.records))
        log = (f"its output is in {result.log_path}" if result.log_error is None else
               f"its output log could not be written ({os_reason(result.log_error)}); its end is above")
        raise CannotGoOn(outcome, say_.pass_could_not(result.label, what, first and outcome is Outcome.EXAMINE_FAILED,
                                                      cause, log))

    def run_folder_lost(self) -> Optional[str]:
        """Why the run folder is no longer the one the hunt created (removed, or replaced), else ``None``."""
        try:
            info = os.stat(self.run)
        except OSError:
            return say_.run_folder_removed(self.run, recreated=False)
        if self.identity is not None and (info.st_dev, info.st_ino) != self.identity:
            return say_.run_folder_removed(self.run, recreated=True)
        return None

    # -- what several steps of the hunt share ---------------------------------------------------------------
    def stopped(self, result: PassResult) -> Outcome:
        """The outcome of a pass the hunt stopped (interrupted, timed out)."""
        if result.signal is not None:
            self.summary.signal = signal_name(result.signal)
        return Outcome.INTERRUPTED if result.stopped == "interrupted" else Outcome.TIMED_OUT

    def mindguard_failed(self, label: str, message: Optional[str], log_path: Path) -> Outcome:
        """mindguard's own code failed in a pass: said as its failure (exit 2), never as the training's."""
        text = str(message or "no message").strip()
        say(say_.mindguard_failed(label, text, log_path, self.run))
        self.summary.mindguard_error = text
        return Outcome.MINDGUARD_FAILED

    def print_replays(self, pass_dir: layout.PassFolder) -> bool:
        """Print the replay reports Guard wrote in ``pass_dir`` (one per rank); False when there are none."""
        replays = _dist.rank_paths(pass_dir.replay_report)
        if not replays:
            return False
        texts = [layout.replay_text(path).read_text(encoding="utf-8") for path in replays]
        if self.options.analyze:
            self.answer.extend(texts)
        atomic_write_text(self.folder.report_text, "".join(texts))   # the run folder's answer, as for a dump
        self.summary.replay = [read_json(path) for path in replays]
        atomic_write_json(self.folder.report, {"replay": self.summary.replay})
        first = self.summary.replay[0].get("first")
        if first:
            self.summary.origin = first
        return True

    def state_at(self, step: Optional[int]) -> Optional[Path]:
        """The state the examined pass kept at the beginning of global step ``step``, if it kept one."""
        state = self.at(self.examined).state
        meta = read_state(state)
        return state if meta is not None and step is not None and meta.step == step else None

    def resume_point_for(self, step: Optional[int]) -> Optional[Path]:
        """The state a wider look at global step ``step`` runs from: :meth:`state_at`, or -- when the examined pass
        kept the big arrays there as statistics only (the locate pass that dumped the step, for that dump's
        analysis: ``summarized``) -- the state that pass resumed from, run from to ``step``."""
        state = self.state_at(step)
        kept = read_state(state) if state is not None else None
        if kept is not None and kept.summarized:
            return self.locate_resumed_from if self.examined == self.locate_name else None
        return state

    def kept_by_pass1(self, step: int) -> Optional[Path]:
        """Pass 1's kept state when resuming is allowed and it begins at or before ``step``, else ``None``."""
        kept = read_state(self.at(layout.PASS1).state) if self.options.resume != "never" else None
        return self.at(layout.PASS1).state if kept is not None and kept.step <= step else None


def _drop_incomplete_dump(dump: Path) -> str:
    """Remove a dump cut short by a full disk (no analysis can read it), so the summary fits; says so."""
    if not dump.is_dir():
        return ""
    size = tree_size(dump)[0]
    shutil.rmtree(dump, ignore_errors=True)
    return say_.dropped_dump(size)
