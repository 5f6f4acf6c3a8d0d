"""Eroica sinks."""
