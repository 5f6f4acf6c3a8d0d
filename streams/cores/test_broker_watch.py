"""BrokerWatch: failed probes and silences between answers are outages; steady answers are not."""

from __future__ import annotations

from eroica.streams.cores.broker_watch import BrokerWatch
from eroica.streams.cores.summariser_core import InputDrain, JobClock


def test_steady_answers_report_themselves_only() -> None:
    w = BrokerWatch(max_silence_s=6.0)
    seen = [obs for t in (0.0, 1.0, 2.5, 6.4, 12.0) for obs in w.result(True, t)]
    assert seen == [(True, 0.0), (True, 1.0), (True, 2.5), (True, 6.4), (True, 12.0)]
    assert w.outages == 0


def test_no_answer_before_the_first_is_no_outage() -> None:
    w = BrokerWatch(max_silence_s=6.0)
    assert w.result(False, 0.0) == []          # a fresh client, still connecting
    assert w.result(True, 2.5) == [(True, 2.5)]
    assert w.outages == 0


def test_a_failed_probe_is_one_outage_until_an_answer() -> None:
    w = BrokerWatch(max_silence_s=6.0)
    w.result(True, 0.0)
    assert w.result(False, 3.0) == [(False, 3.0)]
    assert w.result(False, 5.0) == [(False, 5.0)]
    assert w.result(True, 20.0) == [(True, 20.0)]   # a recovery, not also a silence
    assert (w.outages, w.silent_outages) == (1, 0)


def test_a_silence_between_two_answers_is_an_outage_that_ended_with_the_second() -> None:
    w = BrokerWatch(max_silence_s=6.0)
    w.result(True, 44.0)
    assert w.result(True, 51.7) == [(False, 44.0), (True, 51.7)]
    assert (w.outages, w.silent_outages) == (1, 1)
    assert w.result(True, 52.7) == [(True, 52.7)]


def test_a_silent_outage_holds_idle_closes_for_the_recovery_grace() -> None:
    # what CI's broker-kill chaos test needed: no probe failed, yet the publishers' backlog was
    # still on its way when the broker answered again
    clock = JobClock()
    clock.saw("j", 40.0)
    drain = InputDrain(clock, recovery_grace_s=60.0)
    w = BrokerWatch(max_silence_s=6.0)
    for answered, at in w.result(True, 44.0) + w.result(True, 51.7):
        drain.observe(answered, at)
    assert drain.outages == 1
    assert drain.drained({0: 10}, {0: 10}, 52.0) == set()          # within the grace: nothing drained
    assert drain.drained({0: 10}, {0: 10}, 51.7 + 60.0) == {0}     # after it, a partition read to its end is
