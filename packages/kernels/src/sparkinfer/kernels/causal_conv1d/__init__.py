"""Causal depthwise conv1d + SiLU for Gated-DeltaNet: varlen prefill, decode update, references.

- ``causal_conv1d``: varlen prefill, conv state in and out per slot (fused.py).
- ``causal_conv1d_update``: one decode token per sequence, window shifted in place (fused.py).
- ``causal_conv1d_verify`` / ``causal_conv1d_commit``: a speculative verify's positions in one
  launch with the window left as it was, then the accepted inputs shifted in (verify.py).
Each ``<op>_ref`` (ref.py) has the same signature and is the specification.
"""

from sparkinfer.kernels.causal_conv1d.fused import causal_conv1d, causal_conv1d_update
from sparkinfer.kernels.causal_conv1d.ref import (
    causal_conv1d_commit_ref,
    causal_conv1d_ref,
    causal_conv1d_update_ref,
    causal_conv1d_verify_ref,
)
from sparkinfer.kernels.causal_conv1d.verify import causal_conv1d_commit, causal_conv1d_verify

__all__ = [
    "causal_conv1d",
    "causal_conv1d_commit",
    "causal_conv1d_commit_ref",
    "causal_conv1d_ref",
    "causal_conv1d_update",
    "causal_conv1d_update_ref",
    "causal_conv1d_verify",
    "causal_conv1d_verify_ref",
]
