"""Gated DeltaNet linear attention with conv and recurrent state per slot (docs/model.md §5).

in_proj gives [q | k | v | z | b | a] in one GEMM (the checkpoint's in_proj_qkv, in_proj_z,
in_proj_b and in_proj_a, stacked by rows in weights.py). Its output is split by views, no copies:
the conv, gating and recurrent kernels read strided rows, the gated norm strided heads. Only the
[q | k | v] channels go through the causal conv and SiLU.
Gates: g = -exp(A_log) * softplus(a + dt_bias) (fp32), beta = sigmoid(b). q and k are
l2-normalised inside the kernel, q scaled by K^-0.5; value head j reads key head j // (HV / H).
The output goes through the gated RMSNorm with z, then out_proj; at decode the recurrent op
applies that norm (inside its kernel up to 4 sequences, which saves a launch per layer).
A speculative verify step runs each sequence's positions through the verify kernels without
writing the state; `commit_verify` then applies the accepted positions (docs/model.md §5).
"""

from __future__ import annotations

import torch
from sparkinfer.kernels.fp8_linear import Fp8Activation
from sparkinfer.model.cache_spec import LinearStateCache
from sparkinfer.model.config import TextConfig
from sparkinfer.model.forward_batch import ForwardBatch, VerifyLayout
from sparkinfer.model.layers import KernelOps, new_parameter
from sparkinfer.model.layers.linear import Linear
from sparkinfer.model.layers.norm import GatedRMSNorm
from torch import nn


class DepthwiseConvWeight(nn.Module):
    """Holds `conv1d.weight` [conv_dim, 1, kernel] as stored; the conv runs in the kernels."""

    def __init__(self, channels: int, width: int, *, device: torch.device, dtype: torch.dtype):
        super().__init__()
        self.weight = new_parameter(channels, 1, width, device=device, dtype=dtype)


class GatedDeltaNet(nn.Module):
    """One linear-attention mixer (`linear_attn.*` in the checkpoint).

    A_log and dt_bias are kept in fp32 whatever the model dtype: the gates are computed in fp32.
    """

    def __init__(
        self,
        config: TextConfig,
        layer_idx: int,
        *,
        ops: KernelOps,
        device: torch.device,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.k_head_dim = config.linear_key_head_dim
        self.v_head_dim = config.linear_value_head_dim
        self.key_dim, self.value_dim = config.linear_key_dim, config.linear_value_dim
        self.ops = ops
        dims = {"ops": ops, "device": device, "dtype": dtype}
        hidden, self.conv_dim = config.hidden_size, config.linear_conv_dim
        self.in_proj_sizes = (self.conv_dim, self.value_dim, self.num_v_heads, self.num_v_heads)
        self.in_proj = Linear(hidden, sum(self.in_proj_sizes), **dims)
        self.conv1d = DepthwiseConvWeight(
            self.conv_dim, config.linear_conv_kernel_dim, device=device, dtype=dtype
        )
        self.dt_bias = new_parameter(self.num_v_heads, device=device, dtype=torch.float32)
        self.A_log = new_parameter(self.num_v_heads, device=device, dtype=torch.float32)
        self.norm = GatedRMSNorm(self.v_head_dim, config.rms_norm_eps, **dims)
        self.out_proj = Linear(self.value_dim, hidden, **dims)

    def _split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[T, conv_dim] -> q, k [T, H, K] and v [T, HV, V]."""
        num_tokens = qkv.shape[0]
        q, k, v = qkv.split((self.key_dim, self.key_dim, self.value_dim), dim=-1)
        return (
            q.reshape(num_tokens, self.num_k_heads, self.k_head_dim),
            k.reshape(num_tokens, self.num_k_heads, self.k_head_dim),
            v.reshape(num_tokens, self.num_v_heads, self.v_head_dim),
        )

    def _verify_positions(
        self,
        qkv: torch.Tensor,
        z: torch.Tensor,
        gates: torch.Tensor,
        conv_weight: torch.Tensor,
        state: LinearStateCache,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        """A verify step (`VerifyLayout`): each sequence's positions in one launch of the verify
        kernels, each row with the numerics of a one-token step there, the slot's state left
        as it was; the rows' inputs go to the layer's `VerifyStash` for `commit_verify`.
        -> [T, HV, V]."""
        verify, stash = batch.verify, state.verify
        assert verify is not None
        if stash is None or stash.conv_in.shape[0] < qkv.shape[0]:
            have = 0 if stash is None else stash.conv_in.shape[0]
            raise ValueError(
                f"a verify step of {qkv.shape[0]} rows needs a VerifyStash of that many rows in "
                f"layer {self.layer_idx}'s cache, which has {have}: allocate the caches with "
                "num_verify_rows (allocate_caches)"
            )
        num_rows = qkv.shape[0]
        stash.gates[:num_rows].copy_(gates)  # b and a in one copy
        b, a = gates.split(self.num_v_heads, dim=-1)
        layout = {"state_slots": verify.seq_slots, "verify_rows": verify.seq_rows}
        # The conv keeps its inputs and outputs in the stash itself (no copy launches).
        x = self.ops.causal_conv1d_verify(
            qkv, conv_weight, state.conv, **layout,
            out=stash.conv_out[:num_rows], x_out=stash.conv_in[:num_rows],
        )  # fmt: skip
        q, k, v = self._split_qkv(x)
        # early_state as at decode (the conv before writes no state): the decode kernel's own
        # build, so inside batch_invariant each row has the bits of a decode step.
        return self.ops.fused_recurrent_gated_delta_rule_verify(
            q, k, v, a, b, self.A_log, self.dt_bias, state.recurrent, **layout,
            norm_gate=z, norm_weight=self.norm.weight, norm_eps=self.norm.eps, early_state=True,
        )  # fmt: skip

    def commit_verify(
        self, state: LinearStateCache, verify: VerifyLayout, num_kept: torch.Tensor
    ) -> None:
        """After a verify step: apply each sequence's first num_kept[i] positions (its input
        token and accepted drafts) to the conv and recurrent state in its slot, from the
        layer's `VerifyStash`, with the decode kernels' arithmetic: the state is then what that
        many one-token steps leave. num_kept: [B] int64 (0: the state stays)."""
        stash = state.verify
        if stash is None:
            raise ValueError(
                f"layer {self.layer_idx}'s cache has no VerifyStash to commit a verify step "
                "from: allocate the caches with num_verify_rows (allocate_caches)"
            )
        layout = {"state_slots": verify.seq_slots, "verify_rows": verify.seq_rows}
        self.ops.causal_conv1d_commit(stash.conv_in, state.conv, **layout, num_kept=num_kept)
        _, k, v = self._split_qkv(stash.conv_out)
        # early_state as at decode (the conv commit before writes no recurrent state)
        self.ops.fused_recurrent_gated_delta_rule_commit(
            k, v, stash.a, stash.b, self.A_log, self.dt_bias, state.recurrent, **layout,
            num_kept=num_kept, early_state=True,
        )  # fmt: skip

    def forward(
        self,
        x: torch.Tensor,
        batch: ForwardBatch,
        output_rows: torch.Tensor | None = None,
        x_fp8: Fp8Activation | None = None,
    ) -> torch.Tensor:
        """x [T, hidden] (normed) -> [T, hidden], or [N, hidden] at output_rows (the gated norm
        and out_proj run on those rows only); updates the conv and recurrent state slots. x_fp8:
        x quantized for an FP8 in_proj."""
        num_tokens = x.shape[0]
        # pre-conv [q | k | v] [T, conv_dim], z [T, value_dim], b and a [T, HV]
        projected = self.in_proj(x, x_fp8)
        qkv, z, b, a = projected.split(self.in_proj_sizes, dim=-1)
        z = z.view(num_tokens, self.num_v_heads, self.v_head_dim)
        conv_weight = self.conv1d.weight.squeeze(1)  # [conv_dim, kernel]
        state = batch.caches.linear[self.layer_idx]
        if batch.verify is not None:
            gates = projected[:, -2 * self.num_v_heads :]  # [b | a]
            o = self._verify_positions(qkv, z, gates, conv_weight, state, batch)
            if output_rows is not None:
                o = o[output_rows]
        elif batch.is_decode:
            # early_state: the kernel before each (in_proj, then the conv) writes neither the
            # slots nor the state rows, so they are read while it runs.
            qkv = self.ops.causal_conv1d_update(
                qkv, conv_weight, state.conv, state_slots=batch.state_slots, early_state=True
            )
            q, k, v = self._split_qkv(qkv)
            o = self.ops.fused_recurrent_gated_delta_rule(
                q, k, v, a, b, self.A_log, self.dt_bias, state.recurrent,
                state_slots=batch.state_slots,
                norm_gate=z, norm_weight=self.norm.weight, norm_eps=self.norm.eps,
                early_state=True,
            )  # fmt: skip
            if output_rows is not None:
                o = o[output_rows]
        else:
            has_initial_state = batch.has_initial_state_mask
            qkv = self.ops.causal_conv1d(
                qkv,
                conv_weight,
                state.conv,
                cu_seqlens=batch.cu_seqlens,
                state_slots=batch.state_slots,
                has_initial_state=has_initial_state,
            )
            q, k, v = self._split_qkv(qkv)
            g, beta = self.ops.gdn_gating(a, b, self.A_log, self.dt_bias)
            o = self.ops.chunk_gated_delta_rule(
                q, k, v, g, beta, state.recurrent,
                cu_seqlens=batch.cu_seqlens,
                state_slots=batch.state_slots,
                has_initial_state=has_initial_state,
                index_cache=batch.index_cache,
            )  # fmt: skip
            if output_rows is not None:
                o, z = o[output_rows], z[output_rows]
            o = self.norm(o, z)  # [T or N, HV, V]
        return self.out_proj(o.reshape(-1, self.value_dim))
