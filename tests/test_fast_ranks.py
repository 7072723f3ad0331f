"""Several ranks keep their training state at the same steps and a job's hunt resumes only from one step on every
rank: the keep agreement carried in the per-step verdict exchange (mindguard.training.state.agreed_keeps, the flag bits
of mindguard.training.checks.consensus), the plan's per-rank rule (mindguard.hunt.plan.common_kept_step) and which
folder each rank of a resumed pass loads. No MindSpore; tests/test_nodes.py runs the real two-node job."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

import pytest

from mindguard.hunt.plan import common_kept_step, plan_from_record
from mindguard.hunt.ranks import rank_record
from mindguard.protocol.folder import rank_state
from mindguard.training.checks import consensus
from mindguard.training.state.agreed_keeps import CHECK, KEEP, READY, TO_DISK, AgreedKeeps

pytestmark = pytest.mark.fast


def run_ranks(steps: int, wants: Dict[int, bool], unready: Dict[int, List[int]], ranks: int = 3
              ) -> Dict[str, List[List[int]]]:
    """``ranks`` ranks through ``steps`` steps: at each step's end every rank's flags are exchanged (as the verdict's
    all-gather does); rank 0 wants a check and a keep at the steps in ``wants`` (True: to disk too); a rank listed in
    ``unready[step]`` cannot keep after that step. Returns the steps each rank checked at and kept at."""
    sides = [AgreedKeeps(r) for r in range(ranks)]
    checked: List[List[int]] = [[] for _ in sides]
    kept: List[List[int]] = [[] for _ in sides]
    for step in range(1, steps + 1):
        for r, side in enumerate(sides):   # the step begins: keep when agreed
            if side.keep_due(step) is not None:
                kept[r].append(step)
            if side.check_due(step):       # its end: the Parameters are checked when agreed
                checked[r].append(step)
        flags = [side.flags(step, wants_check=step in wants, wants_keep=step in wants, to_disk=bool(wants.get(step)),
                            ready=r not in unready.get(step, [])) for r, side in enumerate(sides)]
        for side in sides:
            side.agree(flags, step, step + 1)
    return {"checked": checked, "kept": kept}


def test_rank_zero_decides_and_every_rank_checks_then_keeps_at_the_same_steps():
    # rank 0 asks at the end of step 1 (first state as early as it can) and of step 6; other ranks' wishes are ignored
    out = run_ranks(10, wants={1: False, 6: True}, unready={})
    assert out["checked"] == [[2, 7]] * 3   # the step after each ask: every rank checks its Parameters
    assert out["kept"] == [[3, 8]] * 3      # and keeps at the beginning of the step after that check


def test_no_rank_keeps_when_one_rank_is_not_ready():
    out = run_ranks(10, wants={1: False, 6: False}, unready={2: [2]})   # rank 2's check after step 2 failed
    assert out["kept"] == [[8]] * 3


def test_a_new_ask_waits_for_the_pending_one_and_a_late_verdict_keeps_nothing():
    side = AgreedKeeps(0)
    assert side.flags(4, wants_check=True, wants_keep=True, to_disk=True, ready=True) == CHECK | KEEP | TO_DISK
    side.agree([CHECK | KEEP | TO_DISK, 0], 4, 5)
    assert side.flags(4, wants_check=True, wants_keep=True, to_disk=False, ready=True) == 0   # one at a time
    assert side.flags(5, wants_check=False, wants_keep=False, to_disk=False, ready=True) == READY
    side.agree([READY, READY], 5, 7)   # the verdict of step 5 read at the end of step 6 (deferred): no keep
    assert side.keep_due(7) is None and side.check_at is None and side.keep_at is None
    side.agree([CHECK | KEEP | TO_DISK, 0], 7, 8)
    side.agree([READY, READY], 8, 9)
    assert side.keep_due(9) is True and side.keep_due(9) is None   # to disk too, consumed once


def test_the_flags_ride_above_the_verdict_code_and_do_not_change_it():
    # the exchange of one process returns its own code: flags and verdict come back apart
    decision, flags = consensus.exchange(0, None, 1.0, [], None, [], True, CHECK | KEEP)
    assert decision is None and flags == [CHECK | KEEP]
    top = consensus._encode(3, consensus.KINDS[-1])
    assert top < 1 << consensus.VERDICT_BITS and (top | (15 << consensus.VERDICT_BITS)) < 2 ** 24   # exact in f32
    codes = [consensus._encode(consensus._INPUTS, "nonfinite_loss"), 0]
    failure = consensus._verdict(1, codes, None, 0.5, [], None, [], True)
    assert failure is not None and failure["stopped_by_rank"] == 0


@pytest.mark.parametrize("kept, why, ok", [
    ({0: 7, 1: 7}, {}, (7, None)),
    ({0: 7, 1: 9}, {}, "the ranks kept their training states at different global steps (rank 0: 7, rank 1: 9)"),
    ({0: 7, 1: None}, {1: "the run kept no training state"},
     "rank 1 has no kept training state to resume from (the run kept no training state)"),
    ({0: 7}, {}, "the records of rank 1 were not read"),
])
def test_a_job_resumes_only_when_every_rank_kept_a_state_at_one_step(kept, why, ok):
    step, problem = common_kept_step(kept, why, 2)
    if isinstance(ok, tuple):
        assert (step, problem) == ok
    else:
        assert step is None and problem is not None and problem.startswith(ok), problem


def test_the_plan_of_a_job_resumes_from_every_rank_s_own_state_and_falls_back_with_the_reason():
    record = {"schema": 2, "status": "failed", "kind": "nonfinite_params", "global_step": 12, "phase": "step",
              "group_size": 2, "failure_window": [9, 12], "argv": ["python", "t.py"]}
    plan = plan_from_record(record, {"schema": 1, "step": 8}, ["python", "t.py"], "dump", ranks=2)
    assert (plan.route, plan.state_step, plan.locate, plan.window) == ("resume", 8, True, (9, 12))
    assert "kept at global step 8, on every rank (0-1) from its own: locate the exact step" in plan.why, plan.why
    _, why = common_kept_step({0: 8, 1: 5}, {}, 2)
    fallback = plan_from_record(record, None, ["python", "t.py"], "dump", why, ranks=2)
    assert (fallback.route, fallback.why) == ("from_step_1", why)


def test_each_rank_loads_its_own_rank_s_state_and_finds_its_sibling_records():
    assert rank_state("/run/kept-ranks", 1, 2) == Path("/run/kept-ranks/rank1")
    assert rank_state("/run/locate/state", 0, 1) == Path("/run/locate/state")   # one process: the folder itself
    assert rank_record(Path("/n/mindguard_failure.rank0.json"), 3, 0) == Path("/n/mindguard_failure.rank3.json")
    assert rank_record(Path("/n/a.rank1.b.rank1.json"), 2, 1) == Path("/n/a.rank1.b.rank2.json")


def test_mindguard_s_own_error_in_the_agreement_never_skips_the_exchange(capsys):
    from mindguard.training.checks.checked import ParamChecks
    from mindguard.training.state.run_state import RunState

    class BrokenKeeper:   # a keeper whose own rule raises (a mindguard bug)
        agreed = AgreedKeeps(0)
        on_disk = True

        def due(self, step):
            raise ZeroDivisionError("division by zero")

    state = RunState(None)
    state.keeper = BrokenKeeper()  # type: ignore[assignment]
    assert state.keep_flags(4, ParamChecks()) == 0   # the rank still takes part in the exchange, asking nothing
    assert state.agreement_lost and "the ranks keep no more training states (ZeroDivisionError" in \
        capsys.readouterr().err
    state.agree_keeps([CHECK | KEEP, 0], 4, 5)       # ignored from now on: this rank never says READY again
    assert BrokenKeeper.agreed.check_at is None and state.keep_flags(5, ParamChecks()) == 0
