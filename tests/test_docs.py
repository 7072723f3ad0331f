"""The documentation: the site builds in strict mode, its examples run, its real output is real, the README is
one screenful that renders as the package description.

Marked ``docs`` (``pytest -m docs tests``). The build runs Sphinx offline, as a user's ``python -m sphinx -W
--keep-going -n -b html docs site`` would; every example runs as a fresh process with this checkout's mindguard.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
EXAMPLES = DOCS / "examples"
README = REPO / "README.md"
sys.path.insert(0, str(DOCS))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

pytestmark = pytest.mark.docs


def _env():
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


# ------------------------------------------------------------------------------------------------ the site
def test_site_builds_in_strict_mode(tmp_path):
    """Broken links and anchors, pages outside the toctree, API references that resolve to nothing, an included
    file or example section that does not exist, summary.json keys without a description: each fails this."""
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
                           str(DOCS), str(site)], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
    index = (site / "index.html").read_text(encoding="utf-8")
    for page in ("how-to/model-train.html", "how-to/functional-loop.html", "how-to/msrun.html",
                 "reference/api.html", "reference/cli.html", "reference/summary.html", "benchmarks.html"):
        assert (site / page).is_file(), page
    assert 'href="how-to/model-train.html"' in index      # the shape table routes from the front page
    cli = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    assert "--dump-scope" in cli and "--keep-every" in cli     # generated from the parser
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    assert 'id="mindguard.training.guard.Guard"' in api and 'id="mindguard.errors.NonFiniteError"' in api


# -------------------------------------------------------------------------------------------- the examples
# (script, arguments, what the page that includes it says it does)
RUNS = [
    ("model_train.py", [], "finished"),
    ("model_train.py", ["--fit"], "finished"),
    ("model_train.py", ["--lr", "1e3"], "failed"),
    ("own_train_cell.py", [], "finished"),
    ("functional_loop.py", [], None),
    ("functional_loop.py", ["--jit"], None),
    ("protect_weights.py", [], None),
    ("safe_norm.py", [], None),
    ("reproduce.py", [], None),
    ("read_dump.py", [], None),
]


def test_every_example_is_run_here():
    assert sorted({name for name, _, _ in RUNS}) == sorted(p.name for p in EXAMPLES.glob("*.py"))


@pytest.mark.parametrize("script,args,record", RUNS, ids=[" ".join([s, *a]) for s, a, _ in RUNS])
def test_example_runs(tmp_path, script, args, record):
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    if record == "failed":
        # tutorial/your-script.md: the loss of step 3 is infinite; Guard records the step; LossMonitor then raises
        data = json.loads((tmp_path / "mindguard_failure.json").read_text())
        assert (data["status"], data["kind"], data["global_step"]) == ("failed", "nonfinite_loss", 3), data
        assert proc.returncode == 1 and "loss is NAN or INF" in out, out[-3000:]
        # ... and prints the command that examines it, naming the failure's record kept under its run id
        line = f"hunt --from {tmp_path / ('mindguard_failure.' + data['run_id'] + '.json')} -- "
        assert line in proc.stderr and proc.stderr.rstrip().endswith(f"{script} --lr 1e3"), proc.stderr[-3000:]
        return
    assert proc.returncode == 0, out[-4000:]
    if record is not None:
        data = json.loads((tmp_path / "mindguard_failure.json").read_text())
        assert data["status"] == record, data
        assert "all parameters finite: True" in out, out[-3000:]


def test_python_in_the_docs_comes_from_the_examples():
    """A page shows Python only by including a section of a docs/examples/ file (which the tests above run)."""
    pages = [p for p in DOCS.rglob("*.md") if "snippets" not in p.parts]
    inline = {str(p.relative_to(DOCS)): n for p in pages
              for n in [len(re.findall(r"^```(?:python|py)\s*$", p.read_text(encoding="utf-8"), re.M))] if n}
    assert not inline, f"Python written into pages instead of included from docs/examples/: {inline}"
    sections = set()
    for page in pages:
        for match in re.finditer(r"```\{literalinclude\} \.\./examples/(\S+)\n(?::[^\n]*\n)*?:start-after: "
                                 r"\"\[start:(\w+)\]\"",
                                 page.read_text(encoding="utf-8")):
            sections.add(match.groups())
    assert sections, "no page includes an example"
    for script, name in sections:
        text = (EXAMPLES / script).read_text(encoding="utf-8")
        assert f"[start:{name}]" in text and f"[end:{name}]" in text, (script, name)


# ----------------------------------------------------------------------------------------- real output
def test_cheap_output_snippets_match_a_real_run():
    """docs/regen.py wrote these snippets; a real run now prints the same (the expensive ones are regenerated
    by hand: `python docs/regen.py`)."""
    import regen

    for name in ("iteration", "dump_config_error"):
        scratch = Path(os.environ.get("TMPDIR", "/tmp"))
        lines = regen.produce(regen.PRODUCERS[name], scratch)
        committed = (DOCS / "snippets" / "output" / f"{name}.txt").read_text(encoding="utf-8")
        assert "\n".join(lines) + "\n" == committed, name


def test_every_output_snippet_has_a_producer():
    names = {p.stem for p in (DOCS / "snippets" / "output").glob("*.txt")}
    import regen

    assert names == set(regen.PRODUCERS), names ^ set(regen.PRODUCERS)


# ------------------------------------------------------------------------------------------ generated tables
def test_benchmark_page_is_rendered_from_a_run():
    import run as bench

    page = bench.markdown({"commit": "abc1234", "dirty": False, "date": "2026-12-01", "label": "",
                           "command": "python benchmarks/run.py --quick", "machine": "2 CPU(s)", "total_s": 61,
                           "rows": [["step mlp bare", "5.0 ms", "", "", ""],
                                    ["  mlp + Guard", "5.1 ms", "1.02x vs bare", "<= 1.02x bare", "ok"],
                                    ["  a | b", "1 ms", "", "", ""]],
                           "notes": ["mlp: weights bit-identical"]})
    lines = page.splitlines()
    assert lines[0] == "Measured on commit `abc1234`, 2026-12-01: `python benchmarks/run.py --quick` (61 s)."
    assert "| **step mlp bare** | 5.0 ms |  |  |  |" in lines
    assert "| &nbsp;&nbsp;&nbsp;&nbsp;mlp + Guard | 5.1 ms | 1.02x vs bare | <= 1.02x bare | ok |" in lines
    assert "| &nbsp;&nbsp;&nbsp;&nbsp;a \\| b | 1 ms |  |  |  |" in lines
    assert lines[-1] == "- note: mlp: weights bit-identical"


def test_benchmark_table_reads_back_what_it_printed():
    import run as bench

    table = bench.Table()
    table.add("step mlp bare", "5.0 ms", "cpu 9.7 ms")
    table.add("  mlp + Guard", "5.1 ms", "1.02x vs bare", "<= 1.02x bare", "over")
    table.notes.append("pinned: no")
    again = bench.Table.from_text(table.render())
    assert again.rows == table.rows and again.notes == table.notes


def test_compatibility_tables_are_rendered_from_saved_runs(tmp_path):
    import compat

    report = {"date": "2026-12-01", "time": "10:00:00", "commit": "abc1234", "dirty": False,
              "platform": "Linux x86_64, 2 CPU", "quick": False,
              "rows": [{"python": "3.11", "mindspore": "2.10.0", "python_full": "3.11.7",
                        "mindspore_installed": "2.10.0", "numpy": "1.26.4", "status": "ok", "passed": 500,
                        "failed": 0, "skipped": 1, "errors": 0, "failures": [], "skips": [], "demo_exit": 0,
                        "wall_s": 240}]}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    text = compat.render_runs([path])
    assert "on commit `abc1234`" in text and "| 3.11.7 | 2.10.0 | 1.26.4 | 500 | 0 | 1 | 0 | 4.0 min | ok |" in text


def test_summary_keys_the_code_writes_must_be_described():
    import dataclasses

    import gen_schema
    from mindguard.protocol.summary import UNSET, HuntSummary

    found = gen_schema.summary_keys()
    assert {"outcome", "exit_code", "failure", "origin", "pass1"} <= set(found)
    assert "passes" not in found
    bigger = dataclasses.make_dataclass("Bigger", [("brand_new_key", object, dataclasses.field(default=UNSET))],
                                        bases=(HuntSummary,))
    assert "brand_new_key" in gen_schema.summary_keys(bigger)
    with pytest.raises(gen_schema.SchemaError, match="brand_new_key"):
        gen_schema.summary_schema(bigger)


# ------------------------------------------------------------------------------------------------ README
def _readme():
    return README.read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def test_readme_is_one_screenful_of_workflow():
    lines = _readme().splitlines()
    assert len(lines) <= 200, len(lines)
    wide = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > 120]
    assert not wide, f"README lines over 120 characters: {wide}"


def test_readme_quick_start_is_the_two_commands_ci_runs():
    blocks = re.findall(r"```bash\n(.*?)\n```", _section(_readme(), "Quick start"), re.S)
    assert blocks == ["python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/mindguard demo",
                      ".venv/bin/pip install '.[test]' && .venv/bin/python -m pytest -n 3 tests"], blocks
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.rstrip().splitlines()[-1] == blocks[1]
    assert "\n.venv/bin/pip install .\n" in ci


def test_readme_python_comes_from_the_examples():
    examples = "\n".join(p.read_text(encoding="utf-8") for p in EXAMPLES.glob("*.py"))
    lines = {line.strip() for line in examples.splitlines()}
    for block in re.findall(r"```python\n(.*?)\n```", _readme(), re.S):
        for line in filter(str.strip, block.splitlines()):
            assert line.strip() in lines, f"README line not in docs/examples/: {line!r}"


def test_readme_demo_output_is_the_real_output_abridged():
    """The README's demo block: lines of docs/snippets/output/demo.txt, in order; `...` leaves lines out, a line
    ending in ` ...` is the start of a longer one."""
    block = re.search(r"```\n(\$ (?:mindguard|python -m mindguard).*?)\n```", _readme(), re.S).group(1).splitlines()
    real = (DOCS / "snippets" / "output" / "demo.txt").read_text(encoding="utf-8").splitlines()
    at = 0
    for line in block:
        if line == "...":
            continue
        prefix = line[:-4] if line.endswith(" ...") else None
        while at < len(real) and not (real[at] == line or prefix is not None and real[at].startswith(prefix)):
            at += 1
        assert at < len(real), f"README demo line not in docs/snippets/output/demo.txt (in order): {line!r}"
        at += 1


def _anchors(markdown: str):
    def slug(title: str) -> str:   # MyST's heading anchors (GitHub's rule)
        title = re.sub(r"[`*]", "", title.strip().lower())
        return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title))
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", markdown, re.M)}


def test_readme_links_resolve_and_route_each_shape_in_one_click():
    text = _readme()
    links = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[\w-]+\]: (\S+)$", text, re.M)
    assert links
    for link in links:
        target, _, anchor = link.partition("#")
        if "://" in target:
            continue
        assert (REPO / target).exists(), link
        if anchor:
            assert anchor in _anchors((REPO / target).read_text(encoding="utf-8")), link
    table = _section(text, "Training shapes")
    refs = dict(re.findall(r"^\[([\w-]+)\]: (\S+)$", text, re.M))
    pages = [refs[name] for name in re.findall(r"\]\[([\w-]+)\]", table)]
    for page in ("model-train", "own-train-cell", "functional-loop", "pynative", "msrun"):
        assert f"docs/how-to/{page}.md" in pages, (page, pages)


def test_readme_renders_as_the_package_description():
    readme_renderer = pytest.importorskip("readme_renderer.markdown")   # in the test extra
    html = readme_renderer.render(_readme())
    assert html and "<table>" in html and "Quick start" in html
    setup_cfg = (REPO / "setup.cfg").read_text()
    assert "long_description = file: README.md" in setup_cfg
    assert "long_description_content_type = text/markdown" in setup_cfg
