"""Input checks shared by the gated-delta-rule launchers (chunked prefill and recurrent decode)."""

import torch
from sparkinfer.kernels._triton import check_contiguous, check_dtype, check_ndim, check_shape

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_HEAD_DIM = 256


def check_qkv(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rows: str) -> None:
    """q, k [rows, H, K] and v [rows, HV, V] with HV a multiple of H and dense heads.

    ``rows`` names the leading dim in messages: "T" (tokens) or "B" (sequences).
    """
    for name, t, layout in (("q", q, f"[{rows}, H, K]"), ("k", k, f"[{rows}, H, K]"),
                            ("v", v, f"[{rows}, HV, V]")):  # fmt: skip
        check_ndim(op, name, t, 3, layout)
        check_dtype(op, name, t, INPUT_DTYPES)
        if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
            raise ValueError(
                f"{op}: {name} has strides {t.stride()}; expected the last two dims dense "
                f"(stride(1) == {t.shape[2]}, stride(2) == 1): call .contiguous() first"
            )
    check_shape(op, "k", k, tuple(q.shape))
    num_heads, head_k = q.shape[1:]
    num_v_heads, head_v = v.shape[1:]
    if v.shape[0] != q.shape[0] or num_heads < 1 or num_v_heads % num_heads:
        raise ValueError(
            f"{op}: v has shape {list(v.shape)} for q {list(q.shape)}; expected [{rows}, HV, V] "
            f"with the same {rows}, H >= 1 and HV a multiple of H"
        )
    if head_k > MAX_HEAD_DIM or head_v > MAX_HEAD_DIM:
        raise ValueError(f"{op}: head dims K={head_k}, V={head_v}; expected at most {MAX_HEAD_DIM}")


def check_state_pool(op: str, state: torch.Tensor, v: torch.Tensor, head_k: int) -> None:
    """state is the fp32 contiguous [num_slots, HV, V, K] pool (each head's S [K, V] stored
    transposed) matching v [rows, HV, V]."""
    check_dtype(op, "state", state, (torch.float32,))
    check_ndim(op, "state", state, 4, "[num_slots, HV, V, K]")
    check_shape(op, "state", state, (state.shape[0], v.shape[1], v.shape[2], head_k))
    check_contiguous(op, "state", state)
