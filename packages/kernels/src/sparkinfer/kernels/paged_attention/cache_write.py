"""Store the new tokens' K and V in their paged cache rows."""

# Triton's annotations misread valid kernel code: num_warps/num_stages.
# pyright: reportCallIssue=false

from __future__ import annotations

import torch
import triton
import triton.language as tl
from sparkinfer.kernels._triton import check_device
from sparkinfer.kernels.dependent_launch import dependent_launch, wait_for_prior_kernels
from sparkinfer.kernels.paged_attention.checks import check_cache


@triton.jit
def _write_kv_cache_kernel(
    p_k, p_v, p_kc, p_vc, p_slot,
    HKV, D,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    BLOCK_SIZE: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, USE_PDL: tl.constexpr,
):  # fmt: skip
    wait_for_prior_kernels(USE_PDL)
    i_t = tl.program_id(0).to(tl.int64)
    slot = tl.load(p_slot + i_t)
    if slot < 0:
        return
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    o_h = tl.arange(0, BH).to(tl.int64)
    o_d = tl.arange(0, BD)
    m = (o_h < HKV)[:, None] & (o_d < D)[None, :]
    b_k = tl.load(p_k + i_t * stride_kt + o_h[:, None] * stride_kh + o_d[None, :], mask=m)
    b_v = tl.load(p_v + i_t * stride_vt + o_h[:, None] * stride_vh + o_d[None, :], mask=m)
    p_kc += block * stride_kcb + offset * stride_kcs
    p_vc += block * stride_vcb + offset * stride_vcs
    tl.store(p_kc + o_h[:, None] * stride_kch + o_d[None, :], b_k, mask=m)
    tl.store(p_vc + o_h[:, None] * stride_vch + o_d[None, :], b_v, mask=m)


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each new token's K and V in its cache row, in place.

    Args:
        k, v: [T, HKV, D] new keys and values (any token/head strides, unit last stride).
        k_cache, v_cache: [num_blocks, block_size, HKV, D], same dtype as k and v.
        slot_mapping: [T] int64 contiguous flat row block * block_size + offset; -1 skips the
            token.
    """
    op = "write_kv_cache"
    check_device(op, {"k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache,
                      "slot_mapping": slot_mapping})  # fmt: skip
    check_cache(op, k_cache, v_cache)
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 3 or t.shape[1:] != (hkv, d) or t.shape[0] != k.shape[0]:
            raise ValueError(
                f"{op}: {name} has shape {list(t.shape)}; expected [T, {hkv}, {d}] like the cache"
            )
        if t.dtype != k_cache.dtype:
            raise TypeError(f"{op}: {name} is {t.dtype} but the cache is {k_cache.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: {name} has strides {t.stride()}; expected a unit last stride")
    if slot_mapping.dtype != torch.int64 or slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"{op}: slot_mapping is {slot_mapping.dtype} {list(slot_mapping.shape)}; "
            f"expected int64 [{k.shape[0]}]"
        )
    if slot_mapping.stride(0) != 1:
        raise ValueError(
            f"{op}: slot_mapping has strides {slot_mapping.stride()}; expected a contiguous "
            "tensor: call .contiguous() first"
        )
    if k.shape[0] == 0:
        return
    pdl = dependent_launch(k)
    _write_kv_cache_kernel[(k.shape[0],)](
        k, v, k_cache, v_cache, slot_mapping,
        hkv, d,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        BLOCK_SIZE=k_cache.shape[1], BH=triton.next_power_of_2(hkv), BD=triton.next_power_of_2(d),
        USE_PDL=pdl, num_warps=4, launch_pdl=pdl,
    )  # fmt: skip
