"""What the detector remembers of a job between windows.

Kept as plain data (a msgspec struct) so the streaming detector can store it
in a changelogged faust table and ``eroica analyze`` can thread it through
windows: the same history, in the same window order, gives the same verdicts.
"""

from __future__ import annotations

import msgspec

from eroica.models.digest import WindowDigest, decoder, encoder


class PauseRecord(msgspec.Struct, array_like=True):
    """One rank's sporadic host pauses of one function in one job window."""

    fn: str
    rank: int
    excl_ns: float      # summed exclusive time of its calls (an every-step function's: the part above its usual level)
    calls: int          # (an every-step function's: its calls that long)
    median_ns: float    # typical call (an every-step function's: its longest call less its usual one)


class PauseWindow(msgspec.Struct):
    """The sporadic host pauses of one job window (:func:`.expected.pause_findings`)."""

    steps: float        # the window's steps (median over ranks)
    step_ns: float
    records: list[PauseRecord] = []


class JobHistory(msgspec.Struct):
    job: str = ""
    windows: int = 0                    # windows analysed so far
    first_step: int = -1                # the job's first step seen (warm-up is counted from it)
    last_start_ns: int = -1
    # function key -> its typical per-step cost (median over ranks) in the job's first windows
    reference: dict[str, list[float]] = {}
    # incident id -> consecutive windows in which the finding was seen
    streak: dict[str, int] = {}
    # incident id -> the steps after the warm-up that showed it over those windows (the sign test's k)
    streak_steps: dict[str, int] = {}
    # incident id -> [S_X, window start] of the last window that could price it (cost.window_cost), for a
    # window of the same incident that cannot (too few complete steps: the job's last, flushed window)
    last_cost: dict[str, list[float]] = {}
    # time-window digests waiting until they hold enough whole steps (steps.py) ...
    pending: list[WindowDigest] = []
    # ... and the incomplete steps the last job window left over
    carry: WindowDigest | None = None
    # the sporadic host pauses of the last job windows (GC on varying ranks is a pattern in time)
    pauses: list[PauseWindow] = []
    # inter-node communicator -> per workload phase [its highest and second highest window's bus
    # bandwidth (B/s), the bytes per step it moved], flattened (bus_reference.py: a measured floor
    # under the links' capacity)
    bus_reference: dict[str, list[float]] = {}


_encoder: msgspec.msgpack.Encoder = encoder()  # the pending digests' columns are arrays (models.digest)
_decoder: msgspec.msgpack.Decoder[JobHistory] = decoder(JobHistory)


def encode_history(h: JobHistory) -> bytes:
    return _encoder.encode(h)


def decode_history(data: bytes) -> JobHistory:
    return _decoder.decode(data)
