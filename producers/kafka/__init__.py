"""Eroica producers/kafka."""
