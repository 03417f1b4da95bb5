"""Zero-centred (1+w) RMSNorm with residual add, and the gated RMSNorm of Gated-DeltaNet."""

from sparkinfer.kernels.rms_norm.fused import gated_rms_norm, rms_norm
from sparkinfer.kernels.rms_norm.ref import gated_rms_norm_ref, rms_norm_ref

__all__ = ["gated_rms_norm", "gated_rms_norm_ref", "rms_norm", "rms_norm_ref"]
