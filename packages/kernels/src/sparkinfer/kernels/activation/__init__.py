"""SwiGLU activation: silu(gate) * up over the [gate | up] halves of the fused gate_up_proj."""

from sparkinfer.kernels.activation.fused import silu_and_mul
from sparkinfer.kernels.activation.ref import silu_and_mul_ref

__all__ = ["silu_and_mul", "silu_and_mul_ref"]
