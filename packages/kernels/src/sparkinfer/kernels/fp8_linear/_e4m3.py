"""e4m3 -> bf16 on the integer and FMA pipes, for the decode GEMM's bf16 dot.

Triton converts e4m3 to bf16 through fp16 (a packed e4m3x2 -> f16x2 conversion, then one
f16 -> bf16 conversion per element), which on sm90 keeps the conversion unit busy for every
weight element. Every e4m3 value is a bf16 value with the same sign, the exponent field's low
four bits and the top three mantissa bits, scaled by 2^-120: so each pair of bytes is moved into
place with a byte permute, a shift and two masks, then multiplied by 2^120 in one packed bf16
FMA (exact, subnormals included). NaN (0x7f, 0xff) maps to a finite value; weights hold none.
"""

# Triton's annotations misread valid kernel code: a constexpr string as inline asm.
# pyright: reportArgumentType=false

import triton
import triton.language as tl

_E4M3X4_TO_BF16X4 = tl.constexpr("""
{
.reg .b32 p, t, c, z;
mov.b32 c, 0x7B807B80;
mov.b32 z, 0x80008000;
prmt.b32 p, $2, 0, 0x1404;
shr.b32 t, p, 4;
and.b32 t, t, 0x07F007F0;
and.b32 p, p, 0x80008000;
or.b32 t, t, p;
fma.rn.bf16x2 $0, t, c, z;
prmt.b32 p, $2, 0, 0x3424;
shr.b32 t, p, 4;
and.b32 t, t, 0x07F007F0;
and.b32 p, p, 0x80008000;
or.b32 t, t, p;
fma.rn.bf16x2 $1, t, c, z;
}
""")


@triton.jit
def e4m3_to_bf16(b_w):
    """An e4m3 tile as bf16, exactly (CUDA only: inline PTX)."""
    return tl.inline_asm_elementwise(
        _E4M3X4_TO_BF16X4,
        "=r,=r,r",
        [b_w.to(tl.uint8, bitcast=True)],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )
