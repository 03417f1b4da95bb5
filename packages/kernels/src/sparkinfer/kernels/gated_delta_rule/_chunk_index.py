"""The chunk and output-block index tables of a varlen prefill batch, built in one launch.

For the chunks of ``chunk_len`` tokens that the prefill kernels run over (each sequence cut from
its first token, T // chunk_len + B rows, the rows past the last chunk marked -1): each chunk's
sequence and its position in that sequence, and the first ``block_len``-token block of each
sequence (the state kernel's output blocks). ``chunk_index_tables_ref`` builds the same tables
with torch ops, a dozen small launches that the kernel replaces. No host sync either way.
"""

# Triton's annotations misread valid kernel code: constexpr arguments.
# pyright: reportArgumentType=false, reportCallIssue=false

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

BN = 256  # chunk rows per program
BS = 32  # sequences per step of a program's loop


@triton.jit(do_not_specialize=["num_seqs", "num_chunks"])  # sizes of the step: one build for all
def _chunk_index_kernel(
    cu_seqlens, chunk_seq, chunk_pos, block_offsets, num_seqs, num_chunks,
    CHUNK_LEN: tl.constexpr, BLOCK_LEN: tl.constexpr, BN: tl.constexpr, BS: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    o_c = pid * BN + tl.arange(0, BN)
    b_seq = tl.zeros([BN], dtype=tl.int32)  # sequences that end at or before chunk c
    b_start = tl.zeros([BN], dtype=tl.int32)  # first chunk of c's sequence
    num_before = 0  # chunks of the sequences before this step of the loop
    blocks_before = 0
    if pid == 0:
        tl.store(block_offsets + tl.arange(0, 1), tl.zeros([1], dtype=tl.int64))
    for s0 in range(0, num_seqs, BS):
        o_s = s0 + tl.arange(0, BS)
        m_s = o_s < num_seqs
        b_len = tl.load(cu_seqlens + o_s + 1, mask=m_s, other=0).to(tl.int32)
        b_len -= tl.load(cu_seqlens + o_s, mask=m_s, other=0).to(tl.int32)
        b_ends = num_before + tl.cumsum((b_len + CHUNK_LEN - 1) // CHUNK_LEN, 0)
        m_le = (b_ends[None, :] <= o_c[:, None]) & m_s[None, :]
        b_seq += tl.sum(m_le.to(tl.int32), 1)
        b_start = tl.maximum(b_start, tl.max(tl.where(m_le, b_ends[None, :], 0), 1))
        b_block_ends = blocks_before + tl.cumsum((b_len + BLOCK_LEN - 1) // BLOCK_LEN, 0)
        m_first = m_s & (o_s * 0 + pid == 0)
        tl.store(block_offsets + o_s + 1, b_block_ends.to(tl.int64), mask=m_first)
        num_before = tl.max(tl.where(m_s, b_ends, 0), 0)
        blocks_before = tl.max(tl.where(m_s, b_block_ends, 0), 0)
    m_c = o_c < num_chunks
    m_valid = b_seq < num_seqs
    tl.store(chunk_seq + o_c, tl.where(m_valid, b_seq, -1), mask=m_c)
    tl.store(chunk_pos + o_c, tl.where(m_valid, o_c - b_start, 0), mask=m_c)


def chunk_index_tables(
    cu_seqlens: torch.Tensor, num_tokens: int, chunk_len: int, block_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(chunk_seq, chunk_pos, block_offsets) of a varlen batch, one launch on cu_seqlens' device.

    Args:
        cu_seqlens: [B + 1] int32/int64 sequence starts in the packed T dimension (B >= 1).
        num_tokens: T.
        chunk_len: tokens per chunk.
        block_len: tokens per output block.

    Returns:
        chunk_seq: [T // chunk_len + B] int32 sequence of each chunk, -1 past the last chunk.
        chunk_pos: same shape, int32 position of the chunk in its sequence (0 past the last).
        block_offsets: [B + 1] int64 first block of each sequence, then the number of blocks.
    """
    num_seqs = cu_seqlens.shape[0] - 1
    num_chunks = num_tokens // chunk_len + num_seqs
    device = cu_seqlens.device
    chunk_seq = torch.empty(num_chunks, dtype=torch.int32, device=device)
    chunk_pos = torch.empty(num_chunks, dtype=torch.int32, device=device)
    block_offsets = torch.empty(num_seqs + 1, dtype=torch.int64, device=device)
    _chunk_index_kernel[(triton.cdiv(num_chunks, BN),)](
        cu_seqlens, chunk_seq, chunk_pos, block_offsets, num_seqs, num_chunks,
        CHUNK_LEN=chunk_len, BLOCK_LEN=block_len, BN=BN, BS=BS,
    )  # fmt: skip
    return chunk_seq, chunk_pos, block_offsets


def chunk_index_tables_ref(
    cu_seqlens: torch.Tensor, num_tokens: int, chunk_len: int, block_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``chunk_index_tables`` with torch ops (the specification)."""
    num_seqs = cu_seqlens.shape[0] - 1
    chunk_offsets = _block_offsets(cu_seqlens, chunk_len)
    chunk_ids = torch.arange(num_tokens // chunk_len + num_seqs, device=cu_seqlens.device)
    seq = torch.searchsorted(chunk_offsets[1:], chunk_ids, right=True)
    is_valid = seq < num_seqs
    pos = chunk_ids - chunk_offsets[seq.clamp(max=num_seqs - 1)]
    return (
        torch.where(is_valid, seq, -1).to(torch.int32),
        torch.where(is_valid, pos, 0).to(torch.int32),
        _block_offsets(cu_seqlens, block_len),
    )


def _block_offsets(cu_seqlens: torch.Tensor, block_len: int) -> torch.Tensor:
    """[B + 1] int64 first ``block_len``-token block of each sequence."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return F.pad(torch.cumsum(triton.cdiv(lens, block_len), 0), (1, 0))
