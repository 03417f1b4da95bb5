"""q/k (1+w) RMSNorm, partial rotary and the KV-cache write of an attention layer, fused."""

from sparkinfer.kernels.qk_norm_rotary.fused import qk_norm_rotary
from sparkinfer.kernels.qk_norm_rotary.ref import qk_norm_rotary_ref

__all__ = ["qk_norm_rotary", "qk_norm_rotary_ref"]
