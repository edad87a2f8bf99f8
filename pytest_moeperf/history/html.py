"""One self-contained HTML file for a session: provenance and topology, the session chart, a sortable verdict table,
trend plots of the metrics that regressed or were inconclusive, and the extra tables (budget, spec decode).

Images are embedded as base64 ``data:`` URIs, styles and the sorting script are inline: the file opens offline,
from a CI artifact, with nothing fetched."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_moeperf.history.plots import SEVERITY, session_plot, trend_plot
from pytest_moeperf.history.records import MetricRecord, records_from_report
from pytest_moeperf.history.trend import Trend
from pytest_moeperf.reports.controls import visible

MIME = {"png": "image/png", "svg": "image/svg+xml"}
FLAGGED = ("REGRESSED", "INCONCLUSIVE")  # verdicts whose trend the report draws

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#212121;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
td:first-child,th:first-child{text-align:left;font-family:monospace;max-width:560px;overflow-wrap:anywhere}
th{background:#eceff1;cursor:pointer;user-select:none}th.sorted-asc::after{content:" ▲"}
th.sorted-desc::after{content:" ▼"}tr.REGRESSED{background:#ffebee}tr.IMPROVED{background:#e3f2fd}
tr.INCONCLUSIVE{background:#fff3e0}tr.NEW{background:#f5f5f5}img{max-width:100%;height:auto;display:block}
.kv td:first-child{font-family:inherit;font-weight:600}.caption{color:#616161;font-size:12px}
pre{background:#f5f5f5;padding:.5em;overflow-x:auto}
"""

# Click a header to sort by it; a second click reverses. Cells with data-v sort as numbers.
_SCRIPT = """
document.querySelectorAll("table.sortable th").forEach(function(th, col) {
  th.addEventListener("click", function() {
    var table = th.closest("table"), body = table.tBodies[0], asc = !th.classList.contains("sorted-asc");
    table.querySelectorAll("th").forEach(function(h) { h.classList.remove("sorted-asc", "sorted-desc"); });
    th.classList.add(asc ? "sorted-asc" : "sorted-desc");
    var key = function(tr) { var c = tr.cells[col]; return c.dataset.v !== undefined ? parseFloat(c.dataset.v)
                                                                                      : c.textContent; };
    Array.from(body.rows).sort(function(a, b) { var x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1); }).forEach(function(tr) { body.appendChild(tr); });
  });
});
"""


def data_uri(image: bytes, fmt: str) -> str:
    return f"data:{MIME[fmt]};base64,{base64.b64encode(image).decode('ascii')}"


def _e(value: Any) -> str:
    return html.escape(visible(value), quote=True)


def _img(image: bytes, fmt: str, alt: str) -> str:
    return f'<img src="{data_uri(image, fmt)}" alt="{_e(alt)}">'


def _num(value: float | None, scale: float = 1.0, spec: str = ".4g", suffix: str = "") -> str:
    if value is None:
        return '<td data-v="-Infinity">-</td>'
    return f'<td data-v="{value * scale!r}">{format(value * scale, spec)}{suffix}</td>'


def verdict_table(metrics: Sequence[MetricRecord]) -> list[str]:
    ordered = sorted(metrics, key=lambda m: (SEVERITY.get(m.status, 9), m.key))
    lines = ['<table class="sortable" id="verdicts"><thead><tr><th>metric</th><th>unit</th><th>better</th>'
             "<th>baseline</th><th>current</th><th>n</th><th>IQR</th><th>Δ</th><th>tol</th><th>verdict</th>"
             "</tr></thead><tbody>"]
    for m in ordered:
        lines.append(f'<tr class="{_e(m.status)}"><td>{_e(m.key)}</td><td>{_e(m.unit)}</td><td>{_e(m.better)}</td>'
                     f"{_num(m.baseline)}{_num(m.median)}{_num(float(m.n), spec='.0f')}{_num(m.iqr)}"
                     f"{_num(m.change, 100, '+.1f', ' %')}{_num(m.allowed, 100, '.0f', ' %')}"
                     f"<td>{_e(m.status)}</td></tr>")
    return lines + ["</tbody></table>"]


def _kv(rows: Sequence[tuple[str, Any]]) -> list[str]:
    return ['<table class="kv">'] + [f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows] + ["</table>"]


def topology_html(machine: Mapping[str, Any]) -> list[str]:
    moeperf = machine.get("moeperf") or {}
    topo = moeperf.get("topology") or {}
    host = topo.get("host") or {}
    rows: list[tuple[str, Any]] = [("fingerprint", f"{moeperf.get('fingerprint', '?')} (hash {moeperf.get('hash')})"),
                                   ("node", machine.get("node", "?"))]
    if host:
        rows.append(("host", f"{host.get('cpu_model', '?')}, {host.get('cores', '?')} cores, "
                             f"{(host.get('memory_bytes') or 0) / 2**30:.0f} GiB, {host.get('arch', '?')}"))
    if topo.get("driver_version") or topo.get("cuda_version"):
        rows.append(("driver / CUDA", f"{topo.get('driver_version') or '?'} / {topo.get('cuda_version') or '?'}"))
    software = topo.get("software") or {}
    if software:
        rows.append(("software", ", ".join(f"{k} {v}" for k, v in sorted(software.items()))))
    lines = _kv(rows)
    gpus = [g for g in topo.get("gpus") or [] if isinstance(g, Mapping)]
    if gpus:
        columns = [c for c in ("index", "name", "memory_bytes", "compute_capability", "pcie_gen", "pcie_width",
                               "numa_node") if any(c in g for g in gpus)]
        lines.append("<table><thead><tr>" + "".join(f"<th>{_e(c)}</th>" for c in columns) + "</tr></thead><tbody>")
        for gpu in gpus:
            cells = [f"{gpu[c] / 2**30:.0f} GiB" if c == "memory_bytes" and isinstance(gpu.get(c), int)
                     else gpu.get(c, "") for c in columns]
            lines.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
        lines.append("</tbody></table>")
    elif topo:
        lines.append('<p class="caption">No GPU: suites ran on the CPU.</p>')
    return lines


def sections_html(doc: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    for section in (doc.get("moeperf") or {}).get("sections") or []:
        columns, rows = section.get("columns") or [], section.get("rows") or []
        lines += [f"<h2>{_e(section.get('title', ''))}</h2>", '<table class="sortable"><thead><tr>'
                  + "".join(f"<th>{_e(c)}</th>" for c in columns) + "</tr></thead><tbody>"]
        lines += ["<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows]
        lines.append("</tbody></table>")
        if section.get("note"):
            lines.append(f'<p class="caption">{_e(section["note"])}</p>')
    return lines


def html_report(doc: Mapping[str, Any], trends: Sequence[Trend] = (), fmt: str = "png",
                title: str = "moeperf report") -> str:
    """The whole page for the report document ``doc``; ``trends`` are drawn (those of flagged metrics first)."""
    run, metrics = records_from_report(doc)
    counts: dict[str, int] = {}
    for m in metrics:
        counts[m.status] = counts.get(m.status, 0) + 1
    count_text = ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items(), key=lambda x: SEVERITY.get(x[0], 9)))
    commit = (run.git_commit or "unknown")[:12] + (" (dirty)" if run.git_dirty else "")
    chart, caption = session_plot(metrics, fmt)
    body = [f"<h1>{_e(title)}</h1>",
            *_kv([("finished", run.finished), ("commit", commit), ("fingerprint", run.fingerprint),
                  ("metrics", count_text or "none")]),
            "<h2>Topology</h2>", *topology_html(doc.get("machine_info") or {}),
            "<h2>Change against the baseline</h2>", _img(chart, fmt, "Δ % per metric"),
            f'<p class="caption">{_e(caption)}</p>']
    if trends:  # what needs a look first, before the full table
        body.append("<h2>History of flagged metrics</h2>")
        for trend in trends:
            body += [f"<h3>{_e(trend.key)}</h3>", _img(trend_plot(trend, fmt), fmt, f"trend of {trend.key}")]
    body += ["<h2>Verdicts</h2>", '<p class="caption">Click a column header to sort.</p>', *verdict_table(metrics)]
    body += sections_html(doc)
    meta = json.dumps({"finished": run.finished, "fingerprint": run.fingerprint, "metrics": len(metrics)})
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      f"<title>{_e(title)}</title>", f'<meta name="moeperf" content="{_e(meta)}">',
                      f"<style>{_STYLE}</style></head><body>", *body, f"<script>{_SCRIPT}</script>",
                      "</body></html>", ""])


def flagged_keys(metrics: Sequence[MetricRecord]) -> list[str]:
    return [m.key for m in metrics if m.status in FLAGGED]
