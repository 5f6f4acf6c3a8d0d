"""Eroica streams."""
