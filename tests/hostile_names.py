"""Hostile names for the "names are data" tests (issue 34, item 5), and checks of what each destination got.

Job, node, rank-role and function names are free text under the telemetry
contract. :data:`HOSTILE` holds names that do harm when a destination takes
them as markup or control: a Slack channel ping and a disguised link, terminal
escape sequences, a forged line, a right-to-left override, and two that break
an HTML page's ``<script>`` elements. :func:`hostile_run` renames a simulated
run's job, nodes and functions to them.

:func:`script_text` finds where a ``<script>`` element really ends the way a
browser's HTML tokenizer does (the script data states of the HTML standard,
escaped and double-escaped ones included: after ``<!--``, a ``<script`` makes
the tokenizer skip the next ``</script>``); Python's ``html.parser`` does not
follow those states, so it would miss the bug the data island had.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

__all__ = ["HOSTILE", "JOB", "NODES", "FNS", "RAW_TERMINAL", "hostile_run", "script_text"]

HOSTILE = (
    "<!channel>",
    "<https://evil.example|click>",
    "\x1b[31mred\x1b[0m",
    "a\r\nb",
    "\u202egnp.exe",
    "<!--<script>alert(1)</script>",
    "</script><script>x</script>",
)
JOB = " ".join(HOSTILE)  # every kind of harm in the one job name
# node-1 holds the throttled rank of the runs below, so its (escape-sequence) name is in the verdicts' summaries
NODES = {"node-0": "\u202egnp.exe", "node-1": "\x1b[31mred\x1b[0m", "node-2": "a\r\nb", "node-3": "<!channel>",
         "node-4": "</script><script>x</script>", "node-5": "<https://evil.example|click>"}
FNS = {"flash_fwd_kernel": "</script><script>x</script>", "flash_bwd_kernel": "<!--<script>alert(1)</script>",
       "layer_norm_kernel": "\x1b[31mred\x1b[0m", "Memcpy HtoD": "a\r\nb", "Memcpy DtoH": "\u202egnp.exe",
       "softmax_warp_forward": "<!channel>", "indexSelectLargeIndex": "<https://evil.example|click>"}

# What a terminal must never get raw: C0 controls, DEL, C1 controls, bidirectional overrides, isolates
# and marks, and the line/paragraph separators.
RAW_TERMINAL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def hostile_run(src: Path, dst: Path) -> Path:
    """``src`` (a simulated run's JSON Lines) with its job, nodes and functions renamed to hostile names."""
    with src.open() as fin, dst.open("w") as fout:
        for line in fin:
            rec = json.loads(line)
            rec["job"] = JOB
            if "node" in rec:
                rec["node"] = NODES.get(rec["node"], rec["node"])
            if "rank_nodes" in rec:
                rec["rank_nodes"] = [NODES.get(n, n) for n in rec["rank_nodes"]]
            if "fn" in rec:
                rec["fn"] = FNS.get(rec["fn"], rec["fn"])
            fout.write(json.dumps(rec) + "\n")
    return dst


_WS = "\t\n\f\r "


def _end_tag_at(html: str, i: int) -> bool:
    """Is ``html[i:]`` an end tag ``</script`` followed by whitespace, ``/`` or ``>`` (an appropriate end tag)?"""
    return (html[i:i + 2] == "</" and html[i + 2:i + 8].lower() == "script"
            and i + 8 < len(html) and html[i + 8] in _WS + "/>")


def script_text(html: str, start: int) -> str | None:
    """The text of the script element whose content starts at ``start``, or None when it never ends.

    Follows the HTML standard's tokenizer states for script data (13.2.5.4 and on): plain, escaped
    (after ``<!--``) and double-escaped (after ``<!--`` then ``<script``), in which ``</script>``
    does not end the element.
    """
    state, i, n = "data", start, len(html)
    while i < n:
        c = html[i]
        if state == "data":
            if _end_tag_at(html, i):
                return html[start:i]
            if html.startswith("<!--", i):  # on at its "--", so that "<!-->" ends the escape at once
                state, i = "escaped", i + 2
                continue
        elif state == "escaped":
            if _end_tag_at(html, i):
                return html[start:i]
            if html.startswith("-->", i):
                state, i = "data", i + 3
                continue
            if c == "<" and html[i + 1:i + 7].lower() == "script" and i + 7 < n and html[i + 7] in _WS + "/>":
                state, i = "double", i + 8
                continue
        else:  # double-escaped: only "-->" or a "</script" end the state, and neither ends the element
            if html.startswith("-->", i):
                state, i = "data", i + 3
                continue
            if _end_tag_at(html, i):
                state, i = "escaped", i + 9
                continue
        i += 1
    return None
