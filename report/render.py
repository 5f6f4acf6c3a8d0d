"""One self-contained HTML page from :class:`~eroica.report.data.JobReport` s (pure, no I/O).

Everything is inline (CSS, a few lines of JS, SVG charts), nothing is fetched:
the page opens from a mail attachment or an air-gapped laptop. The numbers
behind each chart are in the markup, so tools (and the tests) can read them:
every heat-map cell is ``<rect class="cell" data-rank data-fn data-slowdown>``,
every culprit row carries ``data-culprit="1"``, every window of the timeline
``data-start-ns``/``data-verdicts`` (``class="verdict-window"`` when a verdict
fired in it), every cell of the node x GPU grid ``<rect class="gcell"
data-rank data-node data-gpu data-max>``.

Readable from 8 to thousands of ranks: up to :data:`ALL_RANKS_UP_TO` ranks the
heat-map has one row per rank; past that the page draws a node x GPU grid
(each cell a rank's hottest function against its peers, nodes wrapped in
columns to fill the width) and the rank x function heat-map of one node, the
culprit's at first; clicking a node (or a rank of the hottest list) draws
that node's instead, from the data embedded in the page (``report.html#node=node-3``
opens on that node).

Names are data: job, node, function (and so verdict summary) text is free under
the telemetry contract, so it reaches the page only through the two escapes
here: :func:`_e` for HTML text and attribute values (``&<>"'`` as entities;
the script's ``esc`` does the same for what it draws), and
:func:`json_for_script` for the JSON data the script reads, which writes ``<``,
``>``, ``&`` and U+2028/U+2029 as ``\\u`` escapes. Inside a ``<script>`` element
the HTML parser looks for ``</script>`` and, after ``<!--``, for ``<script``
(which makes it skip the next ``</script>``): with no ``<`` in the data neither
can occur, so a function named ``<!--<script>`` cannot swallow the page's script.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import re
from collections.abc import Sequence

from .data import CounterRow, JobReport

__all__ = ["render_page", "color_of", "column_labels", "json_for_script", "ALL_RANKS_UP_TO"]

ALL_RANKS_UP_TO = 64    # one heat-map row per rank up to this many ranks; a node x GPU grid past it
PAGE_W = 1240           # the width the charts are laid out for (they shrink with the window, never grow blurry)
CHAR_W = 6.9            # px per character of 11 px text (DejaVu Sans / Segoe UI, generous)
ROW_H = 16
HEADER_MAX = 40         # longest column header, in characters (the full name is in its tooltip)

_CSS = """
:root { --fg:#1d2430; --muted:#667085; --line:#d0d5dd; --bg:#ffffff; --panel:#f8f9fb; --hot:#c0262d;
        --better:#2e7d32; --diff:#b54708; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; padding: 20px 24px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 26px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.muted { color: var(--muted); } .hot { color: var(--hot); font-weight: 600; }
.better { color: var(--better); } .different { color: var(--diff); }
.panel { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px;
         margin: 10px 0; overflow-x: auto; }
.panel svg { max-width: 100%; height: auto; display: block; }
.headline { font-size: 15px; border-left: 4px solid var(--hot); padding: 8px 12px; background: #fff4f4;
            border-radius: 4px; margin: 12px 0; }
.headline.ok { border-color: #2e7d32; background: #f1f8f1; }
table { border-collapse: collapse; width: 100%; table-layout: auto; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line); vertical-align: top;
         overflow-wrap: break-word; word-break: normal; hyphens: none; }
th { font-weight: 600; color: var(--muted); font-size: 12px; letter-spacing: .02em; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.nowrap { white-space: nowrap; }
code.fn { overflow-wrap: anywhere; font-size: 12px; }  /* a kernel name is one 100-character word */
tr.worse td { color: var(--hot); } tr.worse td.name { font-weight: 600; }
details pre { white-space: pre-wrap; font-size: 12px; background: #fff; border: 1px solid var(--line);
              padding: 8px; border-radius: 4px; max-height: 320px; overflow: auto; }
svg text { font-size: 11px; fill: #344054; } svg .axis { stroke: #98a2b3; stroke-width: 1; }
svg text.big { font-size: 12px; } svg text.hot { fill: var(--hot); font-weight: 700; }
svg .cell:hover, svg .cell.focus, svg .gcell:hover { stroke: #111; stroke-width: 1.2; }
svg .rowlabel, svg .nodelabel, svg .gcell { cursor: pointer; }
svg .rowlabel.culprit, svg .nodelabel.culprit { fill: var(--hot); font-weight: 700; }
svg .nodelabel.selected { text-decoration: underline; font-weight: 700; }
svg .culprit-frame { fill: none; stroke: var(--hot); stroke-width: 2; }
svg .gcell.culprit { stroke: var(--hot); stroke-width: 2.2; }
.legend { display: flex; flex-wrap: wrap; gap: 6px; align-items: center; font-size: 12px; color: var(--muted);
          margin: 6px 0; }
.swatch { width: 26px; height: 12px; display: inline-block; border: 1px solid var(--line); }
.bar { height: 10px; background: #98a2b3; display: inline-block; vertical-align: middle; }
.bar.culprit { background: var(--hot); }
.cost { display: grid; grid-template-columns: minmax(220px, max-content) 1fr; gap: 6px 14px; align-items: center; }
.cost .track { background: #eef0f3; border-radius: 3px; height: 18px; position: relative; }
.cost .fill { background: var(--hot); height: 18px; border-radius: 3px; }
.cost .what { font-size: 12px; color: var(--muted); grid-column: 2; margin-top: -4px; }
.grid-wrap { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
ol.top { margin: 0; padding-left: 22px; font-size: 13px; } ol.top li { cursor: pointer; margin: 2px 0; }
ol.top li.culprit { color: var(--hot); font-weight: 600; }
nav a { margin-right: 14px; } button { font: inherit; padding: 3px 10px; margin-left: 8px; }
"""

_JS = """
(function () {
  'use strict';
  function each(list, fn) { for (var i = 0; i < list.length; i++) { fn(list[i], i); } }
  function esc(s) {
    return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;')
      .replace(/'/g, '&#x27;').replace(/\\r/g, '&#13;');
  }
  function color(v) {
    if (v === null || !isFinite(v)) { return '#eceff3'; }
    var d = Math.max(-1, Math.min(1, (v - 1) / 0.5)), r, g, b;
    if (d >= 0) { r = 255; g = Math.floor(255 - 200 * d); b = Math.floor(255 - 210 * d); }
    else { r = Math.floor(255 + 170 * d); g = Math.floor(255 + 120 * d); b = 255; }
    function h(x) { return ('0' + x.toString(16)).slice(-2); }
    return '#' + h(r) + h(g) + h(b);
  }
  function wire(svg) {
    each(svg.querySelectorAll('.rowlabel'), function (label) {
      label.addEventListener('mouseenter', function () {
        each(svg.querySelectorAll('.cell[data-rank="' + label.getAttribute('data-rank') + '"]'),
             function (c) { c.classList.add('focus'); });
      });
      label.addEventListener('mouseleave', function () {
        each(svg.querySelectorAll('.cell.focus'), function (c) { c.classList.remove('focus'); });
      });
    });
  }
  // The rank x function heat-map of some ranks, the same markup as render.py's _heat_svg.
  function heatSvg(job, ranks, id) {
    var L = job.layout, nf = job.fns.length, culprits = {};
    each(job.culprits, function (r) { culprits[r] = true; });
    var width = L.left + nf * L.cw + L.right, height = L.top + ranks.length * L.ch + 10;
    var out = ['<svg class="heatmap" id="' + id + '" xmlns="http://www.w3.org/2000/svg" width="' + width +
               '" height="' + height + '" viewBox="0 0 ' + width + ' ' + height + '" data-cell-h="' + L.ch +
               '" data-top="' + L.top + '" role="img" aria-label="rank by function slowdown heat-map">'];
    each(job.fns, function (fn, j) {
      var x = L.left + j * L.cw + L.cw / 2;
      out.push('<text transform="translate(' + x.toFixed(1) + ',' + (L.top - 6) + ') rotate(-60)" data-fn="' +
               esc(fn) + '"><title>' + esc(fn) + ' (' + esc(job.kinds[j]) + ')</title>' + esc(job.labels[j]) +
               '</text>');
    });
    each(ranks, function (rank, i) {
      var row = job.rows[rank] || [], node = job.nodes[rank] || '', isC = !!culprits[rank];
      var vals = row.filter(function (v) { return v !== null; });
      var mx = vals.length ? Math.max.apply(null, vals) : null;
      out.push('<g class="row" data-rank="' + rank + '" data-max="' + (mx === null ? 0 : mx).toFixed(4) + '"' +
               (isC ? " data-culprit='1'" : '') + ' transform="translate(0,' + (L.top + i * L.ch) + ')">');
      out.push('<text class="rowlabel' + (isC ? ' culprit' : '') + '" data-rank="' + rank + '" x="' + (L.left - 6) +
               '" y="' + (L.ch * 0.75).toFixed(1) + '" text-anchor="end">' + esc('rank ' + rank +
               (node ? ' · ' + node : '') + (job.gpus[rank] !== undefined ? ' · GPU ' + job.gpus[rank] : '')) +
               '</text>');
      each(job.fns, function (fn, j) {
        var v = row[j] === undefined ? null : row[j];
        out.push('<rect class="cell" x="' + (L.left + j * L.cw) + '" y="0" width="' + (L.cw - 1) + '" height="' +
                 (L.ch - 1) + '" fill="' + color(v) + '" data-rank="' + rank + '" data-fn="' + esc(fn) +
                 '" data-slowdown="' + (v === null ? '' : v.toFixed(4)) + '"><title>rank ' + rank +
                 (node ? ' (' + esc(node) + ')' : '') + ', ' + esc(fn) + ': ' +
                 (v === null ? 'no data' : v.toFixed(3) + 'x its peers\\' median') + '</title></rect>');
      });
      if (isC) {
        out.push('<rect class="culprit-frame" x="' + (L.left - 1) + '" y="-1" width="' + (nf * L.cw + 1) +
                 '" height="' + (L.ch + 1) + '"/>');
      }
      if (mx !== null) {
        out.push('<text x="' + (L.left + nf * L.cw + 6) + '" y="' + (L.ch * 0.75).toFixed(1) + '"' +
                 (isC ? ' class="hot"' : '') + '>' + mx.toFixed(2) + 'x' + (isC ? ' ◀ culprit' : '') + '</text>');
      }
      out.push('</g>');
    });
    out.push('</svg>');
    return out.join('');
  }
  var data = JSON.parse(document.getElementById('eroica-data').textContent);
  each(document.querySelectorAll('svg.heatmap'), wire);
  each(document.querySelectorAll('[data-grid-job]'), function (wrap) {
    var idx = parseInt(wrap.getAttribute('data-grid-job'), 10), job = data[idx];
    var detail = document.getElementById('detail-' + idx), title = document.getElementById('detail-title-' + idx);
    function show(node) {
      var ranks = job.by_node[node] || [];
      detail.innerHTML = heatSvg(job, ranks, 'heat-' + idx);
      title.textContent = node + ': ' + ranks.length + ' ranks';
      each(wrap.querySelectorAll('.nodelabel'), function (t) {
        t.classList.toggle('selected', t.getAttribute('data-node') === node);
      });
      each(detail.querySelectorAll('svg.heatmap'), wire);
    }
    each(wrap.querySelectorAll('[data-node]'), function (el) {
      el.addEventListener('click', function () { show(el.getAttribute('data-node')); });
    });
    // a link to one node's detail: report.html#node=node-3 (the name percent-encoded; a malformed
    // encoding, e.g. a bare '%' typed by hand, is ignored rather than stopping the script)
    var m = /[#&]node=([^&]+)/.exec(window.location.hash), wanted = null;
    try { wanted = m ? decodeURIComponent(m[1]) : null; } catch (e) { wanted = null; }
    if (wanted !== null && Object.prototype.hasOwnProperty.call(job.by_node, wanted)) { show(wanted); }
  });
  each(document.querySelectorAll('button[data-sort-target]'), function (button) {
    button.addEventListener('click', function () {
      var svg = document.getElementById(button.getAttribute('data-sort-target'));
      if (!svg) { return; }
      var rows = Array.prototype.slice.call(svg.querySelectorAll('g.row'));
      var byHeat = button.getAttribute('data-order') !== 'heat';
      rows.sort(function (a, b) {
        return byHeat ? parseFloat(b.getAttribute('data-max')) - parseFloat(a.getAttribute('data-max'))
                      : parseInt(a.getAttribute('data-rank'), 10) - parseInt(b.getAttribute('data-rank'), 10);
      });
      var h = parseFloat(svg.getAttribute('data-cell-h'));
      var top = parseFloat(svg.getAttribute('data-top'));
      each(rows, function (row, i) { row.setAttribute('transform', 'translate(0,' + (top + i * h) + ')'); });
      button.setAttribute('data-order', byHeat ? 'heat' : 'rank');
      button.textContent = byHeat ? 'order by rank' : 'order by heat';
    });
  });
  document.body.setAttribute('data-ready', '1');
})();
"""


def _e(text: object) -> str:
    """``text`` for HTML text or a quoted attribute value: ``& < > " '`` (and CR) as character references.

    CR too because the HTML parser turns a raw CR (or CR LF) into LF: a node named ``a\\r\\nb`` would
    come back from its ``data-node`` as ``a\\nb`` and no longer find its ranks in the page's data.
    """
    return html.escape(str(text), quote=True).replace("\r", "&#13;")


# JSON text inside a <script> element: the characters the HTML tokenizer reacts to (``<`` of
# ``</script>``, ``<!--`` and ``<script``; ``>`` and ``&`` for good measure) and the two line
# separators older JavaScript parsers refuse in string literals, as JSON ``\\u`` escapes. A JSON
# encoder writes none of them outside a string, so the escaped text decodes to the same value.
_SCRIPT_JSON_ESCAPES = {ord("<"): "\\u003c", ord(">"): "\\u003e", ord("&"): "\\u0026",
                        0x2028: "\\u2028", 0x2029: "\\u2029"}


def json_for_script(doc: object) -> str:
    """``doc`` as JSON text that is safe as the content of a ``<script type="application/json">``.

    ``json.loads`` of the result (and the script's ``JSON.parse`` of the element's text) gives
    ``doc`` back; the text holds no ``<``, ``>``, ``&``, U+2028 or U+2029, so no name inside can
    close the element or put the HTML parser in a state where the element's end is missed.
    """
    text = json.dumps(doc, allow_nan=False, separators=(",", ":"))
    return text.translate(_SCRIPT_JSON_ESCAPES)


def _utc(ns: int, with_date: bool = False) -> str:
    t = _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC" if with_date else "%H:%M:%S")


def _fmt(value: float | None, unit: str) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    if unit == "B/s":
        for div, name in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
            if abs(value) >= div:
                return f"{value / div:,.2f} {name}"
        return f"{value:,.0f} B/s"
    if unit == "share":
        return f"{value * 100:.0f}%"
    if unit == "ratio":
        return f"{value:.3f}"
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}{(' ' + unit) if unit else ''}"
    return f"{value:,.2f}{(' ' + unit) if unit else ''}"


def _ms(ns: float | None) -> str:
    if ns is None or not math.isfinite(ns):
        return "–"
    ms = ns / 1e6
    return f"{ms:,.0f} ms" if ms >= 10 else f"{ms:.2f} ms"


def color_of(value: float | None) -> str:
    """White at 1.0 (like its peers), red when slower (full at 1.5x), blue when faster; grey: no data."""
    if value is None or not math.isfinite(value):
        return "#eceff3"
    d = max(-1.0, min(1.0, (value - 1.0) / 0.5))
    if d >= 0:
        r, g, b = 255, int(255 - 200 * d), int(255 - 210 * d)
    else:
        r, g, b = int(255 + 170 * d), int(255 + 120 * d), 255
    return f"#{r:02x}{g:02x}{b:02x}"


def _common(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def column_labels(names: Sequence[str], limit: int = HEADER_MAX) -> list[str]:
    """Column headers of at most ``limit`` characters, all distinct (the full name is in each tooltip).

    A long name keeps its head; when it shares that head with another name (three GEMM kernels
    that differ only in their tile size), the label keeps the head, the part where it starts to
    differ and the tail: ``sm90_xmma_ge…tilesize128x256…cublas``.
    """
    long = [n for n in names if len(n) > limit]
    out = []
    for n in names:
        if len(n) <= limit:
            out.append(n)
            continue
        p = max((_common(n, m) for m in long if m != n), default=0)
        if p < limit - 4:
            out.append(n[:limit - 1] + "…")
            continue
        head, tail = 10, 8
        mid = limit - head - tail - 2
        start = max(head, min(p - 3, len(n) - tail - mid))
        out.append(f"{n[:head]}…{n[start:start + mid]}…{n[-tail:]}")
    seen: dict[str, int] = {}
    for label in out:
        seen[label] = seen.get(label, 0) + 1
    return [f"{lab} [{i + 1}]" if seen[lab] > 1 else lab for i, lab in enumerate(out)]


def _natural(text: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


class _Layout:
    """Sizes of the rank x function heat-map, shared by the page and its script (so both draw alike)."""

    def __init__(self, rep: JobReport) -> None:
        labels = column_labels(rep.fns)
        longest_row = max((len(_row_label(rep, r)) for r in rep.ranks), default=8)
        self.labels = labels
        self.left = int(12 + CHAR_W * longest_row)
        self.right = 110  # "1.41x ◀ culprit"
        self.top = int(18 + 0.87 * CHAR_W * max((len(x) for x in labels), default=4))
        self.cw = int(max(14, min(64, (PAGE_W - self.left - self.right) // max(1, len(rep.fns)))))
        self.ch = ROW_H

    def as_dict(self) -> dict[str, int]:
        return {"left": self.left, "right": self.right, "top": self.top, "cw": self.cw, "ch": self.ch}


def _row_label(rep: JobReport, rank: int) -> str:
    node = rep.nodes.get(rank, "")
    gpu = rep.gpus.get(rank)
    return f"rank {rank}" + (f" · {node}" if node else "") + (f" · GPU {gpu}" if gpu is not None else "")


def _heat_svg(rep: JobReport, lay: _Layout, ranks: Sequence[int], svg_id: str) -> str:
    """The rank x function heat-map of ``ranks`` (the script's ``heatSvg`` draws the same)."""
    n_f = len(rep.fns)
    index = {r: i for i, r in enumerate(rep.ranks)}
    culprits = set(rep.culprit_ranks)
    width, height = lay.left + n_f * lay.cw + lay.right, lay.top + len(ranks) * lay.ch + 10
    out = [f'<svg class="heatmap" id="{svg_id}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" data-cell-h="{lay.ch}" data-top="{lay.top}" '
           f'role="img" aria-label="rank by function slowdown heat-map">']
    for j, fn in enumerate(rep.fns):
        x = lay.left + j * lay.cw + lay.cw / 2
        out.append(f'<text transform="translate({x:.1f},{lay.top - 6}) rotate(-60)" data-fn="{_e(fn)}">'
                   f'<title>{_e(fn)} ({_e(rep.fn_kinds[j])})</title>{_e(lay.labels[j])}</text>')
    for i, rank in enumerate(ranks):
        row = rep.heat[index[rank]] if rank in index else [None] * n_f
        vals = [v for v in row if v is not None]
        rmax = max(vals) if vals else None
        is_culprit = rank in culprits
        node = rep.nodes.get(rank, "")
        mark = ' data-culprit="1"' if is_culprit else ""
        out.append(f'<g class="row" data-rank="{rank}" data-max="{0 if rmax is None else rmax:.4f}"{mark} '
                   f'transform="translate(0,{lay.top + i * lay.ch})">')
        out.append(f'<text class="rowlabel{" culprit" if is_culprit else ""}" data-rank="{rank}" x="{lay.left - 6}" '
                   f'y="{lay.ch * 0.75:.1f}" text-anchor="end">{_e(_row_label(rep, rank))}</text>')
        for j, fn in enumerate(rep.fns):
            v = row[j]
            shown = "no data" if v is None else f"{v:.3f}x its peers' median"
            out.append(f'<rect class="cell" x="{lay.left + j * lay.cw}" y="0" width="{lay.cw - 1}" '
                       f'height="{lay.ch - 1}" fill="{color_of(v)}" data-rank="{rank}" data-fn="{_e(fn)}" '
                       f'data-slowdown="{"" if v is None else f"{v:.4f}"}"><title>rank {rank}'
                       f'{" (" + _e(node) + ")" if node else ""}, {_e(fn)}: {_e(shown)}</title></rect>')
        if is_culprit:
            out.append(f'<rect class="culprit-frame" x="{lay.left - 1}" y="-1" width="{n_f * lay.cw + 1}" '
                       f'height="{lay.ch + 1}"/>')
        if rmax is not None:
            out.append(f'<text x="{lay.left + n_f * lay.cw + 6}" y="{lay.ch * 0.75:.1f}"'
                       f'{" class=" + chr(34) + "hot" + chr(34) if is_culprit else ""}>{rmax:.2f}x'
                       f'{" ◀ culprit" if is_culprit else ""}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


def _legend(extra: str = "") -> str:
    sw = "".join(f'<span class="swatch" style="background:{color_of(v)}"></span>{v:.2f}x '
                 for v in (0.7, 0.9, 1.0, 1.1, 1.25, 1.5))
    return (f'<div class="legend">per-step cost of the function on the rank / median of its peers: {sw}'
            f'<span class="swatch" style="background:{color_of(None)}"></span>no data{extra}</div>')


def _focus_node(rep: JobReport, row_max: dict[int, float]) -> str:
    for r in rep.culprit_ranks:
        if rep.nodes.get(r):
            return rep.nodes[r]
    if rep.culprit_nodes:
        return rep.culprit_nodes[0]
    finite = {r: v for r, v in row_max.items() if math.isfinite(v)}
    top = max(finite, key=lambda r: (finite[r], -r)) if finite else (rep.ranks[0] if rep.ranks else None)
    return rep.nodes.get(top, "") if top is not None else ""


def _grid_svg(rep: JobReport, idx: int, row_max: dict[int, float], selected: str) -> str:
    """Nodes x GPUs, each cell a rank's hottest function against its peers; nodes wrapped in columns."""
    by_node: dict[str, dict[int, int]] = {}
    for r in rep.ranks:
        by_node.setdefault(rep.nodes.get(r, "?"), {})[rep.gpus.get(r, 0)] = r
    nodes = sorted(by_node, key=_natural)
    n_gpu = max((g for m in by_node.values() for g in m), default=0) + 1
    cell_w, cell_h, gap = (18 if n_gpu <= 16 else 10), 16, 26
    label_w = int(10 + CHAR_W * max(len(n) for n in nodes))
    block_w = label_w + n_gpu * cell_w + gap
    fit = max(1, int((PAGE_W - 280) // block_w))          # room is left for the list of hottest ranks
    per_block = max(1, math.ceil(len(nodes) / fit))
    blocks = math.ceil(len(nodes) / per_block)
    top = 22
    width, height = blocks * block_w, top + per_block * cell_h + 6
    culprits = set(rep.culprit_ranks)
    culprit_nodes = set(rep.culprit_nodes)
    out = [f'<svg class="grid" id="grid-{idx}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="node by GPU grid of each rank\'s hottest '
           f'function against its peers">']
    for b in range(blocks):
        x0 = b * block_w
        for g in range(n_gpu):
            if n_gpu <= 16 or g % 4 == 0:
                out.append(f'<text x="{x0 + label_w + g * cell_w + cell_w / 2:.1f}" y="{top - 8}" '
                           f'text-anchor="middle">{g}</text>')
        for k, node in enumerate(nodes[b * per_block:(b + 1) * per_block]):
            y = top + k * cell_h
            cls = ("nodelabel" + (" culprit" if node in culprit_nodes else "")
                   + (" selected" if node == selected else ""))
            out.append(f'<text class="{cls}" data-node="{_e(node)}" x="{x0 + label_w - 6}" y="{y + cell_h * 0.75:.1f}" '
                       f'text-anchor="end">{_e(node)}</text>')
            for g in range(n_gpu):
                r = by_node[node].get(g)
                if r is None:
                    continue
                v = row_max.get(r, float("nan"))
                v = v if math.isfinite(v) else None
                shown = "no data" if v is None else f"hottest function {v:.3f}x its peers' median"
                out.append(f'<rect class="gcell{" culprit" if r in culprits else ""}" x="{x0 + label_w + g * cell_w}" '
                           f'y="{y}" width="{cell_w - 1}" height="{cell_h - 1}" fill="{color_of(v)}" '
                           f'data-rank="{r}" data-node="{_e(node)}" data-gpu="{g}" '
                           f'data-max="{"" if v is None else f"{v:.4f}"}"><title>rank {r} ({_e(node)}, GPU {g}): '
                           f'{_e(shown)}</title></rect>')
    out.append('<text x="0" y="10">GPU →</text>')
    out.append("</svg>")
    return "".join(out)


_CULPRIT_CLASS = ' class="culprit"'


def _hottest(rep: JobReport, row_max: dict[int, float], n: int = 10) -> str:
    finite = {r: v for r, v in row_max.items() if math.isfinite(v)}
    top = sorted(finite, key=lambda r: (-finite[r], r))[:n]
    culprits = set(rep.culprit_ranks)
    items = "".join(
        f'<li data-node="{_e(rep.nodes.get(r, ""))}"{_CULPRIT_CLASS if r in culprits else ""}>'
        f'{_e(_row_label(rep, r))}: {finite[r]:.2f}x{" ◀ culprit" if r in culprits else ""}</li>' for r in top)
    return (f'<div><div class="muted">hottest ranks (click: that node\'s detail)</div>'
            f'<ol class="top">{items}</ol></div>')


def _heatmap(rep: JobReport, idx: int) -> str:
    if not rep.ranks or not rep.fns:
        return '<p class="muted">No window summaries: nothing to draw.</p>'
    lay = _Layout(rep)
    if len(rep.ranks) <= ALL_RANKS_UP_TO:
        button = (f'<button type="button" data-sort-target="heat-{idx}" data-order="rank">order by heat</button>')
        return _legend(button) + _heat_svg(rep, lay, rep.ranks, f"heat-{idx}")
    row_max = rep.row_max()
    node = _focus_node(rep, row_max)
    ranks = sorted((r for r in rep.ranks if rep.nodes.get(r, "?") == node), key=lambda r: (rep.gpus.get(r, 0), r))
    n_nodes = len({rep.nodes.get(r, "?") for r in rep.ranks})
    return (_legend()
            + f'<div class="muted">{len(rep.ranks):,} ranks on {n_nodes:,} nodes: each cell of the grid is one '
              f'rank, its hottest function against its peers (framed: the culprit). Click a node for its ranks '
              f'x functions below.</div>'
            + f'<div class="grid-wrap" data-grid-job="{idx}">{_grid_svg(rep, idx, row_max, node)}'
              f'{_hottest(rep, row_max)}</div>'
            + f'<h3 id="detail-title-{idx}">{_e(node)}: {len(ranks)} ranks</h3>'
            + f'<div id="detail-{idx}">{_heat_svg(rep, lay, ranks, f"heat-{idx}")}</div>')


def _timeline_sentence(rep: JobReport) -> str:
    rows = rep.windows
    fired = sum(1 for r in rows if r.verdicts)
    parts = []
    cx = [r.culprit_x for r in rows if r.culprit_x is not None]
    ox = [r.other_x for r in rows if r.other_x is not None]
    if rep.culprit_ranks and cx:
        hot = sum(1 for x in cx if x >= 1.1)
        parts.append(f"rank {rep.culprit_ranks[0]}'s hottest function ran at {sorted(cx)[len(cx) // 2]:.2f}x its "
                     f"peers (median over {len(cx)} window(s); 1.1x or more in {hot})")
        if ox:
            parts.append(f"no other rank above {max(ox):.2f}x")
    elif ox:
        parts.append(f"the most different rank reached {max(ox):.2f}x its peers")
    steps = [r.step_ns for r in rows if r.step_ns is not None]
    if steps:
        parts.append(f"median step {_ms(sorted(steps)[len(steps) // 2])}")
    parts.append(f"verdicts in {fired} of {len(rows)} window(s)")
    return "; ".join(parts) + "."


def _timeline(rep: JobReport) -> str:
    rows = rep.windows
    if not rows:
        return '<p class="muted">No window.</p>'
    series = (("median_x", "#98a2b3", "median rank"), ("other_x", "#e36209", "most different other rank"),
              ("culprit_x", "#c0262d", "culprit"))
    present = [s for s in series if any(getattr(r, s[0]) is not None for r in rows)]
    vals = [getattr(r, a) for r in rows for a, _c, _n in present if getattr(r, a) is not None]
    lo = min([1.0] + vals)
    hi = max([1.05] + vals)
    lo, hi = max(0.0, lo - (hi - lo) * 0.08), hi + (hi - lo) * 0.12
    width, left, right, top = PAGE_W, 64, 16, 24
    bars = len(rows) <= 12
    bottom = 62 if bars else 40
    height = 280

    def y(v: float) -> float:
        return top + (1 - (v - lo) / (hi - lo)) * (height - top - bottom)

    plot_w = width - left - right
    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="timeline">']
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        out.append(f'<line class="axis" x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke-dasharray="2,3" opacity="0.5"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}x</text>')
    out.append(f'<line class="axis" x1="{left}" x2="{width - right}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}"/>')
    out.append(f'<text x="{width - right}" y="{y(1.0) - 4:.1f}" text-anchor="end" class="muted">1.00x: like its '
               f'peers</text>')
    if bars:
        slot = plot_w / len(rows)
        bw = min(46.0, slot / (len(present) + 1.5))
        for i, r in enumerate(rows):
            x0 = left + i * slot
            cls = "verdict-window" if r.verdicts else "window"
            out.append(f'<rect class="{cls}" x="{x0 + 2:.1f}" y="{top}" width="{slot - 4:.1f}" '
                       f'height="{height - top - bottom}" fill="{"#fde2e1" if r.verdicts else "none"}" '
                       f'opacity="0.55" data-start-ns="{r.start_ns}" data-verdicts="{r.verdicts}">'
                       f'<title>{_utc(r.start_ns)}–{_utc(r.end_ns)}: {r.verdicts} verdict(s)</title></rect>')
            gx = x0 + (slot - bw * len(present)) / 2
            for k, (attr, colour, name) in enumerate(present):
                v = getattr(r, attr)
                if v is None:
                    continue
                bx = gx + k * bw
                y1, y2 = sorted((y(1.0), y(v)))
                out.append(f'<rect x="{bx + 2:.1f}" y="{y1:.1f}" width="{bw - 4:.1f}" height="{max(1.0, y2 - y1):.1f}" '
                           f'fill="{colour}" data-series="{attr}" data-value="{v:.4f}"><title>{_e(name)}'
                           f'{f" (rank {r.other_rank})" if attr == "other_x" and r.other_rank is not None else ""}: '
                           f'{v:.3f}x</title></rect>')
                out.append(f'<text x="{bx + bw / 2:.1f}" y="{min(y(v), y(1.0)) - 4:.1f}" text-anchor="middle"'
                           f'{" class=" + chr(34) + "hot" + chr(34) if attr == "culprit_x" else ""}>{v:.2f}x</text>')
            cx = x0 + slot / 2
            base = height - bottom
            out.append(f'<text x="{cx:.1f}" y="{base + 16}" text-anchor="middle">{_utc(r.start_ns)}–'
                       f'{_utc(r.end_ns)}</text>')
            detail = (f"step {_ms(r.step_ns)} · " if r.step_ns is not None else "") + (
                f"{r.verdicts} verdict(s)" if r.verdicts else "no verdict")
            out.append(f'<text x="{cx:.1f}" y="{base + 32}" text-anchor="middle"'
                       f'{" class=" + chr(34) + "hot" + chr(34) if r.verdicts else ""}>{_e(detail)}</text>')
    else:
        t0, t1 = rows[0].start_ns, rows[-1].end_ns
        span = max(1, t1 - t0)

        def x(ns: int) -> float:
            return left + (ns - t0) / span * plot_w

        for r in rows:
            cls = "verdict-window" if r.verdicts else "window"
            out.append(f'<rect class="{cls}" x="{x(r.start_ns):.1f}" y="{top}" '
                       f'width="{max(1.0, x(r.end_ns) - x(r.start_ns)):.1f}" height="{height - top - bottom}" '
                       f'fill="{"#fde2e1" if r.verdicts else "none"}" data-start-ns="{r.start_ns}" '
                       f'data-verdicts="{r.verdicts}"><title>{_utc(r.start_ns)}–{_utc(r.end_ns)}: '
                       f'{r.verdicts} verdict(s){f", step {_ms(r.step_ns)}" if r.step_ns is not None else ""}'
                       f'</title></rect>')
        ticks = max(1, len(rows) // 10)
        for r in rows[::ticks]:
            out.append(f'<text x="{x(r.start_ns):.1f}" y="{height - bottom + 16}" text-anchor="middle">'
                       f'{_utc(r.start_ns)}</text>')
        for attr, colour, _name in present:
            pts = [(x((r.start_ns + r.end_ns) // 2), y(getattr(r, attr))) for r in rows if getattr(r, attr) is not None]
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2" '
                       f'data-series="{attr}"/>')
            for px, py in pts:
                out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{colour}"/>')
    out.append("</svg>")
    legend = " ".join(f'<span class="swatch" style="background:{c}"></span>{n}' for _a, c, n in present)
    return (f'<div class="legend">each rank\'s hottest function against its peers, per window: {legend} '
            f'<span class="swatch" style="background:#fde2e1"></span>window with a verdict</div>'
            f'<p>{_e(_timeline_sentence(rep))}</p>' + "".join(out))


def _costs(rep: JobReport) -> str:
    if not rep.costs:
        return ""
    s = next((c.job_slowdown for c in rep.costs if c.job_slowdown is not None), None)
    head = ""
    if s is not None and s > 1.0:
        head = (f'<p>The job runs <b>{s:.2f}x</b> slower than it would at its ranks\' typical speed: it loses '
                f'<b>{1 - 1 / s:.0%}</b> of its time. Each bar: the culprit\'s share of that lost time (what the '
                f'job would lose with only this culprit slow).</p>')
    else:
        head = '<p>Each bar: the share of the job\'s time the culprit alone costs.</p>'
    rows = []
    for c in rep.costs:
        share = c.share_of_lost if c.share_of_lost is not None else c.lost_share
        pct = 0.0 if share is None else max(0.0, min(1.0, share))
        what = []
        if c.cost is not None:
            what.append(f"alone it makes the job {c.cost:.2f}x slower ({c.lost_share or 0:.0%} of its time)")
        if c.share_of_lost is not None:
            what.append(f"{c.share_of_lost:.0%} of the lost time")
        if c.gpu_hours_per_hour is not None:
            what.append(f"{c.gpu_hours_per_hour:,.1f} GPU-hours lost per hour")
        what.append(f"{c.windows} window(s)")
        rows.append(f'<div class="name" data-cost-culprit="{_e(c.label)}"><b>{_e(c.label)}</b> '
                    f'<span class="muted">[{_e(c.component)}]</span></div>'
                    f'<div class="track" title="{pct:.0%}"><div class="fill" style="width:{pct * 100:.1f}%" '
                    f'data-share="{pct:.4f}"></div></div><div class="what">{_e("; ".join(what))}</div>')
    return (f'<h2>What it costs</h2><div class="panel">{head}<div class="cost">{"".join(rows)}</div></div>')


def _verdicts(rep: JobReport) -> str:
    if not rep.verdicts:
        return '<p class="muted">No verdict: no rank, node or link behaves abnormally.</p>'
    out = ['<table class="verdicts"><thead><tr><th>window</th><th>kind</th><th>component</th><th>culprit</th>'
           '<th>slowdown</th><th>confidence</th><th>summary and evidence</th></tr></thead><tbody>']
    for v in rep.verdicts:
        culprit = (f"rank {v.rank} ({v.node})" if v.scope == "rank" else f"node {v.node}" if v.scope == "node"
                   else "job")
        evidence = json.dumps(v.evidence, indent=1, sort_keys=True, default=str, allow_nan=True)
        victims = f"; victims: {len(v.victims)} ranks" if v.victims else ""
        out.append(
            f'<tr data-verdict-id="{_e(v.verdict_id)}"><td class="num">{_utc(v.window_start_ns)}–'
            f'{_utc(v.window_end_ns)}</td><td>{_e(v.kind)}</td><td>{_e(v.component)}</td>'
            f'<td class="nowrap">{_e(culprit)}</td>'
            f'<td class="num">{v.slowdown:.2f}x</td><td class="num">{v.confidence:.2f}</td>'
            f'<td>{_e(v.summary)}<details><summary class="muted">evidence · fn '
            f'<code class="fn">{_e(v.fn or "–")}</code> · '
            f'{len(v.peers)} peers{_e(victims)} · incident {_e(v.incident_id[:12])}</summary>'
            f'<pre>{_e(evidence)}</pre></details></td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def _counters(rep: JobReport) -> str:
    if not rep.counters:
        return ('<p class="muted">No counters for a single culprit'
                + (f" ({_e(rep.subject)})" if rep.subject else "") + ".</p>")
    out = [f'<p class="muted">{_e(rep.subject)} against the median of the others; from {_e(rep.counters_basis)}. '
           'Red: different from its peers in the direction that is bad for that counter (a lower clock, more '
           'retransmits); amber: different, in a counter with no bad direction.</p>',
           ]
    head = ('<table class="counters"><thead><tr><th>group</th><th>counter</th><th>culprit</th><th>peer median</th>'
            '<th>culprit / peers</th><th>against its peers</th><th></th></tr></thead><tbody>')
    differ = [c for c in rep.counters if c.verdict]
    alike = [c for c in rep.counters if not c.verdict]
    if len(alike) <= 8:  # few: one table in the collector's order
        differ, alike = list(rep.counters), []
    out.append(head + "".join(_counter_row(c) for c in differ) + "</tbody></table>")
    if alike:
        out.append(f'<details><summary class="muted">{len(alike)} more counters, like its peers (within 10%)'
                   f'</summary>{head}{"".join(_counter_row(c) for c in alike)}</tbody></table></details>')
    return "".join(out)


def _counter_row(c: CounterRow) -> str:
    ratio = c.ratio
    verdict = c.verdict
    scale = max(abs(c.culprit or 0.0), abs(c.peer_median or 0.0)) or 1.0
    bars = (f'<span class="bar{" culprit" if verdict == "worse" else ""}" '
            f'style="width:{120 * abs(c.culprit or 0) / scale:.0f}px"></span><br>'
            f'<span class="bar" style="width:{120 * abs(c.peer_median or 0) / scale:.0f}px"></span>')
    name = c.name + (f" ({c.subject})" if c.subject else "")
    said = {"worse": f"{c.direction}: worse", "better": f"{c.direction}: better",
            "different": f"{c.direction}", "": "like its peers"}[verdict]
    cls = {"worse": "worse hot", "better": "better", "different": "different"}.get(verdict, "")
    row_cls = f' class="{cls}"' if cls else ""
    return (f'<tr data-counter="{_e(c.name)}" data-verdict="{verdict}"{row_cls}><td>{_e(c.group)}</td>'
            f'<td class="name">{_e(name)}</td><td class="num">{_fmt(c.culprit, c.unit)}</td>'
            f'<td class="num">{_fmt(c.peer_median, c.unit)}</td>'
            f'<td class="num">{"–" if ratio is None else f"{ratio:.2f}"}</td>'
            f'<td class="nowrap {verdict}">{_e(said)}</td><td>{bars}</td></tr>')


def _section(rep: JobReport, idx: int) -> str:
    from .data import main_verdict

    main = main_verdict(rep.verdicts)
    if main is not None:
        head = (f'<div class="headline">{_e(main.summary)} <span class="muted">(confidence '
                f'{main.confidence:.2f})</span></div>')
    else:
        head = '<div class="headline ok">No verdict: no rank, node or link behaves abnormally.</div>'
    span = ""
    if rep.windows:
        span = (f"{_utc(rep.windows[0].start_ns, True)} – {_utc(rep.windows[-1].end_ns, True)}, "
                f"{len(rep.windows)} window(s) of {rep.window_ns / 1e9:g} s, ")
    notes = "".join(f'<li>{_e(n)}</li>' for n in rep.notes)
    return (
        f'<section class="job" id="job-{idx}" data-job="{_e(rep.job)}">'
        f'<h1>Job {_e(rep.job)}</h1><div class="muted">{_e(span)}{len(rep.ranks):,} ranks; from {_e(rep.source)}</div>'
        f'{head}{_costs(rep)}'
        f'<h2>Which rank is different: slowdown against peers</h2><div class="muted">Each cell: the rank\'s per-step '
        f'cost of a function over the median of the ranks of the same role ({_e(rep.heat_basis)}); collectives left '
        f'out, their time is waiting and marks the victims.</div><div class="panel">{_heatmap(rep, idx)}</div>'
        f'<h2>When: timeline</h2><div class="panel">{_timeline(rep)}</div>'
        f'<h2>Verdicts</h2><div class="panel">{_verdicts(rep)}</div>'
        f'<h2>The culprit\'s counters</h2><div class="panel">{_counters(rep)}</div>'
        + (f'<h3>Notes</h3><ul class="muted">{notes}</ul>' if notes else "")
        + "</section>")


def _round(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 4)


def _data_json(reports: Sequence[JobReport]) -> str:
    doc = []
    for r in reports:
        entry: dict = {"job": r.job, "ranks": r.ranks, "fns": r.fns, "culprit_ranks": r.culprit_ranks,
                       "row_max": {str(k): (v if math.isfinite(v) else None) for k, v in r.row_max().items()},
                       "verdicts": len(r.verdicts)}
        if len(r.ranks) > ALL_RANKS_UP_TO and r.fns:  # what the script draws a node's detail from
            lay = _Layout(r)
            by_node: dict[str, list[int]] = {}
            for rank in sorted(r.ranks, key=lambda k: (r.gpus.get(k, 0), k)):
                by_node.setdefault(r.nodes.get(rank, "?"), []).append(rank)
            entry.update({"layout": lay.as_dict(), "labels": lay.labels, "kinds": r.fn_kinds,
                          "culprits": r.culprit_ranks, "nodes": {str(k): v for k, v in r.nodes.items()},
                          "gpus": {str(k): v for k, v in r.gpus.items()}, "by_node": by_node,
                          "rows": {str(rank): [_round(v) for v in row] for rank, row in zip(r.ranks, r.heat)}})
        doc.append(entry)
    return json_for_script(doc)


def render_page(reports: Sequence[JobReport], generated_at_ns: int, title: str = "Eroica report") -> str:
    """The whole page (UTF-8 text)."""
    nav = ""
    if len(reports) > 1:
        nav = "<nav>" + "".join(f'<a href="#job-{i}">{_e(r.job)}</a>' for i, r in enumerate(reports)) + "</nav>"
    body = "".join(_section(r, i) for i, r in enumerate(reports)) or '<p class="muted">No job in the input.</p>'
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f'<div class="muted">Eroica report · generated {_utc(generated_at_ns, True)}</div>{nav}{body}'
        f'<script type="application/json" id="eroica-data">{_data_json(reports)}</script>'
        f"<script>{_JS}</script></body></html>\n")
