"""Zero edits (issue 53): Guard attached to a training the user launches as it is -- ``mindguard run -- COMMAND``,
``mindguard hunt -- COMMAND`` on a script with no mindguard in it, and ``MINDGUARD=1`` in the environment.

The scripts (``tests/zoo/unmodified_*.py``) import no mindguard; each is launched through ``bash launch.sh`` (a
launcher script written here, running ``python`` from ``PATH`` as a job file does) and once under ``msrun``. Real
MindSpore on CPU, real subprocesses. The pure parts (the advice read from a script's source, the environment the
commands set) are ``fast``.
"""
from __future__ import annotations

import json
import os
import shlex
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hunting import ZOO, clean_env, explain, line_of, summary_of

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PTH = REPO / "mindguard" / "training" / "attach" / "mindguard_attach.pth"
MODEL_TRAIN, CELL_LOOP, FUNCTIONAL = "unmodified_model_train.py", "unmodified_cell_loop.py", "unmodified_functional.py"
SHAPES = "unmodified_functional_shapes.py"


def user_env(**extra: str) -> dict:
    """The environment a user's job has: no mindguard variable, this venv's ``python`` first on ``PATH``, and this
    checkout's ``mindguard`` the one it imports (``PYTHONPATH``: the same package when the venv's editable install
    is this checkout; this one when it is a worktree beside that install)."""
    env = clean_env()
    for key in ("MINDGUARD", "MINDGUARD_SEED", "PYTHONPATH"):
        env.pop(key, None)
    env["PYTHONPATH"] = str(REPO)
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def launcher(tmp_path: Path, script: str) -> Path:
    """``launch.sh``: what a cluster's ``scripts/run_train.sh`` does -- cd, set variables, run python."""
    path = tmp_path / "launch.sh"
    path.write_text(f'#!/bin/bash\nexport OMP_NUM_THREADS=2\npython {ZOO / script} "$@"\n')
    return path


def mindguard(*args: str, cwd: Path, env=None, timeout: float = 300, merged: bool = False):
    return subprocess.run([sys.executable, "-m", "mindguard", *args], cwd=cwd, env=env or user_env(), text=True,
                          timeout=timeout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT if merged else subprocess.PIPE)


def run_hunt(run: Path, *command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``mindguard hunt --run-dir RUN -- COMMAND`` in the user's environment (``python`` on ``PATH``)."""
    return mindguard("hunt", "--run-dir", str(run), "--", *command, cwd=cwd)


def hunt_line(stderr: str) -> list:
    """The command Guard printed (``mindguard hunt --from RECORD -- COMMAND``), as words after ``mindguard``."""
    lines = [line.strip() for line in stderr.splitlines() if " hunt --from " in line]
    assert lines, stderr[-3000:]
    words = shlex.split(lines[-1])
    return words[words.index("hunt"):]


def losses(stdout: str) -> list:
    return [line for line in stdout.splitlines() if line.startswith("loss ")]


def check_origin(summary: dict, script: str, op_type: str, step: int) -> None:
    assert summary.get("outcome") == "failure_found", summary.get("outcome")
    assert summary["failure"]["global_step"] == step, summary["failure"]
    origin = summary.get("origin") or {}
    assert origin.get("op_type") == op_type, origin
    source = origin.get("source") or {}
    assert Path(source.get("file", "")).resolve() == (ZOO / script).resolve(), source
    assert source.get("line") == line_of(ZOO / script, "# CULPRIT"), source


# ------------------------------------------------------------------------- mindguard run, then its line
@pytest.mark.slow
def test_run_prints_the_hunt_line_and_that_line_finds_the_step_op_and_line(tmp_path):
    """Model.train, unmodified, launched by a shell script: the NaN of global step 6 is recorded, the printed line
    names the command as typed, and running that line answers with the step, the op and the line."""
    launch = launcher(tmp_path, MODEL_TRAIN)
    proc = mindguard("run", "--", "bash", str(launch), "--bad_step", "6", cwd=tmp_path)
    assert proc.returncode == 0, explain(proc)   # Guard stopped Model.train, which returned: the script's own 0
    assert "mindguard attach: Guard attached to Model.train" in proc.stderr, explain(proc)
    assert losses(proc.stdout)[-1].startswith("loss 6 nan"), explain(proc)   # stopped at the failing step
    words = hunt_line(proc.stderr)
    assert words[words.index("--"):] == ["--", "bash", str(launch), "--bad_step", "6"], words
    record = json.loads(Path(words[words.index("--from") + 1]).read_text())
    assert (record["status"], record["kind"], record["global_step"]) == ("failed", "nonfinite_loss", 6), record

    run = tmp_path / "hunt"
    hunt = mindguard(words[0], "--run-dir", str(run), *words[1:], cwd=tmp_path)
    assert hunt.returncode == 1, explain(hunt)
    check_origin(summary_of(run), MODEL_TRAIN, "Sqrt", 6)


# ------------------------------------------------------------------------- mindguard hunt, unmodified
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_hunt_attaches_to_a_train_cell_stepped_by_hand(tmp_path, mode):
    """A TrainOneStepCell subclass called in a Python loop: each call is one watched step; GRAPH is dumped,
    PyNative replayed -- the same step, op and line."""
    launch = launcher(tmp_path, CELL_LOOP)
    run = tmp_path / "run"
    proc = run_hunt(run, "bash", str(launch), "--mode", mode, cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    check_origin(summary_of(run), CELL_LOOP, "Log", 5)
    if mode == "pynative":   # and the line `mindguard run` prints finds the same
        ran = mindguard("run", "--", "bash", str(launch), "--mode", mode, cwd=tmp_path)
        assert ran.returncode == 1 and "NonFiniteError" in ran.stderr, explain(ran)
        words = hunt_line(ran.stderr)
        assert words[words.index("--"):] == ["--", "bash", str(launch), "--mode", mode], words
        answer = mindguard(words[0], "--run-dir", str(tmp_path / "from"), *words[1:], cwd=tmp_path)
        assert answer.returncode == 1, explain(answer)
        check_origin(summary_of(tmp_path / "from"), CELL_LOOP, "Log", 5)


@pytest.mark.slow
def test_hunt_attaches_to_model_train_launched_by_a_script(tmp_path):
    launch = launcher(tmp_path, MODEL_TRAIN)
    run = tmp_path / "run"
    proc = run_hunt(run, "bash", str(launch), "--bad_step", "6", "--mode", "pynative", cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    check_origin(summary_of(run), MODEL_TRAIN, "Sqrt", 6)


# ------------------------------------------------------------------------- the environment switch
def installed_pth() -> "Path | None":
    for folder in site.getsitepackages():
        if (Path(folder) / PTH.name).is_file():
            return Path(folder) / PTH.name
    return None


def pth_env(tmp_path: Path, **extra: str) -> dict:
    """The environment of a Python that starts with ``mindguard_attach.pth`` in site-packages: this one's when it is
    installed there (``pip install .``); else (an editable install gets none) a ``sitecustomize`` on ``PYTHONPATH``
    hands a folder holding a copy to ``site.addsitedir`` -- what Python's start-up does with site-packages."""
    env = user_env(**extra)
    if installed_pth() is not None:
        return env
    folder, boot = tmp_path / "pth_site", tmp_path / "pth_boot"
    folder.mkdir(exist_ok=True)
    boot.mkdir(exist_ok=True)
    (folder / PTH.name).write_text(PTH.read_text())
    (boot / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(folder)!r})\n")
    env["PYTHONPATH"] = os.pathsep.join([str(boot), str(REPO)])
    return env


@pytest.mark.slow
def test_the_environment_switch_attaches_without_a_wrapper(tmp_path):
    """``MINDGUARD=1`` in a job's environment: the same record and printed line, with no mindguard command."""
    script = ZOO / MODEL_TRAIN
    env = pth_env(tmp_path, MINDGUARD="1")
    proc = subprocess.run(["python", str(script), "--bad_step", "3"], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, explain(proc)
    assert "mindguard attach: Guard attached to Model.train" in proc.stderr, explain(proc)
    words = hunt_line(proc.stderr)
    assert words[words.index("--") + 1:][-3:] == [str(script), "--bad_step", "3"], words
    record = json.loads(Path(words[words.index("--from") + 1]).read_text())
    assert (record["kind"], record["global_step"]) == ("nonfinite_loss", 3), record


@pytest.mark.fast
def test_the_hook_costs_nothing_when_off(tmp_path):
    """With the .pth in site-packages: off, nothing of mindguard (nor MindSpore) is imported at start-up; on, the
    hook is, but MindSpore still is not (it waits for the script's own ``import mindspore``)."""
    code = "import sys; print('mindspore' in sys.modules, 'mindguard' in sys.modules, " \
           "'mindguard.training.attach.hook' in sys.modules)"
    for switch, expected in ((None, "False False False"), ("0", "False False False"), ("1", "False True True")):
        env = pth_env(tmp_path, **({"MINDGUARD": switch} if switch is not None else {}))
        proc = subprocess.run([sys.executable, "-c", code], env=env, text=True, capture_output=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip() == expected, (switch, explain(proc))
    if installed_pth() is not None:   # a non-editable install (CI): the real start-up
        proc = subprocess.run([sys.executable, "-c", "import sys; print('mindspore' in sys.modules)"],
                              env=user_env(), text=True, capture_output=True, timeout=60)
        assert proc.stdout.strip() == "False", explain(proc)


# ------------------------------------------------------------------------- the guest contract
@pytest.mark.slow
@pytest.mark.parametrize("script", [MODEL_TRAIN, CELL_LOOP, FUNCTIONAL])
def test_a_healthy_run_computes_bit_for_bit_what_the_bare_run_computes(tmp_path, script):
    """Every step's loss (its float32 bits), with Guard attached and without; the exit code is the command's."""
    launch = launcher(tmp_path, script)
    bare = subprocess.run(["bash", str(launch), "--bad_step", "0"], cwd=tmp_path, env=user_env(), text=True,
                          capture_output=True, timeout=300)
    assert bare.returncode == 0, explain(bare)
    attached = mindguard("run", "--", "bash", str(launch), "--bad_step", "0", cwd=tmp_path)
    assert attached.returncode == 0, explain(attached)
    assert "mindguard attach: " in attached.stderr, explain(attached)
    assert losses(attached.stdout) == losses(bare.stdout) and len(losses(bare.stdout)) >= 12, \
        (losses(bare.stdout), losses(attached.stdout))
    assert json.loads((tmp_path / "mindguard_failure.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_an_unseeded_script_is_seeded_and_told_so(tmp_path):
    """A script that sets no seed computes something else at each bare run; attached, it repeats (and is told)."""
    command = [sys.executable, str(ZOO / MODEL_TRAIN), "--bad_step", "0", "--epochs", "1", "--no_seed"]
    runs = [mindguard("run", "--", *command, cwd=tmp_path) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), explain(runs[0])
    assert losses(runs[0].stdout) == losses(runs[1].stdout), [losses(r.stdout)[:2] for r in runs]
    assert "the script sets no seed: mindguard seeded" in runs[0].stderr, explain(runs[0])


@pytest.mark.slow
def test_a_script_with_its_own_guard_or_watch_gets_no_second_one(tmp_path):
    """The docs' examples wire Guard (Model.train) and watch (a value_and_grad loop) themselves: attached, they
    print what they print bare, and the hook neither adds a Guard nor advises a line."""
    for example, args in (("model_train.py", ["--lr", "1e3"]), ("functional_loop.py", [])):
        command = [sys.executable, str(REPO / "docs" / "examples" / example), *args]
        bare = subprocess.run(command, cwd=tmp_path, env=user_env(), text=True, capture_output=True, timeout=300)
        attached = mindguard("run", "--", *command, cwd=tmp_path)
        assert attached.returncode == bare.returncode, (explain(bare), explain(attached))
        assert "mindguard attach:" not in attached.stderr, explain(attached)
        assert attached.stdout == bare.stdout, (bare.stdout[-2000:], attached.stdout[-2000:])


@pytest.mark.fast
def test_run_exits_with_the_commands_own_code(tmp_path):
    assert mindguard("run", "--", "bash", "-c", "exit 7", cwd=tmp_path).returncode == 7
    missing = mindguard("run", "--", "no-such-command-here", cwd=tmp_path)
    assert missing.returncode == 127 and "command not found: no-such-command-here" in missing.stderr, explain(missing)
    assert mindguard("run", cwd=tmp_path).returncode == 2
    bad_seed = mindguard("run", "--seed", "x", "--", "true", cwd=tmp_path)
    assert bad_seed.returncode == 2 and "--seed" in bad_seed.stderr, explain(bad_seed)


# ------------------------------------------------------------------------- functional loops
@pytest.mark.slow
@pytest.mark.parametrize("jit", [False, True])
def test_a_functional_loop_is_attached_and_its_printed_line_finds_the_step_op_and_line(tmp_path, jit):
    """value_and_grad + a local train_step + a for loop, unmodified, through bash: the step function is found and
    watched (said before its first loss prints); the run stops at the NaN of step 4 with the printed line, and that
    line -- and `mindguard hunt` of the same command -- answer with step 4, the op and the marked line."""
    launch = launcher(tmp_path, FUNCTIONAL)
    args = ["--jit"] if jit else []
    proc = mindguard("run", "--", "bash", str(launch), *args, cwd=tmp_path, merged=True)
    out = proc.stdout
    assert proc.returncode == 1 and "NonFiniteError" in out, explain(proc)   # watch's contract: it raises
    attached = out.index("mindguard attach: watching the functional step `train_step")
    assert attached < out.index("loss 1 "), out[-3000:]
    assert "loss 3 " in out and "loss 4 " not in out, out[-3000:]   # stopped at the failing step, before printing
    words = hunt_line(out)
    assert words[words.index("--"):] == ["--", "bash", str(launch), *args], words
    record = json.loads(Path(words[words.index("--from") + 1]).read_text())
    assert (record["status"], record["global_step"]) == ("failed", 4), record

    run = tmp_path / "from"
    answer = mindguard(words[0], "--run-dir", str(run), *words[1:], cwd=tmp_path)
    assert answer.returncode == 1, explain(answer)
    check_origin(summary_of(run), FUNCTIONAL, "Log", 4)

    hunted = tmp_path / "hunt"
    hunt = run_hunt(hunted, "bash", str(launch), *args, cwd=tmp_path)
    assert hunt.returncode == 1, explain(hunt)
    check_origin(summary_of(hunted), FUNCTIONAL, "Log", 4)


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["epoch", "trainer"])
def test_hunt_attaches_to_the_zoos_other_functional_shapes(tmp_path, shape):
    """mindcv's train_with_func shape (a jit step made anew in every epoch, a dataset iterator) and a trainer
    object's step method: `mindguard hunt` of the unmodified script answers with step 25, the op and the line."""
    launch = launcher(tmp_path, SHAPES)
    run = tmp_path / "run"
    proc = run_hunt(run, "bash", str(launch), "--shape", shape, cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    check_origin(summary_of(run), SHAPES, "Log", 25)


@pytest.mark.slow
def test_an_epoch_jit_loop_failing_in_epoch_2_is_resumed_in_one_process(tmp_path):
    """mindcv's train_with_func shape, the bad row only in epoch 2's data: global step 52 fails, in the 12th call of
    epoch 2's own `jit` graph, its state kept a few calls into that graph (MINDGUARD_KEEP_STEPS), where MindSpore's
    CPU kernels still search their thread split (a resumed graph starting there computed the loss a few ulps off:
    docs/mindspore-facts.md, "warm-up"). The printed line runs epoch 2's steps before the kept one first and then
    computes what the failing run computed: one locate pass finds step 52, the op and the line."""
    launch = launcher(tmp_path, SHAPES)
    args = ["--shape", "epoch", "--bad_step", "12", "--bad_epoch", "2", "--epochs", "2"]
    proc = mindguard("run", "--", "bash", str(launch), *args, cwd=tmp_path,
                     env=user_env(MINDGUARD_KEEP_STEPS="46-50"))
    assert proc.returncode == 1 and "NonFiniteError" in proc.stderr, explain(proc)
    assert len(losses(proc.stdout)) == 51, explain(proc)   # epoch 1's 40 steps, epoch 2's first 11
    words = hunt_line(proc.stderr)
    record = json.loads(Path(words[words.index("--from") + 1]).read_text())
    kept = (record.get("kept_state") or {}).get("step")
    assert (record["global_step"], record["call"]["index"]) == (52, 2) and kept in range(46, 51), record
    state = json.loads((Path(record["kept_state"]["path"]) / "state.json").read_text())
    assert state["warm_up"] == kept - 41, (kept, state.get("warm_up"))   # epoch 2's calls before the kept one

    run = tmp_path / "from"
    answer = mindguard(words[0], "--run-dir", str(run), *words[1:], cwd=tmp_path)
    assert answer.returncode == 1, explain(answer)
    assert "computes something else" not in answer.stdout + answer.stderr, explain(answer)
    summary = summary_of(run)
    check_origin(summary, SHAPES, "Log", 52)
    assert (summary["from_record"]["route"], summary["from_record"]["kept_step"]) == ("resume", kept), summary
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == ["locate"], sorted(run.iterdir())
    said = (run / "locate" / "output.log").read_text()
    assert f"the last {kept - 41} ran first" in said, said[-3000:]


FACTORY = textwrap.dedent("""\
    import numpy as np
    import mindspore
    from mindspore import Tensor, nn, ops


    def make_steps(model, loss_fn, optimizer):
        def forward_fn(data, label):
            return loss_fn(model(data), label)

        grad_fn = mindspore.value_and_grad(forward_fn, None, optimizer.parameters)

        def train_step(data, label):
            loss, grads = grad_fn(data, label)
            optimizer(grads)
            return loss
        return {"train": train_step}


    mindspore.set_seed(3)
    model = nn.Dense(8, 4)
    optimizer = nn.SGD(model.trainable_params(), learning_rate=0.01)
    steps = make_steps(model, nn.MSELoss(), optimizer)
    rng = np.random.RandomState(0)
    for step in range(1, 7):
        x = rng.randn(4, 8).astype(np.float32) * (np.inf if step == 4 else 1)
        print(f"loss {step} {steps['train'](Tensor(x), Tensor(rng.randn(4, 4).astype(np.float32)))}", flush=True)
    """)


@pytest.mark.slow
def test_a_step_no_frame_shows_is_said_at_its_first_step_with_the_line_to_add(tmp_path):
    """A step function made by a factory and called from a dict: no frame of the loop names it, so it is said at its
    first step (before its loss prints) with the line to add where the step is made; the hunt then says the same
    instead of "no failure" for the NaN losses the output shows."""
    script = tmp_path / "factory.py"
    script.write_text(FACTORY)
    proc = mindguard("run", "--", "python", str(script), cwd=tmp_path, merged=True)
    assert proc.returncode == 0, explain(proc)
    out = proc.stdout
    advice = out.index("mindguard attach: factory.py:")
    assert advice < out.index("loss 1 ") and "loss 4 nan" in out, out[-3000:]
    line = "train_step = mindguard.watch(train_step, model, optimizer)"
    assert f"\n    {line}\n" in out and "after `def train_step`" in out, out[-3000:]

    run = tmp_path / "run"
    hunt = run_hunt(run, "python", str(script), cwd=tmp_path)
    assert hunt.returncode == 2 and summary_of(run)["outcome"] == "no_guard", explain(hunt)
    assert line in hunt.stderr and "mindguard attached Guard to no training" in hunt.stderr, explain(hunt)


@pytest.mark.fast
def test_the_advice_names_the_scripts_own_step_network_and_optimizer():
    from mindguard.training.attach.advice import already_watched, functional_advice

    source = (ZOO / FUNCTIONAL).read_text()
    lineno = line_of(ZOO / FUNCTIONAL, "mindspore.value_and_grad(")
    advice = functional_advice(source, lineno)
    assert advice.line == "train_step = mindguard.watch(train_step, model, optimizer)", advice
    assert advice.loop == line_of(ZOO / FUNCTIONAL, "for step in range") and advice.after == advice.loop - 1
    tutorial = textwrap.dedent("""\
        net = Network()
        opt = nn.SGD(net.trainable_params(), 1e-2)
        def fwd(x, y):
            return loss_fn(net(x), y)
        grad_fn = ms.value_and_grad(fwd, None, opt.parameters)
        @ms.jit
        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return loss
        for x, y in data:
            step(x, y)
        """)
    advice = functional_advice(tutorial, 5)
    assert (advice.line, advice.after, advice.loop) == ("step = mindguard.watch(step, net, opt)", 10, 11), advice
    assert functional_advice("x = (", 1).line == "train_step = mindguard.watch(train_step, net, optimizer)"
    assert already_watched("import mindguard\nstep = mindguard.watch(step, net)\n")


@pytest.mark.fast
def test_the_attach_environment():
    from mindguard.protocol import attach

    env = attach.environment({"PYTHONPATH": "/a"}, ["bash", "run train.sh", "--x"], seed_value="off")
    assert env["PYTHONPATH"].split(os.pathsep) == [attach.site_dir(), "/a"]
    assert (Path(attach.site_dir()) / "sitecustomize.py").is_file()
    assert attach.original_command(env) == ["bash", "run train.sh", "--x"]
    assert attach.seed(env) is None and attach.seed({}) == 0 and attach.seed({"MINDGUARD_SEED": "7"}) == 7
    assert attach.environment(env, ["x"])["PYTHONPATH"] == env["PYTHONPATH"]   # once on the path
    assert attach.requested(env) and attach.requested({"MINDGUARD": "1"}) and attach.requested({"MINDGUARD": "on"})
    assert not attach.requested({"MINDGUARD": "0"}) and not attach.requested({})
    with pytest.raises(ValueError):
        attach.seed({"MINDGUARD_SEED": "-1"})


# ------------------------------------------------------------------------- msrun, launched by a script
@pytest.mark.slow
@pytest.mark.distributed
def test_run_attaches_to_every_msrun_worker_launched_by_a_script(tmp_path):
    """``mindguard run -- bash run_distributed.sh``, which starts 2 msrun workers: both ranks' Guards record the
    failure of global step 5 (rank 1's batch), and the line names the command as typed."""
    from test_distributed import LAUNCH_TIMEOUT, MSRUN, _loopback_problem, free_port, run_bounded, worker_logs

    if _loopback_problem():
        pytest.skip(_loopback_problem())
    launch = tmp_path / "run_distributed.sh"
    launch.write_text(f"#!/bin/bash\n{MSRUN} --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 "
                      f"--master_port={free_port()} --join=True --log_dir={tmp_path / 'logs'} "
                      f"{ZOO / MODEL_TRAIN} --distributed \"$@\"\n")
    proc = run_bounded([sys.executable, "-m", "mindguard", "run", "--", "bash", str(launch), "--bad_step", "5"],
                       user_env(), LAUNCH_TIMEOUT, cwd=tmp_path)
    logs = worker_logs(tmp_path / "logs")
    assert proc.returncode == 0, explain(proc) + logs
    for rank in (0, 1):
        record = json.loads((tmp_path / f"mindguard_failure.rank{rank}.json").read_text())
        assert (record["status"], record["global_step"], record["group_size"]) == ("failed", 5, 2), record
    words = hunt_line(logs)
    assert words[words.index("--"):] == ["--", "bash", str(launch), "--bad_step", "5"], words
