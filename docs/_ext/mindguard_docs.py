"""A Sphinx extension: the reference pages' generated parts, made from the code at every build.

A page asks for a generated part with a marker line; the extension replaces it before the page is parsed:

* ``<!-- mindguard:record-schema -->``  -- the failure record's fields and JSON Schema (docs/gen_schema.py)
* ``<!-- mindguard:summary-schema -->`` -- the keys of summary.json, checked against mindguard/hunt.py
* ``<!-- mindguard:exit-codes -->``     -- the hunt's exit codes, from its ``Outcome`` enum

An unknown marker, or a generator that finds the docs out of date with the code, is a warning, which the
strict build (``-W``) turns into a failure. (The command line's reference is sphinx-argparse's ``argparse``
directive on ``mindguard.cli.build_parser``.)
"""
from __future__ import annotations

import re

from sphinx.util import logging

import gen_schema

log = logging.getLogger(__name__)
MARKER = re.compile(r"^<!-- mindguard:([a-z-]+) -->$", re.M)
GENERATORS = {
    "record-schema": gen_schema.record_schema,
    "summary-schema": gen_schema.summary_schema,
    "exit-codes": gen_schema.exit_codes,
}


def _source_read(app, docname, source):
    def replace(match):
        name = match.group(1)
        generator = GENERATORS.get(name)
        if generator is None:
            log.warning(f"unknown generated part <!-- mindguard:{name} --> (known: {', '.join(GENERATORS)})",
                        location=docname)
            return match.group(0)
        try:
            return generator()
        except gen_schema.SchemaError as exc:
            log.warning(str(exc), location=docname)
            return f"**The docs are out of date with the code:** {exc}\n"
    source[0] = MARKER.sub(replace, source[0])


def setup(app):
    app.connect("source-read", _source_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ------------------------------------------------------------------------------------ short references
# The docstrings name mindguard's objects the way their modules see them: ``:class:`ReproducibilityError```,
# ``:class:`mindguard.NonFiniteError``` (the root's lazy alias). A reference Sphinx cannot resolve is looked up
# here by its last name among the documented mindguard objects; exactly one match resolves it, anything else is
# left missing -- and the strict build (-n -W) fails on it.
from sphinx.util.nodes import make_refnode   # noqa: E402


def _missing_reference(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if target.startswith("mindguard.") or "." not in target:
        name = target.rsplit(".", 1)[-1]
        objects = env.get_domain("py").objects
        matches = [full for full in objects if full.startswith("mindguard.") and full.rsplit(".", 1)[-1] == name]
        if len(matches) == 1:
            entry = objects[matches[0]]
            return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, matches[0])
    return None


def _setup_references(app):
    app.connect("missing-reference", _missing_reference)


_setup = setup


def setup(app):  # noqa: F811 - extends the setup above
    _setup_references(app)
    return _setup(app)
