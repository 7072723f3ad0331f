"""``mindguard verify --from RECORD [--steps K] [--from-start] -- COMMAND``: does the fix hold, without re-training?

After a hunt named the culprit, the user edits the script (``SafeNorm`` for ``nn.Norm``, a clamp, a lower learning
rate). This runs the *edited* command from the training state the failing run kept before its failure (the
machinery of ``hunt --from``: :mod:`mindguard.training.state.resume`), through the failing step or window and ``K``
more steps, every step checked (loss and Parameters), then stops the training
(:mod:`mindguard.training.child.verify_run` in the training process). The decisions are pure
(:mod:`mindguard.hunt.verify_plan`); the pass and its examination are :class:`~mindguard.hunt.verify_pass.VerifyPass`
(which the hunt's fix check runs too); this module says the verdict:

* exit 0 -- the fix holds: the steps trained finite; their loss next to the failing run's, a far one flagged;
* exit 1 -- still failing: the step, then the same examination a hunt does (the pass kept the state at each step
  it trained, so the examination starts at the failing step: one compile, one step), or the ``hunt`` line to run;
* exit 2 -- cannot verify: no usable kept state (``--from-start`` trains from step 1 instead), the state does not
  load into the edited script (Parameters renamed or reshaped), or the command ended before the failing step;
* exit 130 -- interrupted.

The run folder holds ``verify/`` (the pass: its record, output, ``verify_steps.json``, its kept state),
``verify.json`` (the verdict) and, when it still fails, the examination's folders and answer as a hunt's.
Steps are 1-based global steps (:mod:`mindguard.training.run`). The wrapper process never imports MindSpore.
"""
from __future__ import annotations

import datetime as _dt
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from .._util.io import atomic_write_json
from ..report.pagedata import write_run_page
from ..errors import HuntError
from ..protocol import verify as protocol
from ..protocol.summary import Outcome
from . import console as speaker_
from .console import console, say as _say
from .context import HuntContext, Options
from .entry import HuntSession, _create_run_folder, _origin_record, _run_to_the_end
from .passes import Supervisor
from .runner import ProcessRunner
from .verify_pass import VerifyPass
from .verify_plan import EXIT_CANNOT, Verdict, cannot, front, verify_line

VERDICT = protocol.VERDICT


class _Verify(HuntSession):
    """``mindguard verify``: the run folder and summary of a hunt, one verification (:class:`VerifyPass`), the
    verdict said."""

    def __init__(self, ctx: HuntContext, steps: Optional[int], from_start: bool):
        super().__init__(ctx)
        self.check = VerifyPass(ctx, steps, from_start)

    @property
    def verdict(self) -> Optional[Verdict]:
        return self.check.verdict

    @verdict.setter
    def verdict(self, value: Optional[Verdict]) -> None:
        self.check.verdict = value

    @property
    def report(self) -> Dict[str, Any]:
        return self.check.report

    def hunt(self) -> Outcome:
        return self.check.hunt()

    def finish(self, outcome: Outcome) -> int:
        """Write ``summary.json`` and ``verify.json``, say the verdict; the exit code is the verdict's (130 when
        interrupted, 2 when the verification itself could not go on)."""
        if self.verdict is None:
            self.verdict = cannot(self.summary.error or f"the verification ended: {outcome.label}")
        if outcome is Outcome.INTERRUPTED:
            self.verdict = Verdict("cannot", 130, "interrupted")
        self.summary.end(outcome, finished=_dt.datetime.now().isoformat(timespec="seconds"))
        written = self.write_summary()
        if written:
            try:
                atomic_write_json(self.run / VERDICT, {**self.report, **self.verdict.to_dict()})
            except (OSError, ValueError) as exc:
                _say(f"could not write {self.run / VERDICT}: {exc}")
        if written and self.ctx.folder.report.exists():   # the examination's answer as a page, as a hunt writes it
            _say(write_run_page(self.run))
        for text in self.ctx.answer:   # the examination's answer, when it still fails
            console(text)
        console("\n".join([f"mindguard verify: {self.verdict.headline}", *self.verdict.lines]))
        _say(f"{self.verdict.outcome} (exit code {self.verdict.exit_code}); everything is in {self.run}")
        return self.verdict.exit_code


def verify(command: Sequence[str], *, record: "os.PathLike[str] | str", steps: Optional[int] = None,
           from_start: bool = False, run_dir: Optional["os.PathLike[str] | str"] = None,
           timeout: Optional[float] = None) -> int:
    """Run the edited ``command`` from the training state the failing run (``record``: the path Guard printed) kept
    before its failure, through the failing step or window and ``steps`` more (default
    :data:`~mindguard.hunt.verify_plan.DEFAULT_MORE_STEPS`), every step checked; ``from_start``: from step 1.
    Returns the exit code: 0 the fix holds, 1 still failing, 2 cannot verify, 130 interrupted (module docstring).
    :class:`~mindguard.errors.HuntError` for bad arguments (the CLI says it, exit 2)."""
    command = list(command)
    if not command:
        raise HuntError("nothing to run: give the edited training command after `--`, e.g. "
                        "`mindguard verify --from mindguard_failure.json -- python train.py`")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
        raise HuntError(f"--steps {steps!r}: must be a number of steps >= 0 to train after the failing one, e.g. 5")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise HuntError(f"--timeout {timeout!r}: must be a positive number of seconds, e.g. 600")
    program = command[0]
    found = program if os.sep in program else shutil.which(program)
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise HuntError(f"cannot run {program!r}: no such executable file or command; e.g. "
                        f"`mindguard verify --from RECORD -- {sys.executable} train.py`")
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise HuntError("the working directory no longer exists; cd to an existing folder") from None
    origin = _origin_record(Path(record))
    supervisor = Supervisor().install()
    speaker, speaker_.SPEAKER = speaker_.SPEAKER, "mindguard verify"
    try:
        run = _create_run_folder(Path(run_dir) if run_dir is not None else None, command, cwd)
        _say(f"run folder: {run}")
        ctx = HuntContext(command, run, ProcessRunner(command, run, timeout), Options(), origin=origin)
        info = os.stat(run)
        ctx.identity = (info.st_dev, info.st_ino)
        return _run_to_the_end(_Verify(ctx, steps, from_start), supervisor)
    finally:
        speaker_.SPEAKER = speaker
        supervisor.restore()


__all__ = ["verify", "verify_line", "front", "EXIT_CANNOT"]
