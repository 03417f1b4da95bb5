"""Zero-centred RMSNorm with residual add (also with its output quantized to e4m3 per token and
128-column group, for an FP8 linear after it), and the gated RMSNorm of Gated-DeltaNet."""

from sparkinfer.kernels.rms_norm.fused import gated_rms_norm, rms_norm
from sparkinfer.kernels.rms_norm.quantize_fp8 import rms_norm_quantize_fp8
from sparkinfer.kernels.rms_norm.ref import (
    gated_rms_norm_ref,
    rms_norm_quantize_fp8_ref,
    rms_norm_ref,
)

__all__ = [
    "gated_rms_norm",
    "gated_rms_norm_ref",
    "rms_norm",
    "rms_norm_quantize_fp8",
    "rms_norm_quantize_fp8_ref",
    "rms_norm_ref",
]
