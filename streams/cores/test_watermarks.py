"""Declared watermarks (frame meta ``wm``): windows close without the lateness allowance, and only then.

A producer that knows nothing older than ``wm`` is still to come on its
stream (the tracer: every span that began before it has been written) says
so in the frame; the summariser then closes a window once every active
stream of the job has declared 5 s past its end (``DECLARED_LATENESS_NS``:
streams not heard from yet, clock reads racing snapshots), instead of one
lateness (a window, by default) after the guessed marks passed it.
"""

from __future__ import annotations

from eroica.models.columns import from_records
from eroica.models.frames import encode_frame
from eroica.models.records import FnRecord
from eroica.streams.cores.digest_messages import DigestMsg, decode_message
from eroica.streams.cores.summariser_core import SUMMARIES, PartitionSummariser

S = 10**9
W = 30 * S
BASE = 10**18 // W * W  # a window boundary


def frame(rank: int, offsets_s: list[float], wm_s: float | None = None) -> bytes:
    cols = from_records("fn", [FnRecord(job="j", node="n", rank=rank, step=0, fn="f", kind="kernel",
                                        ts_ns=BASE + int(t * S), dur_ns=5) for t in offsets_s])
    return encode_frame(cols, {} if wm_s is None else {"wm": BASE + int(wm_s * S)})


def closed(step) -> list[int]:
    """Window starts (seconds after BASE) of the digests a step sends."""
    out = []
    for send in step.sends:
        msg = decode_message(send.value) if send.topic == SUMMARIES else None
        if isinstance(msg, DigestMsg):
            out.append((msg.start_ns - BASE) // S)
    return out


def summariser() -> PartitionSummariser:
    return PartitionSummariser("raw/0", W, W, 10 * W, hold_s=0.0, declared_lateness_ns=5 * S)


def test_every_stream_declared_past_a_window_closes_it_at_once() -> None:
    ps = summariser()
    assert closed(ps.on_message(b"j/0", frame(0, [1, 2], wm_s=34), "a", 0.0)) == []   # 4 s past: not yet
    assert closed(ps.on_message(b"j/1", frame(1, [1.5, 33]), "b", 0.1)) == []         # rank 1 joins late
    assert closed(ps.on_message(b"j/1", frame(1, [34], wm_s=36), "c", 0.2)) == []      # rank 0 at 34
    assert closed(ps.on_message(b"j/0", frame(0, [35], wm_s=35.5), "d", 0.3)) == [0]
    assert ps.stats.late_records == 0


def test_the_same_frames_without_declarations_wait_for_the_lateness() -> None:
    ps = summariser()
    ps.on_message(b"j/0", frame(0, [1, 2, 31]), "a", 0.0)
    assert closed(ps.on_message(b"j/1", frame(1, [1.5, 31]), "b", 0.1)) == []
    ps.on_message(b"j/0", frame(0, [61]), "c", 0.2)
    assert closed(ps.on_message(b"j/1", frame(1, [61]), "d", 0.3)) == [0]   # marks past end + lateness


def test_one_stream_without_declarations_holds_the_job_to_the_lateness() -> None:
    ps = summariser()
    ps.on_message(b"j/1", frame(1, [1.5, 35]), "b", 0.0)
    assert closed(ps.on_message(b"j/0", frame(0, [1, 2], wm_s=40), "a", 0.1)) == []  # guessed mark 1.5 < 30 + 30
    assert closed(ps.on_message(b"j/1", frame(1, [40]), "c", 0.15)) == []           # 40 < 30 + 30
    assert closed(ps.on_message(b"j/1", frame(1, [61]), "d", 0.2)) == [0]


def test_a_declared_stream_moves_only_by_its_declarations() -> None:
    """A frame without ``wm`` on a stream that declares (a batch split in several frames, the
    watermark on its last) must not let its oldest record stand in for a declaration."""
    ps = summariser()
    ps.on_message(b"j/0", frame(0, [1], wm_s=2), "a", 0.0)
    ps.on_message(b"j/1", frame(1, [1], wm_s=36), "b", 0.1)
    assert closed(ps.on_message(b"j/0", frame(0, [70]), "c", 0.2)) == []
    assert closed(ps.on_message(b"j/0", frame(0, [71], wm_s=36), "d", 0.3)) == [0]


def test_a_broken_promise_is_counted_late_not_reopened() -> None:
    ps = summariser()
    ps.on_message(b"j/0", frame(0, [1], wm_s=3), "a", 0.0)
    ps.on_message(b"j/1", frame(1, [1], wm_s=36), "b", 0.1)
    assert closed(ps.on_message(b"j/0", frame(0, [2], wm_s=36), "a2", 0.1)) == [0]
    step = ps.on_message(b"j/1", frame(1, [5]), "c", 0.2)   # older than rank 1 declared
    assert closed(step) == [] and ps.stats.late_records == 1 and step.acks == ["c"]
