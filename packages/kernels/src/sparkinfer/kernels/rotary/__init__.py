"""Partial rotary embedding applied in place to q and k (rotate_half style)."""

from sparkinfer.kernels.rotary.fused import apply_rotary
from sparkinfer.kernels.rotary.ref import apply_rotary_ref

__all__ = ["apply_rotary", "apply_rotary_ref"]
