"""The hunts of one multi-node msrun job meet before every pass: one plan, launched together, one answer.

Each node runs ``mindguard hunt [--from RECORD] -- msrun ... --node_rank=K ...``. The hunt on node 0 hosts a small
key-value store -- MindSpore's own ``mindspore.mint.distributed.TCPStore`` -- on all interfaces at the master
address's :func:`~mindguard.protocol.cluster.store_port`; the others connect to it. No shared disk is needed: each
node keeps its records, dumps and run folder locally and only small JSON documents cross (records, plans,
reports; a few kB).

* :meth:`Cluster.join` -- every node announces itself; a node missing after ``join_timeout`` seconds is named,
  with the command to run there, before any pass starts (nothing is launched, nothing hangs).
* :meth:`Cluster.agree` -- before each pass every node posts what it is about to launch (pass, step, dump
  iterations, scope); all wait for all, compare, and launch within milliseconds of each other.
* :meth:`Cluster.gather` -- after a pass every node's records (or, at the end, its report) reach every node, so
  every later decision is taken from the same facts on every node, and the answer is one.

Every wait is bounded by ``join_timeout`` and raises :class:`ClusterError` naming the nodes that did not come.
"""
from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Set

from ..errors import HuntError
from ..protocol.cluster import JOIN_TIMEOUT, Launch, parse_launch, store_port

_POLL = 0.1        # seconds between two looks at a counter while waiting for the other nodes
_CONNECT = 2.0     # seconds one connection attempt to node 0's store may take


class ClusterError(HuntError):
    """The nodes of a hunt across nodes could not meet (a node missing, gone, or about to do something else)."""


class Cluster:
    """This node's side of the hunts of one job. ``node``: this node's 0-based rank (msrun ``--node_rank``)."""

    VERIFY_NOTE = ("once the script is edited, check the fix by training it again: `mindguard verify` does not "
                   "coordinate several nodes yet (it can check a fix run on one node, with --local_worker_num equal "
                   "to --worker_num)")

    def __init__(self, launch: Launch, port: int, join_timeout: float = JOIN_TIMEOUT):
        self.launch, self.port, self.join_timeout = launch, port, float(join_timeout)
        self.node, self.nodes = launch.node_rank, launch.nodes
        self._store: Any = None
        self._joined = False   # every node came: leaving waits for the others to leave too
        self.timings: Dict[str, float] = {}   # seconds each exchange waited for the other nodes
        self.sent_bytes = 0                     # what this node posted (records, reports), JSON bytes
        self._seq = 0   # exchanges so far: every node makes the same ones in the same order, so a label met twice
                        # (a pass run again, an analysis redone) is a new meeting, never an old answer

    # -- the store ---------------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"{self.launch.master_addr}:{self.port}"

    def _open(self, deadline: float) -> bool:
        """Host the store (node 0) or connect to it, retrying until ``deadline``; False when node 0 never came."""
        from mindspore.mint.distributed import TCPStore

        if self.node == 0:
            try:
                self._store = TCPStore("0.0.0.0", self.port, world_size=self.nodes, is_master=True,
                                       timeout=timedelta(seconds=_CONNECT), wait_for_workers=False)
            except RuntimeError as exc:
                raise ClusterError(f"cannot host the hunts' meeting point on port {self.port} of this node (the "
                                   f"master, {self.launch.master_addr}): {str(exc).strip().splitlines()[0]}; give "
                                   f"every node's hunt the same free port with --cluster-port PORT") from None
            return True
        while True:
            try:
                self._store = TCPStore(self.launch.master_addr, self.port, is_master=False,
                                       timeout=timedelta(seconds=_CONNECT))
                return True
            except RuntimeError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(_POLL * 5)

    def _count(self, key: str, add: int = 0) -> int:
        try:
            return int(self._store.add(key, add))
        except RuntimeError as exc:
            raise ClusterError(f"lost node 0's hunt at {self.address} ({str(exc).strip().splitlines()[0]}): it "
                               f"ended or its node went away; see its output, then hunt again on every node") \
                from None

    # -- what the hunt calls -------------------------------------------------------------------------------
    def join(self) -> None:
        """Meet the other nodes' hunts before anything is launched; :class:`ClusterError` naming who is missing
        and what to run there, within ``join_timeout`` seconds."""
        started = time.monotonic()
        if not self._open(started + self.join_timeout):
            raise ClusterError(self._missing_text([0], "did not answer (its hunt hosts the meeting point)"))
        self._store.set(f"info/node{self.node}", json.dumps(
            {"node": self.node, "host": socket.gethostname(), "cwd": os.getcwd(), "pid": os.getpid()}))
        self._count(f"join/node{self.node}", 1)
        left = max(0.0, self.join_timeout - (time.monotonic() - started))
        missing = self._wait_polling("join", {n: f"join/node{n}" for n in range(self.nodes)}, left)
        if missing:
            raise ClusterError(self._missing_text(missing, "did not join"))
        self._joined = True
        from .console import say as _say

        _say(f"node {self.node} of {self.nodes}: the hunts of all {self.nodes} nodes met at {self.address} after "
             f"{self.timings['join']:.1f} s; every pass is agreed and launched together, and the answer is one")

    def agree(self, label: str, plan: Dict[str, Any]) -> None:
        """Before pass ``label``: every node posts ``plan`` (what it is about to launch, node-independent fields);
        all wait for all and check they are the same, so the launches start together and do the same thing."""
        key = self._key("plan", label)
        self._store.set(f"{key}/node{self.node}", json.dumps(plan, sort_keys=True, default=str))
        self._count(f"{key}/node{self.node}/ready", 1)
        missing = self._wait_polling(f"plan {label}", {n: f"{key}/node{n}/ready" for n in range(self.nodes)},
                                     self.join_timeout)
        if missing:
            raise ClusterError(self._missing_text(missing, f"did not reach {label}"))
        plans = {n: json.loads(self._store.get(f"{key}/node{n}")) for n in range(self.nodes)}
        differ = {n: p for n, p in plans.items() if p != plans[0]}
        if differ:
            raise ClusterError(f"the nodes' hunts disagree on {label}: node 0 would run {plans[0]}, "
                               + "; ".join(f"node {n} {p}" for n, p in differ.items())
                               + ". They started from different records or options: give every node the same "
                                 "hunt options (--from the record Guard printed on that node)")

    def gather(self, label: str, payload: Any) -> List[Any]:
        """Post ``payload`` (JSON-able) and return every node's, indexed by node."""
        text = json.dumps(payload, default=str)
        self.sent_bytes += len(text)
        key = self._key("data", label)
        self._store.set(f"{key}/node{self.node}", text)
        self._count(f"{key}/node{self.node}/ready", 1)
        missing = self._wait_polling(label, {n: f"{key}/node{n}/ready" for n in range(self.nodes)},
                                     self.join_timeout)
        if missing:
            raise ClusterError(self._missing_text(missing, f"sent nothing for {label}"))
        return [json.loads(self._store.get(f"{key}/node{n}")) for n in range(self.nodes)]

    # -- the hunt's three questions, asked of every node -----------------------------------------------------
    @staticmethod
    def plan_of(folder: str, request: Any, dump: Any) -> Dict[str, Any]:
        """What a pass launches, in the fields that must be the same on every node (no local paths)."""
        plan = {"pass": folder, "pass_name": request.pass_name, "examine_step": request.examine_step,
                "examine": request.examine, "keep_steps": request.keep_steps, "keep_every": request.keep_every,
                "resumed": request.resume_dir is not None}
        if dump is not None:
            plan["dump"] = {"iteration": dump.iteration, "kernels": dump.kernels, "input_output": dump.input_output}
        return plan

    def all_records(self, folder: str, records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """After pass ``folder``: every node's records (one per rank), sorted by rank; this node's for its ranks."""
        mine = {r.get("rank") for r in records}
        joined = list(records)
        for node, theirs in enumerate(self.gather(f"records {folder}", records)):
            if node != self.node:
                joined += [r for r in theirs or [] if r.get("rank") not in mine]
        return sorted(joined, key=lambda r: (r.get("rank") is None, r.get("rank") or 0))

    def one_report(self, label: str, report: Any) -> Any:
        """After this node analysed its dump: the one answer of every node's (:mod:`mindguard.report.nodes`), a
        :class:`NodesReport` read where the hunt reads its ``DumpReport``."""
        from ..report.nodes import merge

        own = _own_ranks(report, set(self.launch.ranks_of(self.node)))
        sent = self.gather(f"report {label}", {"report": own.to_dict()})
        return NodesReport(merge(sent, self.launch.ranks_of, self.launch.worker_num), own)

    def close(self) -> None:
        """Leave: node 0 keeps the store until every node has left (bounded), so that none loses an answer."""
        if self._store is None:
            return
        if self._joined:
            from .console import say as _say

            _say(f"node {self.node}: waited for the other nodes' hunts "
                 + ", ".join(f"{what} {seconds:.2f} s" for what, seconds in self.timings.items())
                 + f"; posted {self.sent_bytes / 1024:.1f} kB")
        try:
            self._count(f"leave/node{self.node}", 1)
            if self.node == 0 and self._joined:
                self._wait_polling("leave", {n: f"leave/node{n}" for n in range(self.nodes)}, self.join_timeout)
        except ClusterError:
            pass
        self._store = None

    # -- helpers -------------------------------------------------------------------------------------------
    def _key(self, kind: str, label: str) -> str:
        self._seq += 1
        return f"{kind}/{self._seq}/{label}"

    def _wait_polling(self, what: str, keys: Dict[int, str], timeout: float) -> List[int]:
        started = time.monotonic()
        while True:
            missing = [node for node, key in keys.items() if self._count(key) < 1]
            if not missing or time.monotonic() - started >= timeout:
                self.timings[what] = round(time.monotonic() - started, 3)
                return missing
            time.sleep(_POLL)

    def _missing_text(self, missing: Sequence[int], what: str) -> str:
        lines = [f"node {n} (ranks {', '.join(map(str, self.launch.ranks_of(n)))}) {what} within "
                 f"{self.join_timeout:g} s (--join-timeout; this is node {self.node})" for n in missing]
        runs = "\n".join(f"    on node {n}: mindguard hunt [--from <the record Guard printed there>] -- "
                         f"{_join(self.launch.for_node(n))}" for n in missing)
        return ("; ".join(lines) + f". A hunt across {self.nodes} nodes runs on every node at once (they meet at "
                f"{self.address}, hosted by node 0's hunt). Run there, with the same options:\n{runs}")


def _join(argv: Sequence[str]) -> str:
    import shlex

    return shlex.join(list(argv))


def cluster_for(command: Sequence[str], join_timeout: Optional[float] = None,
                port: Optional[int] = None) -> Optional[Cluster]:
    """The cluster a hunt of ``command`` belongs to: None unless it is one node's launcher of a multi-node msrun
    job (``--local_worker_num`` < ``--worker_num``). Bad msrun options are refused (:class:`ArgumentError`)."""
    launch = parse_launch(command)
    if launch is None or not launch.multi_node:
        return None
    launch.check_hunt()
    timeout = JOIN_TIMEOUT if join_timeout is None else join_timeout
    return Cluster(launch, store_port(launch, port), timeout)


def _own_ranks(report: Any, mine: Set[int]) -> Any:
    """This node's part of its dump's report: MindSpore writes a ``rank_0`` folder (metadata only) on every node,
    which the analysis reads as a rank of its own; the answer for a rank comes from the node that runs it."""
    if not report.ranks:
        return report
    kept = [r for r in report.ranks if r.rank in mine]
    if not kept or len(kept) == len(report.ranks):
        return report
    if len(kept) == 1:
        return kept[0]
    from ..analysis.report import _combine

    return _combine(report.dump, kept)


class NodesReport:
    """The merged answer in the shape the hunt's analysis step reads from a :class:`DumpReport` (``to_dict()``,
    ``str()``, ``explains_failure``, ``origin_rank``, ``ranks``, ...); this node's own report for the rest."""

    def __init__(self, merged: Dict[str, Any], local: Any):
        self._merged, self._local = merged, local
        self.notes: List[str] = []
        self.origin_rank: Optional[int] = merged["origin_rank"]
        self.ranks: List[Dict[str, Any]] = merged["report"]["ranks"]
        self.iteration = merged["report"].get("iteration", local.iteration)
        self.explains_failure: bool = merged["explains"]
        self.holds_nonfinite: bool = merged["holds"]
        self.profile = local.profile

    def to_dict(self) -> Dict[str, Any]:
        out = dict(self._merged["report"])
        out["notes"] = self.notes + list(out.get("notes") or [])
        return out

    def __str__(self) -> str:
        return "\n".join([*(f"note: {n}" for n in self.notes), self._merged["text"]])
