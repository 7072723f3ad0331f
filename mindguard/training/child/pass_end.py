"""The training process's side of ``pass_status.json``: what it says to the hunt about how its pass ended.

Each fact is observed here, in the process, on typed things -- the run's record, the exception object and the code
objects of its traceback -- and written through :func:`mindguard.protocol.pass_status.note`, so the hunt decides on
facts and never reads the pass's output. Outside ``mindguard hunt`` (no request) nothing is written.

Never imports MindSpore.
"""
from __future__ import annotations

import atexit
import os
import re
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional

from ..._util.dist import per_rank_path, rank_info
from ..._util.io import free_bytes
from ...protocol import pass_status
from ...protocol.pass_status import DatasetError, MindguardFailure
from ...protocol.request import record_from_environ

if TYPE_CHECKING:
    from ...protocol.request import HuntRequest

_OWN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep   # mindguard/
_DEMOS_DIR = os.path.join(_OWN_DIR, "demos") + os.sep
#: the MindSpore function that refuses dataset sink mode while the pipeline runs synchronously (its debug mode)
_SINK_CHECK = "_check_sink_mode_for_ds_debug_mode"
#: free bytes under which the run folder's disk counts as full
_FULL_BELOW = 1 << 16


def status_record(request: "HuntRequest") -> Path:
    """This process's record path under the hunt (per rank), beside which its pass status goes."""
    return per_rank_path(Path(request.record).absolute(), *rank_info())


def reserve(request: Optional["HuntRequest"]) -> None:
    """At the start of a pass's process: claim the status file's room (a disk that fills later still takes it)."""
    if request is not None:
        pass_status.reserve(status_record(request))


def note(request: Optional["HuntRequest"], **facts: Any) -> None:
    """Say ``facts`` (fields of :class:`~mindguard.protocol.pass_status.PassStatus`) to the hunt; nothing outside
    the hunt. Never raises."""
    if request is None:
        return
    try:
        pass_status.note(status_record(request), **facts)
    except Exception:  # noqa: BLE001 - the status is the hunt's; the training's end stays its own
        pass


def at_exit(run: Any, uncaught: Optional[BaseException]) -> None:
    """At interpreter exit (``run``: the process's :class:`mindguard.training.run.Run`): how the process ended,
    unless an earlier note said so already (the hunt stopped it, it diverged, it cannot continue)."""
    request = run.request
    if request is None:
        return
    said = pass_status.read(status_record(request))
    facts: Dict[str, Any] = {}
    if said is None or said.ended is None:
        facts.update(_ending(run, uncaught))
    full = _disk_full(status_record(request).parent)
    if full is not None:
        facts["no_space"] = full
    if facts:
        note(request, **facts)


def _ending(run: Any, uncaught: Optional[BaseException]) -> Dict[str, Any]:
    failure = run.failure
    facts: Dict[str, Any] = {}
    if uncaught is not None and run.request is not None and run.request.examine == "dataset" \
            and _raised_by(uncaught, _SINK_CHECK):
        facts["sink_refused"] = True
    if failure is not None and failure.phase == "mindguard":
        facts.update(ended="raised", mindguard_error=MindguardFailure(error=str(failure.message or failure.kind)))
    elif failure is not None and failure.kind != "interrupted":
        facts.update(ended="failed", failure_kind=failure.kind)
        if failure.phase == "between_steps":
            facts["dataset_error"] = dataset_error(failure.message or "")
    elif uncaught is not None:
        facts["ended"] = "raised"
    else:
        facts["ended"] = "finished"
    if uncaught is not None and "mindguard_error" not in facts and _broke_inside_mindguard(uncaught):
        # (also when a failure is recorded: mindguard's error then ended the process, whatever the record says)
        facts["mindguard_error"] = _mindguard_failure(uncaught)
    return facts


def _raised_by(exc: BaseException, function: str) -> bool:
    """Whether a frame of ``exc``'s traceback runs the function named ``function``."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == function:
            return True
        tb = tb.tb_next
    return False


def _broke_inside_mindguard(exc: BaseException) -> bool:
    """The innermost frame of ``exc``'s traceback is mindguard's own code (its demos aside), and ``exc`` is not the
    failure mindguard raises on purpose for the training (``NonFiniteError``)."""
    if type(exc).__name__ == "NonFiniteError":
        return False
    tb = exc.__traceback__
    innermost = None
    while tb is not None:
        innermost = os.path.abspath(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return innermost is not None and innermost.startswith(_OWN_DIR) and not innermost.startswith(_DEMOS_DIR)


#: a frame of a Python traceback quoted in an exception's text (MindSpore's dataset workers quote the user's)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')
_CAUSE = re.compile(r"^\w+(Error|Exception): ")


def dataset_error(message: str) -> DatasetError:
    """The dataset pipeline's error, from its exception's text (this process's classifier reads the exception it
    caught; the hunt gets the facts): the innermost frame outside MindSpore and the installed packages, and the
    last ``SomethingError: ...`` line."""
    frames = [m for m in _FRAME.finditer(message) if "site-packages" not in m.group(1)
              and "/mindspore/" not in m.group(1)]
    causes = [line for line in message.splitlines() if _CAUSE.match(line)]
    cause = causes[-1].strip() if causes else None
    if not frames:
        return DatasetError(error=cause)
    last = frames[-1]
    return DatasetError(error=cause, file=last.group(1), line=int(last.group(2)), function=last.group(3),
                        code=last.group(4).strip())


def _disk_full(folder: Path) -> Optional[str]:
    """``"<free> bytes free on the file system of <folder>"`` when the disk is (nearly) full, else ``None``."""
    free = free_bytes(folder)
    if free is None:
        return None
    return f"{free} bytes free on the file system of {folder}" if free < _FULL_BELOW else None


def _at_exit_without_run() -> None:
    """At exit of a process under the hunt in which no run said how it ended (its request could not be parsed,
    mindguard broke before the first training call): the uncaught exception, and whether mindguard's code raised
    it. Registered when this module is imported under the hunt, so it runs after the run's own exit hook."""
    record = record_from_environ()
    uncaught = uncaught_exception()
    if record is None or uncaught is None:
        return
    path = per_rank_path(record.absolute(), *rank_info())
    said = pass_status.read(path)
    if said is not None and said.ended is not None:
        return
    facts: Dict[str, Any] = {"ended": "raised"}
    if _broke_inside_mindguard(uncaught):
        facts["mindguard_error"] = _mindguard_failure(uncaught)
    try:
        pass_status.note(path, **facts)
    except Exception:  # noqa: BLE001 - the process is ending for its own reasons
        pass


def _mindguard_failure(exc: BaseException) -> MindguardFailure:
    return MindguardFailure(error=f"{type(exc).__name__}: {exc}"[:300],
                            traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


if record_from_environ() is not None:
    atexit.register(_at_exit_without_run)


def uncaught_exception() -> Optional[BaseException]:
    """The exception that nothing caught (the interpreter keeps it before it runs the exit hooks), or ``None``."""
    found = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return found if isinstance(found, BaseException) else None
