"""The link from a notification to its job's report page (pure, no I/O).

``eroica alert --report-url-base BASE`` (``EROICA_REPORT_URL_BASE``) makes
every notification carry ``BASE/<file>``, where ``<file>`` is
:func:`report_file_name` of the job: the name ``eroica report ... --out-dir DIR``
gives the job's page. So a static location works as it is: point BASE at DIR
as a web server publishes it (``https://reports.example/eroica``) or at DIR
itself (``file:///srv/eroica-reports``), and write the pages there with
``eroica report --job J --out-dir DIR`` (or ``eroica report FILES --out-dir DIR``).
A BASE that holds ``{job}`` takes the URL-encoded job there instead, for a
server that looks the job up itself
(``https://grafana.example/d/eroica?var-job={job}``).

Job names are data (any text, ``/``, ``..``, ``<!channel>``, control
characters included), so neither the file name nor the URL takes them raw:

- the file name is the job percent-encoded (only ASCII letters, digits, ``-``,
  ``_``, ``.`` and ``~`` stay; a leading ``.`` is encoded too, so no name is
  hidden, ``.`` or ``..``), cut with a hash of the job when it would be too
  long for a file system;
- the URL path holds that file name percent-encoded once more (its ``%``
  becomes ``%25``), so a server that decodes the path finds exactly that file.

The URL therefore holds no space, quote, ``<``, ``>`` or ``|`` from the job, and
:func:`check_base` refuses a BASE that holds them, so a Slack link
``<URL|text>`` cannot be broken open by either; each destination escapes
the link's *text* its own way (payloads.py).
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

__all__ = ["report_file_name", "report_url", "check_base", "JOB_PLACEHOLDER"]

JOB_PLACEHOLDER = "{job}"
_MAX_NAME = 200            # bytes: below every common file system's 255, with room for ".html"
_HEAD = 160
_BASE = re.compile(r"^(https?|file)://[^\s<>|\"'`\\\x00-\x1f\x7f]*$")


def _quote(text: str) -> str:
    return quote(text, safe="", errors="surrogatepass")  # a lone surrogate (JSON allows one) stays distinct


def report_file_name(job: str) -> str:
    """The file name of ``job``'s page (``sim-1`` -> ``sim-1.html``); safe for any job name."""
    name = _quote(job)
    if name.startswith("."):
        name = "%2E" + name[1:]
    if len(name) > _MAX_NAME:
        head = name[:_HEAD]
        cut = head.rfind("%", _HEAD - 2)  # never half an escape
        if cut >= 0:
            head = head[:cut]
        name = f"{head}~{hashlib.blake2b(job.encode('utf-8', 'surrogatepass'), digest_size=8).hexdigest()}"
    return f"{name}.html"


def check_base(base: str) -> str:
    """``base`` without trailing slashes; ValueError unless it is an http(s):// or file:// URL with
    nothing a link could be broken open with (whitespace, quotes, ``<``, ``>``, ``|``, controls)."""
    text = base.strip()
    if not _BASE.match(text):
        raise ValueError(f"report URL base {base!r}: use an http://, https:// or file:// URL "
                         "without spaces, quotes, '<', '>' or '|'")
    return text if JOB_PLACEHOLDER in text else text.rstrip("/")


def report_url(base: str, job: str) -> str:
    """The link to ``job``'s report under ``base`` ("" without a base)."""
    if not base:
        return ""
    if JOB_PLACEHOLDER in base:
        return base.replace(JOB_PLACEHOLDER, _quote(job))
    return f"{base.rstrip('/')}/{quote(report_file_name(job), safe='')}"
