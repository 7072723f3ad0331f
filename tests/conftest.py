"""Shared fixtures. Every test runs real MindSpore on CPU; nothing MindSpore decides is mocked."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["graph", "pynative"])
def ms_mode(request):
    """Run the test once in GRAPH and once in PyNative mode (CPU), restoring the previous mode after."""
    import mindspore as ms

    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if request.param == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    yield request.param
    ms.set_context(mode=previous)


@pytest.fixture
def graph_mode():
    import mindspore as ms

    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    yield "graph"
    ms.set_context(mode=previous)


def run_python(code: str, *args: str, cwd=None, env=None, timeout: float = 300,
               check: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) in a fresh Python process -- needed wherever MindSpore reads process-wide
    state once (the dump config at the first compile, seeds before the network is built).

    The code goes to a temporary ``.py`` file (GRAPH mode cannot compile a Cell whose source is
    ``python -c`` text). On an unexpected exit code the assertion shows the child's stdout and stderr.
    """
    full_env = dict(os.environ)
    full_env.pop("MINDSPORE_DUMP_CONFIG", None)
    full_env.setdefault("GLOG_v", "3")
    if env:
        full_env.update(env)
    with tempfile.TemporaryDirectory(prefix="mindguard_child_") as scratch:
        script = Path(scratch) / "child.py"
        script.write_text(textwrap.dedent(code))
        proc = subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=full_env,
                              capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, (
            f"child exited {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr "
            f"---\n{proc.stderr[-4000:]}"
        )
    return proc


@pytest.fixture
def run_py():
    return run_python


@pytest.fixture(autouse=True)
def fresh_run():
    """Every test is a fresh "process" for mindguard: a new Run (step count, first failure, record paths).

    A real script has one Run per process; the test session trains many independent networks in one process.
    """
    from mindguard.training.run import reset_run

    reset_run()
    yield
    reset_run()


#: msrun's workers retry their registration with the scheduler, and send their heartbeats, every
#: MS_RETRY_INTERVAL_LOWER-UPPER whole seconds (3-5 by default; MindSpore reads them with ``std::stoi``, so "0.2"
#: is 0). A two-worker launch of samples/distributed_train.py: 15 s at 3-5, 10.6 s at 1-1. At 0 (what "0.2"-"0.5"
#: gave) the heartbeat loop does not wait between heartbeats, and 8 of 48 launches ended with a worker's segfault
#: in ComputeGraphNode::Finalize (docs/mindspore-facts.md, "Distributed"). Set for the test session (every child
#: inherits it) unless given.
MSRUN_RETRY_SECONDS = {"MS_RETRY_INTERVAL_LOWER": "1", "MS_RETRY_INTERVAL_UPPER": "1"}


def pytest_configure(config):
    """pytest-xdist (load scheduling) refills a worker that runs quick tests with a chunk of up to a quarter of
    the tests still pending, in collection order: near the end one worker got the remaining ~20 s hunts of
    tests/test_zoo_loops_and_hints.py in one chunk and ran them alone for minutes while the other, done with the fast
    tests, waited. Two at a time (unless ``--maxschedchunk`` is given) keeps both busy to the end. And
    :data:`MSRUN_RETRY_SECONDS`."""
    for key, value in MSRUN_RETRY_SECONDS.items():
        os.environ.setdefault(key, value)
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 2


#: Modules whose tests share an expensive module- or session-scoped fixture (real dumps or captures trained in
#: child processes, 5-30 s): under load scheduling both workers ran some of their tests, and each built it.
SHARED_FIXTURE_MODULES = frozenset(f"tests/{name}.py" for name in (
    "test_analysis",            # dumps: five real dumps (session scope), norm_report
    "test_analysis_crash",      # crashes
    "test_analysis_culprits",   # dumps
    "test_analysis_damaged",    # real_dump
    "test_analysis_window",     # two_models
    "test_replay",              # demo_captures
    "test_replay_ops",          # graph_answers, jit_capture
    "test_faults_io",           # healthy_dump
    "test_verify",              # failed: the run failing at step 1500 (5 of its 8 tests)
    "test_divergence",          # failed: one failing run per kept step (3 params, 3 tests each)
    "test_guest_io",            # bare: the bare script's losses, healthy and poisoned
))


@pytest.hookimpl(tryfirst=True, optionalhook=True)   # optional: a run without pytest-xdist never calls it
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n`` with the default ``--dist load``: the tests of each module of SHARED_FIXTURE_MODULES go whole
    to one worker (which builds the fixture once), and every other test is a unit of its own.

    xdist's ``loadgroup`` would do this from ``xdist_group`` marks, but it renames the items through
    ``item._nodeid``, which pytest 9 no longer reads: the marks had no effect. This is xdist's own LoadScope
    scheduler with the scope chosen here, on the controller, from the node id: the module groups are handed out
    first (most tests first); then single tests in collection order, a worker refilled with one test once it has
    two or fewer pending -- so no worker runs the last ~20 s hunts alone at the end."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in SHARED_FIXTURE_MODULES else nodeid

    return SharedFixtureScheduling(config, log)


def pytest_collection_modifyitems(session, config, items):
    """The modules of ``fast`` tests (pure decisions, no MindSpore, a fraction of a second each) run last.

    pytest-xdist hands tests out in collection order: whichever tests come last decide how long one worker
    waits for the other at the end. Collected alphabetically, the whole-hunt tests of tests/test_zoo_*.py
    (~20 s each) came last; with the fast modules after them, the tail is filled by tests of a second or
    less. The order is the same in every worker (a stable sort of the collection, module by module), as
    xdist requires; the order within a module is kept.
    """
    modules = {}
    for item in items:
        modules.setdefault(item.module.__name__ if getattr(item, "module", None) else item.nodeid, []).append(item)
    all_fast = {name for name, group in modules.items()
                if all(item.get_closest_marker("fast") is not None for item in group)}
    items.sort(key=lambda item: (item.module.__name__ if getattr(item, "module", None) else item.nodeid) in all_fast)
