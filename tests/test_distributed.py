"""mindguard under ``msrun``: real 2-worker data-parallel trainings on CPU (mccl collectives, loopback only).

Three msrun launches in all (each ~15-45 s): ``mindguard hunt`` on a run whose rank 1 gets a poisoned batch
(pass 1 records, pass 2 dumps both ranks, the analysis names rank 1), and one healthy run.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from page_checks import check_in_browser, check_page_file

SAMPLE = REPO / "samples" / "distributed_train.py"
MSRUN = Path(sys.executable).parent / "msrun"
LAUNCH_TIMEOUT = 240  # seconds for one msrun launch (measured 15-45 s on an idle 2-core machine)


def _loopback_problem() -> str:
    if not MSRUN.exists():
        return f"msrun not found next to {sys.executable} (MindSpore's launcher; comes with the mindspore wheel)"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
    except OSError as exc:
        return f"cannot bind a TCP port on 127.0.0.1 ({exc}); msrun's scheduler needs one"
    return ""


needs_msrun = pytest.mark.skipif(bool(_loopback_problem()), reason=_loopback_problem())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def msrun_command(log_dir: Path, *script_args: str) -> list:
    return [str(MSRUN), "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
            f"--master_port={free_port()}", "--join=True", f"--log_dir={log_dir}", str(SAMPLE), *script_args]


def child_env(**extra: str) -> dict:
    env = dict(os.environ, GLOG_v="3", PYTHONUNBUFFERED="1")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    for key in [k for k in env if k.startswith("MINDGUARD_")]:
        env.pop(key)
    env["PATH"] = str(MSRUN.parent) + os.pathsep + env.get("PATH", "")  # msrun starts `python` from PATH
    env.update(extra)
    return env


def run_bounded(command: list, env: dict, timeout: float, cwd=None) -> subprocess.CompletedProcess:
    """Run ``command``; on timeout stop it and every worker msrun started (they run in their own sessions)."""
    from mindguard.hunt.passes import _stop

    proc = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        out, err = proc.communicate()
        pytest.fail(f"{command[:3]}... did not finish in {timeout:.0f} s\n--- stdout ---\n{out[-3000:]}\n"
                    f"--- stderr ---\n{err[-3000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def worker_logs(log_dir: Path) -> str:
    return "\n".join(f"--- {p.name} ---\n{p.read_text(errors='replace')[-2500:]}"
                     for p in sorted(log_dir.glob("worker_*.log")))


def explain(proc: subprocess.CompletedProcess, log_dir: Path) -> str:
    noise = re.compile(r"^\[(INFO|WARNING)\] ")
    err = "\n".join(line for line in proc.stderr.splitlines() if not noise.match(line))
    return f"exit {proc.returncode}\n--- stderr ---\n{err[-4000:]}\n{worker_logs(log_dir)}"


@pytest.mark.distributed
@needs_msrun
def test_hunt_under_msrun_names_the_rank_whose_batch_was_poisoned(tmp_path):
    """Rank 1's shard holds an Inf at global step 5: both ranks stop at step 5, rank 1 is the origin everywhere."""
    run, log_dir = tmp_path / "run", tmp_path / "msrun_logs"
    proc = run_bounded([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(run), "--timeout",
                        str(LAUNCH_TIMEOUT), "--", *msrun_command(log_dir, "--poison-rank", "1", "--poison-step", "5")],
                       child_env(), timeout=2 * LAUNCH_TIMEOUT + 120, cwd=tmp_path)
    why = explain(proc, log_dir)
    assert proc.returncode == 1, why
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "failure_found", (summary["outcome"], why)

    # pass 1: one record per rank, both failed at the same step; rank 1 is the origin, rank 0 stopped for it
    records = {r["rank"]: r for r in summary["pass1"]["records"]}
    assert sorted(records) == [0, 1] and all(r["group_size"] == 2 for r in records.values()), records
    assert [(records[r]["status"], records[r]["global_step"], records[r]["dump_iteration"]) for r in (0, 1)] \
        == [("failed", 5, 4), ("failed", 5, 4)], records
    origin, follower = records[1], records[0]
    assert origin["kind"] == "nonfinite_loss" and origin["stopped_by_rank"] is None, origin
    assert "input0" in origin["nonfinite"] and "loss" in origin["nonfinite"], origin["nonfinite"]
    assert follower["stopped_by_rank"] == 1 and follower["origin_kind"] == "nonfinite_loss", follower
    assert follower["kind"] == "nonfinite_params" and np.isfinite(follower["loss"]), follower
    assert "inputs and loss were finite" in follower["message"] and "AllReduce" in follower["message"], \
        follower["message"]
    assert (run / "pass1" / "failure.rank0.json").is_file() and (run / "pass1" / "failure.rank1.json").is_file(), \
        sorted(p.name for p in (run / "pass1").iterdir())
    # no rank ran past the failing step (each worker prints "rank R step S: loss L")
    steps = re.findall(r"rank (\d) step (\d+): loss", (run / "pass1" / "output.log").read_text(errors="replace"))
    last = {rank: max(int(s) for r, s in steps if r == rank) for rank in ("0", "1")}
    assert last == {"0": 5, "1": 5}, (last, steps)

    # pass 2: the dump the hunt armed (one dump.json, exported before msrun) reached both workers: each rank
    # dumped iteration 4
    pass2 = run / "pass2"
    assert (pass2 / "dump.json").is_file(), sorted(p.name for p in pass2.iterdir())
    for rank in (0, 1):
        dumped = sorted((pass2 / "dump" / f"rank_{rank}" / "Net").glob("*/4"))
        assert dumped and any(dumped[0].iterdir()), (rank, sorted(p.name for p in (pass2 / "dump").rglob("*"))[:20])
    assert {r["rank"]: r["stopped_by_rank"] for r in summary["pass2"]["records"]} == {0: 1, 1: None}, \
        summary["pass2"]["records"]

    # analysis: rank 1's batch brought the Inf in, rank 0 received it through the gradient AllReduce
    report = json.loads((run / "report.json").read_text())
    roles = {r["rank"]: r for r in report["rank_roles"]}
    assert report["origin_rank"] == 1 and summary["origin_rank"] == 1, (report["origin_rank"], report["rank_roles"])
    assert roles[1]["role"] == "batch" and roles[1]["inputs"] == ["inputs0"], roles
    assert roles[0]["role"] == "received" and "AllReduce" in roles[0]["op"], roles
    assert report["nonfinite_inputs"][0]["pos_inf"] == 1, report["nonfinite_inputs"]
    text = (run / "report.txt").read_text()
    assert "rank 1: originated: its batch holds Inf/NaN (inputs0)" in text, text
    assert "rank 0: received Inf/NaN through AllReduce" in text, text
    # report.html: a graph per rank (rank 1's batch input, rank 0's AllReduce) and who made / received the values
    page = check_page_file(run)
    assert "originated: its batch holds Inf/NaN (inputs0)" in page and "received Inf/NaN through AllReduce" in page
    check_in_browser(run, culprit_texts=["inputs0", "+Inf 1"],
                     received_texts=["AllReduce", "RECEIVED FROM ANOTHER RANK"], min_nodes=3)


@pytest.mark.distributed
@needs_msrun
def test_healthy_run_under_msrun_keeps_ranks_identical_and_finishes(tmp_path):
    log_dir, params = tmp_path / "msrun_logs", tmp_path / "params"
    record = tmp_path / "failure.json"
    proc = run_bounded(msrun_command(log_dir, "--epochs", "2", "--steps-per-epoch", "4", "--params-out", str(params)),
                       child_env(MINDGUARD_RECORD=str(record)), timeout=LAUNCH_TIMEOUT, cwd=tmp_path)
    why = explain(proc, log_dir)
    assert proc.returncode == 0, why
    from mindguard.protocol.record import FailureRecord
    from mindguard._util.io import load_npy

    assert not record.exists(), "one record per rank is expected when distributed, not an unsuffixed one"
    for rank in (0, 1):
        rec = FailureRecord.load(tmp_path / f"failure.rank{rank}.json")
        assert (rec.status, rec.kind, rec.rank, rec.group_size, rec.global_step) == ("finished", None, rank, 2, 8), \
            (rec.to_dict(), why)
    logs = worker_logs(log_dir)
    for rank in (0, 1):
        assert re.search(rf"rank {rank}: cross-rank verdict exchange [\d.]+ ms/step over 8 steps", logs), logs
        # each rank kept its state in its own folder while it trained; a run that finished leaves none behind
        assert not (tmp_path / f"failure.rank{rank}.state").exists(), sorted(p.name for p in tmp_path.iterdir())
    files = sorted(p.name for p in (params / "rank_0").glob("*.npy"))
    assert files and files == sorted(p.name for p in (params / "rank_1").glob("*.npy")), (files, why)
    for name in files:
        a, b = load_npy(params / "rank_0" / name), load_npy(params / "rank_1" / name)
        assert np.isfinite(a).all() and np.array_equal(a, b), (name, a, b)


# ---------------------------------------------------------------------------------------------- in-process
def test_single_process_training_makes_no_collective_call(graph_mode, tmp_path):
    """Not distributed: the per-step verdict exchange is off (no cost), the record keeps its plain name."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    import mindguard
    import mindguard.protocol.record
    import mindguard.training.locator
    from mindguard._util.dist import collective_ready, exchange_codes
    from mindguard.demos import norm_nan

    assert not collective_ready() and exchange_codes(13) == [13]
    mindguard.fix_randomness(1)
    net = norm_nan.build_network()
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", check_every_step=True)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05)).train(
        1, norm_nan.make_dataset(4, poison_step=2), callbacks=[locator], dataset_sink_mode=False)
    assert locator.sync_steps == 0 and locator.sync_seconds == 0.0, (locator.sync_steps, locator.sync_seconds)
    record = mindguard.protocol.record.FailureRecord.load(tmp_path / "failure.json")
    assert (record.kind, record.global_step, record.group_size) == ("nonfinite_params", 2, 1), record.to_dict()
    assert record.stopped_by_rank is None and record.origin_kind is None, record.to_dict()
    assert ms.get_context("mode") == ms.GRAPH_MODE


def test_record_keeps_which_rank_stopped_it(tmp_path):
    from mindguard.protocol.record import FailureRecord, RecordError

    record = FailureRecord(status="failed", kind="nonfinite_params", global_step=5, dump_iteration=4, rank=0,
                           group_size=2, stopped_by_rank=1, origin_kind="nonfinite_loss", message="stopped")
    loaded = FailureRecord.load(record.save(tmp_path / "failure.rank0.json"))
    assert loaded == record, (loaded, record)
    data = dict(record.to_dict(), origin_kind="exploded")
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"origin_kind must be null or one of .*'exploded'"):
        FailureRecord.load(tmp_path / "bad.json")
    (tmp_path / "bad2.json").write_text(json.dumps(dict(record.to_dict(), stopped_by_rank="1")))
    with pytest.raises(RecordError, match=r"stopped_by_rank must be an integer or null, got '1'"):
        FailureRecord.load(tmp_path / "bad2.json")
