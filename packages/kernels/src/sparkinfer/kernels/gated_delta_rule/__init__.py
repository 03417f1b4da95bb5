"""Gated-DeltaNet linear attention: chunked prefill, recurrent decode, gates, and their references.

Until the Triton launchers land, the fast entry points are the references themselves (same
signature, same results, slower).
"""

from sparkinfer.kernels.gated_delta_rule.ref import (
    chunk_gated_delta_rule_ref,
    fused_recurrent_gated_delta_rule_ref,
    gdn_gating_ref,
)

chunk_gated_delta_rule = chunk_gated_delta_rule_ref
fused_recurrent_gated_delta_rule = fused_recurrent_gated_delta_rule_ref
gdn_gating = gdn_gating_ref

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_ref",
    "fused_recurrent_gated_delta_rule",
    "fused_recurrent_gated_delta_rule_ref",
    "gdn_gating",
    "gdn_gating_ref",
]
