"""Causal depthwise conv1d + SiLU for Gated-DeltaNet: varlen prefill, decode update, references.

- ``causal_conv1d``: varlen prefill, conv state in and out per slot (fused.py).
- ``causal_conv1d_update``: one decode token per sequence, window shifted in place (fused.py).
Each ``<op>_ref`` (ref.py) has the same signature and is the specification.
"""

from sparkinfer.kernels.causal_conv1d.fused import causal_conv1d, causal_conv1d_update
from sparkinfer.kernels.causal_conv1d.ref import causal_conv1d_ref, causal_conv1d_update_ref

__all__ = ["causal_conv1d", "causal_conv1d_ref", "causal_conv1d_update", "causal_conv1d_update_ref"]
