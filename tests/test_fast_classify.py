"""Every decision of the exception classifier (mindguard.training.record.classify), on real exceptions with real
tracebacks.

Pure Python (no MindSpore): frames are given MindSpore's, mindguard's or a user's file name by compiling source
text under that name (``compile(src, "/x/site-packages/mindspore/train/model.py", "exec")``).
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

import mindguard
from mindguard.training.record.classify import (
    MESSAGE_LIMIT,
    READ_AHEAD,
    ExceptionDecision,
    RunFacts,
    classify_exception,
    mindguards_own,
)
from mindguard.training.child.hunt_stop import HuntCannotContinue, HuntStop
from mindguard.errors import NonFiniteError

pytestmark = pytest.mark.fast

MINDSPORE_FILE = "/x/site-packages/mindspore/train/model.py"
USER_FILE = "/home/user/project/train.py"
MINDGUARD_DIR = Path(mindguard.__file__).resolve().parent

UNDER_WAY = RunFacts(step_under_way=True, any_step=True, any_call=True)
BETWEEN = RunFacts(any_step=True, any_call=True)                  # after a step ended, before the next began
BEFORE_FIRST_STEP = RunFacts(any_call=True)                       # a training call began, no step yet
NOTHING_YET = RunFacts()


def module_at(filename: str, name: str, source: str, monkeypatch) -> dict:
    """Run ``source`` as module ``name`` whose file is ``filename`` (registered in sys.modules); its namespace."""
    module = types.ModuleType(name)
    module.__file__ = filename
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(source, filename, "exec"), module.__dict__)   # noqa: S102 - the test's own source text
    return module.__dict__


def raised(call, *args) -> BaseException:
    try:
        call(*args)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt are cases too
        return exc
    raise AssertionError("did not raise")


def decide(exc: BaseException, facts: RunFacts) -> ExceptionDecision:
    return classify_exception(type(exc), exc, facts)


@pytest.fixture
def mindspore_code(monkeypatch):
    return module_at(MINDSPORE_FILE, "mindspore_fake_model", """
def run_kernel():
    raise RuntimeError("Gather: index 7 out of range")

def call_hooks(callback):
    callback.on_train_step_end(None)

def read_batch():
    raise RuntimeError("Exception thrown from dataset pipeline. Refer to 'Dataset Pipeline Error Message'.")

class LossMonitor:
    def on_train_step_end(self, run_context):
        raise ValueError("epoch: 1 step: 3. Invalid loss, terminating training.")
""", monkeypatch)


@pytest.fixture
def user_code(monkeypatch):
    return module_at(USER_FILE, "user_train_fake", """
def between_steps():
    return {}["learning_rate"]

class MyCallback:
    def on_train_step_end(self, run_context):
        raise ZeroDivisionError("division by zero")

def interrupt():
    raise KeyboardInterrupt

def exit_early():
    raise SystemExit(0)
""", monkeypatch)


def mindguard_code(monkeypatch, file: str = "training/examine/capture.py", source: str = "def check():\n    return "
                                                                                         "None.shape\n"):
    return module_at(str(MINDGUARD_DIR / file), f"mindguard_fake_{file.replace('/', '_')[:-3]}", source, monkeypatch)


# -- nothing to record -----------------------------------------------------------------------------------
def test_a_second_failure_is_never_recorded(mindspore_code):
    decision = decide(raised(mindspore_code["run_kernel"]), RunFacts(failed=True, step_under_way=True, any_step=True))
    assert not decision.record and not decision.finished and "first" in decision.why


@pytest.mark.parametrize("stop", [HuntStop("done"), HuntCannotContinue("disk full")])
def test_the_hunts_own_ending_is_no_failure(stop):
    decision = decide(raised(lambda: (_ for _ in ()).throw(stop)), UNDER_WAY)
    assert not decision.record and not decision.finished


def test_sys_exit_in_the_script_finishes_the_run(user_code):
    decision = decide(raised(user_code["exit_early"]), UNDER_WAY)
    assert decision.finished and not decision.record


# -- the step's failure ----------------------------------------------------------------------------------
def test_a_mindspore_error_in_a_step_is_the_steps(mindspore_code):
    decision = decide(raised(mindspore_code["run_kernel"]), UNDER_WAY)
    assert (decision.record, decision.kind, decision.phase, decision.next_step) == (True, "exception", "step", False)
    assert decision.message == "RuntimeError: Gather: index 7 out of range"


def test_mindspores_own_callback_raising_in_a_step_is_the_steps(mindspore_code):
    """LossMonitor raises on the NaN loss: MindSpore's callback, not the script's."""
    decision = decide(raised(mindspore_code["LossMonitor"]().on_train_step_end, None), UNDER_WAY)
    assert decision.phase == "step" and decision.message.startswith("ValueError: epoch: 1 step: 3.")


def test_a_mindspore_error_after_a_step_ended_is_the_last_steps(mindspore_code):
    """A device's kernel failure surfaces when a deferred verdict is read: no script code raised it."""
    decision = decide(raised(mindspore_code["run_kernel"]), BETWEEN)
    assert (decision.phase, decision.next_step) == ("step", False)


def test_a_dataset_error_while_a_step_is_under_way_is_the_steps(mindspore_code):
    assert decide(raised(mindspore_code["read_batch"]), UNDER_WAY).phase == "step"


def test_an_interrupt_in_a_step_is_recorded_interrupted(user_code):
    decision = decide(raised(user_code["interrupt"]), UNDER_WAY)
    assert (decision.kind, decision.phase, decision.message) == ("interrupted", "step", "KeyboardInterrupt:")


def test_a_long_message_is_cut(mindspore_code):
    exc = RuntimeError("x" * (2 * MESSAGE_LIMIT))
    exc.__traceback__ = raised(mindspore_code["run_kernel"]).__traceback__
    message = decide(exc, UNDER_WAY).message
    assert len(message) == MESSAGE_LIMIT + len(" [...]") and message.endswith(" [...]")


# -- the script's own error ------------------------------------------------------------------------------
def test_the_scripts_callback_raising_in_a_step_is_the_scripts(mindspore_code, user_code):
    exc = raised(mindspore_code["call_hooks"], user_code["MyCallback"]())
    decision = decide(exc, UNDER_WAY)
    assert (decision.kind, decision.phase) == ("exception", "script")
    assert decision.message == (f"ZeroDivisionError: division by zero [raised by MyCallback.on_train_step_end at "
                                f"{USER_FILE}:7 (in on_train_step_end), before the step's checks]")


def test_the_scripts_code_raising_between_steps_is_the_scripts(user_code):
    decision = decide(raised(user_code["between_steps"]), BETWEEN)
    assert decision.phase == "script" and decision.message == (
        f"KeyError: 'learning_rate' [raised at {USER_FILE}:3 (in between_steps), after the step's checks passed]")


LOADER_SOURCE = """
def decode(index):
    raise ValueError(f"corrupt image file {index:04d}.png")

def load_batches():
    for index in range(3):
        yield decode(index)

class Batches:
    def __next__(self):
        return decode(7)

def loop():
    for batch in load_batches():
        pass

def loop_over_iterator():
    next(Batches())

def not_iterating():
    decode(1)
"""


@pytest.mark.parametrize("entry, loader, line", [("loop", "load_batches", 7), ("loop_over_iterator", "__next__", 11)])
def test_the_scripts_own_loader_raising_is_put_at_the_next_step_exactly(monkeypatch, entry, loader, line):
    """The loop's own generator (or iterator) raising while it makes the next batch: the step after the last one
    begun, with no read-ahead caveat -- the loader is the loop's, so the step is certain."""
    code = module_at(USER_FILE, "user_loader_fake", LOADER_SOURCE, monkeypatch)
    decision = decide(raised(code[entry]), BETWEEN)
    assert (decision.phase, decision.next_step) == ("loader", True), decision
    assert decision.message == (f"ValueError: corrupt image file {0 if entry == 'loop' else 7:04d}.png [raised at "
                                f"{USER_FILE}:3 (in decode), in the loader {loader} ({USER_FILE}:{line}), producing "
                                f"the step's batch]"), decision.message
    assert not decision.message.startswith(READ_AHEAD)
    plain = decide(raised(code["not_iterating"]), BETWEEN)   # no generator on the way: the script's own code
    assert (plain.phase, plain.next_step) == ("script", False), plain


def test_an_interrupt_between_steps_is_the_scripts_and_its_text_stays(user_code):
    decision = decide(raised(user_code["interrupt"]), BETWEEN)
    assert (decision.kind, decision.phase, decision.message) == ("interrupted", "script", "KeyboardInterrupt:")


def test_an_error_after_the_training_calls_ended_is_the_scripts(mindspore_code):
    exc = raised(mindspore_code["run_kernel"])
    decision = decide(exc, RunFacts(any_step=True, any_call=True, training_ended=True))
    assert (decision.phase, decision.message) == (
        "script", "RuntimeError: Gather: index 7 out of range [raised after training ended]")


def test_an_interrupt_after_the_training_calls_ended_is_not_said_to_be_after_them(user_code):
    decision = decide(raised(user_code["interrupt"]), RunFacts(any_step=True, any_call=True, training_ended=True))
    assert (decision.kind, decision.phase, decision.message) == ("interrupted", "script", "KeyboardInterrupt:")


# -- between steps: the dataset --------------------------------------------------------------------------
@pytest.mark.parametrize("facts", [BETWEEN, BEFORE_FIRST_STEP], ids=["after a step", "before the first step"])
def test_the_dataset_raising_between_steps_is_put_at_the_next_step(mindspore_code, facts):
    decision = decide(raised(mindspore_code["read_batch"]), facts)
    assert (decision.phase, decision.next_step) == ("between_steps", True)
    assert decision.message.startswith(READ_AHEAD + "RuntimeError: Exception thrown from dataset pipeline")


def test_a_synchronous_pipeline_names_its_step_for_certain(mindspore_code):
    decision = decide(raised(mindspore_code["read_batch"]), RunFacts(any_step=True, any_call=True, reads_ahead=False))
    assert decision.next_step and decision.message.startswith("RuntimeError: Exception thrown from dataset")


# -- before anything -------------------------------------------------------------------------------------
@pytest.mark.parametrize("facts, code", [(BEFORE_FIRST_STEP, "run_kernel"), (NOTHING_YET, "read_batch")],
                         ids=["not the dataset", "no training call"])
def test_an_error_before_the_first_step_has_no_phase(mindspore_code, facts, code):
    decision = decide(raised(mindspore_code[code]), facts)
    assert decision.record and (decision.phase, decision.next_step) == (None, False)


# -- mindguard's own -------------------------------------------------------------------------------------
def test_mindguards_own_bug_is_said_as_such(monkeypatch):
    decision = decide(raised(mindguard_code(monkeypatch)["check"]), UNDER_WAY)
    assert (decision.kind, decision.phase) == ("exception", "mindguard")
    assert decision.message == ("mindguard's own error at training/examine/capture.py:2 (in check): AttributeError: "
                                "'NoneType' object has no attribute 'shape'")


def test_mindguards_own_bug_between_steps_is_still_its_own(monkeypatch):
    assert decide(raised(mindguard_code(monkeypatch)["check"]), BETWEEN).phase == "mindguard"


def test_the_users_error_through_mindguards_call_of_the_step_is_not_mindguards(monkeypatch, user_code):
    """``watch`` calls the user's step: mindguard's frame only calls through."""
    calls = mindguard_code(monkeypatch, "training/watch.py", "def __call__(step):\n    return step()\n")
    exc = raised(calls["__call__"], user_code["between_steps"])
    assert mindguards_own(exc) is None and decide(exc, UNDER_WAY).phase == "step"


def test_a_mindspore_error_through_a_mindguard_frame_is_not_mindguards(monkeypatch, mindspore_code):
    """MindSpore's kernel error surfacing where mindguard read a value (its text names the op)."""
    reads = mindguard_code(monkeypatch, "training/checks.py", "def read(kernel):\n    kernel()\n")
    exc = raised(reads["read"], lambda: (_ for _ in ()).throw(RuntimeError("For 'Gather', index out of range")))
    assert mindguards_own(exc) is None and decide(exc, UNDER_WAY).phase == "step"


def test_an_error_mindguard_raises_for_the_user_is_not_its_bug(monkeypatch):
    raises = mindguard_code(monkeypatch, "training/watch.py", "def verdict(error):\n    raise error\n")
    exc = raised(raises["verdict"], NonFiniteError("loss", None))
    assert mindguards_own(exc) is None and decide(exc, UNDER_WAY).phase == "step"


def test_the_demos_are_not_mindguards_own(monkeypatch):
    demo = mindguard_code(monkeypatch, "demos/norm_nan.py", "def train():\n    return 1 / 0\n")
    exc = raised(demo["train"])
    assert mindguards_own(exc) is None and decide(exc, UNDER_WAY).phase == "step"


def test_an_interrupt_inside_mindguard_is_an_interrupt(monkeypatch):
    waits = mindguard_code(monkeypatch, "training/resume.py", "def keep():\n    raise KeyboardInterrupt\n")
    decision = decide(raised(waits["keep"]), UNDER_WAY)
    assert (decision.kind, decision.phase) == ("interrupted", "step")


def test_every_decision_says_why(mindspore_code, user_code):
    cases = [(raised(mindspore_code["run_kernel"]), facts) for facts in (UNDER_WAY, BETWEEN, BEFORE_FIRST_STEP)]
    cases.append((raised(user_code["between_steps"]), BETWEEN))
    for exc, facts in cases:
        assert decide(exc, facts).why


# -- the run acts on the decision ------------------------------------------------------------------------
def _run_after_steps(steps: int, batch_num: int):
    from mindguard.training.run import Run, TrainingCall

    run = Run()
    run.recorder.base = {"rank": 0, "group_size": 1}   # what begin_call reads from MindSpore
    call = TrainingCall(index=1, network="Net", kind="train", key=object())
    run.calls.append(call)
    for cur_step in range(1, steps + 1):
        run.end_step(run.begin_step(call, cur_step, batch_num=batch_num, epoch=(cur_step - 1) // batch_num + 1))
    return run


def test_the_run_puts_a_dataset_error_at_the_step_after_the_last(mindspore_code):
    run = _run_after_steps(4, batch_num=4)
    exc = raised(mindspore_code["read_batch"])
    failure = run.fail_with_exception(type(exc), exc)
    assert (failure.phase, failure.global_step, failure.epoch, failure.step_in_epoch) == ("between_steps", 5, 2, 1)
    assert failure.message.startswith(READ_AHEAD)


def test_the_run_records_a_step_error_at_its_step_and_keeps_the_first(mindspore_code, user_code):
    run = _run_after_steps(3, batch_num=4)
    call = run.calls[-1]
    run.begin_step(call, 4, batch_num=4, epoch=1)
    exc = raised(mindspore_code["run_kernel"])
    first = run.fail_with_exception(type(exc), exc)
    assert (first.kind, first.phase, first.global_step) == ("exception", "step", 4)
    later = raised(user_code["between_steps"])
    assert run.fail_with_exception(type(later), later) is first


def test_the_run_ends_on_sys_exit_and_ignores_the_hunts_stop(user_code):
    run = _run_after_steps(2, batch_num=4)
    assert run.fail_with_exception(HuntStop, HuntStop("done")) is None and run.failure is None
    exc = raised(user_code["exit_early"])
    assert run.fail_with_exception(type(exc), exc) is None and run.failure is None and run.recorder.finished_at == 2
