"""Plain-torch references for the gated delta rule: the specification the Triton kernels must match.

Each function here has the same signature as its fast twin. They accumulate in fp32, loop one
timestep at a time and are written for reading, not speed.
"""

import torch
import torch.nn.functional as F
from sparkinfer.kernels.rms_norm.ref import gated_rms_norm_ref

L2NORM_EPS = 1e-6


def l2norm_ref(x: torch.Tensor) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + 1e-6) over the last dim, in fp32 (the FLA and transformers form)."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def gdn_gating_ref(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated-DeltaNet gates from the raw projections.

    Args:
        a: [T, HV] raw decay projection (any float dtype).
        b: [T, HV] raw write-strength projection (any float dtype).
        A_log: [HV] log of the decay rate.
        dt_bias: [HV] bias added to ``a`` before the softplus.

    Returns:
        (g, beta): both [T, HV] fp32; g = -exp(A_log) * softplus(a + dt_bias) is the log-decay
        (g <= 0) and beta = sigmoid(b).
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    beta = b.float().sigmoid()
    return g, beta


def _prepare_qk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, scale: float | None, use_qk_l2norm: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Broadcast q, k [N, H, K] to value heads [N, HV, K] in fp32, l2-normalised, q scaled."""
    group = num_v_heads // q.shape[1]
    q = q.float().repeat_interleave(group, dim=1)
    k = k.float().repeat_interleave(group, dim=1)
    if use_qk_l2norm:
        q, k = l2norm_ref(q), l2norm_ref(k)
    q_scale: float = q.shape[-1] ** -0.5 if scale is None else scale
    return q * q_scale, k


def _delta_rule_step(
    S: torch.Tensor,
    q_t: torch.Tensor,
    k_t: torch.Tensor,
    v_t: torch.Tensor,
    g_t: torch.Tensor,
    beta_t: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for every value head.

    S [HV, K, V] fp32, q_t/k_t [HV, K], v_t [HV, V], g_t/beta_t [HV]. Returns (S_new, o_t [HV, V]).
    Decay first, read the memory from the decayed state, write the delta, then read out.
    """
    S = S * g_t.exp()[:, None, None]
    kv_mem = torch.einsum("hkv,hk->hv", S, k_t)  # [HV, V]
    delta = (v_t - kv_mem) * beta_t[:, None]
    S = S + k_t[:, :, None] * delta[:, None, :]
    o_t = torch.einsum("hkv,hk->hv", S, q_t)
    return S, o_t


def chunk_gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    index_cache: dict[str, tuple[torch.Tensor, ...]] | None = None,
) -> torch.Tensor:
    """Gated delta rule over a packed (varlen) prefill batch, one timestep at a time.

    Args:
        q: [T, H, K] queries.
        k: [T, H, K] keys.
        v: [T, HV, V] values; value head j reads key head j // (HV // H).
        g: [T, HV] fp32 log-decay (g <= 0).
        beta: [T, HV] write strength in (0, 1).
        state: [num_slots, HV, V, K] fp32 state pool, each head's S [K, V] stored transposed;
            updated in place.
        cu_seqlens: [B + 1] int32 sequence starts in the packed T dimension.
        state_slots: [B] int64 row of ``state`` per sequence; -1 is a padding row (state untouched,
            output zero).
        has_initial_state: [B] bool; True reads the initial state from the slot, False starts at 0.
        scale: query scale; defaults to K ** -0.5.
        use_qk_l2norm: l2-normalise q and k (fp32, eps 1e-6) before use.
        index_cache: unused here (the fast op keeps its chunk tables there between calls).

    Returns:
        o: [T, HV, V] in v.dtype. Each sequence's final state is written to ``state[slot]``.
    """
    num_v_heads = v.shape[1]
    o = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_slots.tolist()):
        if slot < 0:
            continue
        bos, eos = bounds[i], bounds[i + 1]
        qs, ks = _prepare_qk(q[bos:eos], k[bos:eos], num_v_heads, scale, use_qk_l2norm)
        vs, gs, betas = v[bos:eos].float(), g[bos:eos].float(), beta[bos:eos].float()
        if bool(has_initial_state[i]):
            S = state[slot].float().transpose(-1, -2).clone()
        else:
            shape = (num_v_heads, q.shape[2], v.shape[2])
            S = torch.zeros(shape, dtype=torch.float32, device=state.device)
        for t in range(eos - bos):
            S, o[bos + t] = _delta_rule_step(S, qs[t], ks[t], vs[t], gs[t], betas[t])
        state[slot] = S.transpose(-1, -2)
    return o.to(v.dtype)


def fused_recurrent_gated_delta_rule_ref(
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
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    norm_gate: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
    early_state: bool = False,
) -> torch.Tensor:
    """One decode token per sequence: gates, l2norm and the delta-rule step, state updated in place.

    Args:
        q: [B, H, K] queries.
        k: [B, H, K] keys.
        v: [B, HV, V] values; value head j reads key head j // (HV // H).
        a: [B, HV] raw decay projection; g = -exp(A_log) * softplus(a + dt_bias) in fp32.
        b: [B, HV] raw write-strength projection; beta = sigmoid(b).
        A_log: [HV] log decay rate.
        dt_bias: [HV] decay bias.
        state: [num_slots, HV, V, K] fp32 state pool, each head's S [K, V] stored transposed; row
            ``state_slots[i]`` updated in place.
        state_slots: [B] int64 slot per sequence; -1 is a padding row (skipped, output zero).
        scale: query scale; defaults to K ** -0.5.
        use_qk_l2norm: l2-normalise q and k (fp32, eps 1e-6) before use.
        norm_gate: optional [B, HV, V] gate z: the output is then
            `gated_rms_norm_ref(o, norm_gate, norm_weight, norm_eps)` of the plain output o.
        norm_weight: [V] the gated norm's weight; given together with norm_gate.
        norm_eps: the gated norm's variance epsilon.
        early_state: the fast op's launch option; no effect here.

    Returns:
        o: [B, HV, V] in v.dtype.
    """
    if (norm_gate is None) != (norm_weight is None):
        raise ValueError(
            "fused_recurrent_gated_delta_rule: give norm_gate and norm_weight together, or neither"
        )
    g, beta = gdn_gating_ref(a, b, A_log, dt_bias)
    qs, ks = _prepare_qk(q, k, v.shape[1], scale, use_qk_l2norm)
    o = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for i, slot in enumerate(state_slots.tolist()):
        if slot < 0:
            continue
        S = state[slot].float().transpose(-1, -2)
        S, o[i] = _delta_rule_step(S, qs[i], ks[i], v[i].float(), g[i], beta[i])
        state[slot] = S.transpose(-1, -2)
    if norm_gate is not None and norm_weight is not None:
        return gated_rms_norm_ref(o.to(v.dtype), norm_gate, norm_weight, norm_eps)
    return o.to(v.dtype)


def fused_recurrent_gated_delta_rule_verify_ref(
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
        q: [N, H, K] queries of every verified row.
        k: [N, H, K] keys.
        v: [N, HV, V] values; value head j reads key head j // (HV // H).
        a: [N, HV] raw decay projection.
        b: [N, HV] raw write-strength projection.
        A_log: [HV] log decay rate.
        dt_bias: [HV] decay bias.
        state: [num_slots, HV, V, K] fp32 state pool, each head's S [K, V] stored transposed;
            read only.
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (its rows zero).
        verify_rows: [B, T] int64 row of position t of sequence i, -1 past its last position.
        scale: query scale; defaults to K ** -0.5.
        use_qk_l2norm: l2-normalise q and k (fp32, eps 1e-6) before use.
        norm_gate: optional [N, HV, V] gate z: the output is then
            `gated_rms_norm_ref(o, norm_gate, norm_weight, norm_eps)` of the plain output o.
        norm_weight: [V] the gated norm's weight; given together with norm_gate.
        norm_eps: the gated norm's variance epsilon.
        early_state: the fast op's launch option; no effect here.

    Returns:
        o: [N, HV, V] in v.dtype.
    """
    if (norm_gate is None) != (norm_weight is None):
        raise ValueError(
            "fused_recurrent_gated_delta_rule_verify: give norm_gate and norm_weight together, "
            "or neither"
        )
    g, beta = gdn_gating_ref(a, b, A_log, dt_bias)
    qs, ks = _prepare_qk(q, k, v.shape[1], scale, use_qk_l2norm)
    o = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for slot, rows in zip(state_slots.tolist(), verify_rows.tolist(), strict=True):
        if slot < 0:
            continue
        S = state[slot].float().transpose(-1, -2)
        for r in (r for r in rows if r >= 0):
            S, o[r] = _delta_rule_step(S, qs[r], ks[r], v[r].float(), g[r], beta[r])
    if norm_gate is not None and norm_weight is not None:
        return gated_rms_norm_ref(o.to(v.dtype), norm_gate, norm_weight, norm_eps)
    return o.to(v.dtype)


def fused_recurrent_gated_delta_rule_commit_ref(
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
        state: [num_slots, HV, V, K] fp32 state pool; row state_slots[i] advanced in place by
            num_kept[i] tokens.
        state_slots: [B] int64 slot per sequence; -1 is a padding sequence (skipped).
        verify_rows: [B, T] int64 row of position t of sequence i (as given to the verify).
        num_kept: [B] int64 positions to apply, 0 to T (0: the state stays).
        use_qk_l2norm: l2-normalise k (fp32, eps 1e-6), as the verify did.
        early_state: the fast op's launch option; no effect here.
    """
    g, beta = gdn_gating_ref(a, b, A_log, dt_bias)
    _, ks = _prepare_qk(k, k, v.shape[1], None, use_qk_l2norm)
    seqs = zip(state_slots.tolist(), verify_rows.tolist(), num_kept.tolist(), strict=True)
    for slot, rows, n in seqs:
        if slot < 0 or n <= 0:
            continue
        S = state[slot].float().transpose(-1, -2)
        for r in rows[:n]:
            S, _ = _delta_rule_step(S, ks[r], ks[r], v[r].float(), g[r], beta[r])
        state[slot] = S.transpose(-1, -2)
