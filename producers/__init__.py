"""Eroica producers."""
