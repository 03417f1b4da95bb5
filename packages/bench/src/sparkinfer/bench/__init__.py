"""sparkinfer-bench: serving, prefill, kernel and determinism benchmarks."""
