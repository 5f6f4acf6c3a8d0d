"""Eroica streams/detection."""
