"""Eroica benchmarks: detection accuracy against ground truth, and throughput."""
