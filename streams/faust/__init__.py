"""Eroica streams/faust."""
