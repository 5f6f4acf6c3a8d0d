"""Coverage-guided fuzzing of every decoder with atheris (``pip install eroica[fuzz]``).

Test support (it reaches the decoders of every layer, so it sits with the
cross-component tests, not in ``models``). Run by hand for as long as you like::

    python tests/fuzz_decoders.py -runs=100000
    python tests/fuzz_decoders.py -max_total_time=600 corpus_dir/

and, bounded, in the normal test run (``tests/test_fuzz_atheris.py``). Each
input is offered to every decoder; a decoder may return or raise its own
declared error, anything else (``RecursionError``, ``MemoryError``,
``OverflowError``, ``TypeError``...) is a finding and stops the run with its
traceback. The first byte picks how the rest is framed (raw, as a frame body,
wrapped in a JSON line with a nested unknown field) so the fuzzer reaches the
deep paths quickly.
"""

from __future__ import annotations

import sys


def _targets():
    import msgspec

    from eroica.models.digest import decode_digest
    from eroica.models.frames import FrameError, decode_end_of_stream, decode_frame, decode_job
    from eroica.models.reader import decode_line, parse_lines
    from eroica.models.verdict import decode_verdict, decode_verdicts
    from eroica.sinks.alerts.consumer import _Rejected, decode_verdict_message, decode_window_message
    from eroica.sinks.clickhouse.messages import RejectedMessage
    from eroica.sinks.clickhouse.messages import decode_summaries as sink_summaries
    from eroica.sinks.clickhouse.messages import decode_verdicts as sink_verdicts
    from eroica.streams.cores.ingest import ingest_message
    from eroica.streams.cores.digest_messages import MessageError, decode_message

    dec = msgspec.DecodeError
    return [
        (decode_line, dec), (decode_verdict, dec), (decode_verdicts, dec), (decode_digest, dec),
        (decode_frame, FrameError), (decode_end_of_stream, FrameError), (decode_job, FrameError),
        (decode_message, MessageError), (sink_verdicts, RejectedMessage),
        (lambda d: sink_summaries(d, 1), RejectedMessage), (decode_verdict_message, _Rejected),
        (decode_window_message, _Rejected), (lambda d: list(parse_lines(iter([(1, d)]))), ()),
        (lambda d: ingest_message(d, "fuzz/0@0"), ()),
    ]


def _shape(data: bytes) -> bytes:
    if not data:
        return data
    mode, rest = data[0] % 4, data[1:]
    if mode == 1:
        return b"EF\x01" + b"CEJ"[len(rest) % 3:len(rest) % 3 + 1] + rest
    if mode == 2:
        depth = (rest[0] * 8) if rest else 0
        return b'{"type":"fn","x":' + b"[" * depth + rest[1:] + b"]" * depth + b"}"
    if mode == 3:
        return b"\x91" * ((rest[0] * 8) if rest else 0) + rest[1:]
    return rest


def main(argv: list[str] | None = None) -> None:
    import atheris

    with atheris.instrument_imports():
        targets = _targets()

    def one(data: bytes) -> None:
        shaped = _shape(data)
        for decode, allowed in targets:
            try:
                decode(shaped)
            except allowed:  # type: ignore[misc]
                pass

    atheris.Setup(list(argv if argv is not None else sys.argv), one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
