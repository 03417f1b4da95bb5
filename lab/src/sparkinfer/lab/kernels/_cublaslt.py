"""cuBLASLt through ctypes, to measure the algorithms its heuristic offers for one GEMM shape.

torch's `F.linear` runs the heuristic's first choice; `prefill_linear` times the others beside it.
y [M, N] = x [M, K] @ w [N, K]^T is, in cuBLAS's column-major terms, D [N, M] = op_T(A) op_N(B)
with A = w (K x N, ld K) and B = x (K x M, ld K): the layout torch uses for `F.linear`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

import torch

_LIB_NAMES = ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")
_CUDA_TYPES = {torch.bfloat16: 14, torch.float16: 2}  # cudaDataType_t
_COMPUTE_32F = 68  # cublasComputeType_t CUBLAS_COMPUTE_32F
_SCALE_32F = 0  # CUDA_R_32F
_DESC_TRANSA, _DESC_TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
_OP_N, _OP_T = 0, 1
_PREF_MAX_WORKSPACE_BYTES = 1  # cublasLtMatmulPreferenceAttributes_t
# cublasLtMatmulAlgoConfigAttributes_t, for naming an algorithm
_CONFIG_ATTRS = {"id": 0, "tile": 1, "splitk": 2, "reduction": 3, "swizzle": 4, "custom": 5,
                 "stages": 6, "cluster": 8}  # fmt: skip
WORKSPACE_BYTES = 32 * 2**20


class LtError(RuntimeError):
    """A cuBLASLt call returned a status other than success."""


class _HeuristicResult(ctypes.Structure):
    _fields_ = [
        ("algo", ctypes.c_uint64 * 8),
        ("workspace_size", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("waves_count", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


@dataclass(frozen=True)
class LtAlgo:
    """One of the heuristic's algorithms: its opaque words and what it says of itself."""

    words: tuple[int, ...]
    config: tuple[tuple[str, int], ...]

    @property
    def name(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.config)


@cache
def _library() -> ctypes.CDLL:
    torch.cuda.init()  # torch's own cuBLASLt is then loaded, and found first by its soname
    for name in _LIB_NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    raise LtError(f"none of {_LIB_NAMES} loads: install torch's CUDA build")


def _check(status: int, what: str) -> None:
    if status != 0:
        raise LtError(f"{what} returned cuBLAS status {status}")


@cache
def _handle() -> ctypes.c_void_p:
    handle = ctypes.c_void_p()
    _check(_library().cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
    return handle


class LtMatmul:
    """Descriptors of y [M, N] = x [M, K] @ w [N, K]^T for one shape and dtype; lists the
    heuristic's algorithms and launches one of them on the current stream."""

    def __init__(self, m: int, n: int, k: int, dtype: torch.dtype) -> None:
        if dtype not in _CUDA_TYPES:
            raise TypeError(f"cuBLASLt matmul takes bf16 or fp16, got {dtype}")
        lib, cuda_type = _library(), _CUDA_TYPES[dtype]
        self._desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self._desc), _COMPUTE_32F, _SCALE_32F),
               "cublasLtMatmulDescCreate")  # fmt: skip
        for attr, op in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N)):
            value = ctypes.c_int32(op)
            _check(lib.cublasLtMatmulDescSetAttribute(self._desc, attr, ctypes.byref(value), 4),
                   "cublasLtMatmulDescSetAttribute")  # fmt: skip
        self._a = self._layout(cuda_type, k, n, k)
        self._b = self._layout(cuda_type, k, m, k)
        self._d = self._layout(cuda_type, n, m, n)
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    @staticmethod
    def _layout(cuda_type: int, rows: int, cols: int, ld: int) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        status = _library().cublasLtMatrixLayoutCreate(
            ctypes.byref(layout), cuda_type, ctypes.c_uint64(rows), ctypes.c_uint64(cols),
            ctypes.c_int64(ld),
        )  # fmt: skip
        _check(status, "cublasLtMatrixLayoutCreate")
        return layout

    def algos(self, count: int = 16) -> list[LtAlgo]:
        """Up to `count` algorithms, in the heuristic's order (its first is torch's choice)."""
        lib = _library()
        pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "PreferenceCreate")
        size = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(
            lib.cublasLtMatmulPreferenceSetAttribute(
                pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(size), 8
            ),
            "PreferenceSetAttribute",
        )
        results = (_HeuristicResult * count)()
        found = ctypes.c_int(0)
        status = lib.cublasLtMatmulAlgoGetHeuristic(
            _handle(), self._desc, self._a, self._b, self._d, self._d, pref, count, results,
            ctypes.byref(found),
        )  # fmt: skip
        lib.cublasLtMatmulPreferenceDestroy(pref)
        _check(status, "cublasLtMatmulAlgoGetHeuristic")
        return [_algo(r) for r in results[: found.value] if r.state == 0]

    def __call__(
        self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, algo: LtAlgo,
        workspace: torch.Tensor,
    ) -> torch.Tensor:  # fmt: skip
        """out = x @ w.T with `algo`, on torch's current stream; inputs contiguous, as planned."""
        words = (ctypes.c_uint64 * 8)(*algo.words)
        status = _library().cublasLtMatmul(
            _handle(), self._desc, ctypes.byref(self._alpha), ctypes.c_void_p(w.data_ptr()),
            self._a, ctypes.c_void_p(x.data_ptr()), self._b, ctypes.byref(self._beta),
            ctypes.c_void_p(out.data_ptr()), self._d, ctypes.c_void_p(out.data_ptr()), self._d,
            ctypes.byref(words), ctypes.c_void_p(workspace.data_ptr()),
            ctypes.c_size_t(workspace.numel()),
            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
        )  # fmt: skip
        _check(status, "cublasLtMatmul")
        return out


def _algo(result: _HeuristicResult) -> LtAlgo:
    lib = _library()
    config = []
    for name, attr in _CONFIG_ATTRS.items():
        value, written = ctypes.c_uint32(0), ctypes.c_size_t(0)
        status = lib.cublasLtMatmulAlgoConfigGetAttribute(
            ctypes.byref(result.algo), attr, ctypes.byref(value), 4, ctypes.byref(written)
        )
        if status == 0:
            config.append((name, value.value))
    return LtAlgo(tuple(result.algo), tuple(config))
