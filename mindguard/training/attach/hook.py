"""The attach hook, started in every Python process at start-up (``mindguard_attach.pth`` in site-packages, or
``startup/sitecustomize.py`` on ``PYTHONPATH``): when the environment asks for it
(:func:`mindguard.protocol.attach.requested`), it puts one finder first on ``sys.meta_path`` that waits for
``import mindspore``; once MindSpore's package has run, :mod:`mindguard.training.attach.patches` attaches Guard.

A process that never imports MindSpore pays for this module and the finder's one comparison per import; with the
environment not asking, for nothing but the ``.pth`` line's two environment look-ups. Imports nothing heavy (no
MindSpore, no numpy); never raises (a broken hook says so in one line and the command runs as it would).
"""
from __future__ import annotations

import os
import sys
from typing import Any, List, Optional, Sequence

from .notes import say

_STARTED: List[bool] = [False]
TARGET = "mindspore"


def start() -> None:
    """Start the hook in this process, once (the ``.pth`` line and the ``sitecustomize`` may both call it)."""
    if _STARTED[0]:
        return
    _STARTED[0] = True
    try:
        from ...protocol import attach as protocol

        if not protocol.requested(os.environ):
            ignored = protocol.switch_value_ignored(os.environ)
            if ignored is not None:
                say(f"{protocol.ENV_SWITCH}={ignored!r} is neither 1 nor 0: Guard is not attached (set "
                    f"{protocol.ENV_SWITCH}=1 to attach it)")
            return
        module = sys.modules.get(TARGET)
        if module is not None and getattr(module, "__version__", None) is not None:
            loaded(module)   # started late (by hand, or MindSpore imported by another start-up file)
        else:
            sys.meta_path.insert(0, MindSporeFinder())
    except Exception as exc:  # noqa: BLE001 - the command runs as it would without mindguard
        say(f"the hook could not start ({type(exc).__name__}: {exc}); the command runs without Guard")


def loaded(module: Any) -> None:
    """MindSpore's package has run: attach (never raises)."""
    try:
        from . import patches

        patches.install(module)
    except Exception as exc:  # noqa: BLE001 - the training runs as it would, unguarded, and says so
        say(f"could not attach Guard after `import mindspore` ({type(exc).__name__}: {exc}); the command runs "
            f"without it")


class MindSporeFinder:
    """A meta path finder for ``mindspore`` alone: finds it with the other finders, and wraps its loader so that
    :func:`loaded` runs once the package has run. Removes itself at its one use."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        import importlib.util

        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec(fullname)   # the finders after this one (it is gone from the list)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenAttach(spec.loader)   # type: ignore[assignment]
        return spec

    def invalidate_caches(self) -> None:
        """Nothing cached."""


class _ThenAttach:
    """The package's own loader, then :func:`loaded`. Everything else is the own loader's; once the package ran, the
    module's ``__loader__`` and ``__spec__.loader`` are the own loader again."""

    def __init__(self, loader: Any):
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        loaded(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
