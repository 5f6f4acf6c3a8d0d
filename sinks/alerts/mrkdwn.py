"""Slack mrkdwn from untrusted text: the one place Slack escaping lives (pure, no I/O).

Job, node, rank-role and function names are free text under the telemetry
contract, and a verdict's summary is built from them. In Slack's mrkdwn, ``<``
starts a control sequence: ``<!channel>``/``<!here>``/``<!everyone>`` ping the
channel, ``<@U123>`` a user, ``<#C123>`` links a channel and
``<https://evil.example|click>`` is a link whose target the reader never sees.
Slack's documented rule for text that must stay text is to replace exactly
three characters with HTML entities: ``&`` -> ``&amp;``, ``<`` -> ``&lt;``,
``>`` -> ``&gt;`` (and nothing else: Slack decodes only those three). With no
``<`` left, none of those sequences can be formed.

Text objects are also marked ``"verbatim": true``: without it Slack
*auto-parses* plain text, linking bare URLs and channel names and turning some
bare mentions into real ones; with it Slack keeps formatting (our ``*bold*``)
but adds nothing of its own to the names in between.

Formatting characters in a name (``*``, ``_``, ``~``, a backtick) can still
bold or strike part of the message; that is cosmetic and cannot notify anyone
or hide a link, so they are left as they are (mrkdwn has no escape for them).
"""

from __future__ import annotations

from typing import Any

__all__ = ["escape", "text_object"]

_ENTITIES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def escape(text: object) -> str:
    """``text`` (any object, as its ``str``) as mrkdwn that shows those characters and forms no sequence."""
    return str(text).translate(_ENTITIES)


def text_object(mrkdwn: str) -> dict[str, Any]:
    """A Block Kit ``mrkdwn`` text object, verbatim (Slack adds no links or mentions of its own).

    ``mrkdwn`` is markup: its untrusted parts must already have gone through :func:`escape`.
    """
    return {"type": "mrkdwn", "text": mrkdwn, "verbatim": True}
