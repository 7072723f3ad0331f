"""Started by Python at every start-up while this folder is on ``PYTHONPATH`` (``mindguard run``, ``mindguard
hunt``): starts mindguard's attach hook (:mod:`mindguard.training.attach.hook`), then runs the ``sitecustomize``
this one hides, if the path holds another. A Python that cannot import mindguard starts as if this were absent."""
import os
import sys


def _start_hook():
    try:
        from mindguard.training.attach import hook
    except Exception:   # noqa: BLE001 - another Python (no mindguard there): nothing to attach
        return
    hook.start()


def _chain():
    """Run the next ``sitecustomize`` on the path (a distribution's, a virtual environment's), as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - as Python's own site.py does: say it, start anyway
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")


_start_hook()
_chain()
