"""Causal depthwise conv1d + SiLU for Gated-DeltaNet: varlen prefill, decode update, references.

Until the Triton launchers land, the fast entry points are the references themselves (same
signature, same results, slower).
"""

from sparkinfer.kernels.causal_conv1d.ref import causal_conv1d_ref, causal_conv1d_update_ref

causal_conv1d = causal_conv1d_ref
causal_conv1d_update = causal_conv1d_update_ref

__all__ = ["causal_conv1d", "causal_conv1d_ref", "causal_conv1d_update", "causal_conv1d_update_ref"]
