"""Gated-DeltaNet linear attention: chunked prefill, recurrent decode, gates, and their references.

- ``chunk_gated_delta_rule``: varlen prefill, chunk 64 in WY/UT form (chunk.py).
- ``fused_recurrent_gated_delta_rule``: one decode token per sequence, gates fused (recurrent.py).
- ``fused_recurrent_gated_delta_rule_verify`` / ``_commit``: a speculative verify's positions in one
  launch with the state left as it was, then the accepted positions replayed into it (verify.py).
- ``gdn_gating``: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b) in fp32 (gating.py).
Each ``<op>_ref`` (ref.py) has the same signature and is the specification.
"""

from sparkinfer.kernels.gated_delta_rule.chunk import chunk_gated_delta_rule
from sparkinfer.kernels.gated_delta_rule.gating import gdn_gating
from sparkinfer.kernels.gated_delta_rule.recurrent import fused_recurrent_gated_delta_rule
from sparkinfer.kernels.gated_delta_rule.ref import (
    chunk_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule_commit_ref,
    fused_recurrent_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule_verify_ref,
    gdn_gating_ref,
)
from sparkinfer.kernels.gated_delta_rule.verify import (
    fused_recurrent_gated_delta_rule_commit,
    fused_recurrent_gated_delta_rule_verify,
)

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_ref",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_commit",
    "fused_recurrent_gated_delta_rule_commit_ref",
    "fused_recurrent_gated_delta_rule_ref",
    "fused_recurrent_gated_delta_rule_verify",
    "fused_recurrent_gated_delta_rule_verify_ref",
    "gdn_gating",
    "gdn_gating_ref",
]
