"""Eroica models."""
