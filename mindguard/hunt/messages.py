"""Every sentence ``mindguard hunt`` prints about its passes and its answer, kept apart from the decisions.

Each function takes the facts (steps are 1-based global steps; paths as given) and returns the text; the executor
decides which one applies and prints it (:func:`mindguard.hunt.console.say`). Never imports MindSpore.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..protocol.pass_status import DatasetError
from .verdicts import DumpRefusal, Fallback, LocateVerdict
from ..protocol.signals import kill_cause as kill_name

PLAIN_HUNT = "running the two passes of a plain hunt instead (from step 1)"

MAKE_IT_REPEAT = ("  A dump of a run that fails somewhere else explains nothing. Make the run repeat first:\n"
                  "    - call mindguard.fix_randomness(seed) at the top of the script, before building the network;\n"
                  "    - do not shuffle the dataset (shuffle=False) while hunting, or fix its seed;\n"
                  "    - remove dropout (mindguard.Guard(disable_dropout=True)) or use "
                  "fix_randomness(cpu_single_thread=True);\n"
                  "    - load fixed initial weights (mindguard.Guard(init_params_dir='init_params')).")


def note(text: str) -> str:
    return f"note: {text}"


def warning(text: str) -> str:
    return f"warning: {text}"


def record_says(path: Path, why: str) -> str:
    return f"{path}: {why}"


def from_the_record(path: Path, description: str) -> str:
    return f"from the failing run's record {path}: {description}"


def located(description: str, by: str = "pass 1 (locate)") -> str:
    return f"{by} found the exact step: {description}"


def every_rank_resumes(ranks: int, step: int) -> str:
    return f"every rank (0-{ranks - 1}) resumes from its own training state kept at global step {step}"


def pass1_failed(description: str) -> str:
    return f"pass 1 failed: {description}"


def run_folder(run: Path) -> str:
    return f"run folder: {run}"


def default_folder_moved(problem: str, fallback: Path) -> str:
    return f"{problem}, which MindSpore's dump refuses; using {fallback} instead (choose with --run-dir)"


def default_folder_unwritable(folder: Path, fallback: Path) -> str:
    return f"{folder} cannot be written here; using {fallback} instead (choose with --run-dir)"


def summary_not_written(lost: str, name: str) -> str:
    return f"{lost}; {name} is not written"


def summary_unwritable(path: Path, reason: str, fix: str) -> str:
    return f"could not write {path}: {reason}; {fix}"


def approximate_resume(note: str) -> str:
    return (f"the resumed passes replay approximately: {note}. If the failure repeats from the kept state, the answer "
            f"is that run's; if not, the hunt runs from step 1")


def approximate_answer(step: Optional[int]) -> str:
    where = f" at global step {step}" if step else ""
    return (f"note: the failure repeated{where} from the kept state with other dropout (random kernel) masks than the "
            f"failing run drew: the answer is that of an approximate replay. For the failing run's own masks, run "
            f"the hunt from step 1 (`mindguard hunt -- COMMAND`)")


def approximate_missed(span: str, where: str) -> str:
    return (f"with other dropout (random kernel) masks than the failing run drew, the run resumed from the kept state "
            f"{where}, not a failure within {span}: the failure depends on the masks")


def falls_back(why: str) -> str:
    return f"{why}: {PLAIN_HUNT}"


def sink_refused(where: str) -> str:
    return ("the dataset pipeline raised, and the script trains with dataset_sink_mode=True: MindSpore cannot run the "
            f"pipeline synchronously (its debug mode) in sink mode, which pass 2 needs to name the batch{where}.\n"
            "  Hunt with Model.train(..., dataset_sink_mode=False) to name the batch and the line that raised")


def second_process(why_not: str) -> str:
    """Why the exact step, once located, is examined by a second process (the locate pass does not examine it)."""
    return f"the locate pass does not examine the step as it runs ({why_not}): a second process examines it"


def dataset_from_step_1(why: str) -> str:
    return (f"{why}: the record says the dataset pipeline raised, so one pass from step 1 runs it synchronously to "
            f"name the batch that raised (no pass to find the step first)")


def not_reproducible_from_record(path: Path, step: int, kind: Optional[str]) -> str:
    return (f"NOT REPRODUCIBLE: the record {path} says the run failed at global step {step} ({kind}), but the hunt's "
            f"runs of the same command did not fail. Its data order or randomness differ between runs (a shuffled "
            f"dataset, an unseeded RNG, a file that changed): make the run repeat (mindguard.fix_randomness(seed), "
            f"shuffle=False) and hunt it again")


def elsewhere_than_record(found: int, path: Path, where: str) -> str:
    return (f"note: this run failed at global step {found}, but the record {path} says the run failed at {where}: "
            f"the run did not repeat itself (data order or randomness differ between runs), so the answer below "
            f"explains the hunt's run, which may not be the recorded failure")


def locate_pass(state_step: Optional[int], span: str, command: Sequence[str], dumped: str = "",
                dump_from: Optional[int] = None) -> str:
    """``dumped``: the dump scope's words when the pass also dumps the steps from global step ``dump_from`` on,
    keeping the failing one's."""
    steps = ("each step" if dump_from is None or dump_from <= (state_step or 0)
             else f"each step from global step {dump_from}")
    also = f", dump {dumped} of {steps} (the failing one's is kept)" if dumped else ""
    return (f"pass 1 (locate: from the training state kept at global step {state_step}, check every step "
            f"through {span}{also} and keep the state at the failing one): {shlex.join(command)}")


def one_pass_from_step_1(why: str, dumped: bool, two_passes: Optional[str] = None, second: bool = False) -> str:
    """``hunt --from`` with no kept state worth resuming from (``why``): the record names the step, so one pass from
    step 1 locates it (``dumped``: and dumps it as it runs); ``two_passes``: why the examination still needs a pass
    of its own; ``second``: after a resumed locate pass that could not be used."""
    then = (f" and dumps it as it runs ({'the second and last process' if second else 'one process'})" if dumped else
            f", keeping the state there; an examine pass then dumps it from that state ({two_passes})")
    return f"{why}: one pass from step 1 finds the exact step the record points at{then}"


def locate_from_step_1(span: str, command: Sequence[str], dumped: str = "", dump_from: Optional[int] = None,
                       by: str = "pass 1") -> str:
    """The locate pass of ``hunt --from`` run from step 1 (:func:`locate_pass`'s words); ``by``: which pass it is
    (``"pass 2"`` after a resumed locate pass that could not be used)."""
    steps = "each step" if dump_from is None or dump_from <= 1 else f"each step from global step {dump_from}"
    also = f", dump {dumped} of {steps} (the failing one's is kept)" if dumped else ""
    return (f"{by} (locate: from step 1, check every step through {span}{also} and keep the state at the failing "
            f"one): {shlex.join(command)}")


def examined_while_locating(step: Optional[int], by: str = "pass 1 (locate)") -> str:
    return (f"{by} dumped global step {step} as it ran: analysing that dump (another pass runs only if it "
            f"must be dumped wider)")


def raised_before_any_dump_file(step: Optional[int], by: str = "pass 1 (locate)") -> str:
    return (f"{by} holds no dump file of global step {step}, which raised before MindSpore wrote one (its first "
            f"kernel raised): its graphs and the batch it kept of the step name the kernel; another pass would dump "
            f"no more of the step")


def locate_dump_missed(step: Optional[int], dump_from: Optional[int] = None, by: str = "pass 1 (locate)") -> str:
    why = (f"it dumped from global step {dump_from} on, where the failure showed in the run" if dump_from is not None
           and step is not None and step < dump_from else "MindSpore dumped nothing of it")
    return f"{by} holds no dump file of global step {step} ({why}); examining it in a pass of its own"


def locate_to_step(kept: int, step: int, command: Sequence[str]) -> str:
    return (f"pass 2 (locate: from the training state kept at global step {kept}, run to global step {step} and "
            f"keep the state there): {shlex.join(command)}")


def killed_from_outside_after_resume(state_step: Optional[int], last: int) -> str:
    return (f"from the training state kept at global step {state_step} the run went through global step {last}, "
            f"where the killed run died, without failing: the kill came from outside the step's computation (the "
            f"OOM-killer when memory ran short, an administrator, a scheduler), so its numbers have nothing to "
            f"explain. If it was the OOM-killer, give the training more memory or a smaller batch")


def killed_then_repeated_without_failing(signum: int, step: int, label: str) -> str:
    return (f"pass 1 was killed by signal {signum} ({kill_name(signum)}) at global step {step}, and {label} ran "
            f"that step without failing: the kill came from outside the step's computation (the OOM-killer when "
            f"memory ran short, an administrator, a scheduler), so its numbers have nothing to explain. If it was "
            f"the OOM-killer, give the training more memory or a smaller batch")


def overridden_edit(edit: str, step: Any, command: Sequence[str]) -> str:
    return (f"{edit}: the kept state (global step {step}) sets the failing run's value, so the answer is the failing "
            f"run's and this edit is not in effect; to try the edit, hunt from step 1: mindguard hunt -- "
            f"{shlex.join(command)}")


def record_pass(command: Sequence[str]) -> str:
    return f"pass 1 (record): {shlex.join(command)}"


def failed_before_guard(rc: int, last_lines: str, log_path: Path, interpreter_hint: str) -> str:
    return (f"the command exited with code {rc} before it started a training with mindguard.Guard or "
            f"mindguard.watch:\n  {last_lines or '(it printed nothing)'}\n"
            f"  fix that first; its output is in {log_path}{interpreter_hint}")


def interpreter_hint(executable: str) -> str:
    return (f"\n  mindguard never ran in the command (another Python than mindguard's?): if its Python cannot import "
            f"mindspore or mindguard, run the script with the one mindguard runs in (mindguard hunt -- "
            f"{executable} train.py ...)")


def no_guard(rc: int, log_path: Path, not_attached: Optional[str] = None) -> str:
    if not_attached:   # issue 53: the attach hook said what it could not attach to, and the line to add
        return ("no failure record was written: mindguard attached Guard to no training of the command (it attaches "
                "to Model.train/fit and to an nn.TrainOneStepCell called by hand), and the script starts no "
                "mindguard.Guard or mindguard.watch of its own:\n  " + not_attached.replace("\n", "\n  ")
                + f"\n  (the command exited with code {rc}; its output is in {log_path})")
    return ("no failure record was written: the command never started a training with mindguard.Guard or "
            "mindguard.watch.\n  hunt needs the script to pass a Guard to model.train, e.g.\n"
            "      model.train(epochs, data, callbacks=[mindguard.Guard(), ...])\n"
            "  or to wrap its train step: train_step = mindguard.watch(train_step, net, optimizer)\n"
            f"  (the command exited with code {rc}; its output is in {log_path})")


def stopped_from_outside(signum: int, where: str, log_path: Path) -> str:
    return (f"the command was stopped by signal {signum} ({kill_name(signum)}) from outside at {where}, not by a "
            f"failure of its training: nothing to hunt (see {log_path})")


def script_raised(step: Optional[int], message: Optional[str], log_path: Path) -> str:
    return (f"pass 1: at global step {step} the script raised {message}.\n"
            f"  That is an error of the script (a callback of its own, the code between steps, or a network that "
            f"does not compile), not of the training's numbers: nothing to dump. Its traceback is in {log_path}")


def command_failed_without_failure(rc: int, log_path: Path) -> str:
    return (f"the command exited with code {rc} but training reported no failure "
            f"(see {log_path}); nothing to hunt (exit 4: the command failed, not its training)")


def healthy(loss_only: bool) -> str:
    if loss_only:
        return ("pass 1 finished with no failure: the loss stayed finite at every step (loss only: no Parameter "
                "was checked -- pass watch() the model whose MindSpore Parameters the step trains)")
    return "pass 1 finished with no failure: all losses and parameters stayed finite"


def failed_before_first_step(message: Optional[str], log_path: Path) -> str:
    return (f"the command failed before the first training step ({message or 'no message'}); "
            f"fix that first (see {log_path})")


NO_SEED = ("note: the script did not call mindguard.fix_randomness(seed); if pass 2 fails elsewhere, that is the "
           "first thing to fix")
REFUSAL_REPLAYED_IN_LOCATE = ("a GuardedTrainStep refused the update, so the step was captured and replayed in the "
                              "same run")
REFUSAL_REPLAYED = REFUSAL_REPLAYED_IN_LOCATE + ": no second pass needed"
PASS2_FROM_STEP_1 = "running pass 2 from step 1 instead"


def kept_but_not_resumed(state: str, why: str, always: bool) -> str:
    then = ": running pass 2 from step 1 (--resume always resumes)" if always else ""
    return f"the training state of {state} was kept, but {why}{then}"


def resumed_dump_missed(step: int) -> str:
    return (f"the dump of the resumed run does not hold global step {step} (its graphs were numbered otherwise); "
            f"dumping it from the state kept at it instead")


def did_not_repeat_from_kept_state(where: str, step: int, kind: Optional[str]) -> str:
    return (f"from the kept state the run {where}, not at global step {step} ({kind}): the step depends on random "
            f"state the kept Parameters do not hold")


def examine_pass(label: str, what: str, command: Sequence[str]) -> str:
    return f"{label} (examine: {what}): {shlex.join(command)}"


def diverged_stop(label: str, why: str) -> str:
    return f"{label} stopped: from the kept state the run computes something else ({why})"


def fast_forward_again(label: str, why: str, aside: Path) -> str:
    return (f"{label}: with the dataset reset to the kept step the run computes something else ({why}); again, "
            f"iterating the dataset there (the first attempt is in {aside})")


def failed_before_its_first_step(label: str, step: int, message: Optional[str], log_path: Path) -> str:
    return (f"{label} failed before its first step, so it could not examine global step {step}: "
            f"{message or 'no message'} (see {log_path})")


def not_examined(step: int, label: str, broken: str, log_path: Path) -> str:
    return (f"could not examine global step {step}: {label} {broken}.\n  That says nothing about whether the "
            f"failure repeats; its output is in {log_path}")


def computes_otherwise(label: str, where: str, step: int, kind: Optional[str]) -> str:
    return (f"{label} {where}, not at global step {step} ({kind}): run this way the step computes otherwise, so its "
            f"dump is no evidence for this failure")


def not_repeated_from_kept_state(label: str, where: str, step: int, kind: Optional[str]) -> str:
    return f"from the kept state {label} {where}, not at global step {step} ({kind})"


def not_reproducible(step: int, kind: Optional[str], label: str, where: str) -> str:
    return f"NOT REPRODUCIBLE: pass 1 failed at global step {step} ({kind}), {label} {where}.\n" + MAKE_IT_REPEAT


def repeated(label: str, step: Optional[int]) -> str:
    return f"{label} repeated the failure at global step {step}"


def where_it_failed(failed: bool, step: Optional[int], kind: Optional[str], message: Optional[str] = None,
                    with_message: bool = True) -> str:
    """``"did not fail"`` or ``"failed at global step N (kind: message)"``."""
    if not failed:
        return "did not fail"
    said = f"{kind}: {message or 'no message'}" if with_message else f"{kind}"
    return f"failed at global step {step} ({said})"


def mindguard_failed(label: str, message: str, log_path: Path, run: Path) -> str:
    return (f"{label}: mindguard itself failed (its own error, not your training's, and not a sign that the run does "
            f"not repeat):\n  {message.splitlines()[0][:500] if message else 'no message'}\n  The training's output "
            f"is in {log_path}; please report this to mindguard's maintainers with the run folder {run}")


def ended_early(where: str, how: str, log_path: Path) -> str:
    return (f"the command ended early {where} ({how}) without its record saying so: it recorded no failure and its "
            f"training did not finish (os._exit, or an exit from native code, skips the end of training).\n"
            f"  Nothing to hunt and no verdict on its numbers: see {log_path}")


def pass_could_not(pass_label: str, what: str, examine_recorded: bool, cause: str, log: str) -> str:
    said = (f"{pass_label} recorded a failure, but the hunt cannot examine it" if examine_recorded
            else f"{pass_label} could not {what}")
    return f"{said}: {cause} ({log})"


def disk_full(full: str) -> str:
    return (f"the run folder's disk is full ({full}): free space there, or give --run-dir a folder on a disk with "
            f"room (pass 2 dumps the failing step there)")


def dropped_dump(size: int) -> str:
    return f"; the incomplete dump ({size} bytes) was removed to make room for the summary"


def run_folder_removed(run: Path, recreated: bool) -> str:
    if recreated:
        return (f"the run folder {run} was removed while the hunt ran (what is there now was recreated by later "
                f"writes; the hunt does not use it)")
    return f"the run folder {run} was removed while the hunt ran"


def why_not_examined(what: str, reached: int, rc: int) -> str:
    at = f"at global step {reached}" if reached else "before its first step"
    return {"mindguard": f"broke inside mindguard {at}", "no_record": f"wrote no record (exit code {rc})",
            "ended_early": f"ended early {at} (exit code {rc}) without its record saying so"}.get(what, what + f" {at}")


def killed_at(stopped: bool, signum: int, reached: int) -> str:
    at = f"at global step {reached}" if reached else "before its first step"
    how = "stopped from outside by" if stopped else "killed by"
    return f"was {how} signal {signum} ({kill_name(signum)}) {at}"


def interrupted(name: str, during: str) -> str:
    return f"interrupted ({name}) {during}; stopping"


# -- the answer ------------------------------------------------------------------------------------------------
def replay_unexplained(step: Optional[int], kind: Optional[str], message: Optional[str], known: str,
                       log_path: Path) -> str:
    return (f"the replay of global step {step} found no operator or cell that turned finite values into Inf/NaN, so "
            f"it does not explain this failure ({kind}: {message or 'no message'}).\n{known}\n  The training's own "
            f"output is in {log_path}.")


def nothing_replayed(log_path: Path) -> str:
    return f"pass 2 captured no step to replay (see {log_path})"


def compiled_look(step: int) -> str:
    return (f"the replay of global step {step} isolated no operator; examining the step compiled instead: the "
            f"watched Cell run as one GRAPH-mode graph, every op's inputs and outputs dumped")


def compiled_look_found(step: int) -> str:
    return f"the compiled step's dump found what the replay of global step {step} could not see"


def every_iteration(iterations: Sequence[int], step: int) -> str:
    return (f"the dump of iteration(s) {'|'.join(map(str, iterations))} holds no file of global step {step} (its "
            f"iteration was not observed): dumping every iteration instead")


def widening(narrow: str, wide: str, from_step: Optional[int], step: Optional[int]) -> str:
    """``from_step``: the global step of the state the wider look resumes from (``None``: from step 1)."""
    where = ("from the state kept at it" if from_step is not None and from_step == step
             else f"from the state kept at global step {from_step} (the one at the step holds statistics only)"
             if from_step is not None else "from step 1 (no state was kept at it)")
    return f"the dump of {narrow} shows no operator that made the Inf/NaN; dumping {wide} of the same step, {where}"


def widening_from_step_1(wide: str, step: Optional[int]) -> str:
    return f"dumping {wide} of global step {step} from step 1 instead"


def not_analysed(dump_path: Path, exc: BaseException) -> str:
    return f"the dump in {dump_path} could not be analysed: {type(exc).__name__}: {exc}"


def iteration_renumbered(iteration: int, folder: str, step: Optional[int], recorded: int) -> str:
    return (f"dump iteration {iteration} of {folder} is global step {step} (dump iteration {recorded} in pass 1's "
            f"record): a pass that starts from a kept training state numbers its iterations from there")


def dump_unexplained(step: Optional[int], holds_nonfinite: bool, kind: Optional[str], message: Optional[str],
                     known: str, log_path: Path) -> str:
    shows = ("shows Inf/NaN but no operator that made it from finite values" if holds_nonfinite else
             "shows no Inf/NaN in the files mindguard could read and no operator where the step stopped")
    return (f"the dump of global step {step} {shows}, so it does not explain this failure ({kind}: "
            f"{message or 'no message'}).\n{known}\n  The training's own output is in {log_path}.")


def dataset_error(position: str, error: Optional[DatasetError], origin: Optional[Dict[str, Any]] = None) -> str:
    """The answer for a batch the dataset pipeline raised on (its frame and error, as the process said them);
    ``origin``: the data file MindSpore's error lines name, with what it holds (``analysis.datafile``)."""
    if origin is not None:
        return "\n".join([f"error: the dataset raised while producing the batch of {position}",
                          f"  --> {origin['name']}", f"   = origin: {origin['text']}"]
                         + ([f"   = {error.error}"] if error is not None and error.error else [])
                         + [f"help: fix or remove the data file {origin['name']} (re-download it, or drop it from the "
                            f"dataset and its list); a guard in the pipeline that skips undecodable files should say "
                            f"which it skipped"])
    lines = [f"error: the dataset raised while producing the batch of {position}"]
    source = error.source() if error is not None else None
    if source is not None:
        lines += [f"  --> {source['file']}:{source['line']} (in {source['function']})", "   |",
                  f"{source['line']:>3} | {source['code']}", "   |"]
    if error is not None and error.error:
        lines.append(f"   = {error.error}")
    lines.append("help: the pipeline runs ahead of training, so without mindguard hunt this exception arrives steps "
                 "before the batch that raised; fix the sample (or the source's __getitem__) named above")
    return "\n".join(lines)


def divergence_lines(entry: Optional[Dict[str, Any]]) -> List[str]:
    """Where the divergence began, for the answer (a record's ``divergence``: :mod:`mindguard.protocol.divergence`):
    said for a loss that climbed or spiked before the failure; nothing for one steady up to it."""
    if not entry or entry.get("kind") not in ("growth", "spike"):
        return []
    from ..protocol.divergence import words

    return ["\n".join(words(entry))]


def verify_next(line: str) -> str:
    return f"once the script is edited, check the fix without re-training:\n    {line}"


def outcome_line(label: str, run: Path, written: bool, code: Optional[int]) -> str:
    text = label.replace("_", " ")
    return f"{text}; everything is in {run}" if written else f"{text} (exit code {code})"


def last_lines(tail: str, count: int = 3) -> str:
    """The last ``count`` non-empty lines of a pass's output, to show the user (never to decide on)."""
    lines = [line.rstrip() for line in tail.splitlines() if line.strip()]
    return "\n  ".join(lines[-count:])


# -- reason codes in words -----------------------------------------------------------------------------------------
def dump_refusal(refusal: DumpRefusal) -> str:
    """Why a locate pass does not dump as it goes (:class:`~mindguard.hunt.verdicts.DumpRefusal`), one line: said to
    the user and kept as the summary's ``from_record.locate_dump``."""
    r, code = refusal, refusal.code
    if code == "no_locate_pass":
        return "no locate pass"
    if code == "no_failure":
        return "no failure to locate"
    if code == "several_ranks":
        return "several ranks (each rank's locate pass keeps its state; the examine pass dumps them together)"
    if code == "not_a_dump":
        return f"the step is examined by {r.how}, not a dump"
    if code == "killed":
        return "the run was killed: the step it died in is dumped whole, in a pass of its own"
    if code == "sink_mode":
        return "dataset sink mode (one iteration holds several steps)"
    if code == "size_unknown":
        return "the kept state does not say its size"
    if code == "window_too_wide":
        return f"the record does not say the training state's size, and the window holds {r.steps} steps"
    if code == "disk_space":
        return (f"{r.free_bytes / 1e9:.1f} GB free where the hunt writes, for ~{r.per_step_bytes / 1e9:.2f} GB of dump "
                f"a step and 1 GB to spare")
    if code == "writes_cost_more":
        return (f"~{r.writes_s:.1f}s of dump writes ({r.total_bytes / 1e9:.2f} GB over {r.steps} steps) cost more than "
                f"a pass of its own (~{r.second_pass_s:.1f}s: ~{r.startup_s:.1f}s to its first step, the rest to hand "
                f"it the state)")
    return (f"~{r.total_bytes / 1e9:.2f} GB of dump over {r.steps} steps (~{r.per_step_bytes / 1e6:.0f} MB a step) "
            f"costs more than a pass of its own")


def locate_fallback(verdict: LocateVerdict, span: str, kind: Optional[str]) -> str:
    """Why ``hunt --from`` falls back to the plain hunt after its locate pass from the kept state (a
    :class:`~mindguard.hunt.verdicts.LocateVerdict` that ``falls_back``; ``span``: the window's words; ``kind``: the
    record's failure kind)."""
    if verdict.code == "unfit" and verdict.diverged:
        return verdict.diverged
    missed = (approximate_missed(span, verdict.where) if verdict.other_masks
              else f"from the kept state the run {verdict.where}, not a failure within {span}")
    return f"{missed} ({kind})"


def resumed_fallback(fallback: Fallback) -> str:
    """Why ``hunt --from`` falls back to the plain hunt after its examine pass from the kept state."""
    if fallback.code == "unfit" and fallback.detail:
        return fallback.detail
    return "the failure did not repeat from the kept state"
