"""The contract (``../shared/spec/telemetry-v1.md``) and the verdict: records, validation with a reason
per invalid record, the JSON Lines reader, columnar batches, digests, dead letters.
"""
