"""Progress on stderr for long file runs (analyze, report, replay, import): only on a terminal.

``track_batches`` wraps a batch iterator: when stderr is a TTY it shows a rich
progress bar over the estimated records of the input (from the file sizes; a
spinner for stdin and gzip, whose decoded size is unknown) with the records
read so far; when stderr is a
pipe or a file, or ``enabled`` is false (``--quiet``), it yields the batches
untouched and prints nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["track_batches", "progress_wanted", "estimate_records", "spinner"]

T = TypeVar("T")


def progress_wanted(enabled: bool = True) -> bool:
    if not enabled or os.environ.get("EROICA_NO_PROGRESS"):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def estimate_records(paths: Iterable[str]) -> int | None:
    """Records in plain input files, from their sizes and the line length of their first MiB.

    None for stdin and gzip (their decoded size is unknown until read).
    """
    total = 0
    for p in paths:
        if p == "-":
            return None
        try:
            with open(p, "rb") as f:
                head = f.read(1 << 20)
            if head[:2] == b"\x1f\x8b":
                return None
            size = os.path.getsize(p)
        except OSError:
            return None
        lines = head.count(b"\n")
        total += int(size / (len(head) / lines)) if lines else (1 if size else 0)
    return total


def track_batches(batches: Iterable[T], paths: Iterable[str], *, enabled: bool = True,
                  label: str = "reading") -> Iterator[T]:
    """The batches, with a progress bar on a terminal (records counted from ``batch.valid_count``)."""
    if not progress_wanted(enabled):
        yield from batches
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    total = estimate_records(list(paths))
    records = 0
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.fields[records]:,} records"), TimeElapsedColumn()]
    with Progress(*columns, transient=True, console=Console(stderr=True)) as progress:
        task = progress.add_task(label, total=total, records=0)
        for batch in batches:
            n = int(getattr(batch, "valid_count", 0)) + len(getattr(batch, "invalid", ()) or ())
            records += n
            if total is not None:
                progress.update(task, completed=min(total, records), records=records)
            else:
                progress.update(task, records=records)
            yield batch
        if total is not None:
            progress.update(task, completed=total)


def _plain(text: str) -> Text:
    """A spinner's line as plain text: names in it (files, brokers) escaped, never read as rich markup."""
    from rich.text import Text

    from .tables import printable

    return Text(printable(text))


class _Status:
    """What :func:`spinner` yields: ``update(text)`` changes the line (a no-op when silent)."""

    def __init__(self, status: object | None, label: str) -> None:
        self._status = status
        self._label = label

    def update(self, text: str) -> None:
        if self._status is not None:
            self._status.update(_plain(f"{self._label}: {text}"))  # type: ignore[attr-defined]


class spinner:  # noqa: N801 - used as a context manager, like open()
    """A one-line spinner on stderr while something long runs; silent unless stderr is a terminal."""

    def __init__(self, label: str, *, enabled: bool = True) -> None:
        self._label = label
        self._enabled = progress_wanted(enabled)
        self._status: object | None = None

    def __enter__(self) -> _Status:
        if self._enabled:
            from rich.console import Console

            self._status = Console(stderr=True).status(_plain(self._label))
            self._status.__enter__()  # type: ignore[attr-defined]
        return _Status(self._status, self._label)

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)  # type: ignore[attr-defined]
