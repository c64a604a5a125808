"""Benchmarks: scripts that time our code next to its baseline (run as `python -m benchmarks.NAME`)."""
