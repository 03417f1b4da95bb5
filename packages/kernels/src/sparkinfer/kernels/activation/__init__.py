"""Activations: SwiGLU, silu(gate) * up over the [gate | up] halves of the fused gate_up_proj,
and gated attention's output gate, x * sigmoid(gate)."""

from sparkinfer.kernels.activation.fused import silu_and_mul
from sparkinfer.kernels.activation.ref import sigmoid_gate_ref, silu_and_mul_ref
from sparkinfer.kernels.activation.sigmoid_gate import sigmoid_gate

__all__ = ["sigmoid_gate", "sigmoid_gate_ref", "silu_and_mul", "silu_and_mul_ref"]
