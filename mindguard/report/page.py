"""The report page: one self-contained ``report.html`` for a hunt's answer (or ``analyze``/``replay --html``).

A second renderer of the data :mod:`.render` turns into text: dict(s) in, an HTML string out -- no MindSpore, no
file reads but the vendored layout library shipped in the package, nothing fetched when the page is opened (no
font, no CDN, no image: styles, script and data are inlined). The data-flow graph is laid out in the browser by
dagre (``_vendor/dagre.min.js``, see ``_vendor/README.md``) and drawn as inline SVG; everything else is static
HTML, readable without script and in print.

:func:`render_page` takes one dict (:mod:`.pagedata` builds it from a run folder or a report)::

    {"kind": "hunt" | "analyze" | "replay",
     "report": DumpReport.to_dict() | None,       "replays": [ReplayReport.to_dict(), ...] | None,
     "run": {"dir", "command", "outcome", "exit_code", "finished"} | None,
     "failure": the failing step's record (dict) | None,   "position": "epoch 2, step 3/8 (global step 11), ..."
     "origin": a culprit dict when neither report holds one (a dataset exception) | None,
     "timeline": {"last_step", "failing_step", "loss": [[step, loss, source], ...], "checks": [...],
                  "kept": [...], "notes": [...]} | None,
     "ranks": [{"rank", "role", "op", "inputs", "text"}] | None,
     "passes": [{"name", "label", "command", "returncode", "examine", "dump", "log"}] | None,
     "sources": {"<file>:<line>": {"file", "line", "lines": [[n, text], ...]}},
     "generated": "<iso time>", "version": "<mindguard version>"}
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .page_assets import CSS, JS
from .page_html import (COUNTS, details, e, io_rows, node_table, passes_section, ranks_section, source_block,
                        source_index, source_listing, stats_table)
from .page_timeline import timeline_svg
from .render import short_op_name

_VENDOR = Path(__file__).resolve().parent / "_vendor"
_CSP = ('<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
        'script-src \'unsafe-inline\'; img-src data:">')


def dagre_source() -> str:
    """The vendored layout library's text (shipped in the wheel)."""
    return (_VENDOR / "dagre.min.js").read_text(encoding="utf-8")


def brief(message: str, limit: int = 400) -> str:
    """A message up to MindSpore's C++ call stack (a line of dashes) or its first blank line, at most ``limit``
    characters (the whole text stays in the run folder's logs and JSON)."""
    text = re.split(r"-{8,}|\n\s*\n", str(message), maxsplit=1)[0].strip()
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _code(text: str) -> str:
    """Backticked parts of a hint as ``<code>``; the rest escaped."""
    parts = re.split(r"(`[^`]+`)", text)
    return "".join(f"<code>{e(p[1:-1])}</code>" if p.startswith("`") and p.endswith("`") and len(p) > 1 else e(p)
                   for p in parts)


# ------------------------------------------------------------------------------------------- what the page says
def _culprit(data: Dict[str, Any]) -> Tuple[Optional[Dict[str, Any]], Optional[Dict[str, Any]], str]:
    """``(finding, stop, kind)``: the Finding dict the verdict is about, the stop point (a step that raised),
    and the kind of answer: ``origin``, ``stop``, ``input``, ``replay``, ``dataset``, ``none``."""
    report = data.get("report")
    if report:
        if report.get("origin"):
            return report["origin"], report.get("stopped_at"), "origin"
        if report.get("stopped_at"):
            return None, report["stopped_at"], "stop"
        if report.get("nonfinite_inputs"):
            return None, None, "input"
        return None, None, "none"
    for replay in data.get("replays") or []:
        if replay.get("first"):
            return replay["first"], None, "replay"
    origin = data.get("origin")
    if origin:
        return origin, None, "dataset" if origin.get("op_type") == "dataset" else "origin"
    return None, None, "none"


def _headline(data: Dict[str, Any]) -> Tuple[str, str]:
    """``(badge class, one-line title)``."""
    finding, stop, kind = _culprit(data)
    run = data.get("run") or {}
    outcome = run.get("outcome")
    if kind == "stop" and stop:
        op = stop["op"]
        return "bad", f"The step stopped in {op.get('op_type')} ({_role(op)}): it did not complete"
    if kind == "input":
        return "bad", "Inf/NaN was already in the step's inputs: no operator produced it"
    if kind == "dataset":
        return "bad", "The dataset raised while producing the batch"
    if finding:
        if finding.get("direction") == "input":
            return "bad", "Inf/NaN was already in the step's inputs: no operator produced it"
        subject = finding.get("op_type") or f"{finding.get('cell_type') or 'cell'} cell `{finding.get('cell')}`"
        if finding.get("received"):
            return "bad", f"{subject} ({_role(finding)}) received Inf/NaN from another rank"
        return "bad", f"{subject} ({_role(finding)}) turned finite inputs into {_what(finding.get('outputs') or [])}"
    if outcome == "healthy":
        return "ok", "No failure: every loss and parameter stayed finite"
    if outcome:
        return "warn", f"Hunt outcome: {outcome.replace('_', ' ')}"
    report = data.get("report") or {}
    if report and not report.get("analysed", True):
        return "warn", "The dump could not be analysed"
    return "ok", "No Inf/NaN found"


def _role(op: Dict[str, Any]) -> str:
    direction = op.get("direction") or "?"
    if direction == "backward" and op.get("forward_op"):
        return f"backward of {short_op_name(op['forward_op'])}"
    return direction


def _what(outputs: Iterable[Dict[str, Any]]) -> str:
    outputs = list(outputs)
    totals = [(sum(int(o.get(k) or 0) for o in outputs), label) for k, label in COUNTS]
    return ", ".join(f"{n} {label}" for n, label in totals if n) or "Inf/NaN"


# ------------------------------------------------------------------------------------------- sections


def _hint_block(hint: Optional[str]) -> str:
    if not hint:
        return ""
    lines = hint.splitlines()
    out = [f'<p class="hint-lead">{_code(lines[0])}</p>']
    rows = []
    for line in lines[1:]:
        match = re.match(r"^\s*(now|fix|or):\s*(.*)$", line)
        if match:
            rows.append(f'<tr class="{match.group(1)}"><th>{match.group(1)}</th><td><pre>{e(match.group(2))}</pre>'
                        f'</td></tr>')
            continue
        if rows:
            out.append(f'<table class="diff">{"".join(rows)}</table>')
            rows = []
        out.append(f"<p>{_code(line.strip())}</p>")
    if rows:
        out.append(f'<table class="diff">{"".join(rows)}</table>')
    return f'<div class="hint"><h3>How to fix it</h3>{"".join(out)}</div>'


def _verdict(data: Dict[str, Any]) -> str:
    finding, stop, kind = _culprit(data)
    sources = data.get("sources") or {}
    facts: List[Tuple[str, str]] = []
    if data.get("position"):
        facts.append(("step", e(data["position"])))
    failure = data.get("failure") or {}
    if failure.get("message"):
        facts.append(("pass 1 saw", e(brief(failure["message"]))))
    report = data.get("report") or {}
    if kind == "input":
        items = report.get("nonfinite_inputs") or []
        facts.append(("inputs", ", ".join(f"<code>{e(i.get('name'))}</code> ({e(i.get('source'))})" for i in items)))
        body = stats_table([dict(i, _label=i.get("name")) for i in items], "input")
        from ..analysis.hints import nonfinite_input_hint  # the hint the text report gives (no MindSpore)

        first = report.get("first_nonfinite") or {}   # its hint, when its input was traced to an origin
        facts.extend(_origin_facts(first.get("traced_to")))
        advice = (first.get("hint") if first.get("traced_to") else None) or next(
            (h for h in (nonfinite_input_hint(str(i.get("name")), str(i.get("source"))) for i in items) if h), None)
        return _card("verdict", facts, body + _hint_block(advice), data)
    if kind == "stop" and stop:
        op = stop["op"]
        facts += [("op", f"<code>{e(op.get('op_type'))}</code> <span class=muted>{e(op.get('name'))}</span>"),
                  ("pass", e(_role(op)))]
        if stop.get("message"):
            facts.append(("exception", f"<code>{e(brief(stop['message']))}</code>"))
        last = stop.get("last_completed")
        if last:
            facts.append(("last completed", f"<code>{e(last.get('op_type'))}</code> "
                                            f"<span class=muted>{e(last.get('name'))}</span>"))
        facts.extend(_origin_facts(stop.get("traced_to")))
        body = source_block(op.get("source"), sources) + stats_table(
            [dict(i, _label=f"input {i.get('slot')}") for i in op.get("inputs") or []], "input")
        return _card("verdict", facts, body + _hint_block(stop.get("hint")), data)
    if finding:
        if kind == "dataset" and finding.get("error"):   # the error the training process named (pass_status.json)
            facts.append(("exception", f"<code>{e(str(finding['error']))}</code>"))
        if finding.get("op_type") and kind != "dataset":
            facts.append(("op", f"<code>{e(finding.get('op_type'))}</code> <span class=muted>"
                                f"{e(finding.get('name') or '')}</span>"))
        if finding.get("cell"):
            facts.append(("cell", f"<code>{e(finding['cell'])}</code> ({e(finding.get('cell_type'))})"))
        if finding.get("direction") and kind != "dataset":
            facts.append(("pass", e(_role(finding))))
        if finding.get("forward_op"):
            facts.append(("forward op", f"<span class=muted>{e(finding['forward_op'])}</span>"))
        if finding.get("reached") is not None:
            facts.append(("reached", f"the non-finite values reached {e(finding['reached'])} later op(s) in the "
                                     f"step"))
        if report.get("origin_rank") is not None and report.get("ranks"):
            facts.append(("rank", f"rank {e(report['origin_rank'])} went non-finite first"))
        facts.extend(_origin_facts(finding.get("traced_to")))
        body = source_block(finding.get("source"), sources) + stats_table(io_rows(finding))
        if stop:
            op = stop["op"]
            later = stop.get("ops_after_origin")
            body += (f'<p class="then">Then the step stopped in <code>{e(op.get("op_type"))}</code> '
                     f'({e(_role(op))}){", " + str(later) + " op(s) later" if isinstance(later, int) else ""}'
                     f'{": " + e(stop.get("message")) if stop.get("message") else ""}.</p>')
        return _card("verdict", facts, body + _hint_block(finding.get("hint")), data)
    outcome = (data.get("run") or {}).get("outcome")
    text = {"healthy": "The training ran to its end with every loss and parameter finite: nothing to hunt.",
            None: "The analysed step holds no Inf/NaN."}.get(outcome, "The hunt did not name a culprit; the "
                                                                 "passes below and their logs say why.")
    return _card("verdict", facts, f"<p>{e(text)}</p>", data)


def _origin_facts(traced: Optional[List[Dict[str, Any]]]) -> List[Tuple[str, str]]:
    """Where the culprit's operands came from (``traced_to``, issue 52): the origin first, with its numbers."""
    if not traced:
        return []
    out = [("origin", f'<span class="bad">{_code(str(traced[0].get("text") or ""))}</span>')]
    out.extend(("also", _code(str(item.get("text") or ""))) for item in traced[1:4])
    return out


def _verify_block(data: Dict[str, Any]) -> str:
    """The ``mindguard verify`` line the hunt printed after its answer: how to check a fix without re-training."""
    line = (data.get("run") or {}).get("verify")
    checked = (data.get("run") or {}).get("fix_check")   # the hint's edit, run by the hunt on a scratch copy
    said = (f'<p>The hint\'s fix, run by the hunt on a scratch copy of the project: <b>{e(checked)}</b></p>'
            if checked else "")
    if not line:
        return ""
    return (f'<section id="verify" class="card"><h2>Check the fix without re-training</h2>{said}<p>Once the script '
            f'is edited, this runs it from the failing run\'s kept training state through the failing steps, every '
            f'step checked (exit 0: the fix holds):</p><pre>{e(line)}</pre></section>')


def _card(kind: str, facts: List[Tuple[str, str]], body: str, data: Dict[str, Any]) -> str:
    badge, title = _headline(data)
    rows = "".join(f"<tr><th>{e(k)}</th><td>{v}</td></tr>" for k, v in facts)
    return (f'<section id="{kind}" class="card verdict {badge}"><h2>{e(title)}</h2>'
            f'<table class="facts">{rows}</table>{body}</section>')


# ------------------------------------------------------------------------------------------- graph
def _graphs(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The data-flow graphs to draw: the culprit's, then each other rank's (several ranks)."""
    out = []
    report = data.get("report") or {}
    if report.get("data_flow"):
        title = f"rank {report.get('rank')}" if report.get("ranks") else ""
        out.append({"title": title, "flow": report["data_flow"], "main": True})
    for other in report.get("ranks") or []:
        if other.get("rank") != report.get("rank") and other.get("data_flow"):
            out.append({"title": f"rank {other.get('rank')}", "flow": other["data_flow"], "main": False})
    for i, replay in enumerate(data.get("replays") or []):
        if replay.get("data_flow"):
            out.append({"title": f"rank {i}" if len(data["replays"]) > 1 else "", "flow": replay["data_flow"],
                        "main": not out})
    return out


def _graph_section(data: Dict[str, Any], graphs: List[Dict[str, Any]]) -> str:
    if not graphs:
        why = ("no data flow to draw: the answer names no operator" if _culprit(data)[2] in ("none", "dataset")
               else "no data flow was recorded for this answer")
        return (f'<section id="graph" class="card"><h2>Data flow around the culprit</h2>'
                f'<p class="muted">{e(why)}.</p></section>')
    parts = []
    roles = {r.get("rank"): r for r in data.get("ranks") or []}
    for i, graph in enumerate(graphs):
        flow = graph["flow"]
        rank = flow_rank = None
        if graph["title"].startswith("rank "):
            flow_rank = int(graph["title"].split()[1])
            rank = roles.get(flow_rank)
        caption = _flow_caption(flow)
        if rank:
            caption = f"{e(graph['title'])}: {e(rank.get('text'))}. " + caption
        omitted = flow.get("omitted") or {}
        more = [f"{n} more {side}" for side, n in omitted.items() if n]
        parts.append(f'<figure class="flow" data-rank="{e(flow_rank) if flow_rank is not None else ""}">'
                     f'<figcaption>{caption}{(" (" + e(", ".join(more)) + " not drawn)") if more else ""}'
                     f'</figcaption><div class="graph" id="graph-{i}" data-graph="{i}"></div>'
                     f'<noscript><p class="muted">The graph needs JavaScript; every node is listed under '
                     f'"Details".</p></noscript></figure>')
    present = {n.get("role") for g in graphs for n in g["flow"].get("nodes") or []}
    keys = [("culprit", "culprit", "culprit"), ("received", "received", "received from another rank"),
            ("first_nonfinite", "first", "first op to read Inf/NaN"), ("stop", "stop", "where the step stopped")]
    legend = ('<div class="legend">' + "".join(f'<span class="lg {cls}">{e(text)}</span>' for role, cls, text in keys
                                              if role in present)
              + '<span class="lg reached">non-finite output</span><span class="lg producer">finite</span><span '
                'class="lg input">Parameter / batch</span><span class="lg edge-bad">non-finite value</span><span '
                'class="lg edge-ok">finite value</span><span class="lg edge-unk">not read / elided</span></div>')
    return (f'<section id="graph" class="card"><h2>Data flow around the culprit</h2>{legend}{"".join(parts)}'
            f'</section>')


def _flow_caption(flow: Dict[str, Any]) -> str:
    role = {"origin": "the culprit", "stop": "the op the step stopped in",
            "first_nonfinite": "the first op that read a non-finite value"}.get(str(flow.get("center_role")),
                                                                                 "the culprit")
    text = f"Around {role}: producers {e(flow.get('up'))} levels up"
    if flow.get("down"):
        text += f", and the ops its non-finite outputs reached, {e(flow.get('down'))} levels on"
    if flow.get("reached") is not None:
        text += f" (in all, {e(flow['reached'])} later op(s) made Inf/NaN)"
    elif flow.get("center_role") == "origin" and not flow.get("down"):
        text += " (a backward op of a replay: the backward pass is not on the replay's tape, so nothing is drawn " \
                "after it)"
    return text + "."


# ------------------------------------------------------------------------------------------- timeline
def _timeline(data: Dict[str, Any]) -> str:
    timeline = data.get("timeline")
    if not timeline:
        why = {"analyze": "`mindguard analyze` reads one dump, which holds no history of the run; a hunt's page "
                          "shows the run up to the failure",
               "replay": "`mindguard replay` re-runs one captured step; a hunt's page shows the run up to the "
                         "failure"}.get(str(data.get("kind")), "nothing of the run's history was found")
        return f'<section id="timeline" class="card"><h2>Timeline</h2><p class="muted">{_code(why)}.</p></section>'
    last = int(timeline.get("last_step") or 0)
    failing = timeline.get("failing_step")
    losses = [(int(s), v, src) for s, v, src in timeline.get("loss") or [] if isinstance(s, int)]
    svg = timeline_svg(last, failing, losses, timeline.get("kept") or [])
    rows = "".join(f"<li>{_code(c)}</li>" for c in timeline.get("checks") or [])
    notes = "".join(f"<li>{_code(n)}</li>" for n in timeline.get("notes") or [])
    return (f'<section id="timeline" class="card"><h2>Timeline of the run</h2>{svg}'
            f'<h3>What the checks saw</h3><ul class="checks">{rows}</ul>'
            + (f'<ul class="muted small">{notes}</ul>' if notes else "") + "</section>")


# ------------------------------------------------------------------------------------------- ranks, details


def _all_tensors(data: Dict[str, Any], graphs: List[Dict[str, Any]]) -> str:
    rows: List[Dict[str, Any]] = []
    finding, stop, _ = _culprit(data)
    if finding:
        rows += [dict(i, _label=f"culprit {i['_label']}") for i in io_rows(finding)]
    if stop:
        rows += [dict(i, _label=f"stop point {stop['op'].get('op_type')} input {i.get('slot')}")
                 for i in stop["op"].get("inputs") or []]
    report = data.get("report") or {}
    rows += [dict(i, _label=f"{i.get('name')} ({i.get('source')})") for i in report.get("nonfinite_inputs") or []]
    for replay in data.get("replays") or []:
        rows += [dict(i, _label=f"{i.get('name')} ({i.get('source')})") for i in replay.get("nonfinite_inputs") or []]
    body = stats_table(rows)
    for g, graph in enumerate(graphs):
        title = f"Data-flow nodes{' of ' + graph['title'] if graph['title'] else ''}"
        body += f'<h4>{e(title)}</h4>' + node_table(graph["flow"], g)
    return details("tensors", "Every tensor's statistics", body)


def _messages(data: Dict[str, Any]) -> str:
    warnings: List[str] = []
    notes: List[str] = []
    report = data.get("report") or {}
    warnings += report.get("warnings") or []
    notes += report.get("notes") or []
    for replay in data.get("replays") or []:
        warnings += replay.get("warnings") or []
    # the report's structured exclusions (each rule that left evidence out, what, and why), never its prose
    excluded = [f"{item.get('what')}: {item.get('reason')} ({item.get('rule')})"
                for item in report.get("excluded") or [] if isinstance(item, dict)]
    out = ""
    out += details("excluded", f"Evidence excluded, and why ({len(excluded)})",
                   _list(excluded) or '<p class="muted">Nothing was left out.</p>')
    out += details("warnings", f"Warnings ({len(warnings)})", _list(warnings) or '<p class="muted">None.</p>')
    out += details("notes", f"Notes ({len(notes)})", _list(notes) or '<p class="muted">None.</p>')
    risk = report.get("fp16_risk") or []
    if risk:
        rows = "".join(f"<tr><td>{e(r.get('name'))}</td><td>{e(r.get('underflow'))}</td><td>{e(r.get('overflow'))}"
                       f"</td></tr>" for r in risk[:50])
        out += details("fp16", f"fp16 range risk ({len(risk)})",
                       "<p>fp32 tensors whose values would underflow (|x| &lt; 2^-24 → 0) or overflow (|x| &gt; "
                       "65504 → Inf) in fp16:</p><table class=stats><tr><th>tensor</th><th>underflow</th>"
                       f"<th>overflow</th></tr>{rows}</table>")
    finding, stop, _ = _culprit(data)
    stack = (finding or {}).get("stack") or ((stop or {}).get("op") or {}).get("stack") or []
    if stack:
        rows = "".join(f"<li><code>{e(f.get('file'))}:{e(f.get('line'))}</code> {e(f.get('code'))}</li>"
                       for f in stack)
        out += details("stack", f"Stack of the culprit, outermost first ({len(stack)} frames)", f"<ol>{rows}</ol>")
    return out


def _list(items: List[str]) -> str:
    return f'<ul class="msgs">{"".join(f"<li>{_code(m)}</li>" for m in items)}</ul>' if items else ""


# ------------------------------------------------------------------------------------------- the page
def render_page(data: Dict[str, Any]) -> str:
    """The page for ``data`` (module docstring) as one HTML string."""
    graphs = _graphs(data)
    _, title = _headline(data)
    payload = {"graphs": [g["flow"] for g in graphs], "sources": source_index(data.get("sources") or {})}
    blob = json.dumps(payload, separators=(",", ":"), default=str).replace("<", "\\u003c")
    run = data.get("run") or {}
    sub = []
    if run.get("dir"):
        sub.append(f"run folder <code>{e(run['dir'])}</code>")
    if run.get("command"):
        sub.append(f"<code>{e(run['command'])}</code>")
    if data.get("kind") != "hunt":
        sub.append(f"<code>mindguard {e(data.get('kind'))}</code>")
    body = "".join([
        _verdict(data), _verify_block(data), _graph_section(data, graphs), _timeline(data), ranks_section(data),
        '<section id="details" class="card"><h2>Details</h2>', _all_tensors(data, graphs), _messages(data),
        source_listing(data.get("sources") or {}), passes_section(data), "</section>"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{_CSP}
<title>mindguard: {e(title)}</title>
<style>{CSS}</style></head>
<body><header><div class="brand">mindguard</div><div class="sub">{' · '.join(sub)}</div></header>
<main>{body}</main>
<footer>Written by mindguard {e(data.get('version'))} on {e(data.get('generated'))}. One file: it loads nothing
from anywhere. The data-flow layout is dagre (MIT), inlined.</footer>
<script type="application/json" id="mg-data">{blob}</script>
<script>{dagre_source()}</script>
<script>{JS}</script>
</body></html>
"""


