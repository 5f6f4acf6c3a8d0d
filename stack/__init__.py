"""Eroica stack."""
