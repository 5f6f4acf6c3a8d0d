"""Names are data on the terminal (issue 34, item 5): ``printable`` and every table and block printer use it.

A job, node or function name with an escape sequence, a CR/LF or a
right-to-left override must come out as visible escapes (``\\x1b``,
``\\r\\n``, ``\\u202e``) in the verdict table and blocks, ``print_rows``
(``eroica sql``/``status``/``demo``) and the notes under ``analyze``'s table;
never raw, so it cannot recolour the terminal, forge a line or reorder what is
shown.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from eroica.cli.analyze_cmd import render_table
from eroica.cli.tables import aligned, print_rows, printable, printable_json, render_verdicts
from hostile_names import HOSTILE, RAW_TERMINAL


def _console(width: int) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, emoji=False, color_system=None), buf


def test_printable_escapes_controls_and_bidi() -> None:
    assert printable("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m"
    assert printable("a\r\nb\tc") == "a\\r\\nb\\tc"
    assert printable("\u202egnp.exe") == "\\u202egnp.exe"
    assert printable("\x00\x7f\x9b\x85") == "\\x00\\x7f\\x9b\\x85"   # NUL, DEL, C1 CSI and NEL
    assert printable("\u2066x\u2069\u200e\u200f\u061c\u2028") == "\\u2066x\\u2069\\u200e\\u200f\\u061c\\u2028"
    # ordinary text, non-ASCII letters and backslashes stay as they are
    for plain in ("node-3", "rank 5 on node-1: GPU 5 throttled", "Ünïcødé ◀ culprit", "C:\\path", "<!channel>"):
        assert printable(plain) == plain
    assert printable(42) == "42"
    every = "".join(map(chr, range(0x3000)))
    assert not RAW_TERMINAL.search(printable(every))


def test_printable_json_decodes_to_the_same_value() -> None:
    doc = [{"job": name, "n": 1} for name in HOSTILE + ("\x85\u2029\u2067",)]
    text = printable_json(json.dumps(doc, ensure_ascii=False))
    assert not RAW_TERMINAL.search(text) and json.loads(text) == doc


@pytest.mark.parametrize("width", [200, 80])
def test_print_rows_shows_hostile_cells_escaped(width: int) -> None:
    """The wide table and the 80-column blocks alike (``eroica sql``, ``eroica status``)."""
    out, buf = _console(width)
    rows = [[name, "gpu", name + " and a summary long enough to wrap " * 3] for name in HOSTILE]
    print_rows(["job\x1b[2J", "component", "summary"], rows, wide={"summary"}, title="t\u202eitle", out=out)
    text = buf.getvalue()
    assert not RAW_TERMINAL.search(text.replace("\n", "")), ascii(text)
    for escaped in ("\\x1b[31mred\\x1b[0m", "a\\r\\nb", "\\u202egnp.exe", "job\\x1b[2J", "t\\u202eitle"):
        assert escaped in text, (escaped, text)


@pytest.mark.parametrize("width", [200, 80])
def test_verdicts_and_notes_show_hostile_names_escaped(width: int, make_verdict, monkeypatch) -> None:
    """``eroica analyze``/``verdicts``: the table (wide), the blocks (80 columns) and the ``note:`` lines."""
    from eroica.streams.detection.notes import Note

    verdicts = [make_verdict(node=name, rank=i, summary=f"rank {i} on {name}: GPU 1 throttled")
                for i, name in enumerate(HOSTILE)]
    out, buf = _console(width)
    render_verdicts(verdicts, out)
    text = buf.getvalue()
    assert not RAW_TERMINAL.search(text.replace("\n", "")), ascii(text)
    assert "\\x1b[31mred\\x1b[0m" in text and "\\u202egnp.exe" in text and "a\\r\\nb" in text

    # render_table prints the notes on a console of its own (cli.tables.console)
    notes_out, notes_buf = _console(width)
    monkeypatch.setattr("eroica.cli.tables.console", lambda: notes_out)
    render_table([], [Note(job=name, kind="few_peers", text=f"job {name}: 2 ranks", ranks=2, smallest_group=2,
                           needed=4, uncompared=(0, 1)) for name in HOSTILE])
    notes = notes_buf.getvalue()
    assert notes.count("note: job ") == len(HOSTILE), notes
    assert not RAW_TERMINAL.search(notes.replace("\n", "")) and "\\x1b[31mred" in notes and "\\u202egnp" in notes


def test_rich_emoji_codes_in_names_stay_text() -> None:
    from eroica.cli.tables import console

    buf = io.StringIO()
    out = console()
    out.file = buf
    out.print(":fire: job", markup=False, highlight=False)
    assert ":fire: job" in buf.getvalue()


def test_aligned_columns_are_as_wide_as_their_longest_cell() -> None:
    assert aligned([["node", "jobs", "state"], ["gpu-node-017", "12", "open"], ["n2", "3", ""]]) == [
        "node          jobs  state",
        "gpu-node-017  12    open",
        "n2            3",
    ]
    assert aligned([]) == []
