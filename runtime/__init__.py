"""Process-level services every Eroica process shares, whatever its role.

Prometheus metrics (:mod:`.metrics`), repeat-limited logging (:mod:`.logfilter`),
the data directory and the single-machine stack's state file (:mod:`.state`),
the retries' exponential backoff (:mod:`.backoff`), and small OS helpers,
``/proc`` readings of a process included (:mod:`.system`). Imports :mod:`eroica.models` at most,
never a role, the Kafka layer or the stack (README, "Layers").
"""
