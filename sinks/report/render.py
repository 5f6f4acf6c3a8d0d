"""One self-contained HTML page from :class:`~eroica.sinks.report.data.JobReport` s (pure, no I/O).

Everything is inline (CSS, a few lines of JS, SVG charts), nothing is fetched:
the page opens from a mail attachment or an air-gapped laptop. The numbers
behind each chart are in the markup, so tools (and the tests) can read them:
every heat-map cell is ``<rect class="cell" data-rank data-fn data-slowdown>``,
every culprit row carries ``data-culprit="1"``, every window band of the
timeline ``data-start-ns``/``data-verdicts``.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from collections.abc import Sequence

from .data import CounterRow, JobReport

__all__ = ["render_page", "color_of"]

_CSS = """
:root { --fg:#1d2430; --muted:#667085; --line:#d0d5dd; --bg:#ffffff; --panel:#f8f9fb; --hot:#c0262d; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; padding: 24px 32px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.muted { color: var(--muted); } .hot { color: var(--hot); font-weight: 600; }
.panel { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px;
         margin: 10px 0; overflow-x: auto; }
.headline { font-size: 15px; border-left: 4px solid var(--hot); padding: 8px 12px; background: #fff4f4;
            border-radius: 4px; margin: 12px 0; }
.headline.ok { border-color: #2e7d32; background: #f1f8f1; }
table { border-collapse: collapse; width: 100%; table-layout: auto; } th, td { text-align: left; padding: 5px 8px;
        border-bottom: 1px solid var(--line); vertical-align: top; overflow-wrap: anywhere; }
th { font-weight: 600; color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
details pre { white-space: pre-wrap; font-size: 12px; background: #fff; border: 1px solid var(--line);
              padding: 8px; border-radius: 4px; max-height: 320px; overflow: auto; }
svg text { font-size: 11px; fill: #344054; } svg .axis { stroke: #98a2b3; stroke-width: 1; }
svg .cell:hover, svg .cell.focus { stroke: #111; stroke-width: 1.2; }
svg .rowlabel { cursor: pointer; } svg .rowlabel.culprit { fill: var(--hot); font-weight: 700; }
svg .culprit-frame { fill: none; stroke: var(--hot); stroke-width: 2; }
.legend { display: flex; gap: 6px; align-items: center; font-size: 12px; color: var(--muted); margin: 6px 0; }
.swatch { width: 26px; height: 12px; display: inline-block; border: 1px solid var(--line); }
.bar { height: 10px; background: #98a2b3; display: inline-block; vertical-align: middle; }
.bar.culprit { background: var(--hot); }
nav a { margin-right: 14px; } button { font: inherit; padding: 3px 10px; margin-left: 8px; }
"""

_JS = """
(function () {
  'use strict';
  function each(list, fn) { for (var i = 0; i < list.length; i++) { fn(list[i], i); } }
  each(document.querySelectorAll('svg.heatmap'), function (svg) {
    var labels = svg.querySelectorAll('.rowlabel');
    each(labels, function (label) {
      label.addEventListener('mouseenter', function () {
        each(svg.querySelectorAll('.cell[data-rank="' + label.getAttribute('data-rank') + '"]'),
             function (c) { c.classList.add('focus'); });
      });
      label.addEventListener('mouseleave', function () {
        each(svg.querySelectorAll('.cell.focus'), function (c) { c.classList.remove('focus'); });
      });
    });
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
    return html.escape(str(text), quote=True)


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


def _heatmap(rep: JobReport, idx: int) -> str:
    if not rep.ranks or not rep.fns:
        return '<p class="muted">No window summaries: nothing to draw.</p>'
    n_r, n_f = len(rep.ranks), len(rep.fns)
    cw = max(14, min(34, 900 // n_f))
    ch = max(5, min(16, 1100 // n_r))
    left, top = 150, 190
    width, height = left + n_f * cw + 90, top + n_r * ch + 10
    culprits = set(rep.culprit_ranks)
    out = [f'<svg class="heatmap" id="heat-{idx}" xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" data-cell-h="{ch}" data-top="{top}" '
           f'role="img" aria-label="rank by function slowdown heat-map">']
    for j, fn in enumerate(rep.fns):
        x = left + j * cw + cw / 2
        label = fn if len(fn) <= 34 else fn[:32] + "…"
        out.append(f'<text transform="translate({x:.1f},{top - 6}) rotate(-60)" data-fn="{_e(fn)}">'
                   f'<title>{_e(fn)} ({_e(rep.fn_kinds[j])})</title>{_e(label)}</text>')
    row_max = rep.row_max()
    for i, rank in enumerate(rep.ranks):
        is_culprit = rank in culprits
        rmax = row_max.get(rank, float("nan"))
        node = rep.nodes.get(rank, "")
        mark = ' data-culprit="1"' if is_culprit else ""
        hot = ' class="hot"' if is_culprit else ""
        out.append(f'<g class="row" data-rank="{rank}" data-max="{rmax if math.isfinite(rmax) else 0:.4f}"'
                   f'{mark} transform="translate(0,{top + i * ch})">')
        if ch >= 8 or is_culprit:
            text = f"rank {rank}" + (f" · {node}" if node and ch >= 10 else "") + (" ◀ culprit" if is_culprit else "")
            out.append(f'<text class="rowlabel{" culprit" if is_culprit else ""}" data-rank="{rank}" x="{left - 6}" '
                       f'y="{ch * 0.8:.1f}" text-anchor="end" style="font-size:{min(11, max(7, ch - 2))}px">'
                       f'{_e(text)}</text>')
        for j, fn in enumerate(rep.fns):
            v = rep.heat[i][j]
            shown = "no data" if v is None else f"{v:.3f}x its peers' median"
            out.append(f'<rect class="cell" x="{left + j * cw}" y="0" width="{cw - 1}" height="{max(1, ch - 1)}" '
                       f'fill="{color_of(v)}" data-rank="{rank}" data-fn="{_e(fn)}" '
                       f'data-slowdown="{"" if v is None else f"{v:.4f}"}"><title>rank {rank}'
                       f'{" (" + _e(node) + ")" if node else ""}, {_e(fn)}: {shown}</title></rect>')
        if is_culprit:
            out.append(f'<rect class="culprit-frame" x="{left - 1}" y="-1" width="{n_f * cw + 1}" height="{ch + 1}"/>')
        if math.isfinite(rmax):
            out.append(f'<text x="{left + n_f * cw + 6}" y="{ch * 0.8:.1f}" style="font-size:{min(11, max(7, ch - 2))}px"'
                       f'{hot}>{rmax:.2f}x</text>')
        out.append("</g>")
    out.append("</svg>")
    legend = "".join(f'<span class="swatch" style="background:{color_of(v)}"></span>{v:.2f}x '
                     for v in (0.7, 0.9, 1.0, 1.1, 1.25, 1.5))
    return (f'<div class="legend">per-step cost of the function on the rank / median of its peers: {legend}'
            f'<span class="swatch" style="background:{color_of(None)}"></span>no data'
            f'<button type="button" data-sort-target="heat-{idx}" data-order="rank">order by heat</button></div>'
            + "".join(out))


def _timeline(rep: JobReport) -> str:
    rows = rep.windows
    if not rows:
        return '<p class="muted">No window.</p>'
    step = rep.timeline == "step_time"
    scale = 1e-6 if step else 1.0
    vals = [x * scale for r in rows for x in (r.value, r.high, r.culprit) if x is not None and math.isfinite(x)]
    lo, hi = (min(vals), max(vals)) if vals else (0.0, 1.0)
    if hi - lo < 0.02 * max(abs(hi), 1e-9):  # flat: show a band of +-5% around it
        lo, hi = lo * 0.95, hi * 1.05 if hi > 0 else lo + 1.0
    pad = (hi - lo) * 0.12
    lo, hi = max(0.0, lo - pad), hi + pad
    width, height, left, right, top, bottom = 1100, 260, 70, 20, 16, 46
    t0, t1 = rows[0].start_ns, rows[-1].end_ns
    span = max(1, t1 - t0)

    def x(ns: int) -> float:
        return left + (ns - t0) / span * (width - left - right)

    def y(v: float) -> float:
        return top + (1 - (v - lo) / (hi - lo)) * (height - top - bottom)

    out = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="timeline">']
    for r in rows:
        if r.verdicts:
            out.append(f'<rect class="verdict-window" x="{x(r.start_ns):.1f}" y="{top}" '
                       f'width="{max(1.0, x(r.end_ns) - x(r.start_ns)):.1f}" height="{height - top - bottom}" '
                       f'fill="#fde2e1" data-start-ns="{r.start_ns}" data-verdicts="{r.verdicts}">'
                       f'<title>{_utc(r.start_ns)}–{_utc(r.end_ns)}: {r.verdicts} verdict(s)</title></rect>')
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        out.append(f'<line class="axis" x1="{left}" x2="{width - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke-dasharray="2,3" opacity="0.5"/>')
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">'
                   f'{v:,.0f} ms</text>' if step else
                   f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}x</text>')
    ticks = max(1, len(rows) // 8)
    for r in rows[::ticks]:
        out.append(f'<text x="{x(r.start_ns):.1f}" y="{height - bottom + 16}" text-anchor="middle">'
                   f'{_utc(r.start_ns)}</text>')
    out.append(f'<line class="axis" x1="{left}" x2="{width - right}" y1="{height - bottom}" y2="{height - bottom}"/>')
    series = (("value", "#667085", "", "median rank" if step else "median rank (its hottest function)"),
              ("high", "#e36209", "", "slowest rank"),
              ("culprit", "#c0262d", "5,3", "culprit"))
    legend = []
    for attr, colour, dash, name in series:
        pts = [(x((r.start_ns + r.end_ns) // 2), y(getattr(r, attr) * scale)) for r in rows
               if getattr(r, attr) is not None and math.isfinite(getattr(r, attr))]
        if not pts:
            continue
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2" '
                   f'{f"stroke-dasharray={chr(34)}{dash}{chr(34)}" if dash else ""} data-series="{attr}"/>')
        for px, py in pts:
            out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{colour}"/>')
        legend.append(f'<span class="swatch" style="background:{colour}"></span>{name}')
    out.append("</svg>")
    what = ("step time per window (median over each rank's steps)" if step else
            "slowest function per rank against its peers, per window (ClickHouse keeps no step time)")
    return (f'<div class="legend">{what}: {" ".join(legend)} '
            f'<span class="swatch" style="background:#fde2e1"></span>window with a verdict</div>' + "".join(out))


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
            f'{_utc(v.window_end_ns)}</td><td>{_e(v.kind)}</td><td>{_e(v.component)}</td><td>{_e(culprit)}</td>'
            f'<td class="num">{v.slowdown:.2f}x</td><td class="num">{v.confidence:.2f}</td>'
            f'<td>{_e(v.summary)}<details><summary class="muted">evidence · fn {_e(v.fn or "–")} · '
            f'{len(v.peers)} peers{_e(victims)} · incident {_e(v.incident_id[:12])}</summary>'
            f'<pre>{_e(evidence)}</pre></details></td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def _counters(rep: JobReport) -> str:
    if not rep.counters:
        return ('<p class="muted">No counters for a single culprit'
                + (f" ({_e(rep.subject)})" if rep.subject else "") + ".</p>")
    out = [f'<p class="muted">{_e(rep.subject)} against the median of the others; from {_e(rep.counters_basis)}.</p>',
           '<table class="counters"><thead><tr><th>group</th><th>counter</th><th>culprit</th><th>peer median</th>'
           '<th>culprit / peers</th><th></th></tr></thead><tbody>']
    for c in rep.counters:
        out.append(_counter_row(c))
    out.append("</tbody></table>")
    return "".join(out)


def _counter_row(c: CounterRow) -> str:
    ratio = c.ratio
    off = (abs(ratio - 1.0) >= 0.1 if ratio is not None
           else c.culprit is not None and c.peer_median == 0 and c.culprit != 0)
    scale = max(abs(c.culprit or 0.0), abs(c.peer_median or 0.0)) or 1.0
    bars = (f'<span class="bar culprit" style="width:{120 * abs(c.culprit or 0) / scale:.0f}px"></span><br>'
            f'<span class="bar" style="width:{120 * abs(c.peer_median or 0) / scale:.0f}px"></span>')
    name = c.name + (f" ({c.subject})" if c.subject else "")
    hot = ' class="hot"' if off else ""
    return (f'<tr data-counter="{_e(c.name)}"{hot}><td>{_e(c.group)}</td>'
            f'<td>{_e(name)}</td><td class="num">{_fmt(c.culprit, c.unit)}</td>'
            f'<td class="num">{_fmt(c.peer_median, c.unit)}</td>'
            f'<td class="num">{"–" if ratio is None else f"{ratio:.2f}"}</td><td>{bars}</td></tr>')


def _section(rep: JobReport, idx: int) -> str:
    from .data import main_verdict

    main = main_verdict(rep.verdicts)
    if main is not None:
        head = f'<div class="headline">{_e(main.summary)} <span class="muted">(confidence {main.confidence:.2f})</span></div>'
    else:
        head = '<div class="headline ok">No verdict: no rank, node or link behaves abnormally.</div>'
    span = ""
    if rep.windows:
        span = (f"{_utc(rep.windows[0].start_ns, True)} – {_utc(rep.windows[-1].end_ns, True)}, "
                f"{len(rep.windows)} window(s) of {rep.window_ns / 1e9:g} s, ")
    notes = "".join(f'<li>{_e(n)}</li>' for n in rep.notes)
    return (
        f'<section class="job" id="job-{idx}" data-job="{_e(rep.job)}">'
        f'<h1>Job {_e(rep.job)}</h1><div class="muted">{_e(span)}{len(rep.ranks)} ranks; from {_e(rep.source)}</div>'
        f'{head}'
        f'<h2>Which rank is different: slowdown against peers</h2><div class="muted">Each cell: the rank\'s per-step '
        f'cost of a function over the median of the ranks of the same role ({_e(rep.heat_basis)}); collectives left '
        f'out, their time is waiting and marks the victims.</div><div class="panel">{_heatmap(rep, idx)}</div>'
        f'<h2>When: timeline</h2><div class="panel">{_timeline(rep)}</div>'
        f'<h2>Verdicts</h2><div class="panel">{_verdicts(rep)}</div>'
        f'<h2>The culprit\'s counters</h2><div class="panel">{_counters(rep)}</div>'
        + (f'<h3>Notes</h3><ul class="muted">{notes}</ul>' if notes else "")
        + "</section>")


def _data_json(reports: Sequence[JobReport]) -> str:
    doc = [{"job": r.job, "ranks": r.ranks, "fns": r.fns, "culprit_ranks": r.culprit_ranks,
            "row_max": {str(k): (v if math.isfinite(v) else None) for k, v in r.row_max().items()},
            "verdicts": len(r.verdicts)} for r in reports]
    return json.dumps(doc, allow_nan=False).replace("</", "<\\/")


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
