"""mindguard benchmarks: what the guards cost a healthy run, and what the hunt costs a failing one.

    python benchmarks/run.py                      # every section (a few minutes on 2 CPU cores)
    python benchmarks/run.py --quick              # smoke run: fewer models, steps and repeats
    python benchmarks/run.py --only overhead --models mlp --repeats 7

Sections (``--only`` takes a comma-separated list):

* ``overhead`` -- per-step time of a real training (GRAPH mode, CPU) with a callback / step cell vs the same
  training bare. One process builds every variant's Model once (compiled in round 0, which is not
  counted), then runs rounds: each round trains every variant for one epoch of ``--steps`` steps, in a
  rotated order. Step time = time between two consecutive ``on_train_step_begin`` of a timing callback
  placed first, so it includes the step and every callback's hooks; a round's value is the mean step from the
  second step's begin to the last one's (what the rare steps that check the Parameters or keep the training state
  cost is in it; the median step, shown too, leaves them out). Ratios are paired per round (variant / bare of the
  same round): their median, a 90% bootstrap confidence interval of it, and the range over rounds. Many short
  rounds make the pairs close in time, so the machine's drift cancels. For ``Guard`` a row also accounts its own
  time a step: the mean time its step hooks add to bare's (everything it does in a step runs in them, the budgeted
  Parameter checks and kept states included, whose share is shown; a call's end, and the check it forces, are
  outside), against bare's step. ``--pin`` pins
  MindSpore's compute threads to distinct cores from round 1 on (unpinned, the scheduler sometimes stacks them on
  one core for dozens of steps: the same bare step is then 2.7 or 4.7 ms by chance). Besides the guards, the
  rows ``host check only``, ``compiled check only`` and the control (numpy reading another buffer of the
  Parameters' size) show where a guard's time goes; ``mlp_b128`` is the ``mlp`` at batch 128 (5-10 ms steps).
* ``analyze`` -- ``analyze_dump`` on a dump of one failing iteration vs ``np.load`` of every file of that
  dump (warm page cache: everything is read once before timing), and the analyzer's peak memory
  (tracemalloc, in a fresh process) vs the largest tensor in the dump.
* ``dumpsize`` -- bytes written by ``DumpOnDemand`` (only the failing iteration) vs ``iteration: "all"``
  for the same 20-step run that fails at its last step (two subprocess trainings).
* ``resnetdump`` -- bytes of the dump a hunt of a ResNet-18 (32x32, batch 8) writes, with ``Model(net, loss, opt)``
  and with a clip + EMA train step: the full dump of the failing step (``--resume never``) vs the hunt's narrow
  one and the widened one (``--dump-scope all_outputs``); the answer of each (not in ``--quick``; ~6 minutes).
* ``fromrun`` -- from a failing run to its culprit: the MLP trained with ``Guard()`` until it fails at step 60 or
  1500, then ``mindguard hunt --from`` the record it wrote (no re-training from step 1) vs the plain hunt; the
  examination time must not grow with the step (<= 1.3x from 60 to 1500).
* ``hunt`` -- wall time of ``mindguard hunt -- <training>`` vs the same training run once until it fails
  (``Guard`` with action="stop", which is what pass 1 of the hunt is), both as fresh processes; pass 2 from
  step 1 (``--resume never``) and resumed (``--keep-every 50``), for the same MLP failing at step 30 and 600.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SECTIONS = ("overhead", "watch", "analyze", "bigtensor", "dumpsize", "resnetdump", "hunt", "fromrun")
sys.path.insert(0, str(HERE))


# ------------------------------------------------------------------------------------------ helpers
def _child_env() -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    for key in [k for k in env if k.startswith("MINDGUARD_")]:
        env.pop(key)
    env["GLOG_v"] = "3"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def _run(cmd: Sequence[str], *, cwd: Optional[Path] = None, expect: Tuple[int, ...] = (0,)) -> float:
    """Run ``cmd`` as a fresh process; return its wall time in seconds (raises with its output on a bad exit)."""
    start = time.perf_counter()
    proc = subprocess.run(list(cmd), cwd=cwd, env=_child_env(), capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode not in expect:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode} (expected {expect})\n"
                           f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}")
    return elapsed


def _spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """``median [min-max]`` of ``values``."""
    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


class Table:
    """Rows of (benchmark, measured, ratio, goal, note), printed as one aligned table at the end."""

    HEADER = ("benchmark", "measured (median [min-max])", "ratio to baseline (median [min-max])", "goal", "verdict")

    def __init__(self):
        self.rows: List[Tuple[str, str, str, str, str]] = []
        self.notes: List[str] = []

    def add(self, name: str, measured: str, ratio: str = "", goal: str = "", verdict: str = "") -> None:
        self.rows.append((name, measured, ratio, goal, verdict))

    def render(self) -> str:
        rows = [self.HEADER] + self.rows
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER))]

        def line(r: Tuple[str, ...]) -> str:
            return "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()

        out = [line(self.HEADER), "  ".join("-" * w for w in widths)] + [line(r) for r in self.rows]
        if self.notes:
            out += [""] + [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    @classmethod
    def from_text(cls, text: str) -> "Table":
        """The table :meth:`render` printed (a saved run's output), read back: columns are cut where the header's
        names start, so a row's cells are where render put them."""
        lines = text.splitlines()
        head = next(i for i, ln in enumerate(lines) if ln.startswith(cls.HEADER[0]) and cls.HEADER[1] in ln)
        starts = [lines[head].index(name) for name in cls.HEADER]
        table = cls()
        for line in lines[head + 2:]:
            if line.startswith("note: "):
                table.notes.append(line[len("note: "):])
            elif line.strip():
                cells = [line[a:b].rstrip() for a, b in zip(starts, starts[1:] + [None])]
                table.rows.append((cells[0], *(c.strip() for c in cells[1:])))   # type: ignore[arg-type]
        return table


def markdown(run: Dict[str, object]) -> str:
    """A saved run (what ``--json`` writes) as the Markdown the docs' benchmark page includes: how and where it
    was measured, then the table (a row indented under its baseline keeps its indent), then the notes."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    def name(text: str) -> str:
        indent = len(text) - len(text.lstrip(" "))
        return "&nbsp;" * (2 * indent) + cell(text.strip()) if indent else f"**{cell(text)}**"

    lines = [f"Measured on commit `{run['commit']}`{' (uncommitted changes)' if run.get('dirty') else ''}, "
             f"{run['date']}: `{run['command']}`" + (f" ({run['total_s']:.0f} s)" if run.get("total_s") else "")
             + ".", "", f"Machine: {run['machine']}.", ""]
    if run.get("label"):
        lines[0:0] = [f"*{run['label']}*", ""]
    header = Table.HEADER
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in run["rows"]:  # type: ignore[union-attr]
        lines.append("| " + " | ".join([name(row[0])] + [cell(c) for c in row[1:]]) + " |")
    notes = run.get("notes") or []
    if notes:
        lines += [""] + [f"- note: {cell(n)}" for n in notes]  # type: ignore[union-attr]
    return "\n".join(lines) + "\n"


def git_commit() -> Tuple[str, bool]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""
    return git("rev-parse", "--short", "HEAD") or "unknown", bool(git("status", "--porcelain", "--untracked-files=no"))


def write_outputs(run: Dict[str, object], json_path: Optional[str], markdown_path: Optional[str]) -> None:
    for path, text in ((json_path, json.dumps(run, indent=2) + "\n"), (markdown_path, markdown(run) if markdown_path
                                                                       else "")):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
            _say(f"wrote {path}")


def _median_ci(values: Sequence[float], level: float = 0.9, draws: int = 4000) -> Tuple[float, float]:
    """A ``level`` bootstrap confidence interval of the median of ``values`` (resampled with a fixed seed)."""
    data = np.asarray(values, dtype=float)
    if data.size < 3:
        return float(data.min()), float(data.max())
    medians = np.median(np.random.default_rng(0).choice(data, (draws, data.size)), axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def _verdict(ratios: Sequence[float], goal: float) -> str:
    if not ratios:
        return ""
    return "ok" if statistics.median(ratios) <= goal else "over"


def _say(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def pinned_compute_threads(enabled: bool = True):
    """Pin MindSpore's CPU compute threads (``ActorThread_*`` with this thread on the first core, each
    ``KernelThread_*`` on the next ones) for the block; every thread's affinity is restored after it.

    Why: unpinned, the Linux scheduler sometimes stacks the actor and the kernel thread on one core for dozens of
    steps, which makes the same bare step 2.7 or 4.7 ms (measured: docs/mindspore-facts.md); a round's median then
    says which mode it drew, not what a callback costs. Yields what was pinned (``""``: nothing, not asked for,
    one core, or no such threads: call it after the first compile has started them)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    saved: Dict[int, set] = {}
    pinned: List[str] = []
    if enabled and len(cores) >= 2:
        kernels = 0
        for tid_text in sorted(os.listdir("/proc/self/task")):
            tid = int(tid_text)
            try:
                name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
                if name.startswith("ActorThread"):
                    core = cores[0]
                elif name.startswith("KernelThread"):
                    kernels += 1
                    core = cores[kernels % len(cores)]
                else:
                    continue
                saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, {core})
                pinned.append(f"{name}->{core}")
            except OSError:   # the thread ended meanwhile
                continue
        if pinned:
            saved[0] = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {cores[0]})
            pinned.append(f"main->{cores[0]}")
    try:
        yield ", ".join(pinned)
    finally:
        for tid, mask in saved.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, mask)


def _check_only(net, how: str):
    """A callback doing only the parameter check at every step end: ``how`` is "host" (numpy reads the
    Parameters), "compiled" (the compiled check) or "other" (numpy reads another buffer of the Parameters' size:
    the control for the host read)."""
    from mindspore.train import Callback

    from mindguard.training.checks.finite import ParamChecker

    class CheckOnly(Callback):
        def __init__(self):
            super().__init__()
            params = net.trainable_params()
            self.checker = ParamChecker(params, on_host=(how == "host")) if how != "other" else None
            self.other = np.ones(sum(p.size for p in params), np.float32) if how == "other" else None

        def on_train_step_end(self, run_context):
            if self.checker is not None:
                self.checker.nonfinite_names()
            else:
                float(np.dot(self.other, self.other))

    return CheckOnly()


# ----------------------------------------------------------------------------------- 1. overhead
def _overhead_variants(scratch: Path) -> List[Tuple[str, Callable]]:
    """(name, factory) pairs; a factory gets (network, loss_fn) and returns (train_network_or_None, callbacks)."""
    import mindguard as mg
    from mindspore.train import LossMonitor

    variants = [
        ("bare", lambda net, loss: (None, [])),
        ("LossMonitor(1)", lambda net, loss: (None, [LossMonitor(1)])),
        ("FailureLocator", lambda net, loss: (None, [mg.locator.FailureLocator(scratch / f"loc{id(net)}.json",
                                                                       check_params=True, action="stop")])),
        ("Guard", lambda net, loss: (None, [mg.Guard(record=str(scratch / f"guard{id(net)}.json"))])),
        # the exact check of earlier releases: every Parameter after every step, no state kept
        ("Guard(check_every_step=True)", lambda net, loss: (None, [mg.Guard(
            record=str(scratch / f"every{id(net)}.json"), check_every_step=True, keep_state=False)])),
        # the GPU/Ascend default run on CPU: the compiled check, its verdict read at the next step's end
        ("Guard(defer_check=True)", lambda net, loss: (None, [mg.Guard(record=str(scratch / f"defer{id(net)}.json"),
                                                                       defer_check=True)])),
    ]
    from mindspore import nn

    # the like-for-like baseline of GuardedTrainStep: the same cells, built and passed to Model the same way
    variants.append(("TrainOneStepCell", lambda net, loss: (
        nn.TrainOneStepCell(nn.WithLossCell(net, loss), _optimizer(net)), [])))

    def guarded(net, loss, with_guard=False):
        step = mg.GuardedTrainStep(nn.WithLossCell(net, loss), _optimizer(net))
        return step, ([mg.Guard(record=str(scratch / f"gstep{id(net)}.json"))] if with_guard else [])

    variants.append(("GuardedTrainStep", guarded))
    variants.append(("GuardedTrainStep+Guard", lambda net, loss: guarded(net, loss, True)))
    # where the Guard's time goes: the two parameter checks alone, and the control for the host one
    variants.append(("host check only (numpy reads the Parameters)",
                     lambda net, loss: (None, [_check_only(net, "host")])))
    variants.append(("compiled check only", lambda net, loss: (None, [_check_only(net, "compiled")])))
    variants.append(("control: numpy reads another buffer of that size",
                     lambda net, loss: (None, [_check_only(net, "other")])))
    return variants


def _optimizer(net):
    from mindspore import nn

    return nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)


def bench_overhead(table: Table, models: Sequence[str], steps: int, repeats: int, scratch: Path,
                   only_variants: Optional[Sequence[str]] = None, pipeline: str = "numpy", pin: bool = False) -> None:
    import mindspore as ms
    from mindspore.train import Callback, Model

    import mindguard as mg
    import workloads

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

    class StepTimer(Callback):
        """First in the callback list: perf_counter (and process CPU time) at every step begin, perf_counter at
        every step end."""

        def __init__(self):
            super().__init__()
            self.begins: List[float] = []
            self.cpu: List[float] = []
            self.ends: List[float] = []

        def on_train_begin(self, run_context):
            self.begins, self.cpu, self.ends = [], [], []

        def on_train_step_begin(self, run_context):
            self.begins.append(time.perf_counter())
            self.cpu.append(time.process_time())  # all threads of this process: less sensitive to other load

        def on_train_step_end(self, run_context):
            self.ends.append(time.perf_counter())

    class TailTimer(StepTimer):
        """Last in the callback list: with the StepTimer it brackets every other callback's step hooks; at every
        step end it also reads what the variant's Guard has spent so far, checking and keeping (seconds)."""

        def __init__(self, mg_run):
            super().__init__()
            self.mg_run, self.spent = mg_run, []

        def on_train_begin(self, run_context):
            super().on_train_begin(run_context)
            self.spent = []

        def on_train_step_end(self, run_context):
            super().on_train_step_end(run_context)
            budget, keeper = self.mg_run.checks.budget, self.mg_run.state.keeper
            if budget is not None:
                self.spent.append((budget.spent, keeper.seconds if keeper is not None else 0.0))

    variants = _overhead_variants(scratch)
    if only_variants:
        by = dict(variants)
        variants = [variants[0]] + [(f"{v}#{i}" if only_variants.count(v) > 1 else v, by[v])
                                    for i, v in enumerate(only_variants) if v in by]
    arrays_by_model = {m: workloads.batches(m, steps) for m in models}
    for model_name in models:
        runs = []
        for name, factory in variants:
            mg.fix_randomness(0)
            net, loss_fn = workloads.build(model_name)
            mg_run = mg.run.reset_run()   # the variant's own run (its Guard's run), kept over every round
            step_cell, callbacks = factory(net, loss_fn)
            model = Model(step_cell) if step_cell is not None else Model(net, loss_fn, _optimizer(net))
            timer, tail = StepTimer(), TailTimer(mg_run)
            runs.append({"name": name, "model": model, "callbacks": [timer] + callbacks + [tail], "timer": timer,
                         "tail": tail, "net": net, "hooks": [], "hooks_mean": [], "mg_run": mg_run, "seconds": 0.0,
                         "data": workloads.dataset(arrays_by_model[model_name], workloads.batch_size(model_name),
                                                   pipeline=pipeline, scratch=scratch),
                         "rounds": [], "medians": [], "cpu": [],
                         "checking": 0.0, "keeping": 0.0, "spent_steps": 0})
        params = workloads.param_count(net)
        _say(f"overhead/{model_name} ({pipeline} pipeline): {params / 1e6:.2f}M parameters, {len(runs)} variants, "
             f"{repeats} rounds of {steps} steps (+1 compile round)")
        with contextlib.ExitStack() as pinning:
            for round_index in range(repeats + 1):
                if round_index == 1:   # round 0 compiled every graph and started MindSpore's threads
                    pinned = pinning.enter_context(pinned_compute_threads(pin))
                    table.notes.append(f"overhead/{model_name}: compute threads pinned: {pinned or 'no (unpinned)'}")
                shift = round_index % len(runs)
                for run in runs[shift:] + runs[:shift]:
                    # each variant is a long training of its own (one mindguard run over every round: its budget and
                    # kept states go on from round to round, as over the epochs of one training)
                    mg.run._RUN = run["mg_run"]
                    began = time.perf_counter()
                    with contextlib.redirect_stdout(io.StringIO()):  # LossMonitor prints every step
                        run["model"].train(1, run["data"], callbacks=run["callbacks"], dataset_sink_mode=False)
                    run["seconds"] += time.perf_counter() - began   # the compile round is training time too
                    if round_index > 0:  # round 0 compiles every graph
                        begins = run["timer"].begins
                        # the mean step from the second step's begin to the last one's: every step's whole cost (the
                        # budgeted checks and kept states included), without the call's start and end
                        run["rounds"].append((begins[-1] - begins[1]) / (len(begins) - 2) * 1000.0)
                        run["medians"].append(float(np.median(np.diff(begins))) * 1000.0)
                        spent = run["tail"].spent
                        if len(spent) > 2:   # from the end of step 1 to the end of the next-to-last step: in the
                            # timed window (a call's end and its forced check are not)
                            run["checking"] += spent[-2][0] - spent[0][0]
                            run["keeping"] += spent[-2][1] - spent[0][1]
                            run["spent_steps"] += len(spent) - 2
                        run["cpu"].append(float(np.median(np.diff(run["timer"].cpu))) * 1000.0)
                        t, tail = run["timer"], run["tail"]
                        hooks = ((np.asarray(tail.begins) - np.asarray(t.begins))
                                 + (np.asarray(tail.ends) - np.asarray(t.ends)))
                        run["hooks"].append(float(np.median(hooks)) * 1000.0)
                        run["hooks_mean"].append(float(np.mean(hooks[1:-1])) * 1000.0)   # the timed steps
        by_name = {run["name"]: run for run in runs}
        bare, bare_cpu = runs[0]["rounds"], runs[0]["cpu"]
        table.add(f"step {model_name} ({params / 1e6:.2f}M params, batch {workloads.batch_size(model_name)}) bare: "
                  f"Model(net, loss, opt)",
                  _spread(bare, "{:.1f}") + " ms", f"cpu {_spread(bare_cpu, '{:.1f}')} ms")
        for run in runs[1:]:
            if run["name"].startswith("GuardedTrainStep") and "TrainOneStepCell" in by_name:
                base_name, base = "TrainOneStepCell", by_name["TrainOneStepCell"]
                goal_text, goal = "<= 1.02x TrainOneStepCell", 1.02
            else:
                base_name, base = "bare", runs[0]
                goal_text, goal = ("<= 1.02x bare" if run["name"] in ("FailureLocator", "Guard")
                                   else "reference"), 1.02
            ratios = [v / b for v, b in zip(run["rounds"], base["rounds"])]
            median_ratios = [v / b for v, b in zip(run["medians"], base["medians"])]
            low, high = _median_ci(ratios)
            hook_share = ((statistics.median(run["hooks"]) - statistics.median(base["hooks"]))
                          / statistics.median(base["rounds"]))
            verdict = "" if goal_text == "reference" else _verdict(ratios, goal)
            table.add(f"  {model_name} + {run['name']}",
                      _spread(run["rounds"], "{:.2f}") + f" ms, hooks {_spread(run['hooks'], '{:.3f}')} ms",
                      f"{statistics.median(ratios):.3f}x vs {base_name} (90% CI {low:.3f}-{high:.3f}; rounds "
                      f"{min(ratios):.3f}-{max(ratios):.3f}; median steps {statistics.median(median_ratios):.3f}x; "
                      f"hooks +{hook_share:.1%} of its step)", goal_text, verdict)
        guard = by_name.get("Guard")
        budget = guard["mg_run"].checks.budget if guard is not None else None
        if guard is not None and budget is not None:   # what the always-on Guard spent, and on what
            mg_run, checks = guard["mg_run"], budget.describe()
            keeper = mg_run.state.keeper
            table.add(f"  {model_name} + Guard: Parameter checks",
                      f"{checks['checks']} checks, every ~{checks['every_steps']} steps, {checks['check_ms']} ms each",
                      f"budget {checks['fraction']:.1%} of the step time", "", "")
            if keeper is not None:
                from mindguard._util.io import tree_size

                kept = tree_size(keeper.directory)[0] if keeper.directory.exists() else 0
                share = keeper.seconds / guard["seconds"] if guard["seconds"] else 0.0   # every round's, round 0's too
                table.add(f"  {model_name} + Guard: training state kept",
                          f"{len(keeper.on_disk_states)} state(s) on disk ({_mb(kept)}), "
                          f"{keeper.seconds * 1e3:.0f} ms copying and writing in {guard['seconds']:.0f} s",
                          f"{share:.2%} of the training time", "<= 0.5%", "ok" if share <= 0.005 else "over")
            # Guard's own time in a step, accounted: everything it does in a step runs inside its step hooks (the
            # budgeted checks and the kept states too), so it is the mean time its hooks add over bare's timer
            # hooks; of it, the checks' and kept states' seconds within the timed steps -- against bare's mean step
            spent_steps = max(guard["spent_steps"], 1)
            own_ms = statistics.median(guard["hooks_mean"]) - statistics.median(runs[0]["hooks_mean"])
            checks_ms = guard["checking"] * 1e3 / spent_steps
            keep_ms = guard["keeping"] * 1e3 / spent_steps
            bare_ms = statistics.median(runs[0]["rounds"])
            accounted = own_ms / bare_ms
            table.add(f"  {model_name} + Guard: its own time a step, accounted",
                      f"{own_ms:.3f} ms (the Parameter checks {checks_ms:.3f}, the kept states {keep_ms:.3f})",
                      f"{1 + accounted:.3f}x bare's {bare_ms:.2f} ms step", "<= 1.02x bare",
                      "ok" if accounted <= 0.02 else "over")
        if "TrainOneStepCell" in by_name:  # do the compared variants do the same work? same weights after all rounds
            reference = [p.asnumpy() for p in runs[0]["net"].trainable_params()]
            same = {name: all(np.array_equal(a, p.asnumpy()) for a, p in zip(reference, run["net"].trainable_params()))
                    for name, run in by_name.items()
                    if name in ("FailureLocator", "Guard", "Guard(defer_check=True)", "TrainOneStepCell",
                                "GuardedTrainStep")}
            table.notes.append(f"{model_name}: weights after every round bit-identical to bare's: "
                               + ", ".join(f"{k} {v}" for k, v in same.items()))


def bench_components(table: Table, models: Sequence[str], repeats: int, scratch: Path) -> None:
    """Where the FailureLocator's per-step time goes: the in-place progress write (and, for comparison,
    an atomic rename) and the parameter check (CPU: BLAS over zero-copy views; GPU/Ascend: compiled)."""
    import mindspore as ms
    from mindguard._util.io import JsonSlot, atomic_write_bytes
    from mindguard.training.checks.finite import ParamChecker as _ParamChecker
    from mindguard.protocol.record import FailureRecord

    import workloads

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    record = FailureRecord(status="running", epoch=1, step_in_epoch=3, global_step=3, dump_iteration=2,
                           steps_per_epoch=20, device_target="CPU")
    path = scratch / "component.json"
    slot = JsonSlot(path)
    atomic_write_bytes(path, slot.padded(record.to_dict()))
    slot.reopen()
    n = 200

    def per_call_ms(call, count: int) -> List[float]:
        out = []
        for _ in range(max(repeats, 3)):
            start = time.perf_counter()
            for _ in range(count):
                call()
            out.append((time.perf_counter() - start) / count * 1000.0)
        return out

    table.add("  per step: progress write (in place, what FailureLocator does)",
              _spread(per_call_ms(lambda: slot.write(record.to_dict()), n)) + " ms")
    table.add("  (for comparison: the same write as an atomic rename)",
              _spread(per_call_ms(lambda: record.save(scratch / "renamed.json"), n)) + " ms")
    slot.close()
    for model_name in models:
        ms.set_seed(0)
        net, _ = workloads.build(model_name)
        for on_host, how in ((True, "host BLAS, CPU default"), (False, "compiled, GPU/Ascend default")):
            checker = _ParamChecker(net.trainable_params(), on_host=on_host)
            checker.nonfinite_names()  # compile
            table.add(f"  per step: parameter check, {model_name} ({how})",
                      _spread(per_call_ms(checker.nonfinite_names, 20)) + " ms")


# ------------------------------------------------------------------------------------ 2. analyze
def _make_failing_dump(scratch: Path, steps: int, hidden: int) -> Tuple[Path, int]:
    dump = scratch / "dump_one"
    iteration = steps - 1
    _run([sys.executable, str(HERE / "failing_train.py"), "--steps", str(steps), "--poison", str(steps),
          "--hidden", str(hidden), "--dump-iteration", str(iteration), "--dump-path", str(dump)])
    return dump, iteration


_MEMORY_PROBE = r"""
import json, sys, time, tracemalloc
from mindguard.analysis import analyze_dump
def hwm_kb():  # this process's peak RSS (ru_maxrss would include the parent's peak: it survives exec)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0
base = hwm_kb()
tracemalloc.start()
report = analyze_dump(sys.argv[1], iteration=int(sys.argv[2]))
current, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
rss = hwm_kb()
origin = report.to_dict().get("origin") or {}
print(json.dumps({"peak": peak, "rss_before_kb": base, "rss_after_kb": rss, "origin": origin.get("op_type"),
                  "mindspore_imported": "mindspore" in sys.modules}))
"""


def bench_analyze(table: Table, repeats: int, scratch: Path, steps: int, hidden: int) -> None:
    from mindguard._util.io import load_npy
    from mindguard.analysis import analyze_dump

    _say(f"analyze: generating a dump of the failing iteration (MLP hidden={hidden}, {steps} steps)")
    dump, iteration = _make_failing_dump(scratch, steps, hidden)
    files = sorted(dump.rglob("*.npy"))
    from mindguard._util.io import tree_size

    total, count = tree_size(dump)
    largest = max(files, key=lambda f: f.stat().st_size)
    largest_bytes = load_npy(largest).nbytes

    def load_all():
        for f in files:
            np.load(f, allow_pickle=False)

    def analyze():
        analyze_dump(dump, iteration=iteration)

    load_all(), analyze()  # warm the page cache (and imports) for both
    loads, analyses, ratios = [], [], []
    for r in range(repeats):
        pair = [("load", load_all), ("analyze", analyze)]
        if r % 2:
            pair.reverse()
        times = {}
        for name, fn in pair:
            start = time.perf_counter()
            fn()
            times[name] = time.perf_counter() - start
        loads.append(times["load"] * 1000)
        analyses.append(times["analyze"] * 1000)
        ratios.append(times["analyze"] / times["load"])
    table.add(f"np.load every file of the dump ({count} files, {count and len(files)} .npy, {_mb(total)})",
              _spread(loads, "{:.0f}") + " ms")
    table.add("  analyze_dump on the same dump (warm cache)", _spread(analyses, "{:.0f}") + " ms",
              _spread(ratios, "{:.2f}") + "x", "<= 2x np.load", _verdict(ratios, 2.0))
    out = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(dump), str(iteration)], env=_child_env(),
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    probe = json.loads(out)
    table.add("  analyze_dump peak traced memory (fresh process)", _mb(probe["peak"]),
              f"{probe['peak'] / largest_bytes:.2f}x largest tensor ({_mb(largest_bytes)})", "", "")
    table.notes.append(f"analyze: origin found = {probe['origin']}; process max RSS {probe['rss_after_kb'] / 1024:.0f} "
                       f"MB "
                       f"(after imports {probe['rss_before_kb'] / 1024:.0f} MB); MindSpore imported by the analyzer: "
                       f"{probe['mindspore_imported']}; timings are warm-cache (every file read once before timing)")


# ----------------------------------------------------------------------------------- 3. dumpsize
def bench_dumpsize(table: Table, scratch: Path, steps: int, hidden: int) -> None:
    one, every = scratch / "size_one", scratch / "size_all"
    base = [sys.executable, str(HERE / "failing_train.py"), "--steps", str(steps), "--poison", str(steps),
            "--hidden", str(hidden)]
    _say(f"dumpsize: two {steps}-step trainings (MLP hidden={hidden}): failing iteration only vs all")
    t_one = _run(base + ["--dump-iteration", str(steps - 1), "--dump-path", str(one)])
    t_all = _run(base + ["--dump-all", str(every)])
    from mindguard._util.io import tree_size

    b_one, f_one = tree_size(one)
    b_all, f_all = tree_size(every)
    table.add(f"dump iteration \"all\" ({steps} steps, {f_all} files)", f"{_mb(b_all)}, run {t_all:.1f} s")
    table.add(f"  DumpOnDemand: failing iteration only ({f_one} files)", f"{_mb(b_one)}, run {t_one:.1f} s",
              f"{b_one / b_all:.3f}x bytes", f"~1/{steps}", "ok" if b_one / b_all <= 1.5 / steps else "over")
    shutil.rmtree(every, ignore_errors=True)


# ---------------------------------------------------------------------------------- bigtensor
_BIG_CHILD = """
import resource, sys, time, tracemalloc
from mindguard.analysis import analyze_dump
tracemalloc.start()
start = time.perf_counter()
report = analyze_dump(sys.argv[1], progress=False)
took = time.perf_counter() - start
peak = tracemalloc.get_traced_memory()[1]
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(f"RESULT {rss} {took} {peak} {report.origin['op_type'] if report.origin else None}")
"""


def bench_bigtensor(table: Table, scratch: Path, gigabytes: float) -> None:
    """``mindguard analyze`` of a dump whose one op output is a ``gigabytes`` GB float32 tensor (valid header, Inf in
    its last element; its input finite): peak RSS of a fresh analyzing process vs the tensor's size. The tensor is
    memory-mapped and scanned in chunks, so the peak must be a small multiple of one chunk, not of the tensor."""
    import mindguard  # noqa: F401 - the child imports it the same way

    iteration_dir = scratch / "big" / "rank_0" / "Net" / "0" / "0"
    iteration_dir.mkdir(parents=True)
    n = int(gigabytes * 2**30) // 4
    stamp = time.time_ns() // 1000
    name = "Default_network-Net_Exp-op0"
    header_in = iteration_dir / f"Exp.{name}.0.0.{stamp}.input.0.DefaultFormat.Float32.npy"
    np.save(header_in, np.zeros(16, np.float32))
    out = iteration_dir / f"Exp.{name}.0.0.{stamp + 1}.output.0.DefaultFormat.Float32.npy"
    big = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n,))
    big[-1] = np.inf
    big.flush()
    del big
    env = _child_env()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _BIG_CHILD, str(scratch / "big")], capture_output=True, text=True,
                          env=env, timeout=1800)
    wall = time.perf_counter() - start
    line = next((out for out in proc.stdout.splitlines() if out.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"analyze child failed: {proc.stderr[-2000:]}")
    _, rss, took, peak, op = line.split()
    size = n * 4
    table.add(f"analyze_dump of a {size / 2**30:.1f} GB float32 tensor (fresh process)",
              f"allocated peak {int(peak) / 2**20:.1f} MB, {float(took):.1f} s (wall {wall:.1f} s)",
              f"{int(peak) / size:.4f}x the tensor", "bounded (not a multiple of the tensor)",
              f"origin {op}")
    table.add("  (max RSS, which counts the memory-mapped file's pages read)", f"{int(rss) / 2**20:.0f} MB",
              f"{int(rss) / size:.3f}x the tensor")
    shutil.rmtree(scratch / "big", ignore_errors=True)


# -------------------------------------------------------------------------------------- watch
def bench_watch(table: Table, steps: int, repeats: int, scratch: Path, pin: bool = False) -> None:
    """The functional loop: ``@jit`` ``train_step`` bare vs ``mindguard.watch(train_step, net, optimizer)`` on the
    MLP workload, same process, interleaved rounds (each round: one pass over ``steps`` batches per variant);
    a round's value is the median step time; ratios paired per round."""
    import mindspore as ms

    import mindguard as mg
    import workloads

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    arrays = workloads.batches("mlp", steps)
    xs = [ms.Tensor(arrays["x"][i * 32:(i + 1) * 32]) for i in range(steps)]
    ys = [ms.Tensor(arrays["y"][i * 32:(i + 1) * 32]) for i in range(steps)]
    def tutorial_step(net, loss_fn, optimizer):
        def forward_fn(x, y):
            logits = net(x)
            return loss_fn(logits, y), logits

        grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

        @ms.jit
        def train_step(x, y):
            (loss, _), grads = grad_fn(x, y)
            optimizer(grads)
            return loss
        return train_step

    loops = {}
    for name in ("bare train_step", "watch(train_step)"):
        mg.fix_randomness(0)
        net, loss_fn = workloads.build("mlp")
        optimizer = _optimizer(net)
        train_step = tutorial_step(net, loss_fn, optimizer)
        if name.startswith("watch"):
            mg.run.reset_run()
            train_step = mg.watch(train_step, net, optimizer, record=str(scratch / "watch.json"))
        loops[name] = train_step
    times: Dict[str, List[float]] = {name: [] for name in loops}
    _say(f"watch: {repeats} rounds of {steps} steps, bare vs watch (MLP, @jit train_step)")
    with contextlib.ExitStack() as pinning:
        for round_index in range(repeats + 1):
            if round_index == 1:
                pinning.enter_context(pinned_compute_threads(pin))
            order = list(loops) if round_index % 2 else list(reversed(list(loops)))
            for name in order:
                step, marks = loops[name], []
                for x, y in zip(xs, ys):
                    marks.append(time.perf_counter())
                    step(x, y).asnumpy()
                marks.append(time.perf_counter())
                if round_index > 0:  # round 0 compiles
                    times[name].append(float(np.median(np.diff(marks))) * 1000.0)
    bare, watched = times["bare train_step"], times["watch(train_step)"]
    ratios = [w / b for w, b in zip(watched, bare)]
    table.add("functional loop mlp: bare @jit train_step (loss read every step)", _spread(bare, "{:.1f}") + " ms")
    table.add("  mindguard.watch(train_step, net, optimizer)", _spread(watched, "{:.1f}") + " ms",
              _spread(ratios, "{:.3f}") + "x vs bare", "<= 1.02x bare", _verdict(ratios, 1.02))


# --------------------------------------------------------------------------------------- 4. hunt
def bench_hunt(table: Table, repeats: int, scratch: Path, workloads_: Sequence[str], keep_every: int = 50) -> None:
    """Per workload and round, side by side in rotating order: the plain run to the failure, ``mindguard hunt
    --resume never`` (pass 2 from step 1) and ``mindguard hunt --keep-every K`` (pass 2 from the state pass 1
    kept at most K steps before the failure, when that is quicker)."""
    commands = {
        "norm_nan demo": [sys.executable, "-m", "mindguard.demos.norm_nan"],
        "MLP 1.86M, fails at step 20": [sys.executable, str(HERE / "failing_train.py"), "--guard"],
        "MLP 1.86M, fails at step 30": [sys.executable, str(HERE / "failing_train.py"), "--guard", "--steps", "30",
                                        "--poison", "30"],
        "MLP 1.86M, fails at step 600": [sys.executable, str(HERE / "failing_train.py"), "--guard", "--steps", "600",
                                         "--poison", "600"],
    }
    extras: Dict[str, Dict[str, List[float]]] = {}
    for label in workloads_:
        command = commands[label]
        times: Dict[str, List[float]] = {"plain": [], "from step 1": [], "resumed": []}
        routes: List[str] = []
        _say(f"hunt/{label}: {repeats} rounds of (plain run, hunt from step 1, hunt resumed)")
        for r in range(repeats):
            work = Path(tempfile.mkdtemp(prefix="hunt_", dir=scratch))

            def hunt_cmd(name: str, *options: str, work: Path = work, command: List[str] = command) -> List[str]:
                return [sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(work / name), *options,
                        "--"] + command

            plain = (command, (0, 1))
            full = (hunt_cmd("full", "--resume", "never"), (1,))
            resumed = (hunt_cmd("resumed", "--keep-every", str(keep_every)), (1,))
            jobs = [("plain", plain), ("from step 1", full), ("resumed", resumed)]
            jobs = jobs[r % 3:] + jobs[:r % 3]
            for name, (argv, expect) in jobs:
                times[name].append(_run(argv, cwd=work, expect=expect))
            summary = json.loads((work / "resumed" / "summary.json").read_text())
            routes.append((summary.get("resume") or {}).get("route") or "from step 1 (no state kept)")
            shutil.rmtree(work, ignore_errors=True)
        plain = times["plain"]
        table.add(f"time to failure, plain run: {label}", _spread(plain, "{:.1f}") + " s")
        for name in ("from step 1", "resumed"):
            ratios = [h / p for h, p in zip(times[name], plain)]
            extra = [h - p for h, p in zip(times[name], plain)]
            extras.setdefault(name, {})[label] = extra
            what = ("mindguard hunt --resume never (pass 2 from step 1)" if name == "from step 1" else
                    f"mindguard hunt --keep-every {keep_every} (route: {', '.join(sorted(set(routes)))})")
            table.add(f"  {what}", _spread(times[name], "{:.1f}") + " s", _spread(ratios, "{:.2f}") + "x vs plain",
                      "<= 2.5x", _verdict(ratios, 2.5))
            table.add("    extra time the hunt adds (hunt - plain)", _spread(extra, "{:.1f}") + " s")
    late, early = "MLP 1.86M, fails at step 600", "MLP 1.86M, fails at step 30"
    for name, by_label in extras.items():
        if late in by_label and early in by_label:
            growth = statistics.median(by_label[late]) - statistics.median(by_label[early])
            table.add(f"growth of the extra time, step 30 -> 600 ({name})", f"{growth:+.1f} s", "",
                      "~0 (independent of the step)" if name == "resumed" else "reference",
                      ("ok" if growth <= 0.5 else "over") if name == "resumed" else "")


def bench_fromrun(table: Table, repeats: int, scratch: Path, failing_steps: Sequence[int] = (60, 1500)) -> None:
    """From a failing run to its culprit: the MLP (1.86M parameters, a blank row at step N) trained with an
    always-on ``Guard()`` until it fails, then ``mindguard hunt --from RECORD`` (the command Guard printed: it
    resumes from the state Guard kept), and for comparison the plain ``mindguard hunt`` (pass 1 from step 1).
    The examination time should not grow with N, and be a small share of the run to the failure."""
    examine: Dict[int, List[float]] = {}
    for failing in failing_steps:
        command = [sys.executable, str(HERE / "failing_train.py"), "--guard", "--steps", str(failing + 10),
                   "--poison", str(failing)]
        times: Dict[str, List[float]] = {"run": [], "from": [], "plain": []}
        steps_found = set()
        _say(f"fromrun/step {failing}: {repeats} rounds of (run with Guard until it fails, hunt --from, plain hunt)")
        for r in range(repeats):
            work = Path(tempfile.mkdtemp(prefix="from_", dir=scratch))
            times["run"].append(_run(command, cwd=work, expect=(0, 1)))
            record = work / "mindguard_failure.json"
            jobs = [("from", [sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(work / "from"), "--from",
                              str(record), "--"] + command),
                    ("plain", [sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(work / "plain"), "--"]
                     + command)]
            for name, cmd in (jobs if r % 2 == 0 else jobs[::-1]):
                times[name].append(_run(cmd, cwd=work, expect=(1,)))
            steps_found.add(json.loads((work / "from" / "summary.json").read_text())["failure"]["global_step"])
            shutil.rmtree(work, ignore_errors=True)
        examine[failing] = times["from"]
        shares = [e / r for e, r in zip(times["from"], times["run"])]
        table.add(f"MLP 1.86M failing at step {failing}: the run with Guard() to the failure",
                  _spread(times["run"], "{:.1f}") + " s")
        table.add(f"  mindguard hunt --from (exact step found: {sorted(steps_found)})",
                  _spread(times["from"], "{:.1f}") + " s", _spread(shares, "{:.2f}") + "x the run to the failure")
        table.add("  plain mindguard hunt (trains again from step 1)", _spread(times["plain"], "{:.1f}") + " s",
                  _spread([p / r for p, r in zip(times["plain"], times["run"])], "{:.2f}") + "x the run")
    if len(failing_steps) == 2 and all(examine.values()):
        early, late = failing_steps
        growth = statistics.median(examine[late]) / statistics.median(examine[early])
        table.add(f"growth of the hunt --from time, step {early} -> {late}", f"{growth:.2f}x", "", "<= 1.3x",
                  "ok" if growth <= 1.3 else "over")


def bench_resnet_dump(table: Table, scratch: Path, steps: int = 4, poison: int = 3,
                      train_steps: Sequence[str] = ("plain", "ema_clip")) -> None:
    """Bytes of the dump a hunt writes for a ResNet-18 (32x32 images, batch 8) whose stem overflows at step
    ``poison``: the full dump of the step (``--resume never``, what the hunt wrote before) vs the narrow one, and the
    dump a widening writes (``--dump-scope all_outputs``: every op's outputs); with
    ``Model(net, loss, opt)`` (``plain``, the goal's case) and with a mindcv-style train step that clips the
    gradients and keeps an EMA of the weights (``ema_clip``: its weight-sized ops are dumped too)."""
    for train_step in train_steps:
        command = [sys.executable, str(HERE / "failing_train.py"), "--model", "resnet18", "--train-step", train_step,
                   "--guard", "--steps", str(steps), "--poison", str(poison), "--batch", "8"]
        results = {}
        for name, options in (("full", ["--resume", "never"]), ("narrow", []),
                              ("all_outputs", ["--dump-scope", "all_outputs"])):
            work = Path(tempfile.mkdtemp(prefix="r18_", dir=scratch))
            _say(f"resnetdump/{train_step}/{name}: mindguard hunt {' '.join(options)}")
            seconds = _run([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(work / "run"), *options,
                            "--"] + command, cwd=work, expect=(1,))
            summary = json.loads((work / "run" / "summary.json").read_text())
            origin = summary.get("origin") or {}
            results[name] = (summary.get("dump_bytes") or 0, seconds,
                             f"{origin.get('op_type')} line {(origin.get('source') or {}).get('line')}")
            shutil.rmtree(work, ignore_errors=True)
        full, narrow = results["full"], results["narrow"]
        what = "Model(net, loss, opt)" if train_step == "plain" else "clip + EMA train step"
        table.add(f"hunt of a ResNet-18 (11.2M params, 32x32, batch 8), {what}: dump of the step, full",
                  _mb(full[0]), f"hunt {full[1]:.0f} s, origin {full[2]}")
        table.add("  the hunt's narrow dump (outputs; no optimizer, weight grads, weights)", _mb(narrow[0]),
                  f"{narrow[0] / full[0]:.2f}x bytes; hunt {narrow[1]:.0f} s, origin {narrow[2]}",
                  "<= 0.2x" if train_step == "plain" else "", ("ok" if narrow[0] <= 0.2 * full[0] else "over")
                  if train_step == "plain" else "")
        wide = results["all_outputs"]
        table.add("  the widened dump, when the narrow one explains nothing (every op's outputs)", _mb(wide[0]),
                  f"{wide[0] / full[0]:.2f}x bytes; hunt {wide[1]:.0f} s, origin {wide[2]}")


# ----------------------------------------------------------------------------------------- main
def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = ""
    try:
        kb = int(next(row for row in Path("/proc/meminfo").read_text().splitlines()
                      if row.startswith("MemTotal")).split()[1])
        ram = f", {kb / 1024 ** 2:.0f} GB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    try:
        import mindspore

        ms_version = mindspore.__version__
    except ImportError:
        ms_version = "?"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{os.cpu_count()} CPU(s), {cpu}{ram}; Python {platform.python_version()}, MindSpore {ms_version}, "
            f"numpy {np.__version__}; load average at start {load:.1f}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 model, few steps, 2 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per benchmark (default 5; quick 2)")
    parser.add_argument("--only", default=None, help=f"comma-separated sections: {','.join(SECTIONS)}")
    parser.add_argument("--models", default=None, help="overhead models (default mlp,embed,cnn,mlp_b128; quick mlp)")
    parser.add_argument("--variants", default=None, help="overhead variants besides bare (default all)")
    parser.add_argument("--steps", type=int, default=None, help="steps per overhead round (default 30; quick 6)")
    parser.add_argument("--pipeline", choices=("numpy", "mindrecord"), default="numpy",
                        help="overhead data pipeline: a Python NumpySlicesDataset (default) or MindRecord (C++ reader)")
    parser.add_argument("--pin", action="store_true",
                        help="overhead/watch: pin MindSpore's compute threads to distinct cores after the compile "
                             "round (default: left to the scheduler, as a user's training runs; see "
                             "pinned_compute_threads)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep dumps and records in DIR")
    parser.add_argument("--json", default=None, metavar="PATH",
                        help="also write the run (when, where, the command, every row) as JSON, e.g. "
                             "docs/data/benchmarks/unpinned.json")
    parser.add_argument("--markdown", default=None, metavar="PATH",
                        help="also write the table as the Markdown the docs include, e.g. "
                             "docs/snippets/benchmarks/unpinned.md (then `mkdocs build`)")
    parser.add_argument("--label", default="", help="a line saying what this run is, shown above its table")
    parser.add_argument("--render", default=None, metavar="JSON",
                        help="measure nothing: write --markdown from a run saved with --json")
    args = parser.parse_args(argv)
    if args.render:
        if not args.markdown:
            parser.error("--render needs --markdown PATH")
        write_outputs(json.loads(Path(args.render).read_text()), None, args.markdown)
        return 0

    sections = (tuple(s for s in SECTIONS if not (args.quick and s == "resnetdump")) if not args.only
                else tuple(s.strip() for s in args.only.split(",") if s.strip()))
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        parser.error(f"--only: unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    repeats = args.repeats or (2 if args.quick else 5)
    if repeats < 1:
        parser.error(f"--repeats must be >= 1, got {repeats}")
    models = (args.models.split(",") if args.models
              else (["mlp"] if args.quick else ["mlp", "embed", "cnn", "mlp_b128"]))
    steps = args.steps or (6 if args.quick else 30)
    if steps < 3:
        parser.error(f"--steps must be >= 3 (a round's mean step runs from its second step's begin to its last's), "
                     f"got {steps}")
    dump_hidden = 256 if args.quick else 1024
    dump_steps = 6 if args.quick else 20

    scratch_root = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp(prefix="mgbench_"))
    scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="run_", dir=scratch_root))  # dump paths must not contain "."
    table = Table()
    header = machine()
    started = time.perf_counter()
    jobs = []
    if "overhead" in sections:
        variants = args.variants.split(",") if args.variants else None
        jobs.append(("overhead", lambda: bench_overhead(table, models, steps, repeats, scratch, variants,
                                                       args.pipeline, pin=args.pin)))
        jobs.append(("overhead components", lambda: bench_components(table, models, repeats, scratch)))
    if "watch" in sections:
        jobs.append(("watch", lambda: bench_watch(table, steps, repeats, scratch, pin=args.pin)))
    if "analyze" in sections:
        jobs.append(("analyze", lambda: bench_analyze(table, max(repeats, 3), scratch, dump_steps, dump_hidden)))
    if "bigtensor" in sections:
        jobs.append(("bigtensor", lambda: bench_bigtensor(table, scratch, 0.25 if args.quick else 2.0)))
    if "dumpsize" in sections:
        jobs.append(("dumpsize", lambda: bench_dumpsize(table, scratch, dump_steps, dump_hidden)))
    if "resnetdump" in sections:
        jobs.append(("resnetdump", lambda: bench_resnet_dump(table, scratch)))
    if "hunt" in sections:
        jobs.append(("hunt", lambda: bench_hunt(table, 1 if args.quick else max(1, repeats // 2), scratch,
                                                ["norm_nan demo"] if args.quick
                                                else ["norm_nan demo", "MLP 1.86M, fails at step 30",
                                                      "MLP 1.86M, fails at step 600"])))
    if "fromrun" in sections:
        jobs.append(("fromrun", lambda: bench_fromrun(table, 1 if args.quick else max(1, repeats // 2), scratch,
                                                      (20, 60) if args.quick else (60, 1500))))
    failed = []
    try:
        for name, job in jobs:
            try:
                job()
            except Exception as exc:  # noqa: BLE001 - report it, keep the other sections' numbers
                failed.append(name)
                table.add(f"{name}: FAILED", f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                _say(f"{name} failed:\n{exc}")
    finally:
        if not args.keep:
            shutil.rmtree(scratch_root, ignore_errors=True)
    print(f"mindguard benchmarks -- {header}")
    print(f"sections: {', '.join(sections)}; repeats {repeats}; overhead: {steps} steps/round, "
          f"GRAPH mode, CPU; total {time.perf_counter() - started:.0f} s\n")
    print(table.render())
    if args.json or args.markdown:
        commit, dirty = git_commit()
        write_outputs({"commit": commit, "dirty": dirty, "date": time.strftime("%Y-%m-%d"), "label": args.label,
                       "command": "python benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
                       "machine": header, "total_s": round(time.perf_counter() - started),
                       "rows": [list(r) for r in table.rows], "notes": table.notes}, args.json, args.markdown)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
