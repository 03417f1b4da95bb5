"""Recurrent gated delta rule for speculative verify: every position of a sequence in one launch,
the state left as it was; then a commit that replays the accepted positions into the slot.

`fused_recurrent_gated_delta_rule_verify`: one program per (V block, sequence x value head) reads
its [BV, K] tile of the fp32 state once, runs the sequence's T positions one after the other in
registers, writes each position's output and never writes the state back: the slot keeps the
state before the step, whatever the sampler then accepts.
`fused_recurrent_gated_delta_rule_commit`: after acceptance the same programs apply a sequence's
first `num_kept` positions (its input token and the accepted drafts) to the state in its slot,
from the post-conv k, v and the gate inputs a, b the verify read (the caller keeps them).

Both are launches of the decode kernel `_fused_recurrent_kernel` (recurrent.py) with the decode
launcher's tile choice (`decode_tiling`): T positions from a row list with the outputs stored,
then num_kept positions with the state stored. With the same `early_state` as decode and the
gated norm after (as decode runs it inside `batch_invariant`, and outside it above
NORM_IN_KERNEL_MAX_SEQS sequences) a verify row has the bits of a one-token decode step at that
position and the state after the commit the bits of num_kept decode steps: one compiled kernel
does all three.

State traffic per sequence and step for a [HV, V, K] fp32 state of S bytes: S read by the verify,
S read and S written by the commit (3 S), against (T + 1) S read and written position by position
plus a copy per position to a roll-back row.
"""

import torch
from sparkinfer.kernels._triton import check_contiguous, check_device, check_dtype, check_shape
from sparkinfer.kernels.gated_delta_rule.checks import check_qkv, check_state_pool
from sparkinfer.kernels.gated_delta_rule.gating import check_gate_inputs
from sparkinfer.kernels.gated_delta_rule.recurrent import _check_norm, launch_recurrent
from sparkinfer.kernels.rms_norm.fused import gated_rms_norm


def _check_layout(op: str, state_slots: torch.Tensor, verify_rows: torch.Tensor) -> None:
    check_dtype(op, "state_slots", state_slots, (torch.int64, torch.int32))
    check_contiguous(op, "state_slots", state_slots)
    check_dtype(op, "verify_rows", verify_rows, (torch.int64, torch.int32))
    if verify_rows.ndim != 2 or verify_rows.shape[0] != state_slots.shape[0]:
        raise ValueError(
            f"{op}: verify_rows has shape {list(verify_rows.shape)} for {state_slots.shape[0]} "
            "state slots; expected [B, T], one row of positions per sequence"
        )
    check_contiguous(op, "verify_rows", verify_rows)


def _check_rows(op: str, q_or_k, k, v, a, b, A_log, dt_bias, state) -> None:
    check_qkv(op, q_or_k, k, v, rows="N")
    check_state_pool(op, state, v, k.shape[2])
    check_gate_inputs(op, a, b, A_log, dt_bias)
    check_shape(op, "a", a, tuple(v.shape[:2]))


def fused_recurrent_gated_delta_rule_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    verify_rows: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    norm_gate: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    early_state: bool = False,
) -> torch.Tensor:
    """Each sequence's positions as consecutive decode tokens from its slot's state, which is
    left untouched.

    Args:
        q: [N, H, K] queries of every verified row (rows may be strided, heads dense).
        k: [N, H, K] keys.
        v: [N, HV, V] values; value head j reads key head j // (HV // H).
        a: [N, HV] raw decay projection; g = -exp(A_log) * softplus(a + dt_bias) in fp32.
        b: [N, HV] raw write-strength projection; beta = sigmoid(b).
        A_log: [HV] log decay rate.
        dt_bias: [HV] decay bias.
        state: [num_slots, HV, V, K] fp32 contiguous state pool (each head's S stored
            transposed); read only.
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (its rows zero).
        verify_rows: [B, T] int64 row of position t of sequence i, -1 past its last position;
            every row of N belongs to one (i, t).
        scale: query scale; defaults to K ** -0.5.
        use_qk_l2norm: l2-normalise q and k (fp32, eps 1e-6) inside the kernel.
        norm_gate: optional [N, HV, V] gate z: the output is then `gated_rms_norm(o,
            norm_gate, norm_weight, norm_eps)` of the plain output o, launched after.
        norm_weight: [V] the gated norm's weight; given together with norm_gate.
        norm_eps: the gated norm's variance epsilon.
        early_state: read the slots and states before waiting on the kernel launched just
            before (dependent launch), as decode does with it: the same tile as decode then.
            Pass True only when that kernel writes neither (the model's conv verify).

    Returns:
        o: [N, HV, V] in v.dtype.
    """
    op = "fused_recurrent_gated_delta_rule_verify"
    _check_rows(op, q, k, v, a, b, A_log, dt_bias, state)
    _check_layout(op, state_slots, verify_rows)
    tensors = {"q": q, "k": k, "v": v, "a": a, "b": b, "state": state}
    check_device(op, tensors | {"state_slots": state_slots, "verify_rows": verify_rows})
    if norm_gate is not None or norm_weight is not None:
        _check_norm(op, v, norm_gate, norm_weight)
    num_rows, _, head_k = q.shape
    num_v_heads, head_v = v.shape[1:]
    q_scale = head_k**-0.5 if scale is None else scale
    o = torch.empty(num_rows, num_v_heads, head_v, dtype=v.dtype, device=v.device)
    num_seqs = state_slots.shape[0]
    if num_rows and num_seqs:
        launch_recurrent(
            q, k, v, a, b, A_log, dt_bias, state, state_slots, o,
            seq_rows=verify_rows, num_kept=None, store_output=True, store_state=False,
            scale=q_scale, use_qk_l2norm=use_qk_l2norm, early_state=early_state,
        )  # fmt: skip
    if norm_gate is not None and norm_weight is not None:
        return gated_rms_norm(o, norm_gate, norm_weight, norm_eps)
    return o


def fused_recurrent_gated_delta_rule_commit(
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    *,
    state_slots: torch.Tensor,
    verify_rows: torch.Tensor,
    num_kept: torch.Tensor,
    use_qk_l2norm: bool = True,
    early_state: bool = False,
) -> None:
    """Apply each sequence's first num_kept positions of a verify to the state in its slot.

    Args:
        k: [N, H, K] the verify's keys (post-conv), by verify row.
        v: [N, HV, V] its values.
        a: [N, HV] its raw decay projection.
        b: [N, HV] its raw write-strength projection.
        A_log: [HV] log decay rate.
        dt_bias: [HV] decay bias.
        state: [num_slots, HV, V, K] fp32 contiguous state pool; row state_slots[i] advanced in
            place by num_kept[i] tokens.
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (skipped).
        verify_rows: [B, T] int64 row of position t of sequence i (as given to the verify).
        num_kept: [B] int64 positions to apply, 0 to T (0: the state stays).
        use_qk_l2norm: l2-normalise k (fp32, eps 1e-6), as the verify did.
        early_state: as for the verify (and decode): the same tile; True only when the kernel
            launched just before writes neither slots nor states (the model's conv commit).
    """
    op = "fused_recurrent_gated_delta_rule_commit"
    _check_rows(op, k, k, v, a, b, A_log, dt_bias, state)
    _check_layout(op, state_slots, verify_rows)
    check_dtype(op, "num_kept", num_kept, (torch.int64, torch.int32))
    check_shape(op, "num_kept", num_kept, tuple(state_slots.shape))
    check_contiguous(op, "num_kept", num_kept)
    tensors = {"k": k, "v": v, "a": a, "b": b, "state": state, "num_kept": num_kept}
    check_device(op, tensors | {"state_slots": state_slots, "verify_rows": verify_rows})
    if state_slots.shape[0] == 0 or k.shape[0] == 0:
        return
    launch_recurrent(
        k, k, v, a, b, A_log, dt_bias, state, state_slots, v,
        seq_rows=verify_rows, num_kept=num_kept, store_output=False, store_state=True,
        scale=1.0, use_qk_l2norm=use_qk_l2norm, early_state=early_state,
    )  # fmt: skip
