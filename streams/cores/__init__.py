"""The stream workers' pure cores (no faust, no Kafka client, no clock): what the faust glue in ``streams/faust`` runs.

- ``summariser_core.py``: one raw partition's frames -> window digests
  (:class:`~.summariser_core.PartitionSummariser`: watermarks, holds, idle closing);
- ``detector_core.py``: one digests partition -> job windows -> verdicts and window
  summaries (:class:`~.detector_core.DetectorCore`, the persisted :class:`~.detector_core.JobState`);
- ``coverage.py``: how far a job's expected keys are covered, kept per message (the detector's
  completeness test without a pass over every source);
- ``ingest.py``: contract JSON Lines from outside collectors -> frames and dead letters;
- ``broker_watch.py``: probe results -> outages, a silence between two answers counted as one
  (what both workers hold back idle closes and forced windows on);
- ``digest_messages.py``: the messages of the digests topic (summariser or edge node -> detector);
- ``step.py``: what each call returns (:class:`~.step.Step`: sends, job states to persist, acks).

The detection itself is ``streams/detection`` (``digest_window``, ``detect_step``).
"""
