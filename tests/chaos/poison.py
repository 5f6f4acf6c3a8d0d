"""The poison case, shared by the chaos modules: hostile messages on every consumed topic around a valid job."""

from __future__ import annotations

import time

from chaos.harness import ChaosStack, Job, check_job, deadletter_sources, publish_poison, replay_with


def poison_case(stack: ChaosStack, job: Job, broker: str) -> None:
    """Poison on raw, ingest, summaries, verdicts and patterns; each consumer dead-letters it and goes on.

    The valid job replayed at the same time must still give exactly ``analyze``'s verdicts, and every
    poisoned topic must show up as the source of dead letters (keys and reasons kept).
    """
    k = stack.kafka_config()
    topics = [k.raw_topic, k.ingest_topic, k.digests_topic, k.verdicts_topic, k.window_summaries_topic]
    t0 = time.monotonic()
    publish_poison(k.bootstrap, topics)
    replay_with(stack, job, [(1.0, lambda: publish_poison(k.bootstrap, topics))])
    result = check_job(stack, job, "poison on every topic", broker, t0)

    def sources(letters: list[dict]) -> set[str]:
        """The poisoned topics named by dead letters (``source`` is ``topic``, ``topic/partition`` or ``...@offset``)."""
        return {t for t in topics for d in letters if str(d.get("source", "")).split("/")[0] == t}

    letters = deadletter_sources(k.bootstrap, k.deadletter_topic, lambda got: sources(got) == set(topics))
    assert sources(letters) == set(topics), f"topics without dead letters: {set(topics) - sources(letters)}"
    assert all(d.get("reason") for d in letters)
    print(f"  dead letters: {len(letters)} from {len(sources(letters))} topics; {result.line()}")
