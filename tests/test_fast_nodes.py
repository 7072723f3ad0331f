"""Several msrun nodes, the pure parts: what a launcher's command line says (mindguard.protocol.cluster), the role a
rank's report gives it (clean only when read), and one answer from the nodes' reports (mindguard.report.nodes).
No MindSpore; tests/test_nodes.py runs the real two-launcher job."""
from __future__ import annotations

import pytest

from mindguard.report.model import role_of
from mindguard.report.nodes import merge
from mindguard.errors import ArgumentError
from mindguard.protocol.cluster import node_note, parse_launch, store_port

pytestmark = pytest.mark.fast

NODE1 = ["msrun", "--worker_num=4", "--local_worker_num", "2", "--node_rank=1", "--master_addr=10.0.0.5",
         "--master_port=8118", "--join=True", "train.py", "--lr", "0.1", "--node_rank=7"]


def test_an_msrun_command_splits_into_launcher_options_and_the_script():
    launch = parse_launch(NODE1)
    assert launch is not None and launch.launcher == ["msrun"] and launch.rest == ["train.py", "--lr", "0.1",
                                                                                    "--node_rank=7"]
    assert (launch.worker_num, launch.local_worker_num, launch.node_rank, launch.nodes, launch.multi_node) \
        == (4, 2, 1, 2, True)
    assert launch.ranks_of(1) == [2, 3] and launch.node_of(3) == 1 and launch.node_of(1) == 0
    # the command for another node: only msrun's --node_rank changes, never the script's own option of that name
    assert launch.for_node(0) == ["msrun", "--worker_num=4", "--local_worker_num=2", "--node_rank=0",
                                  "--master_addr=10.0.0.5", "--master_port=8118", "--join=True", "train.py", "--lr",
                                  "0.1", "--node_rank=7"]
    assert store_port(launch) == 8119 and store_port(launch, 9000) == 9000
    python_run = parse_launch(["/venv/bin/python3", "/venv/bin/msrun", "--worker_num=2", "--local_worker_num=2",
                               "t.py"])
    assert python_run is not None and python_run.launcher == ["/venv/bin/python3", "/venv/bin/msrun"]
    assert not python_run.multi_node and python_run.nodes == 1
    assert parse_launch(["python", "train.py"]) is None and parse_launch([]) is None


def test_a_hunt_across_nodes_refuses_what_msrun_would_number_otherwise():
    no_rank = parse_launch(["msrun", "--worker_num=4", "--local_worker_num=2", "t.py"])
    with pytest.raises(ArgumentError, match=r"--node_rank=-1: a hunt across 2 nodes needs each node's own "
                                            r"--node_rank, 0 to 1"):
        no_rank.check_hunt()
    uneven = parse_launch(["msrun", "--worker_num=3", "--local_worker_num=2", "--node_rank=0", "t.py"])
    with pytest.raises(ArgumentError, match=r"worker_num a multiple of local_worker_num"):
        uneven.check_hunt()
    bad = parse_launch(["msrun", "--worker_num=two", "t.py"])
    with pytest.raises(ArgumentError, match=r"msrun --worker_num='two': must be an integer"):
        bad.worker_num  # noqa: B018 - the property refuses
    with pytest.raises(ArgumentError, match=r"cluster port 65536: must be 1024-65535 .* --cluster-port PORT"):
        store_port(parse_launch(["msrun", "--master_port=65535", "t.py"]))


def test_guards_line_on_a_node_names_the_node_and_the_rank_that_failed_first():
    launcher = ["/venv/bin/python3", "/venv/bin/msrun", *NODE1[1:]]
    note = node_note(launcher, rank=2, stopped_by=1)
    assert "on this node (node 1 of 2)" in note and "10.0.0.5:8119" in note, note
    assert "rank 1 failed first, on node 0" in note, note
    assert "failed first" not in node_note(launcher, rank=2, stopped_by=None)
    one_node = ["msrun", "--worker_num=2", "--local_worker_num=2", "t.py"]
    assert node_note(one_node, 0, 1) == "" and node_note(None, 0, None) == ""


def test_a_rank_is_clean_only_when_its_step_was_read():
    read = {"rank": 0, "nonfinite_inputs": [], "origin": None, "analysed": True, "ops_analyzed": 37}
    assert role_of(read)["role"] == "clean"
    # the rank_0 folder MindSpore leaves on every node: metadata, no file of the step
    assert role_of(dict(read, ops_analyzed=0))["role"] == "not_read"
    assert role_of(dict(read, analysed=False))["role"] == "not_read"
    received = dict(read, origin={"name": "Default/AllReduce-op0", "received": True})
    assert role_of(received) == {"rank": 0, "role": "received", "op": "Default/AllReduce-op0"}


def _rank(rank, **fields):
    return dict({"rank": rank, "nonfinite_inputs": [], "origin": None, "first_nonfinite": None, "stopped_at": None,
                 "analysed": True, "ops_analyzed": 37, "warnings": [], "iteration": 4}, **fields)


def test_the_nodes_reports_become_one_answer_about_the_rank_that_made_the_values():
    sqrt_grad = {"op_type": "SqrtGrad", "name": "Gradients/norm-Norm/Grad_Sqrt/SqrtGrad-op0", "direction": "backward",
                 "forward_op": "Sqrt", "index": 12, "received": False}
    all_reduce = {"op_type": "AllReduce", "name": "Default/grad_reducer/AllReduce-op0", "direction": "forward",
                  "index": 20, "received": True}
    node0 = {"report": _rank(0, origin=all_reduce)}
    # node 1's dump also holds the metadata-only rank_0 folder: its rank 0 was not read there
    node1 = {"report": dict(_rank(1, origin=sqrt_grad), ranks=[_rank(0, ops_analyzed=0), _rank(1, origin=sqrt_grad)])}
    merged = merge([node0, node1], lambda node: [node], 2)
    assert (merged["origin_rank"], merged["origin_node"], merged["explains"]) == (1, 1, True)
    roles = {r["rank"]: (r["role"], r["node"]) for r in merged["report"]["rank_roles"]}
    assert roles == {0: ("received", 0), 1: ("local", 1)}, roles
    text = merged["text"]
    assert text.startswith("error: SqrtGrad") and "rank 0: no Inf/NaN" not in text, text
    assert "   rank 0 (node 0): received Inf/NaN through AllReduce" in text, text
    assert "   rank 1 (node 1): originated: SqrtGrad produced Inf/NaN" in text, text
    assert "rank 1 (node 1) went non-finite first" in text, text
    # a node that sent nothing: its ranks are "not read", never clean, and the answer still comes from the others
    alone = merge([node0, None], lambda node: [node], 2)
    assert {r["rank"]: r["role"] for r in alone["report"]["rank_roles"]} == {0: "received", 1: "not_read"}
    assert alone["origin_rank"] is None and "rank 1 (node 1): not read" in alone["text"], alone["text"]


def test_hunt_from_a_workers_record_under_its_launcher_is_the_same_command():
    from mindguard.hunt.plan import plan_from_record

    record = {"schema": 2, "status": "failed", "kind": "nonfinite_params", "global_step": 5, "phase": "step",
              "rank": 1, "argv": ["python", "train.py", "--lr", "0.1"]}
    same = plan_from_record(record, None, ["msrun", "--worker_num=2", "--local_worker_num=1", "--node_rank=1",
                                           "train.py", "--lr", "0.1"], "dump")
    assert not [w for w in same.warnings if "the record was written by" in w], same.warnings
    edited = plan_from_record(record, None, ["msrun", "--worker_num=2", "train.py", "--lr", "0.2"], "dump")
    assert [w for w in edited.warnings if "the record was written by `python train.py --lr 0.1`" in w], edited.warnings
