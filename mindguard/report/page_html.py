"""The report page's HTML pieces that only lay data out: escaping, numbers, a tensor's statistics table, a
data-flow graph's node table, the source listings, the ranks and passes tables and the collapsible sections that
hold them (:mod:`.page` composes the page from them)."""
from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any, Dict, List, Optional

from .render import NONFINITE_COUNTS as COUNTS


def e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def num_text(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value == 0:
            return "0"
        if abs(value) >= 1e5 or abs(value) < 1e-3:
            return f"{value:.3e}"
        return f"{value:.4g}"
    return str(value)


def shape_text(stats: Optional[Dict[str, Any]]) -> str:
    if not stats or stats.get("shape") is None:
        return ""
    return "[" + ",".join(str(d) for d in stats["shape"]) + "]"


def has_nonfinite(stats: Optional[Dict[str, Any]]) -> bool:
    return stats is not None and bool(stats) and any(int(stats.get(k) or 0) for k, _ in COUNTS)


def source_block(source: Optional[Dict[str, Any]], sources: Dict[str, Any]) -> str:
    if not source:
        return '<p class="muted">Source line unknown (no trace for this op).</p>'
    key = f"{source.get('file')}:{source.get('line')}"
    context = (sources.get(key) or {}).get("lines")
    rows = []
    if context:
        for number, text in context:
            mark = " hit" if number == source.get("line") else ""
            rows.append(f'<tr class="src{mark}"><td class="ln">{e(number)}</td><td><pre>{e(text)}</pre></td></tr>')
    else:
        rows.append(f'<tr class="src hit"><td class="ln">{e(source.get("line"))}</td>'
                    f'<td><pre>{e(source.get("code"))}</pre></td></tr>')
    return (f'<div class="where"><a class="file" href="{e(file_url(source.get("file")))}">{e(source.get("file"))}:'
            f'{e(source.get("line"))}</a><table class="code">{"".join(rows)}</table></div>')


def file_url(path: Optional[str]) -> str:
    if not path:
        return "#"
    return "file://" + "/".join(_url_part(p) for p in str(path).split("/"))


def _url_part(part: str) -> str:
    from urllib.parse import quote

    return quote(part)


def stats_table(items: List[Dict[str, Any]], label: str = "tensor") -> str:
    if not items:
        return ""
    head = (f"<tr><th>{e(label)}</th><th>shape</th><th>dtype</th><th>min</th><th>max</th><th>zeros</th>"
            f"<th>NaN</th><th>+Inf</th><th>-Inf</th></tr>")
    rows = []
    for item in items:
        name = item.get("_label") or slot_label(item)
        if item.get("unreadable"):
            rows.append(f"<tr><td>{e(name)}</td><td colspan=8 class=muted>unreadable</td></tr>")
            continue
        cells = [shape_text(item), item.get("dtype"), num_text(item.get("min")), num_text(item.get("max")),
                 num_text(item.get("zeros"))]
        counts = [int(item.get(k) or 0) for k, _ in COUNTS]
        bad = "".join(f'<td class="{"bad" if n else ""}">{n}</td>' for n in counts)
        rows.append(f'<tr class="{"badrow" if any(counts) else ""}"><td>{e(name)}</td>'
                    + "".join(f"<td>{e(c)}</td>" for c in cells) + bad + "</tr>")
    return f'<table class="stats">{head}{"".join(rows)}</table>'


def slot_label(item: Dict[str, Any]) -> str:
    role = {"grad_of_output": "d(output)", "grad_of_input": "d(input)", "grad_of_parameter": "d(parameter)",
            "output": "output", "input": "input"}.get(item.get("role") or "", item.get("role") or "")
    base = f"{role or 'tensor'} {item.get('slot', '')}".strip()
    if item.get("parameter"):
        base += f" ({item['parameter']})"
    if item.get("post_update"):
        base += " (after update)"
    return base


def io_rows(finding: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for item in finding.get("inputs") or []:
        out.append(dict(item, _label=slot_label(dict(item, role=item.get("role") or "input"))))
    for item in finding.get("outputs") or []:
        out.append(dict(item, _label=slot_label(dict(item, role=item.get("role") or "output"))))
    return out


def ranks_section(data: Dict[str, Any]) -> str:
    ranks = data.get("ranks") or []
    if len(ranks) < 2:
        return ""
    rows = "".join(f'<tr class="role-{e(r.get("role"))}"><td>rank {e(r.get("rank"))}</td><td>{e(r.get("role"))}'
                   f'</td><td>{e(r.get("text"))}</td></tr>' for r in ranks)
    return (f'<section id="ranks" class="card"><h2>Ranks: who made the values, who received them</h2>'
            f'<table class="ranks"><tr><th>rank</th><th>role</th><th>what it shows</th></tr>{rows}</table>'
            f'</section>')


def node_table(flow: Dict[str, Any], g: int) -> str:
    head = ("<tr><th>node</th><th>role</th><th>tensor</th><th>shape</th><th>dtype</th><th>min</th><th>max</th>"
            "<th>zeros</th><th>NaN</th><th>+Inf</th><th>-Inf</th><th>line</th></tr>")
    rows = []
    for n, node in enumerate(flow.get("nodes") or []):
        tensors = list(node.get("outputs") or []) + ([node["value"]] if node.get("value") else []) + \
            [dict(i, role="input") for i in node.get("inputs") or []]
        if not tensors:
            tensors = [{}]
        source = node.get("source") or {}
        line = f"{Path(str(source.get('file'))).name}:{source.get('line')}" if source else ""
        for t, item in enumerate(tensors):
            first = t == 0
            label = (node.get("op_type") or node.get("name") or "") if first else ""
            what = "value" if node.get("value") is item else slot_label(dict(item, role=item.get("role") or
                                                                                "output")) if item else "(not read)"
            counts = [int(item.get(k) or 0) for k, _ in COUNTS]
            rows.append(f'<tr id="{e(node_anchor(g, n)) if first else ""}" class="{"badrow" if any(counts) else ""}">'
                        f'<td title="{e(node.get("name"))}">{e(label)}</td><td>{e(node.get("role")) if first else ""}'
                        f'</td><td>{e(what)}</td><td>{e(shape_text(item))}</td><td>{e(item.get("dtype"))}</td>'
                        f'<td>{e(num_text(item.get("min")))}</td><td>{e(num_text(item.get("max")))}</td>'
                        f'<td>{e(num_text(item.get("zeros")))}</td>'
                        + "".join(f'<td class="{"bad" if c else ""}">{c}</td>' for c in counts)
                        + f'<td>{e(line) if first else ""}</td></tr>')
    return f'<table class="stats nodes">{head}{"".join(rows)}</table>'


def node_anchor(g: int, n: int) -> str:
    return f"node-{g}-{n}"


def passes_section(data: Dict[str, Any]) -> str:
    passes = data.get("passes") or []
    if not passes:
        return ""
    rows = []
    for p in passes:
        dump = p.get("dump") or {}
        what = p.get("examine") or ""
        if dump:
            what += f" · dump iteration(s) {dump.get('iteration')} · input_output {dump.get('input_output')}"
            if dump.get("kernels"):
                what += f" · kernels {', '.join(map(str, dump['kernels']))}"
        rows.append(f"<tr><td>{e(p.get('name'))}</td><td>{e(p.get('label'))}</td><td><code>{e(p.get('command'))}</code>"
                    f"</td><td>{e(what)}</td><td>{e(p.get('returncode'))}</td><td><code>{e(p.get('log'))}</code>"
                    f"</td></tr>")
    run = data.get("run") or {}
    lead = (f"<p>Run folder <code>{e(run.get('dir'))}</code>; outcome <b>{e(run.get('outcome'))}</b>, exit code "
            f"{e(run.get('exit_code'))}.</p>") if run else ""
    return details("passes", f"The passes and their commands ({len(passes)})",
                   lead + "<table class=passes><tr><th>folder</th><th>pass</th><th>command</th><th>what it did</th>"
                           f"<th>exit</th><th>output</th></tr>{''.join(rows)}</table>")


def details(ident: str, title: str, body: str) -> str:
    return f'<details id="{e(ident)}"><summary>{e(title)}</summary><div class="det">{body}</div></details>'


def source_index(sources: Dict[str, Any]) -> Dict[str, Dict[str, str]]:
    """``"<file>:<line>"`` -> the short label and the anchor of its listing (:func:`source_listing`)."""
    return {key: {"label": f"{Path(str(v.get('file'))).name}:{v.get('line')}", "anchor": f"src-{i}"}
            for i, (key, v) in enumerate(sources.items())}


def source_listing(sources: Dict[str, Any]) -> str:
    """Every source line the page names (the graph's nodes link here), with the lines around it."""
    if not sources:
        return ""
    blocks = []
    for i, (_key, value) in enumerate(sources.items()):
        rows = "".join(f'<tr class="src{" hit" if n == value.get("line") else ""}"><td class="ln">{e(n)}</td>'
                       f'<td><pre>{e(text)}</pre></td></tr>' for n, text in value.get("lines") or [])
        blocks.append(f'<div class="where" id="src-{i}"><a class="file" href="{e(file_url(value.get("file")))}">'
                      f'{e(value.get("file"))}:{e(value.get("line"))}</a><table class="code">{rows}</table></div>')
    return details("sources", f"Source lines ({len(sources)})", "".join(blocks))
