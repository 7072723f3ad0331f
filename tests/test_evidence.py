"""A failure's evidence is kept until the user is done with it, bound to its run (issues 38 and 39).

Each test is one fault, on a real Guard training (tests/zoo/evidence_train.py, copied as ``train.py`` into the test's
folder, run as a user runs it) and the real ``mindguard hunt --from``: a re-run after a failure, two trainings in
one folder, a state of another run, another folder, ``kill -9`` while the failure's state is written, damaged or
missing files, a renamed layer, a run SIGKILLed mid-way. Each asserts the exit code, the message, and that nothing
was lost or misattributed. The failing step is 12 (a padded batch through nn.Norm), found by the hunt, never told.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hunting import clean_env, explain, summary_of

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "zoo" / "evidence_train.py"
RECORD = "mindguard_failure.json"
POISON = 12


def folder_with_script(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(SCRIPT, path / "train.py")
    return path


def train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=300)


def hunt_from(cwd: Path, record: Path, *args: str, run: str = "run") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(cwd / run), "--from",
                           str(record), "--", sys.executable, "train.py", *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=600)


def printed_command(proc: subprocess.CompletedProcess) -> list:
    match = re.search(r"^    (.* hunt --from .*)$", proc.stderr, re.M)
    assert match, explain(proc)
    return shlex.split(match.group(1))


def printed_record(proc: subprocess.CompletedProcess) -> Path:
    command = printed_command(proc)
    return Path(command[command.index("--from") + 1])


def record_of(path: Path) -> dict:
    return json.loads(path.read_text())


def digests(folder: Path) -> dict:
    """Every file under ``folder`` and its sha256: what must stay as it was."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def no_crash(proc: subprocess.CompletedProcess) -> None:
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text and "internal error" not in text and "HuntProtocolError" not in text, explain(proc)


def failed_run(cwd: Path, *args: str) -> tuple:
    """A failing run's ``(process, its own record -- the path it printed --, that record)``."""
    proc = train(cwd, *args)
    assert proc.returncode == 1, explain(proc)
    own = printed_record(proc)
    data = record_of(own)
    assert own == cwd / f"mindguard_failure.{data['run_id']}.json" and data["status"] == "failed", (own, data)
    return proc, own, data


def test_a_rerun_after_a_failure_keeps_the_failures_record_and_state(tmp_path):
    """The user runs the script again after the failure (to check): the failure's record and kept state stay, the
    line it printed still examines exactly that failure."""
    cwd = folder_with_script(tmp_path / "w")
    first, own, failure = failed_run(cwd)
    assert record_of(cwd / RECORD) == failure   # the usual record is the failure, until the next run starts
    states = Path(failure["states"])
    assert states.name == failure["run_id"] and Path(failure["kept_state"]["path"]).parent == states, failure
    kept = digests(states)

    again = train(cwd, "--poison", "0")   # the re-run: healthy this time
    assert again.returncode == 0, explain(again)
    assert "holds the record of an earlier failure" in again.stderr and f"it stays as '{own}'" in again.stderr, \
        explain(again)
    latest = record_of(cwd / RECORD)
    assert latest["status"] == "finished" and latest["run_id"] != failure["run_id"], latest
    assert record_of(own) == failure and digests(states) == kept, "the earlier failure's evidence changed"
    assert not Path(latest["states"]).exists(), "a run with nothing to hunt removes its own states at exit"

    proc = subprocess.run(printed_command(first), cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, explain(proc)
    runs = list((cwd / "mindguard_runs").iterdir())
    summary = summary_of(runs[0])
    assert summary["from_record"]["record"] == str(own) and summary["from_record"]["route"] == "resume", summary
    assert "fallback" not in summary["from_record"] and summary["failure"]["global_step"] == POISON, summary
    assert summary["origin"]["op_type"] == "SqrtGrad", summary["origin"]


def test_two_trainings_in_one_folder_keep_their_own_files(tmp_path):
    """Started together in one folder (each waits at step 3 until the other is there): one writes the usual record,
    the other its own, each keeps its states in its own folder; the failing one's line names its own record."""
    cwd = folder_with_script(tmp_path / "w")
    meet = tmp_path / "meet"
    meet.mkdir()
    failing = subprocess.Popen([sys.executable, "train.py", "--meet", str(meet)], cwd=cwd, env=clean_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    healthy = subprocess.Popen([sys.executable, "train.py", "--meet", str(meet), "--poison", "0"], cwd=cwd,
                               env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = [p.communicate(timeout=300) for p in (failing, healthy)]
    ran = [subprocess.CompletedProcess(p.args, p.returncode, *out) for p, out in zip((failing, healthy), outs)]
    assert (ran[0].returncode, ran[1].returncode) == (1, 0), explain(ran[0]) + explain(ran[1])
    assert len(list(meet.iterdir())) == 2   # both were alive at once
    assert sum("another training is writing" in p.stderr for p in ran) == 1, [p.stderr[-2000:] for p in ran]
    own = printed_record(ran[0])
    failure = record_of(own)
    assert failure["status"] == "failed" and failure["argv"][-2:] == ["--meet", str(meet)], failure
    kept = Path(failure["kept_state"]["path"])
    assert kept.parent.name == failure["run_id"] == json.loads((kept / "state.json").read_text())["run_id"]
    records = {p.name: record_of(p) for p in cwd.glob("mindguard_failure*.json")}
    # whichever took the usual path first: the failing run also keeps its failure under its run id (one run, 2 files)
    by_run = {r["run_id"]: r["status"] for r in records.values()}
    assert sorted(by_run.values()) == ["failed", "finished"], records
    assert all(by_run[r["run_id"]] == r["status"] for r in records.values()), records
    healthy_record = next(r for r in records.values() if r["status"] == "finished")
    assert healthy_record["argv"][-2:] == ["--poison", "0"] and not Path(healthy_record["states"]).exists()
    assert kept.is_dir() and (kept / "state.npz").is_file(), "the healthy run removed the failing run's state"


def test_a_state_copied_from_another_run_is_refused(tmp_path):
    cwd = folder_with_script(tmp_path / "w")
    _, own, failure = failed_run(cwd)
    _, other_own, other = failed_run(cwd)
    kept, foreign = Path(failure["kept_state"]["path"]), Path(other["kept_state"]["path"])
    assert kept != foreign
    for name in ("state.json", "state.npz"):   # the other run's state, copied over this run's
        shutil.copy(foreign / name, kept / name)
    proc = hunt_from(cwd, own)
    assert proc.returncode == 1, explain(proc)
    no_crash(proc)
    why = f"was kept by run {other['run_id']}, not by run {failure['run_id']} whose record this is"
    # (issue 51) the record names the step: one locate pass from step 1, not the plain hunt's two passes
    assert why in proc.stderr and "one pass from step 1 finds the exact step" in proc.stderr, explain(proc)
    summary = summary_of(cwd / "run")
    assert why in summary["from_record"]["fallback"] and (cwd / "run" / "locate").is_dir(), summary["from_record"]
    assert not (cwd / "run" / "pass1").exists()
    assert summary["failure"]["global_step"] == POISON and summary["origin"]["op_type"] == "SqrtGrad", summary
    assert record_of(other_own) == other, "the other run's record changed"


def test_the_line_run_from_another_folder_says_where_to_run_it(tmp_path):
    """Another folder with its own (fixed) train.py: refused, naming the edit and the folder (it used to answer
    "healthy"); a folder with the same files: hunted, with a note."""
    cwd = folder_with_script(tmp_path / "w")
    first, own, failure = failed_run(cwd)
    elsewhere = folder_with_script(tmp_path / "fixed")
    script = elsewhere / "train.py"
    script.write_text(script.read_text().replace("padding_idx=0)", "padding_idx=None)"))
    proc = subprocess.run(printed_command(first), cwd=elsewhere, env=clean_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, explain(proc)
    no_crash(proc)
    assert f"the failing run ran in {cwd}, this hunt runs in {elsewhere} (train.py changed since the failure)" in \
        proc.stderr and f"run it from {cwd}" in proc.stderr, explain(proc)
    assert not (elsewhere / "mindguard_runs").exists(), "a refused hunt leaves nothing behind"

    same = folder_with_script(tmp_path / "same")
    proc = hunt_from(same, own)
    assert proc.returncode == 1, explain(proc)
    assert f"note: the failing run ran in {cwd}; the project files here are the same" in proc.stderr, explain(proc)
    assert summary_of(same / "run")["failure"]["global_step"] == POISON


def test_kill_9_while_the_failures_state_is_written_leaves_the_previous_state_usable(tmp_path):
    """SIGKILL in the middle of writing the state at the failure: the record says the failure but names no state; the
    hunt resumes from the run's last complete state on disk; the next start removes the cut write's leftovers."""
    cwd = folder_with_script(tmp_path / "w")
    args = ("--disk-until", "6", "--cut-write")
    killed = train(cwd, *args)
    assert killed.returncode == -signal.SIGKILL, explain(killed)
    record = record_of(cwd / RECORD)
    assert record["status"] == "failed" and "kept_state" not in record, record
    states = Path(record["states"])
    leftovers = list(states.rglob("*.tmp"))
    assert leftovers, sorted(states.rglob("*"))
    complete = max(int(p.parent.name.split("-")[1]) for p in states.glob("step-*/state.json"))
    assert 1 < complete < POISON, complete

    proc = hunt_from(cwd, cwd / RECORD, *args)
    assert proc.returncode == 1, explain(proc)
    no_crash(proc)
    assert ("the record names no kept state (the run was killed, or killed while writing it); resuming from the "
            f"last complete state on disk, kept at global step {complete}") in proc.stderr, explain(proc)
    summary = summary_of(cwd / "run")
    assert summary["from_record"]["route"] == "resume" and summary["from_record"]["kept_step"] == complete, summary
    assert summary["failure"]["global_step"] == POISON and not (cwd / "run" / "pass1").exists(), summary
    kept = digests(states)

    again = train(cwd, "--poison", "0")   # the next start cleans the cut write, keeps the rest
    assert again.returncode == 0, explain(again)
    assert not any(left.exists() for left in leftovers) and not any(states.rglob("*.tmp"))
    assert {k: v for k, v in kept.items() if not k.endswith(".tmp")} == digests(states), "a complete state was lost"
    aside = cwd / f"mindguard_failure.{record['run_id']}.json"
    assert f"it is kept as '{aside}'" in again.stderr and record_of(aside) == record, explain(again)


DAMAGES = {
    "truncated state.json": r"state\.json is damaged \(not valid JSON: .* truncated\?\)",
    "damaged state.npz": r"state\.npz is damaged or replaced \(its checksum is not the one .*state\.json was "
                         r"written with\)",
    "missing state.npz": r"state\.npz is missing",
    "truncated record": r"is not valid JSON \(.*\); is it a mindguard failure record\?",
}


def test_a_damaged_piece_gets_a_one_line_reason_and_the_plain_hunt(tmp_path):
    """Each damage in turn on one failing run's evidence, put back byte for byte (the whole folder) before the next:
    one training serves them all. Every damaged state is refused with its reason by the rule the hunt applies
    (``choose_kept_state``); a damaged state and a damaged record are hunted too (the two routes: one locate pass from
    step 1, and the plain hunt's two passes)."""
    from mindguard.protocol.kept_state import choose_kept_state

    cwd = folder_with_script(tmp_path / "w")
    _, own, failure = failed_run(cwd)
    pristine = tmp_path / "pristine"
    shutil.copytree(cwd, pristine)
    for number, (damage, reason) in enumerate(DAMAGES.items()):
        if number:   # the evidence as the failing run left it
            shutil.rmtree(cwd)
            shutil.copytree(pristine, cwd)
        kept = Path(failure["kept_state"]["path"])
        target = {"truncated state.json": kept / "state.json", "damaged state.npz": kept / "state.npz",
                  "missing state.npz": kept / "state.npz", "truncated record": own}[damage]
        data = target.read_bytes()
        if damage.startswith("missing"):
            target.unlink()
        elif damage.startswith("damaged"):
            target.write_bytes(data[:100] + bytes(b ^ 0xFF for b in data[100:200]) + data[200:])
        else:
            target.write_bytes(data[:len(data) // 2])
        if target != own:
            folder, meta, why = choose_kept_state(failure, POISON)
            assert folder is None and meta is None and re.search(reason, why or ""), (damage, folder, why)
        if damage not in ("damaged state.npz", "truncated record"):
            continue
        proc = hunt_from(cwd, own)
        assert proc.returncode == 1, (damage, explain(proc))
        no_crash(proc)
        said = ("running the two passes of a plain hunt instead",   # (a record that cannot be read names no step)
                "one pass from step 1 finds the exact step")           # (issue 51: the record names the step)
        lines = [line for line in proc.stderr.splitlines() if any(words in line for words in said)]
        assert len(lines) == 1 and re.search(reason, lines[0]), (damage, explain(proc))
        assert "failed at global step 2 (exception)" not in proc.stderr, damage
        summary = summary_of(cwd / "run")
        assert re.search(reason, summary["from_record"]["fallback"]), (damage, summary["from_record"])
        assert summary["failure"]["global_step"] == POISON and summary["origin"]["op_type"] == "SqrtGrad", \
            (damage, summary)


def test_a_renamed_layer_is_said_and_hunted_from_step_1(tmp_path):
    """The user renamed a layer after the failure: the kept state's Parameters no longer fit. One line says which
    Parameter and that train.py changed; one locate pass from step 1 answers (it used to print the child's
    traceback and "the run failed at global step 2 (exception)", then the plain hunt's two passes)."""
    cwd = folder_with_script(tmp_path / "w")
    _, own, _ = failed_run(cwd)
    script = cwd / "train.py"
    script.write_text(script.read_text().replace("self.embedding", "self.embed"))
    proc = hunt_from(cwd, own)
    assert proc.returncode == 1, explain(proc)
    assert "Traceback" not in proc.stderr and "failed at global step 2 (exception)" not in proc.stderr, explain(proc)
    assert "note: train.py changed since the failure" in proc.stderr, explain(proc)
    why = ("the kept training state does not fit this run: Parameter 0 is 'embed.embedding_table' here, "
           "'embedding.embedding_table' when it was kept")
    assert f"{why}" in proc.stderr and "running the two passes of a plain hunt instead" not in proc.stderr, \
        explain(proc)   # the record names the step: one locate pass from step 1 after the resumed one
    assert "one pass from step 1 finds the exact step the record points at and dumps it as it runs (the second and " \
        "last process)" in proc.stderr, explain(proc)
    assert sorted(p.name for p in (cwd / "run").iterdir() if (p / "output.log").is_file()) == \
        ["locate", "locate-from-step-1"], explain(proc)
    summary = summary_of(cwd / "run")
    assert why in summary["from_record"]["fallback"] and summary["from_record"]["edits"], summary["from_record"]
    assert summary["failure"]["global_step"] == POISON and summary["origin"]["op_type"] == "SqrtGrad", summary


def test_an_edit_the_kept_state_overrides_is_named(tmp_path):
    """The learning rate changed in the script after the failure: the kept state holds the failing run's (a
    Parameter), so the resumed hunt answers for the failing run -- and says the edit is not in effect."""
    cwd = folder_with_script(tmp_path / "w")
    _, own, _ = failed_run(cwd)
    script = cwd / "train.py"
    script.write_text(script.read_text().replace("learning_rate=0.01))   # LR", "learning_rate=0.002))   # LR"))
    proc = hunt_from(cwd, own)
    assert proc.returncode == 1, explain(proc)
    assert ("note: learning_rate: 0.002 in the script now, 0.01 in the failing run: the kept state (global step "
            in proc.stderr and "this edit is not in effect" in proc.stderr), explain(proc)
    summary = summary_of(cwd / "run")
    assert summary["from_record"]["route"] == "resume" and "fallback" not in summary["from_record"], summary
    assert any("learning_rate" in e for e in summary["from_record"]["edits"]), summary["from_record"]
    assert summary["failure"]["global_step"] == POISON


@pytest.mark.parametrize("poison, outcome", [(POISON, 1), (0, 4)])
def test_a_sigkilled_run_resumes_from_its_last_state_on_disk(tmp_path, poison, outcome):
    """SIGKILLed at step 14 (as the OOM-killer does), its record running, states on disk: the hunt resumes from the
    last one. Weights already NaN since step 12 (unseen by the sparse checks): found at step 12. A healthy run:
    the kill came from outside, exit 4. Nothing re-trained from step 1."""
    cwd = folder_with_script(tmp_path / "w")
    args = ("--disk-until", "6", "--kill-at", "14", "--poison", str(poison))
    killed = train(cwd, *args)
    assert killed.returncode == -signal.SIGKILL, explain(killed)
    states = Path(record_of(cwd / RECORD)["states"])
    last = max(int(p.parent.name.split("-")[1]) for p in states.glob("step-*/state.json"))
    shown = subprocess.run([sys.executable, "-m", "mindguard", "record", RECORD], cwd=cwd, env=clean_env(),
                           capture_output=True, text=True, timeout=60)
    assert "running: epoch 1, step 14/16 (global step 14)" in shown.stdout, explain(shown)
    assert f"last state on disk global step {last} (" in shown.stdout, explain(shown)
    proc = hunt_from(cwd, cwd / RECORD, *args)
    assert proc.returncode == outcome, explain(proc)
    no_crash(proc)
    assert f"resuming from the last complete state on disk, kept at global step {last}" in proc.stderr, explain(proc)
    log = (cwd / "run" / "locate" / "output.log").read_text()
    assert f"training state of global step {last} loaded" in log, log[-2000:]
    summary = summary_of(cwd / "run")
    assert not (cwd / "run" / "pass1").exists() and "fallback" not in summary["from_record"], summary
    if outcome == 1:
        assert summary["failure"]["global_step"] == POISON and summary["origin"]["op_type"] == "SqrtGrad", summary
    else:
        assert "the kill came from outside the step's computation" in proc.stderr, explain(proc)


def test_a_damaged_progress_file_of_a_killed_run_is_said_and_the_whole_run_hunted(tmp_path):
    """The step a killed run was in lives in its progress file: damaged, the record alone cannot say it; one line
    says so and the plain hunt runs the whole training (healthy here: the kill came from outside)."""
    cwd = folder_with_script(tmp_path / "w")
    args = ("--disk-until", "6", "--kill-at", "9", "--poison", "0")
    killed = train(cwd, *args)
    assert killed.returncode == -signal.SIGKILL, explain(killed)
    progress = cwd / f".{RECORD}.progress"
    progress.write_bytes(progress.read_bytes()[:40])
    proc = hunt_from(cwd, cwd / RECORD, *args)
    assert proc.returncode == 0, explain(proc)
    no_crash(proc)
    lines = [line for line in proc.stderr.splitlines() if "running the two passes of a plain hunt instead" in line]
    assert len(lines) == 1 and f"the progress file {progress} is damaged" in lines[0], explain(proc)
    assert summary_of(cwd / "run")["outcome"] == "healthy"


def test_a_data_file_changed_since_the_failure_is_named(tmp_path):
    """The run read its batches from a CSV file through MindSpore's CSVDataset; a row was appended after the failure.
    The record carries the file's fingerprint (size, modification time), and ``hunt --from`` names the change and what
    it means, in its output and in summary.json; the hunt still answers (the changed file only adds a row at the
    end)."""
    cwd = tmp_path / "w"
    cwd.mkdir()
    shutil.copy(Path(__file__).resolve().parent / "zoo" / "csv_train.py", cwd / "train.py")
    assert train(cwd, "data/train.csv", "--write", "9").returncode == 0
    proc = train(cwd, "data/train.csv")
    assert proc.returncode == 1, explain(proc)
    own = printed_record(proc)
    size = (cwd / "data" / "train.csv").stat().st_size
    assert record_of(own)["data_sources"]["data/train.csv"]["bytes"] == size, record_of(own)
    with open(cwd / "data" / "train.csv", "a") as data:
        data.write("0.1,0.2,0.3,0.4,0.5\n")
    hunt = hunt_from(cwd, own, "data/train.csv")
    assert hunt.returncode == 1, explain(hunt)
    note = (f"note: data/train.csv changed since the failure ({size:,} -> {size + 20:,} bytes): the hunt reads the "
            f"data as it is now, so its answer may not be the failing run's")
    assert note in hunt.stderr, explain(hunt)
    summary = summary_of(cwd / "run")
    assert any("data/train.csv changed since the failure" in e for e in summary["from_record"]["edits"]), summary
    assert summary["failure"]["global_step"] == 9, summary
