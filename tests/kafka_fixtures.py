"""Kafka-protocol broker fixtures (tansu here, testcontainers when Docker is reachable)."""
