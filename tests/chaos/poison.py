"""The poison case, shared by the chaos modules: hostile messages on every consumed topic around a valid job."""

from __future__ import annotations

import time

from chaos.harness import (ChaosStack, Job, check_job, deadletter_sources, publish_clock_poison, publish_poison,
                           replay_with)


def poison_case(stack: ChaosStack, job: Job, broker: str) -> None:
    """Poison on raw, ingest, summaries, verdicts and patterns; each consumer dead-letters it and goes on.

    Besides undecodable messages, valid records of the job itself stamped 2100 and 1970 go to ingest and
    raw (before and during the replay): they are dead-lettered with their reason or dropped as late. The
    valid job replayed at the same time must still give exactly ``analyze``'s verdicts, and every
    poisoned topic must show up as the source of dead letters (keys and reasons kept).
    """
    k = stack.kafka_config()
    topics = [k.raw_topic, k.ingest_topic, k.digests_topic, k.verdicts_topic, k.window_summaries_topic]
    t0 = time.monotonic()
    publish_poison(k.bootstrap, topics)
    publish_clock_poison(k.bootstrap, k.ingest_topic, k.raw_topic, job.name)

    def mid_replay() -> None:
        publish_poison(k.bootstrap, topics)
        publish_clock_poison(k.bootstrap, k.ingest_topic, k.raw_topic, job.name)

    replay_with(stack, job, [(1.0, mid_replay)])
    result = check_job(stack, job, "poison on every topic", broker, t0)

    def sources(letters: list[dict]) -> set[str]:
        """The poisoned topics named by dead letters (``source`` is ``topic``, ``topic/partition`` or ``...@offset``)."""
        return {t for t in topics for d in letters if str(d.get("source", "")).split("/")[0] == t}

    letters = deadletter_sources(k.bootstrap, k.deadletter_topic, lambda got: sources(got) == set(topics))
    assert sources(letters) == set(topics), f"topics without dead letters: {set(topics) - sources(letters)}"
    assert all(d.get("reason") for d in letters)
    clock = deadletter_sources(k.bootstrap, k.deadletter_topic,
                               lambda got: any("after its arrival" in str(d.get("reason")) for d in got))
    assert any("after its arrival" in str(d.get("reason")) for d in clock), "no record stamped 2100 dead-lettered"
    print(f"  dead letters: {len(letters)} from {len(sources(letters))} topics; {result.line()}")
