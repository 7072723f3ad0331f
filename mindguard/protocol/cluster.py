"""One msrun launcher per node: what its command line says about the job (pure; no MindSpore, no I/O but
:func:`launcher_argv`).

MindSpore's ``msrun`` runs on every node of a multi-node job with the same ``--worker_num`` (ranks in the job),
``--local_worker_num`` (ranks on this node), ``--master_addr``/``--master_port`` (the scheduler, started by the
launcher whose node owns the master address) and its own ``--node_rank`` (0-based). Global rank ids are then
``node_rank * local_worker_num + local index`` (0-based), exported to each worker as ``RANK_ID``; msrun exports
no node rank to the workers (measured, docs/mindspore-facts.md "nodes"), so a worker learns its launcher's
arguments from its parent process's command line.

The hunts of one job meet on a key-value store (MindSpore's ``TCPStore``) on the master address, at
:func:`store_port` -- ``--master_port + 1`` unless the hunt is given ``--cluster-port``.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from ..errors import ArgumentError

JOIN_TIMEOUT = 120.0   # seconds a hunt waits for the hunts of the other nodes (``--join-timeout``)
_VALUED = ("worker_num", "local_worker_num", "master_addr", "master_port", "node_rank", "log_dir", "join",
           "cluster_time_out", "bind_core", "bind_numa", "sim_level", "sim_rank_id", "rank_table_file",
           "worker_log_name", "tail_worker_log")
_DEFAULTS = {"worker_num": "8", "local_worker_num": "8", "master_addr": "127.0.0.1", "master_port": "8118",
             "node_rank": "-1", "cluster_time_out": "600"}


def is_msrun(program: str) -> bool:
    """``program`` (argv[0] or the script a Python interpreter runs) is MindSpore's launcher."""
    return os.path.basename(program) == "msrun"


@dataclass(frozen=True)
class Launch:
    """One node's ``msrun`` command, split: ``launcher`` (what runs msrun: ``["msrun"]`` or
    ``["python", ".../msrun"]``), ``options`` (``{name: value}``, names without ``--``, as given), ``rest`` (the
    training script and its arguments)."""

    launcher: List[str]
    options: Dict[str, str]
    rest: List[str]

    def _int(self, name: str) -> int:
        value = self.options.get(name, _DEFAULTS.get(name, ""))
        try:
            return int(value)
        except ValueError:
            raise ArgumentError(f"msrun --{name}={value!r}: must be an integer (msrun's own rule); fix the msrun "
                                f"command after `--`") from None

    @property
    def worker_num(self) -> int:
        """Ranks in the whole job (every node)."""
        return self._int("worker_num")

    @property
    def local_worker_num(self) -> int:
        """Ranks this launcher starts on its node."""
        return self._int("local_worker_num")

    @property
    def node_rank(self) -> int:
        """This node's 0-based rank; -1 when not given (msrun then assigns rank ids after the cluster is built)."""
        return self._int("node_rank")

    @property
    def master_addr(self) -> str:
        return self.options.get("master_addr", _DEFAULTS["master_addr"])

    @property
    def master_port(self) -> int:
        return self._int("master_port")

    @property
    def cluster_time_out(self) -> int:
        """msrun's ``--cluster_time_out`` in seconds (default 600): how long workers wait for the others."""
        return self._int("cluster_time_out")

    @property
    def nodes(self) -> int:
        """Launchers (nodes) in the job: ``worker_num / local_worker_num`` (every node runs as many ranks)."""
        return max(1, -(-self.worker_num // max(self.local_worker_num, 1)))

    @property
    def multi_node(self) -> bool:
        return self.local_worker_num < self.worker_num

    def ranks_of(self, node: int) -> List[int]:
        """The 0-based global ranks node ``node`` runs."""
        first = node * self.local_worker_num
        return list(range(first, min(first + self.local_worker_num, self.worker_num)))

    def node_of(self, rank: int) -> int:
        """The node that runs 0-based global rank ``rank``."""
        return rank // max(self.local_worker_num, 1)

    def for_node(self, node: int) -> List[str]:
        """This command with ``--node_rank`` set to ``node``: what to run on that node."""
        options = dict(self.options, node_rank=str(node))
        return [*self.launcher, *[f"--{k}={v}" for k, v in options.items()], *self.rest]

    def argv(self) -> List[str]:
        return [*self.launcher, *[f"--{k}={v}" for k, v in self.options.items()], *self.rest]

    def check_hunt(self) -> None:
        """The rules a hunt across nodes needs, refused before anything runs (naming the value and the fix)."""
        if self.local_worker_num < 1 or self.worker_num < 1 or self.worker_num % self.local_worker_num:
            raise ArgumentError(f"msrun --worker_num={self.worker_num} --local_worker_num={self.local_worker_num}: a "
                                f"hunt across nodes needs every node to run the same number of ranks (worker_num a "
                                f"multiple of local_worker_num), as msrun's own rank numbering assumes")
        if not 0 <= self.node_rank < self.nodes:
            raise ArgumentError(f"msrun --node_rank={self.node_rank}: a hunt across {self.nodes} nodes needs each "
                                f"node's own --node_rank, 0 to {self.nodes - 1} (msrun otherwise numbers the ranks "
                                f"in the order they connect, which differs between passes); add e.g. "
                                f"--node_rank=0 on the master node and --node_rank=1 on the next")


def parse_launch(command: Sequence[str]) -> Optional[Launch]:
    """``command`` split as an msrun launch, or None when it is not one (``msrun ...`` or ``python .../msrun ...``).
    Options are msrun's (``--name=value`` or ``--name value``) up to the first other argument: the script."""
    argv = list(command)
    if not argv:
        return None
    start = 1 if is_msrun(argv[0]) else 2 if len(argv) > 1 and is_msrun(argv[1]) \
        and os.path.basename(argv[0]).startswith("python") else 0
    if not start:
        return None
    options: Dict[str, str] = {}
    i = start
    while i < len(argv) and argv[i].startswith("--"):
        name, eq, value = argv[i][2:].partition("=")
        if name not in _VALUED:
            break
        if not eq:
            if i + 1 >= len(argv):
                break
            i += 1
            value = argv[i]
        options[name] = value
        i += 1
    return Launch(launcher=argv[:start], options=options, rest=argv[i:])


def store_port(launch: Launch, override: Optional[int] = None) -> int:
    """The port the hunts of one job meet on (on the master address): ``override`` or ``--master_port + 1``."""
    port = override if override is not None else launch.master_port + 1
    if not 1024 <= port <= 65535:
        raise ArgumentError(f"cluster port {port}: must be 1024-65535 (msrun --master_port={launch.master_port} + 1 "
                            f"by default); give --cluster-port PORT, a free port on the master node")
    return port


def launcher_argv(pid: Optional[int] = None) -> Optional[List[str]]:
    """The command line of this process's parent (``pid``'s parent) when it is an msrun launcher, else None.
    Linux only (``/proc``); msrun starts every worker directly."""
    try:
        ppid = os.getppid() if pid is None else int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{ppid}/cmdline", "rb") as handle:
            argv = [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except (OSError, ValueError, IndexError):
        return None
    return argv if parse_launch(argv) is not None else None


def launcher_line(argv: Sequence[str], msrun_on_path: Optional[str]) -> str:
    """The launcher's command as a user types it: ``msrun ARGS`` when the ``msrun`` found on PATH
    (``msrun_on_path``) is the one that ran, else the interpreter and msrun's full path."""
    launch = parse_launch(argv)
    if launch is None:
        return shlex.join(argv)
    ran = launch.launcher[-1]
    if msrun_on_path is not None and os.path.realpath(msrun_on_path) == os.path.realpath(ran):
        return shlex.join(["msrun", *launch.argv()[len(launch.launcher):]])
    return shlex.join(launch.argv())


def local_index(environ: Mapping[str, str]) -> Optional[int]:
    """This worker's 0-based index among its node's ranks (msrun's ``DEVICE_ID``), None when not under msrun."""
    value = environ.get("DEVICE_ID") if environ.get("MS_ROLE") == "MS_WORKER" else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def says_hunt_line(environ: Mapping[str, str], rank: int) -> bool:
    """Whether this process prints Guard's hunt line at a failure: under msrun the first rank of each node (each
    node runs its own launcher, so each needs its own line), else rank 0 only."""
    index = local_index(environ)
    return index == 0 if index is not None and launcher_argv() is not None else rank == 0


def node_note(launcher: Optional[Sequence[str]], rank: Optional[int], stopped_by: Optional[int]) -> str:
    """What Guard's line adds under a multi-node msrun launcher: which node this is, where the failure started, and
    that every node's line is run at once (their hunts meet)."""
    launch = parse_launch(launcher) if launcher is not None else None
    if launch is None or not launch.multi_node:
        return ""
    node = launch.node_rank if launch.node_rank >= 0 else (launch.node_of(rank) if rank is not None else None)
    started = (f"; rank {stopped_by} failed first, on node {launch.node_of(stopped_by)}, whose Guard printed its "
               f"line and record there" if stopped_by is not None else "")
    return (f" on this node (node {node} of {launch.nodes}) and, at the same time, the line Guard printed on each "
            f"other node (their hunts meet at {launch.master_addr}:{launch.master_port + 1}){started}")
