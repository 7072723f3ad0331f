"""``mindguard hunt --from`` of a multi-rank job: every rank's kept state, read on the node that runs it, and the
folder a resumed pass's ranks each load their own rank's state from.

An always-on Guard in a job of several ranks keeps each rank's state in that rank's own folder, at the same global
steps on every rank (:mod:`mindguard.training.state.agreed_keeps`), and each rank's record names its own. The hunt on a
node reads the records of the ranks that node runs (beside the record it was given: ``<stem>.rank<r>.json``), the
nodes exchange what they found (:meth:`mindguard.hunt.cluster.Cluster.gather`), and the plan resumes only when every
rank kept a state at one step (:func:`mindguard.hunt.plan.common_kept_step`). The resumed pass is then given
``<run>/kept-ranks/`` holding ``rank<r>`` -- a link to rank ``r``'s kept state -- for each rank of this node
(:func:`mindguard.protocol.folder.rank_state`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import RecordError
from ..protocol.cluster import parse_launch
from ..protocol.record import read_record_data
from ..protocol.kept_state import StateMeta, choose_state, read_state
from . import messages as say_
from .console import say
from .plan import common_kept_step, first_possible_step

KEPT_RANKS = "kept-ranks"   # in the hunt's run folder: one link per rank of this node to its kept state


def rank_record(path: Path, rank: int, own: int) -> Path:
    """The record of rank ``rank`` beside ``path``, rank ``own``'s (``x.rank0.json`` -> ``x.rank1.json``)."""
    tail = f".rank{own}{path.suffix}"   # mindguard._util.dist.per_rank_path's naming
    if not path.name.endswith(tail):
        return path if rank == own else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    return path.with_name(f"{path.name[:-len(tail)]}.rank{rank}{path.suffix}")


def local_states(path: Path, record: Dict[str, Any], ranks: List[int]
                 ) -> Tuple[Dict[int, Optional[Path]], Dict[int, Optional[int]], Dict[int, str]]:
    """For each of ``ranks`` (this node's 0-based ranks): its usable kept state's folder and step (``None``: none)
    and why not, from its record beside ``path`` (the record ``--from`` named, ``record`` its contents)."""
    own = int(record.get("rank") or 0)
    upto = first_possible_step(record)
    folders: Dict[int, Optional[Path]] = {}
    steps: Dict[int, Optional[int]] = {}
    why: Dict[int, str] = {}
    for rank in ranks:
        where = rank_record(path, rank, own)
        try:
            data = record if rank == own else read_record_data(where)
        except (RecordError, OSError, ValueError) as exc:
            folders[rank], steps[rank], why[rank] = None, None, f"its record {where} cannot be read: {exc}"
            continue
        if not isinstance(data, dict) or data.get("global_step") != record.get("global_step"):
            folders[rank], steps[rank] = None, None
            said, failed = data.get("global_step") if isinstance(data, dict) else None, record.get("global_step")
            why[rank] = f"its record {where} is of another failure (global step {said}, not {failed})"
            continue
        folder, meta, note = choose_state(data, upto)
        folders[rank] = folder
        steps[rank] = meta.step if meta is not None and folder is not None else None
        if steps[rank] is None:
            why[rank] = note or "none named"
    return folders, steps, why


def link_states(run: Path, folders: Dict[int, Optional[Path]]) -> Path:
    """``<run>/kept-ranks/rank<r>`` -> each rank's kept state folder; returns ``<run>/kept-ranks``."""
    kept = run / KEPT_RANKS
    kept.mkdir(exist_ok=False)
    for rank, folder in folders.items():
        if folder is not None:
            os.symlink(Path(folder).resolve(), kept / f"rank{rank}", target_is_directory=True)
    return kept


def kept_meta(folder: Path) -> Optional[StateMeta]:
    """The ``state.json`` of a kept state folder: its own (one process), or -- several ranks, each in ``rank<r>/``
    (:func:`mindguard.protocol.folder.rank_state`) -- its first rank's when every rank in it kept the same step;
    ``None`` when there is none or the ranks' steps differ."""
    meta = read_state(folder)
    if meta is not None:
        return meta
    metas = [read_state(d) for d in sorted(Path(folder).glob("rank*")) if d.is_dir()]
    if not metas or any(m is None for m in metas) or len({m.step for m in metas if m is not None}) > 1:
        return None
    return metas[0]


def job_states(path: Path, record: Dict[str, Any], ranks: int, command: Sequence[str], cluster: Any, run: Path
               ) -> Tuple[Optional[Path], Optional[StateMeta], Optional[str]]:
    """``--from`` ``path``, rank ``record["rank"]``'s record of a job of ``ranks`` ranks: this node's ranks' kept
    states (all ranks when ``cluster``, a :class:`~mindguard.hunt.cluster.Cluster`, is ``None``: one node), every
    node's steps through the cluster, and -- when every rank kept one at the same step -- the hunt's ``run`` folder's
    ``kept-ranks`` linking each of this node's ranks to its own, with its ``state.json``; else ``(None, None, why)``.
    Every node must call this at the same point of its hunt (it is one of the nodes' meetings)."""
    launch = parse_launch(command)
    mine = launch.ranks_of(cluster.node) if cluster is not None and launch is not None else list(range(ranks))
    folders, steps, why = local_states(path, record, mine)
    if cluster is not None:
        for theirs in cluster.gather("kept states", {"steps": steps, "why": why}):
            steps.update({int(r): s for r, s in theirs["steps"].items()})
            why.update({int(r): w for r, w in theirs["why"].items()})
    step, problem = common_kept_step(steps, why, ranks)
    if step is None:
        return None, None, problem
    kept = link_states(run, folders)
    say(say_.every_rank_resumes(ranks, step))
    return kept, kept_meta(kept), None
