"""Triton kernels for Qwen3.8, each beside a plain-torch reference."""
