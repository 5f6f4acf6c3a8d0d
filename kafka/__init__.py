"""The shared Kafka layer: configuration, admin, clients, the consume loop, framing, dead letters, the publisher.

Every role that talks to Kafka (producers, streams, sinks) and the stack use
it; it imports only :mod:`eroica.models` and :mod:`eroica.runtime`.
"""
