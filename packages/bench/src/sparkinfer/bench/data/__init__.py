"""Prompt data shipped with the benchmarks (see scripts/make_data.py)."""
