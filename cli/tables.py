"""Terminal tables that stay readable at 80 columns: words are never cut in the middle.

rich shrinks every wrappable column of a table that does not fit, and a column
narrower than one of its words folds that word (``collective`` / ``s``). Here
short columns (times, names, numbers) never wrap, so only the long text
column gives way, and it wraps between words; when even that leaves it too
narrow for its words, the rows are printed as blocks instead (a head line,
then the text wrapped at the terminal's width), which is how verdict lists
read at 80 columns.

Names are data: job, node, rank-role and function names are free text under
the telemetry contract, and so is what is built from them (a verdict's
summary, a stored row). :func:`printable` is the one place that makes such
text safe for a terminal, and every printer of names goes through it (the
tables and blocks here, ``eroica sql``/``verdicts``/``fleet``/``status``/
``report`` messages): a control character (C0 including CR, LF and TAB inside
a field, DEL, C1 including ESC's 8-bit forms) or a bidirectional override or
isolate is shown as its escape (``\\x1b``, ``\\n``, ``\\u202e``) instead of
being sent raw, so a name cannot recolour or clear the terminal, forge lines
or reorder what is shown around it. Rich's emoji codes are off in
:func:`console` for the same reason (a job named ``:fire:`` stays that text).
"""

from __future__ import annotations

import textwrap
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from eroica.models.verdict import Verdict

__all__ = ["add_columns", "aligned", "console", "print_rows", "printable", "printable_json", "render_verdicts", "wrap"]

SHORT = 19          # a column whose cells are all at most this long never wraps
MIN_TEXT = 36       # narrowest a wrapped text column may get before rows turn into blocks

# Bidirectional controls: embeddings and overrides (U+202A-U+202E), isolates (U+2066-U+2069), the
# LRM/RLM marks (U+200E/F) and the Arabic letter mark (U+061C); with them a name can make the
# terminal show text in an order other than the bytes' (a "\u202egnp.exe" reads as "exe.png").
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_SHORT_ESCAPES = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
# The line and paragraph separators end a line for some renderers (and for str.splitlines), so a
# name could still forge a line with them.
_SEPARATORS = (0x2028, 0x2029)
_TERMINAL_ESCAPES: dict[int, str] = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))},  # C0, DEL, C1 (ESC = 0x1b)
    **_SHORT_ESCAPES,
    **{c: f"\\u{c:04x}" for c in (*_BIDI, *_SEPARATORS)},
}


def printable(text: object) -> str:
    """``text`` safe to print on a terminal: control and bidirectional characters shown as escapes.

    Pure and total (any object is shown as its ``str``). C0 controls (``\\x00``-``\\x1f``, with
    ``\\t``, ``\\n``, ``\\r`` for TAB, LF and CR), DEL, C1 controls (``\\x80``-``\\x9f``), the
    bidirectional overrides, isolates and marks and the line/paragraph separators become backslash
    escapes; every other character, backslashes included, is kept as it is, so ordinary names and
    messages print unchanged. Meant for one field or message at a time: a newline the caller wants
    is added around the result, never passed through it.
    """
    return str(text).translate(_TERMINAL_ESCAPES)


# What a JSON encoder leaves raw (it escapes only C0, '"' and '\\') but a terminal must not get raw.
_JSON_ESCAPES: dict[int, str] = {c: f"\\u{c:04x}" for c in (0x7F, *range(0x80, 0xA0), *_BIDI, *_SEPARATORS)}


def printable_json(text: str) -> str:
    """Encoded JSON ``text`` with DEL, C1 controls, bidirectional and separator characters as ``\\uXXXX``.

    For JSON printed on a terminal: the document decodes to the same value (outside strings a JSON
    encoder writes none of these characters, and inside them ``\\uXXXX`` is the character), but no
    raw control or bidi character reaches the terminal. C0 controls are already escaped by any JSON
    encoder (JSON forbids them raw).
    """
    return text.translate(_JSON_ESCAPES)


def console() -> Console:
    """A console at the terminal's width (``COLUMNS`` when set; 80 when not a terminal).

    Emoji codes are not replaced (``emoji=False``): the text printed is data, and ``:fire:`` in a
    name is a name, not a picture.
    """
    from rich.console import Console

    return Console(emoji=False)


def wrap(text: str, width: int, indent: str = "") -> str:
    """``text`` wrapped at ``width`` between words only (a word longer than the line stays whole)."""
    return "\n".join(textwrap.wrap(text, width=max(20, width), initial_indent=indent, subsequent_indent=indent,
                                   break_long_words=False, break_on_hyphens=False)) or indent


def aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Plain columns, each as wide as its longest cell, two spaces apart, no box drawing; one line a row.

    For lists meant to be read at any width and grepped (``eroica fleet``): a row is never wrapped
    or folded. The cells are shown as given: names go through :func:`printable` first.
    """
    widths = [max(len(r[i]) for r in rows if i < len(r)) for i in range(max((len(r) for r in rows), default=0))]
    return ["  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in rows]


def add_columns(table: Table, columns: Sequence[str], rows: Sequence[Sequence[str]] = (),
                wide: set[str] | frozenset[str] = frozenset()) -> None:
    """Columns whose cells are short never wrap; the others (and ``wide``) wrap between words."""
    for i, name in enumerate(columns):
        longest = max([len(str(name))] + [len(str(r[i])) for r in rows if i < len(r)])
        if name not in wide and longest <= SHORT:
            table.add_column(name, no_wrap=True, overflow="ellipsis")
        else:
            longest_word = max([len(w) for r in rows if i < len(r) for w in str(r[i]).split()] + [len(str(name))])
            table.add_column(name, overflow="fold", min_width=min(longest_word, 30))


def print_rows(columns: Sequence[str], rows: Sequence[Sequence[str]], wide: set[str] | frozenset[str] = frozenset(),
               title: str | None = None, out: Console | None = None) -> None:
    """A table when its text columns get room for their words, else one block per row.

    Every cell, column name and the title go through :func:`printable` first (rows may hold names
    or anything else read back from the store), so the widths are those of what is shown.
    """
    from rich.table import Table
    from rich.text import Text

    out = out or console()
    wide = {printable(c) for c in wide}
    columns = [printable(c) for c in columns]
    rows = [[printable(x) for x in r] for r in rows]
    title = None if title is None else printable(title)
    fixed = [i for i, c in enumerate(columns)
             if c not in wide and max([len(c)] + [len(str(r[i])) for r in rows]) <= SHORT]
    fixed_width = sum(max([len(columns[i])] + [len(str(r[i])) for r in rows]) for i in fixed)
    borders = 3 * len(columns) + 1
    flexible = len(columns) - len(fixed)
    room = (out.width - fixed_width - borders) // max(1, flexible)
    if flexible and room < MIN_TEXT:
        if title:
            out.print(title, highlight=False, markup=False)
        for r in rows:
            head = "  ".join(f"{c}={r[i]}" if c not in ("culprit", "window") else str(r[i])
                             for i, c in enumerate(columns) if i in fixed and str(r[i]))
            out.print(wrap(head, out.width - 1).replace("\n", "\n    "), highlight=False, markup=False,
                      soft_wrap=True)
            for i, c in enumerate(columns):
                if i not in fixed and str(r[i]):
                    out.print(wrap(f"{c}: {r[i]}", out.width - 1, "    "), highlight=False, markup=False,
                              soft_wrap=True)
        return
    table = Table(title=title, show_lines=True)
    add_columns(table, columns, rows, wide)
    for r in rows:
        table.add_row(*(Text(str(x)) for x in r))
    out.print(table)


def render_verdicts(verdicts: Sequence[Verdict], out: Console | None = None, show_job: bool = False) -> None:
    """Verdicts as a table on a wide terminal, as blocks (head line + wrapped summary) on a narrow one.

    Each field goes through :func:`printable`: a verdict's job, node and summary carry names.
    ``show_job`` adds the job (after the window), for lists that may hold several jobs (``eroica verdicts``).
    """
    out = out or console()
    if not verdicts:
        out.print("no verdict: no rank, node or link behaves abnormally", highlight=False, markup=False)
        return
    rows = []
    for v in verdicts:
        culprit = f"rank {v.rank}" if v.scope == "rank" else (v.node or "?") if v.scope == "node" else "job"
        # Two quantities, two names: how much slower the culprit's function runs (the verdict's
        # ``slowdown``, against its peers or its expected level) and what the job loses by it (``cost``).
        rows.append([printable(x) for x in (
            time.strftime("%H:%M:%S", time.gmtime(v.window_start_ns / 1e9)), *([v.job] if show_job else []), v.kind,
            v.component, culprit, f"{v.slowdown:.2f}x", job_loss(v.cost), f"{v.confidence:.2f}", v.summary)])
    columns = ["window", *(["job"] if show_job else []), "kind", "component", "culprit", "fn slower", "job loses",
               "conf", "summary"]
    fixed_width = sum(max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns[:-1]))
    if out.width - fixed_width - 3 * len(columns) - 1 >= MIN_TEXT + 10:
        from rich.table import Table
        from rich.text import Text

        table = Table(show_lines=True)
        add_columns(table, columns, rows, wide={"summary"})
        for r in rows:
            table.add_row(*(Text(x) for x in r))
        out.print(table)
        return
    for r in rows:
        window, job = r[0], (f"  {r[1]}" if show_job else "")
        kind, component, culprit, slower, loses, conf, summary = r[2:] if show_job else r[1:]
        out.print(wrap(f"{window}{job}  {component} ({kind})  {culprit}  fn {slower} slower  job loses {loses}  "
                       f"conf {conf}", out.width - 1), highlight=False, markup=False, soft_wrap=True)
        out.print(wrap(summary, out.width - 1, "    "), highlight=False, markup=False, soft_wrap=True)


def job_loss(cost: float | None) -> str:
    """What the job loses to a culprit, as a share of its throughput (1 - 1/S_X); '-' where unpriced."""
    from eroica.streams.detection.cost import lost_share

    if cost is None or not cost >= 1.0:
        return "-"
    return f"{lost_share(cost):.0%}"
