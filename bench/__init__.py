"""Benchmarks: each prints a ratio against a peer measured in the same run and writes bench/results/<name>.json."""
