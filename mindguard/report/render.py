"""The one renderer: ``str(DumpReport)`` and any :class:`~.model.Finding` read like a compiler error -- what,
where (file:line and the code), the numbers, the fix. Takes Findings or their dicts (anything with ``get``)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

#: The non-finite counts of a tensor's statistics (``mindguard.analysis.stats``): ``(key, label)``, in the order
#: they are said; the text report's and the page's.
NONFINITE_COUNTS = (("nan", "NaN"), ("pos_inf", "+Inf"), ("neg_inf", "-Inf"))

_COLUMNS = ("shape", "dtype", "min", "max", "zeros", "nan", "pos_inf", "neg_inf")
_HEADERS = ("tensor", "shape", "dtype", "min", "max", "zeros", "nan", "+inf", "-inf")


def render_report(report, job: Optional[Dict[str, Any]] = None) -> str:
    """``report`` as text. ``job`` (a hunt across nodes: ``{"roles": [{"rank", "node", "role", "op", ...}],
    "origin_node": k, "nodes": n}``) replaces the per-rank block by the whole job's, each rank with its node."""
    # the failing run's step when the hunt gave it (its record's position names the rank of a multi-rank run)
    where = getattr(report, "step", None) or (f"dump iteration {report.iteration}"
                                              + (f", rank {report.rank}" if report.rank is not None else ""))
    origin = report.origin
    stopped = getattr(report, "stopped_at", None)
    lines = _verdict_lines(report, job, where)
    if report.nonfinite_inputs:
        lines.extend(_nonfinite_input_lines(report))
    lines.extend(_rank_lines(report, job))
    first = report.first_nonfinite
    if first is not None and (origin is None or first["name"] != origin["name"]):
        lines.append(f"note: first op touching a non-finite value: {first['op_type']} {first['name']}")
    if origin is not None and origin.get("stack"):
        lines.extend(_stack(origin["stack"]))
    elif stopped is not None and stopped["op"].get("stack"):
        lines.extend(_stack(stopped["op"]["stack"]))
    if report.fp16_risk and getattr(report, "computes_in_half", None) is not False:   # an fp32 run: not its risk
        lines.append(f"note: {len(report.fp16_risk)} fp32 tensor(s) would under/overflow in fp16 "
                     f"(|x| < 2^-24 -> 0, |x| > 65504 -> inf), e.g.:")
        for item in report.fp16_risk[:5]:
            lines.append(f"   {item['name']}: underflow {item['underflow']}, overflow {item['overflow']}")
    for note in getattr(report, "notes", None) or []:
        lines.append(f"note: {note}")
    excluded = getattr(report, "excluded", None) or []
    if excluded:
        lines.append("excluded from the evidence (each rule that left files out, and why):")
        for item in excluded[:12]:
            lines.append(f"   - {item.get('rule')}: {item.get('what')} -- {item.get('reason')}")
        if len(excluded) > 12:
            lines.append(f"   ... and {len(excluded) - 12} more (report.json \"excluded\")")
    for warning in report.warnings:
        lines.append(f"warning: {warning}")
    lines.append(f"   ({report.ops_analyzed} op launches in graph(s) {report.graphs} of {report.dump})")
    return "\n".join(lines)


def _verdict_lines(report, job: Optional[Dict[str, Any]], where: str) -> List[str]:
    """The answer's first lines: the culprit's error block and its help, the op a raising step stopped in, Inf/NaN
    already in the inputs, or why there is no culprit."""
    lines: List[str] = []
    origin = report.origin
    stopped = getattr(report, "stopped_at", None)
    if origin is None and stopped is not None:
        lines.extend(_stop_error(stopped, where))
        if report.nonfinite_inputs or report.first_nonfinite is not None:
            lines.append("note: the iteration also holds Inf/NaN that no operator produced (see below)")
    elif origin is not None:
        lines.extend(render_finding(origin, where))
        if job is not None and report.origin_rank is not None:
            lines.append(f"   = rank {report.origin_rank} (node {job.get('origin_node')}) went non-finite first; the "
                         f"other ranks received it (every node's hunt gives this same answer)")
        elif report.origin_rank is not None and report.ranks and not origin.get("received"):
            lines.append(f"   = rank {report.origin_rank} went non-finite first (locally, not received through a "
                         f"collective)")
        lines.extend(_help_lines(origin.get("hint")))
        if stopped is not None:
            lines.extend(_stop_note(stopped))
    elif report.nonfinite_inputs:
        lines.append(f"error: Inf/NaN was already in the step's inputs, no operator produced it ({where})")
        first = report.first_nonfinite
        lines.extend(origin_lines(first.get("traced_to") if first is not None else None))
        if report.origin_rank is not None and report.ranks:
            lines.append(f"   = rank {report.origin_rank}'s batch brought it in "
                         f"(each rank's part: see \"per rank\" below)")
    elif report.first_nonfinite is not None:
        lines.append(f"error: Inf/NaN present but no operator turned finite inputs into it ({where})")
    elif not getattr(report, "analysed", True):
        lines.append(f"error: could not analyse the dump ({where}): no tensor file could be used; "
                     f"the warnings below say why")
    elif getattr(report, "unusable_files", 0):
        lines.append(f"error: no Inf/NaN in the files that could be read, but {report.unusable_files} tensor file(s) "
                     f"could not be used ({where}): the answer covers only part of the step (see the warnings)")
    else:
        lines.append(f"ok: no Inf/NaN found ({where})")
    return lines


def _nonfinite_input_lines(report) -> List[str]:
    """The graph inputs and Parameters non-finite from the step's start (rows of a batch column too), and the
    hint for them when no operator is the culprit."""
    lines = ["note: non-finite from the start of the step (graph inputs / parameters):"]
    for item in report.nonfinite_inputs[:10]:
        counts = ", ".join(f"{k}={item.get(k, 0)}" for k in ("nan", "pos_inf", "neg_inf"))
        via = f" -> {item['op']} input {item['slot']}" if item.get("op") else ""
        rows = ""
        if item.get("rows"):
            more = int(item.get("row_count") or 0) - len(item["rows"])
            rows = (f"; row(s) {', '.join(str(r) for r in item['rows'])}{f' (+{more} more)' if more > 0 else ''} "
                    f"of {item.get('rows_total')}")
        lines.append(f"   {item['name']} ({item.get('source', '?')}, shape {item.get('shape')}): {counts}{rows}"
                     f"{via}")
    from ..analysis.hints import nonfinite_input_hint

    first = report.first_nonfinite   # its hint, when its input was traced to an origin (a Parameter, a constant)
    traced = first.get("hint") if first is not None and first.get("traced_to") else None
    advice = traced or next((h for h in (nonfinite_input_hint(str(i.get("name")), str(i.get("source")))
                                         for i in report.nonfinite_inputs) if h), None)
    if advice and report.origin is None:
        lines.extend(_help_lines(advice))
    return lines


def _rank_lines(report, job: Optional[Dict[str, Any]]) -> List[str]:
    """What each rank shows (made the values, received them), with its node for a job across nodes."""
    lines: List[str] = []
    if job is not None:
        roles = job.get("roles") or []
        lines.append(f"note: per rank ({len(roles)} ranks on {job.get('nodes')} nodes):")
        for role in roles:
            lines.append(f"   rank {role['rank']} (node {role.get('node')}): {_rank_role_text(role)}")
    elif report.ranks:
        lines.append("note: per rank:")
        for r in report.ranks:
            lines.append(f"   rank {r.rank}: {_rank_role_text(r.rank_role())}")
    return lines


def render_finding(finding, where: str) -> List[str]:
    """The error block of one Finding (or its dict): what it did, where (file:line and code), which op or cell,
    its input/output table and how far the values reached. Works for dump answers (``op_type`` and ``name``)
    and cell-level replay answers (``cell`` and ``cell_type``, no op name). The ``help:`` lines follow apart."""
    op_type, cell, cell_type = finding.get("op_type"), finding.get("cell"), finding.get("cell_type")
    if op_type:
        subject = op_type
    else:
        subject = f"{cell_type or 'cell'} cell" + (f" `{cell}`" if cell else "")
    inputs = [i for i in finding.get("inputs") or [] if isinstance(i, dict)]
    from_infinite = any(i.get("pos_inf") or i.get("neg_inf") for i in inputs) and not any(i.get("nan") for i in inputs)
    verb = ("received Inf/NaN through" if finding.get("received") else
            "turned infinite inputs (no NaN) into NaN:" if from_infinite else "turned finite inputs into Inf/NaN:")
    lines = [f"error: {subject} ({_role(finding)}) {verb} {_what(finding.get('outputs') or [])} ({where})"]
    lines.extend(_location(finding))
    if finding.get("name"):
        lines.append(f"   = op: {finding['name']}")
    lines.extend(call_site_lines(finding.get("call_sites")))
    lines.extend(origin_lines(finding.get("traced_to")))
    if cell:
        lines.append(f"   = cell: {cell}" + (f" ({cell_type})" if cell_type else ""))
    if finding.get("forward_op"):
        lines.append(f"   = forward op: {finding['forward_op']}")
    lines.extend("   " + row for row in _table(finding.get("inputs") or [], finding.get("outputs") or []))
    if finding.get("reached") is not None:
        lines.append(f"   = reached: the non-finite values reached {finding['reached']} later op(s) in this iteration")
    return lines


def _role(op) -> str:
    direction = op.get("direction") or "?"
    if direction == "backward" and op.get("forward_op"):
        return f"backward of {short_op_name(op['forward_op'])}"
    return direction


def _stop_error(stopped: Dict[str, Any], where: str) -> List[str]:
    """The stop point as the error: a step raised and its dump ends before this op."""
    op = stopped["op"]
    lines = [f"error: the step stopped in {op['op_type']} ({_role(op)}) -- it did not complete ({where})"]
    lines.extend(_location(op))
    lines.append(f"   = op: {op['name']}")
    if op.get("call_site"):
        lines.append(f"   = line: {op['call_site']}")
    lines.extend(call_site_lines(op.get("call_sites")))
    if op.get("forward_op"):
        lines.append(f"   = forward op: {op['forward_op']}")
    if stopped.get("message"):
        lines.append(f"   = exception: {stopped['message']}")
    lines.extend(origin_lines(stopped.get("traced_to")))
    lines.extend("   " + row for row in _stop_table(op["inputs"]))
    if stopped.get("inputs_not_dumped"):
        lines.append(f"   = input(s) {stopped['inputs_not_dumped']} not dumped before the stop: dtype/shape from the "
                     f".ir")
    last = stopped.get("last_completed")
    tail = f"{stopped.get('ops_not_run', 0)} op(s) after {op['op_type']} in execution order did not run (no files)"
    if last:
        lines.append(f"   = last completed: {last['op_type']} ({last['name']}); {tail}")
    else:
        lines.append(f"   = nothing of graph {stopped.get('graph')} completed; {tail}")
    lines.extend(_help_lines(stopped.get("hint")))
    if stopped.get("log"):
        lines.append(f"note: the training's exception and traceback: {stopped['log']}")
    return lines


def _stop_note(stopped: Dict[str, Any]) -> List[str]:
    """After a NaN origin (the cause): where the step then stopped."""
    op = stopped["op"]
    later = stopped.get("ops_after_origin")
    distance = f", {later} op(s) later" if isinstance(later, int) and later > 0 else " later"
    downstream = stopped.get("downstream_of_origin")
    if stopped.get("inputs_nonfinite") or downstream:
        reached = ", which the non-finite values reached"
    elif downstream is False:
        reached = " (it does not read the origin's values: the stop may have another cause)"
    else:
        reached = ""
    lines = [f"note: the step then stopped in {op['op_type']} ({_role(op)}){distance}{reached}; it did not complete"]
    source = op.get("source")
    if source:
        lines.append(f"   --> {source['file']}:{source['line']}: {source['code']}")
    lines.append(f"   = op: {op['name']}")
    if stopped.get("message"):
        lines.append(f"   = exception: {stopped['message']}")
    hint = stopped.get("hint")
    if hint:
        lines.append(f"   = {hint.splitlines()[0]}")
    return lines


def _stop_table(inputs: List[Dict[str, Any]]) -> List[str]:
    headers = ("tensor",) + _HEADERS[1:] + ("from",)
    rows = [list(headers)]
    for item in inputs:
        label = f"input {item['slot']}"
        origin = _from(item)
        if item.get("unreadable"):
            rows.append([label, "(unreadable)"] + [""] * (len(headers) - 3) + [origin])
            continue
        cells = [_fmt(item.get(c)) for c in _COLUMNS]
        if item.get("not_dumped"):
            cells = cells[:2] + ["?"] * (len(_COLUMNS) - 2)
        rows.append([label] + cells + [origin])
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _from(item: Dict[str, Any]) -> str:
    if item.get("constant"):
        return "constant"
    if item.get("parameter"):
        return f"parameter {item['parameter']}" + (" (not dumped)" if item.get("not_dumped") else "")
    if item.get("producer"):
        return f"output of {short_op_name(item['producer'])}"
    text = str(item.get("from", ""))
    return "own input file" if text == "dumped input" else short_op_name(text.split(" (", 1)[0]) + \
        (" (not dumped)" if item.get("not_dumped") else "")


def origin_lines(traced: Optional[List[Dict[str, Any]]]) -> List[str]:
    """Where the culprit's operands came from (``traced_to``): one ``= origin:`` line each, the origin first."""
    if not traced:
        return []
    lines = [f"   = origin: {traced[0].get('text')}"]
    lines.extend(f"   = also: {item.get('text')}" for item in traced[1:4])
    if len(traced) > 4:
        lines.append(f"   = also: {len(traced) - 4} more (report.json \"traced_to\")")
    return lines


def call_site_lines(sites: Optional[Dict[str, Any]]) -> List[str]:
    """The call of a shared cell the data flow names, or every call with its evidence when it names none."""
    if not sites:
        return []
    if sites.get("line"):
        return [f"   = call site: line {sites['line']} (`{sites.get('code', '')}`): {sites.get('why', '')}"]
    lines = [f"   = call site not known: {sites.get('why', '')}"]
    lines.extend(f"     line {c['line']}: `{c['code']}` -- {c['evidence']}" for c in sites.get("calls") or [])
    return lines


def _stack(stack: List[Dict[str, Any]]) -> List[str]:
    """The user's frames, outermost first; MindSpore's own frames are counted, not shown (the JSON has them all)."""
    from ..analysis.trace import is_mindspore_frame

    mindspore = {(f["file"], f["line"]) for f in stack if is_mindspore_frame(str(f.get("file", "")))}
    shown = [f for f in stack if not is_mindspore_frame(str(f.get("file", "")))] or stack
    lines = ["note: stack, outermost first:"]
    previous = None
    for f in shown:
        if (f["file"], f["line"]) != previous:
            lines.append(f"   {f['file']}:{f['line']}: {f['code']}")
        previous = (f["file"], f["line"])
    if len(shown) < len(stack):
        lines.append(f"   (+{len(mindspore)} MindSpore frame{'s' if len(mindspore) != 1 else ''}; "
                     f"`mindguard analyze --json` shows the full stack)")
    return lines


def short_op_name(name: Optional[str]) -> str:
    """A kernel's short name: the last scope part without its ``-opN`` suffix (``"Default/.../Sqrt-op12"`` ->
    ``"Sqrt"``); ``"?"`` for none. The one shortener of the text report, the page and its data."""
    if not name:
        return "?"
    return re.sub(r"-op\d+$", "", str(name).rsplit("/", 1)[-1])


def _what(outputs: List[Dict[str, Any]]) -> str:
    totals = [(sum(int(o.get(key) or 0) for o in outputs), label) for key, label in NONFINITE_COUNTS]
    parts = [f"{n} {label}" for n, label in totals if n]
    return ", ".join(parts) or "non-finite values"


def _location(origin) -> List[str]:
    source = origin.get("source")
    if not source:
        what = "no .ir trace for this op" if origin.get("name") else "no frame recorded for this cell"
        return [f"  --> (source line unknown: {what})"]
    gutter = " " * len(str(source["line"]))
    return [f"  --> {source['file']}:{source['line']}",
            f"{gutter} |",
            f"{source['line']} | {source['code']}",
            f"{gutter} |"]


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def _table(inputs: List[Dict[str, Any]], outputs: List[Dict[str, Any]]) -> List[str]:
    rows = [list(_HEADERS)]
    for label, items in (("input", inputs), ("output", outputs)):
        for item in items:
            role = {"grad_of_output": "d(output)", "grad_of_input": "d(input)"}.get(str(item.get("role")), label)
            name = f"{role} {item['slot']}" + (" (after update)" if item.get("post_update") else "")
            if item.get("unreadable"):
                rows.append([name, "(unreadable)"] + [""] * (len(_HEADERS) - 2))
            else:
                rows.append([name] + [_fmt(item.get(c)) for c in _COLUMNS])
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADERS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


def _rank_role_text(role: Dict[str, Any]) -> str:
    """One rank's part in a multi-rank failure (:meth:`RankReport.rank_role`), as the text report says it."""
    kind = role["role"]
    if kind == "batch":
        return f"originated: its batch holds Inf/NaN ({', '.join(role['inputs'])})"
    if kind == "local":
        return f"originated: {short_op_name(role['op'])} produced Inf/NaN from finite inputs ({role['op']})"
    if kind == "received":
        return f"received Inf/NaN through {short_op_name(role['op'])} ({role['op']})"
    if kind == "unexplained":
        return "holds Inf/NaN, no producing operator found"
    if kind == "stopped":
        return f"no Inf/NaN; the step stopped in {short_op_name(role['op'])} ({role['op']})"
    if kind == "not_read":
        return "not read on this node (no file of its step here)"
    return "no Inf/NaN"   # "clean"


def _help_lines(hint):
    """A hint as compiler-style ``help:`` lines (continuation lines indented under it)."""
    if not hint:
        return []
    first, *rest = hint.splitlines()
    return [f"help: {first}"] + [f"      {r}" for r in rest]


def render_replay(report) -> str:
    """``str(ReplayReport)``: the replayed step's origin through :func:`render_finding` (the same block as a dump
    answer), Inf/NaN already in the inputs, what the update made non-finite, the stack and the warnings."""
    step = "replay" + ("" if report.iteration is None else
                       f" of iteration {report.iteration} (global step {report.iteration + 1})")
    lines: List[str] = []
    first = report.first
    if first is None:
        lines.append(f"ok: no operator turned finite values into Inf/NaN ({step}, loss {report.loss})")
    elif first.get("direction") == "input":
        lines.append(f"error: Inf/NaN was already in the step's inputs, no operator produced it ({step})")
    elif first.get("stopped"):
        lines.append(f"error: the step stopped in {first.get('op_type')} ({_role(first)}) -- it raised ({step})")
        lines.extend(_location(first))
        if first.get("cell"):
            lines.append(f"   = cell: {first['cell']}" + (f" ({first['cell_type']})" if first.get("cell_type") else ""))
        if first.get("exception"):
            lines.append(f"   = exception: {first['exception']}")
        lines.extend(origin_lines(first.get("traced_to")))
        rows = _stop_table([dict(i, **{"from": "input"}) for i in first.get("inputs") or []])
        lines.extend("   " + row for row in rows)
    else:
        lines.extend(render_finding(first, step))
        if first.get("call") and first.get("cell") and isinstance(first.get("call"), int) and first["call"] > 1:
            lines.append(f"   = call {first['call']} of cell {first['cell']} in this step")
    if first is not None:
        lines.extend(_help_lines(first.get("hint")))
    if report.nonfinite_inputs:
        lines.append("note: non-finite from the start of the step (batch inputs / parameters):")
        for item in report.nonfinite_inputs[:10]:
            counts = ", ".join(f"{k}={item.get(k, 0)}" for k in ("nan", "pos_inf", "neg_inf"))
            lines.append(f"   {item['name']} ({item.get('source', '?')}, shape {item.get('shape')}): {counts}")
    if report.parameters_nonfinite_after_update:
        names = report.parameters_nonfinite_after_update
        lines.append(f"note: parameters non-finite after the update ({len(names)}): {', '.join(names[:20])}"
                     + (f", ... (+{len(names) - 20})" if len(names) > 20 else ""))
    if first is not None and first.get("stack"):
        lines.extend(_stack(first["stack"]))
    lines.extend(f"warning: {w}" for w in report.warnings)
    return "\n".join(lines)
