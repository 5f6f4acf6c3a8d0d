"""Eroica cli."""
