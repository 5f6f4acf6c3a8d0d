"""Terminal tables that stay readable at 80 columns: words are never cut in the middle.

rich shrinks every wrappable column of a table that does not fit, and a column
narrower than one of its words folds that word (``collective`` / ``s``). Here
short columns (times, names, numbers) never wrap, so only the long text
column gives way, and it wraps between words; when even that leaves it too
narrow for its words, the rows are printed as blocks instead (a head line,
then the text wrapped at the terminal's width), which is how verdict lists
read at 80 columns.
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

__all__ = ["add_columns", "console", "print_rows", "render_verdicts", "wrap"]

SHORT = 19          # a column whose cells are all at most this long never wraps
MIN_TEXT = 36       # narrowest a wrapped text column may get before rows turn into blocks


def console() -> Console:
    """A console at the terminal's width (``COLUMNS`` when set; 80 when not a terminal)."""
    from rich.console import Console

    return Console()


def wrap(text: str, width: int, indent: str = "") -> str:
    """``text`` wrapped at ``width`` between words only (a word longer than the line stays whole)."""
    return "\n".join(textwrap.wrap(text, width=max(20, width), initial_indent=indent, subsequent_indent=indent,
                                   break_long_words=False, break_on_hyphens=False)) or indent


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
    """A table when its text columns get room for their words, else one block per row."""
    from rich.table import Table
    from rich.text import Text

    out = out or console()
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


def render_verdicts(verdicts: Sequence[Verdict], out: Console | None = None) -> None:
    """Verdicts as a table on a wide terminal, as blocks (head line + wrapped summary) on a narrow one."""
    out = out or console()
    if not verdicts:
        out.print("no verdict: no rank, node or link behaves abnormally", highlight=False, markup=False)
        return
    rows = []
    for v in verdicts:
        culprit = f"rank {v.rank}" if v.scope == "rank" else (v.node or "?") if v.scope == "node" else "job"
        # Two quantities, two names: how much slower the culprit's function runs (the verdict's
        # ``slowdown``, against its peers or its expected level) and what the job loses by it (``cost``).
        rows.append([time.strftime("%H:%M:%S", time.gmtime(v.window_start_ns / 1e9)), v.kind, v.component,
                     culprit, f"{v.slowdown:.2f}x", job_loss(v.cost), f"{v.confidence:.2f}", v.summary])
    columns = ["window", "kind", "component", "culprit", "fn slower", "job loses", "conf", "summary"]
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
        out.print(wrap(f"{r[0]}  {r[2]} ({r[1]})  {r[3]}  fn {r[4]} slower  job loses {r[5]}  conf {r[6]}",
                       out.width - 1), highlight=False, markup=False, soft_wrap=True)
        out.print(wrap(r[7], out.width - 1, "    "), highlight=False, markup=False, soft_wrap=True)


def job_loss(cost: float | None) -> str:
    """What the job loses to a culprit, as a share of its throughput (1 - 1/S_X); '-' where unpriced."""
    if cost is None or not cost >= 1.0:
        return "-"
    return f"{1.0 - 1.0 / cost:.0%}"
