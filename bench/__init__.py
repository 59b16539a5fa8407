"""Benchmarks: ``python -m bench [NAME ...]`` (``make bench``). Results print as ratios and
percentiles and are written to ``bench/results/NAME.json``."""
