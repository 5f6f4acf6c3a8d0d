"""The shared at-least-once loop (``loop.py``) against a fake consumer and producer: its guarantees, one by one.

- offsets are committed only after the write that covers them, and exactly those;
- a failed write commits nothing, pauses every assigned partition (the consumer
  still polls) and is retried; once it succeeds the partitions are resumed;
- an undecodable message (a Rejected reason, or any exception such as
  RecursionError) goes to the dead-letter topic whole, with its reason, and the
  loop goes on; the commit covers it only once its dead letter is delivered;
- a message the write itself refuses is dead-lettered and committed past;
- a stop while the write keeps failing commits nothing (read again next start);
- a revoke while the write fails drops the revoked partitions' messages, uncommitted.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from eroica.kafka.loop import Batch, ConsumeLoop, LoopSettings, Rejected, Retry

TOPIC = "t.in"
DLQ = "t.deadletter"


@dataclass
class FakeMessage:
    _topic: str
    _partition: int
    _offset: int
    _value: bytes | None
    _key: bytes | None = b"k"

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


@dataclass
class FakeConsumer:
    """Partitions of one topic; ``consume`` honours pause; every call is logged in ``events`` (shared)."""

    partitions: dict[int, list[bytes | None]]
    events: list[tuple] = field(default_factory=list)
    position: dict[int, int] = field(default_factory=dict)
    paused: set[int] = field(default_factory=set)
    commits: list[dict[tuple[str, int], int]] = field(default_factory=list)
    callbacks: dict[str, Any] = field(default_factory=dict)
    closed: bool = False

    def subscribe(self, topics: list[str], on_assign: Any = None, on_revoke: Any = None, on_lost: Any = None) -> None:
        self.callbacks = {"assign": on_assign, "revoke": on_revoke, "lost": on_lost}
        on_assign(self, self.assignment())

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in sorted(self.partitions)]

    def consume(self, n: int, timeout: float) -> list[FakeMessage]:
        out = []
        for p, values in sorted(self.partitions.items()):
            if p in self.paused:
                continue
            pos = self.position.get(p, 0)
            while pos < len(values) and len(out) < n:
                out.append(FakeMessage(TOPIC, p, pos, values[pos]))
                pos += 1
            self.position[p] = pos
        self.events.append(("consume", len(out), frozenset(self.paused)))
        return out

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        assert asynchronous is False, "commits must be synchronous"
        got = {(tp.topic, tp.partition): tp.offset for tp in offsets}
        self.commits.append(got)
        self.events.append(("commit", got))

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {tp.partition for tp in tps}
        self.events.append(("pause", sorted(tp.partition for tp in tps)))

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {tp.partition for tp in tps}
        self.events.append(("resume", sorted(tp.partition for tp in tps)))

    def close(self) -> None:
        self.closed = True

    def revoke(self, parts: list[int]) -> None:
        self.callbacks["revoke"](self, [TopicPartition(TOPIC, p) for p in parts])
        for p in parts:
            self.partitions.pop(p)


class FakeProducer:
    def __init__(self, events: list[tuple], fail: bool = False) -> None:
        self.events = events
        self.fail = fail
        self.sent: list[tuple[str, bytes, bytes | None]] = []
        self._pending: list[tuple[Any, tuple]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, on_delivery: Any = None) -> None:
        self._pending.append((on_delivery, (topic, value, key)))

    def _serve(self) -> None:
        pending, self._pending = self._pending, []
        for cb, item in pending:
            if self.fail:
                cb("broker away", None)
            else:
                self.sent.append(item)
                self.events.append(("deadletter", json.loads(item[1])["offset"]))
                cb(None, None)

    def poll(self, timeout: float = 0) -> int:
        self._serve()
        return 0

    def flush(self, timeout: float = 0) -> int:
        self._serve()
        return 0


class Handler:
    """Decodes JSON numbers; ``b"poison"`` is Rejected, ``b"deep"`` raises RecursionError; writes to a list."""

    def __init__(self, events: list[tuple], fail_writes: int = 0, refuse: set[int] | None = None) -> None:
        self.events = events
        self.fail_writes = fail_writes
        self.refuse = refuse or set()
        self.stored: list[int] = []

    def decode(self, msg: FakeMessage) -> tuple[int, int]:
        raw = msg.value()
        if raw == b"poison":
            raise Rejected("not a number")
        if raw == b"deep":
            raise RecursionError("maximum recursion depth exceeded")
        return json.loads(raw), 1

    def write(self, batch: Batch) -> None:
        if self.fail_writes:
            self.fail_writes -= 1
            self.events.append(("write-failed", len(batch)))
            raise Retry("store away")
        for e in batch.values():
            if e.value in self.refuse:
                e.reject(f"store refused {e.value}")
        values = [e.value for e in batch.values()]
        self.stored.extend(values)
        self.events.append(("write", tuple(values)))


def make_loop(partitions: dict[int, list[bytes | None]], handler: Handler | None = None, *, producer_fail: bool = False,
              batch_size: int = 100, shutdown_timeout_s: float = 5.0) -> tuple[ConsumeLoop, FakeConsumer, Handler,
                                                                                 FakeProducer]:
    events: list[tuple] = []
    consumer = FakeConsumer(partitions, events)
    handler = handler or Handler(events)
    handler.events = events
    producer = FakeProducer(events, fail=producer_fail)
    loop = ConsumeLoop(handler, deadletter_topic=DLQ, consumer=consumer, producer_factory=lambda: producer,
                       settings=LoopSettings(max_poll_messages=100, flush_interval_s=0.0, batch_size=batch_size,
                                             shutdown_timeout_s=shutdown_timeout_s, backoff=lambda n: 0.01,
                                             idle_slice_s=0.005, deadletter_flush_s=0.1))
    loop.subscribe([TOPIC])
    return loop, consumer, handler, producer


def _nums(*values: int) -> list[bytes | None]:
    return [str(v).encode() for v in values]


def test_offsets_are_committed_only_after_the_write_that_covers_them() -> None:
    loop, consumer, handler, _ = make_loop({0: _nums(1, 2, 3), 1: _nums(4, 5)})
    loop.step()
    kinds = [e[0] for e in consumer.events if e[0] in ("write", "commit")]
    assert kinds == ["write", "commit"]
    assert consumer.commits == [{(TOPIC, 0): 3, (TOPIC, 1): 2}]  # exactly the next offsets of what was written
    assert sorted(handler.stored) == [1, 2, 3, 4, 5]
    # More input: the next commit again follows its own write and covers it exactly.
    consumer.partitions[0].extend(_nums(6))
    loop.step()
    assert consumer.events[-2][0] == "write" and consumer.events[-1] == ("commit", {(TOPIC, 0): 4})


def test_a_failed_write_commits_nothing_pauses_and_is_retried_then_resumes() -> None:
    events: list[tuple] = []
    loop, consumer, handler, _ = make_loop({0: _nums(1, 2), 1: _nums(3)}, Handler(events, fail_writes=3))
    loop.step()
    names = [e[0] for e in consumer.events]
    assert names.count("write-failed") == 3 and names.count("write") == 1
    first_commit = names.index("commit")
    assert first_commit > names.index("write"), "a commit came before the write succeeded"
    assert consumer.commits == [{(TOPIC, 0): 2, (TOPIC, 1): 1}]
    # Paused from the first failure to the success; the consumer kept polling meanwhile (group membership).
    pause, resume = names.index("pause"), names.index("resume")
    assert names.index("write-failed") < pause < names.index("write") < resume
    polls_while_paused = [e for e in consumer.events[pause:resume] if e[0] == "consume"]
    assert polls_while_paused and all(e[2] == {0, 1} for e in polls_while_paused)
    assert not consumer.paused
    assert sorted(handler.stored) == [1, 2, 3]


def test_poison_is_dead_lettered_whole_with_its_reason_and_the_loop_goes_on() -> None:
    payload = b"poison"
    loop, consumer, handler, producer = make_loop({0: [b"1", payload, b"2", b"deep", b"3"]})
    loop.step()
    assert handler.stored == [1, 2, 3]
    letters = [json.loads(v) for _t, v, _k in producer.sent]
    assert [(d["offset"], d["source"]) for d in letters] == [(1, TOPIC), (3, TOPIC)]
    assert letters[0]["reason"] == "not a number"
    assert "RecursionError" in letters[1]["reason"]
    for d, raw in zip(letters, (payload, b"deep")):
        got = d["raw"].encode() if d.get("raw_encoding", "text") == "text" else base64.b64decode(d["raw"])
        assert got == raw and d["raw_bytes"] == len(raw) and not d["raw_truncated"]
    assert all(t == DLQ for t, _v, _k in producer.sent)
    assert consumer.commits == [{(TOPIC, 0): 5}]  # past the poison, once its dead letters were delivered
    names = [e[0] for e in consumer.events]
    assert max(i for i, n in enumerate(names) if n == "deadletter") < names.index("commit")


def test_undelivered_dead_letters_hold_the_commit_back() -> None:
    loop, consumer, _handler, producer = make_loop({0: [b"1", b"poison"]}, producer_fail=True,
                                                   shutdown_timeout_s=0.05)
    loop.stop()  # so the retries end at the (short) deadline
    assert loop.flush() is True  # nothing read yet
    loop.poll(0)
    assert loop.flush() is False
    assert consumer.commits == [] and producer.sent == []
    producer.fail = False
    loop.stop_at = None
    loop.stopping.clear()
    assert loop.flush() is True
    assert consumer.commits == [{(TOPIC, 0): 2}] and len(producer.sent) == 1


def test_a_message_the_store_refuses_is_dead_lettered_and_committed_past() -> None:
    events: list[tuple] = []
    loop, consumer, handler, producer = make_loop({0: _nums(1, 2, 3)}, Handler(events, refuse={2}))
    loop.step()
    assert handler.stored == [1, 3]
    assert [json.loads(v)["reason"] for _t, v, _k in producer.sent] == ["store refused 2"]
    assert consumer.commits == [{(TOPIC, 0): 3}]


def test_stopping_while_the_write_keeps_failing_commits_nothing() -> None:
    events: list[tuple] = []
    loop, consumer, handler, _ = make_loop({0: _nums(1, 2)}, Handler(events, fail_writes=10**6),
                                           shutdown_timeout_s=0.1)
    loop.poll(0)
    loop.stop()
    loop.run()  # stopping at once: only the last flush, bounded by the shutdown deadline
    assert consumer.commits == [] and handler.stored == []
    assert not consumer.paused  # resumed on the way out


def test_a_revoke_while_the_write_fails_drops_those_messages_uncommitted() -> None:
    events: list[tuple] = []
    handler = Handler(events, fail_writes=2)
    loop, consumer, handler, _ = make_loop({0: _nums(1, 2), 1: _nums(3)}, handler)
    loop.poll(0)
    assert len(loop.batch) == 3
    consumer.revoke([1])  # the rebalance callback: cannot write now (store away), so partition 1 is dropped
    assert [e.partition for e in loop.batch.entries] == [0, 0]
    loop.flush()
    assert consumer.commits == [{(TOPIC, 0): 2}]
    assert handler.stored == [1, 2]


def test_a_revoke_writes_and_commits_what_it_can_at_once() -> None:
    loop, consumer, handler, _ = make_loop({0: _nums(1), 1: _nums(2)})
    loop.poll(0)
    consumer.revoke([0, 1])
    assert consumer.commits == [{(TOPIC, 0): 1, (TOPIC, 1): 1}] and sorted(handler.stored) == [1, 2]
    assert len(loop.batch) == 0


@pytest.mark.parametrize("size", [1, 3])
def test_a_full_batch_is_written_before_its_interval(size: int) -> None:
    loop, consumer, handler, _ = make_loop({0: _nums(1, 2, 3)}, batch_size=size)
    loop.settings = LoopSettings(**{**loop.settings.__dict__, "flush_interval_s": 3600.0})
    loop.poll(0)
    assert loop.due() is (len(loop.batch) >= size)
    loop.flush()
    assert consumer.commits == [{(TOPIC, 0): 3}]
