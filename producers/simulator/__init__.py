"""Eroica producers/simulator."""
