"""Triton kernels for Qwen3.8, each beside a plain-torch reference of the same signature.

One subpackage per op; import the op from its subpackage (this module imports nothing):

- `paged_attention`: `write_kv_cache`, `paged_attention_prefill`, `paged_attention_decode`,
  `paged_attention_block` (a block drafter's rows)
- `rms_norm`: `rms_norm` ((1+w) form, optional residual add), `gated_rms_norm` (norm, then silu(z))
- `rotary`: `apply_rotary` (in place, partial, rotate_half style)
- `qk_norm_rotary`: `qk_norm_rotary` (q/k head norms, partial rotary and the KV-cache write)
- `linear`: `linear` (skinny GEMM or cuBLAS per shape), `skinny_gemm`
- `gated_delta_rule`, `causal_conv1d`: the Gated-DeltaNet mixer's kernels
- `tuning`: `KernelTuning` (dependent launch, the linear shape table) and `kernel_tuning(...)`,
  the launch choices a caller passes to the kernels it runs

Each `<op>` has an `<op>_ref` in plain torch (fp32 accumulate) that is its specification.
"""
