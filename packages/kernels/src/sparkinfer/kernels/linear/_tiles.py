"""Accumulator tiles shared by the skinny and stream-K GEMM kernels: weight-first (SWAP_AB) or
x-first dots and the matching output offsets."""

# Triton's annotations misread valid kernel code: constexpr arguments.
# pyright: reportCallIssue=false

import triton
import triton.language as tl


@triton.jit
def zero_tile(BM: tl.constexpr, BN: tl.constexpr, SWAP_AB: tl.constexpr):
    """An fp32 accumulator: [BN, BM] with SWAP_AB, else [BM, BN]."""
    if SWAP_AB:
        return tl.zeros((BN, BM), dtype=tl.float32)
    else:
        return tl.zeros((BM, BN), dtype=tl.float32)


@triton.jit
def tile_dot(b_x, b_w, b_acc, DOT_DTYPE: tl.constexpr, SWAP_AB: tl.constexpr):
    """b_acc + x [BM, BK] @ w [BN, BK].T, or its transpose w @ x.T with SWAP_AB."""
    if SWAP_AB:
        return tl.dot(b_w.to(DOT_DTYPE), tl.trans(b_x.to(DOT_DTYPE)), b_acc)
    else:
        return tl.dot(b_x.to(DOT_DTYPE), tl.trans(b_w.to(DOT_DTYPE)), b_acc)


@triton.jit
def tile_offsets(o_m, o_n, m_m, m_n, N, SWAP_AB: tl.constexpr):
    """Offsets into a contiguous [M, N] output and their mask, laid out as the accumulator."""
    if SWAP_AB:
        return o_m[None, :] * N + o_n[:, None], m_m[None, :] & m_n[:, None]
    else:
        return o_m[:, None] * N + o_n[None, :], m_m[:, None] & m_n[None, :]
