"""Sphinx configuration of the docs site (Markdown pages through MyST).

Build it as the test suite does (tests/test_docs.py), strict: every warning -- a broken link or anchor, a
missing page, an API reference that resolves to nothing -- fails the build::

    python -m sphinx -W --keep-going -n -b html docs site

The API reference is generated from the docstrings (autodoc + napoleon, which imports mindguard and so
MindSpore), the command-line reference from the argparse parser (sphinx-argparse), and the JSON schemas and
exit codes from the code (docs/_ext/mindguard_docs.py). Nothing is fetched from the network.
"""
import os
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(DOCS))          # document this checkout's mindguard
sys.path.insert(0, os.path.join(DOCS, "_ext"))
sys.path.insert(0, DOCS)

project = "mindguard"
author = "the mindguard authors"
copyright = "the mindguard authors; Apache-2.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
    "mindguard_docs",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "snippets", "data", "examples", "**/__pycache__", "README.md"]

# strict: a reference that resolves to nothing is an error. MindSpore's and the standard library's own names are
# not documented here (no intersphinx: the build is offline), so those alone are let through.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(mindspore|ms|nn|np|numpy|os|pathlib|typing|enum|argparse|dataclasses)(\..*)?"),
    (r"py:.*", r"(Cell|Model|Tensor|Parameter|Callback|RunContext|Path|PathLike|Any|Axis|PathLike\[str\])"),
    (r"py:.*", r"'.*|.*'"),        # string annotations ("os.PathLike[str]") that Python cannot evaluate here
    (r"py:exc", r".* .*"),         # napoleon's "Raises:" prose ("a TypeError", "TypeError / ValueError")
    (r"py:class", r".* .*"),       # a property docstring's "label: text" first line, which napoleon reads as a type
]
# internals the docstrings mention that are not part of the API reference (private modules and helpers)
nitpick_ignore = [
    ("py:mod", "mindguard.training.checks.consensus"), ("py:mod", "mindguard.training.state.resume"),
    ("py:mod", "mindguard.training.child.verify_run"), ("py:class", "mindguard.training.examine.api_hooks.OpTape"),
    ("py:func", "mindguard.training.checks.finite.host_check_by_default"),
    ("py:class", "mindguard.training.checks.finite.OutputChecker"), ("py:attr", "complete"),
    ("py:class", "GE"),           # DumpConfig.async_path's "(GE): ..." read as a type by napoleon
]

myst_enable_extensions = ["colon_fence", "deflist", "attrs_inline"]
myst_heading_anchors = 3           # links to page.md#a-heading are checked
suppress_warnings = []

autodoc_typehints = "signature"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = "mindguard"
html_static_path = []
