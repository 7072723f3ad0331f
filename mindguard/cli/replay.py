"""``mindguard replay CAPTURE_DIR --net MODULE:FACTORY``: re-run a captured step from the command line."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
import uuid
from pathlib import Path

from .._util.io import _json_default
from ..errors import ArgumentError, MindguardError


def cli_replay(args) -> int:
    """``mindguard replay CAPTURE_DIR --net MODULE:FACTORY [--optimizer MODULE:FACTORY] [--json] [--html FILE]``.

    Prints the report (and writes its page to ``--html FILE``, never over an existing file); returns 0 when the
    replay ran (whatever it found), 2 on bad arguments or a page that cannot be written.
    """
    from ..training.examine.capture import load_capture
    from ..training.examine.replay import replay
    from .analyze import html_destination_problem, write_html

    page = getattr(args, "html", None)
    problem = html_destination_problem(page) if page else ""
    if problem:
        print(f"mindguard replay: {problem}", file=sys.stderr)
        return 2
    try:
        load_capture(args.capture)   # a wrong directory is refused before the user's module runs
        network = _load_factory(args.net, "--net")()
        optimizer = None
        if getattr(args, "optimizer", None):
            optimizer = _load_factory(args.optimizer, "--optimizer")(network)
        report = replay(network, args.capture, optimizer=optimizer)
    except (MindguardError, ImportError, AttributeError) as exc:
        print(f"mindguard replay: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2, default=_json_default) if args.json else str(report))
    if page and write_html(page, json.loads(json.dumps(report.to_dict(), default=_json_default)), "replay") is None:
        return 2
    return 0


def _load_factory(spec: str, option: str):
    module_name, sep, attr = (spec or "").rpartition(":")
    if not sep or not module_name or not attr:
        raise ArgumentError(f"{option} {spec!r}: expected MODULE:FACTORY, e.g. train.py:build or mypkg.model:build")
    if module_name.endswith(".py") or os.sep in module_name:
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise ArgumentError(f"{option} {spec!r}: no such file {str(path)!r}")
        name = f"_mindguard_user_{path.stem}_{uuid.uuid4().hex[:8]}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise ArgumentError(f"{option} {spec!r}: {str(path)!r} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module  # MindSpore's graph compiler looks the module of a construct up by name
        sys.path.insert(0, str(path.parent))
        try:
            mod_spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(str(path.parent))
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ArgumentError(f"{option} {spec!r}: {module_name} has no callable {attr!r}")
    return factory


