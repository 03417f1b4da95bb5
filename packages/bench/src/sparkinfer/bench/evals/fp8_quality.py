"""FP8 quality on the embedded checkpoint: held-out perplexity and greedy agreement, FP8 on load
against the checkpoint's own weights, both run in the same dtype on the same device.

The held-out split is `code_corpus`'s (this interpreter's standard library, the training split
rule). Run: ``python -m sparkinfer.bench.evals.fp8_quality [--device cuda] [--dtype bfloat16]``;
on CPU the FP8 layers run the dequantizing reference (the same weights the GPU kernels read).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
from sparkinfer.bench.evals.code_corpus import read_source, split_files, stdlib_root
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.embedded import embedded_checkpoint_dir
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.model.weights import load_model

BLOCK = 16
MIN_CHARS = 4000  # files long enough to fill a window


@dataclass(frozen=True)
class Fp8Quality:
    """Perplexities over the same tokens, and the share of greedy tokens that agree."""

    num_tokens: int
    ppl_reference: float
    ppl_fp8: float
    num_greedy: int
    greedy_agreement: float

    @property
    def ppl_increase(self) -> float:
        return self.ppl_fp8 / self.ppl_reference - 1.0


def _batch(model: Qwen3_8ForCausalLM, num_tokens: int, device: torch.device) -> ForwardBatch:
    num_blocks = -(-(num_tokens + 1) // BLOCK)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=num_blocks, block_size=BLOCK, num_slots=1, device=device
    )
    return ForwardBatch.build(
        [num_tokens], [0], [list(range(num_blocks))], [0], caches=caches, block_size=BLOCK,
        device=device,
    )  # fmt: skip


@torch.no_grad()
def _logits(model: Qwen3_8ForCausalLM, ids: list[int], device: torch.device) -> torch.Tensor:
    hidden = model(torch.tensor(ids, device=device), _batch(model, len(ids), device))
    return model.compute_logits(hidden).float().cpu()  # [T, vocab]


def _nll(logits: torch.Tensor, ids: list[int]) -> float:
    target = torch.tensor(ids[1:])
    return torch.nn.functional.cross_entropy(logits[:-1], target, reduction="sum").item()


def _greedy(model: Qwen3_8ForCausalLM, prompt: list[int], n: int, device) -> list[int]:
    ids = list(prompt)
    for _ in range(n):  # whole-prefix forwards: short, and free of cache bookkeeping
        ids.append(int(_logits(model, ids, device)[-1].argmax()))
    return ids[len(prompt) :]


def measure(
    *,
    device: torch.device,
    dtype: torch.dtype,
    num_files: int = 12,
    window: int = 384,
    num_prompts: int = 4,
    greedy_tokens: int = 128,
) -> Fp8Quality:
    """Perplexity over the first `window` tokens of `num_files` held-out files, and greedy
    agreement over `greedy_tokens` after the first 64 tokens of `num_prompts` of them."""
    path = embedded_checkpoint_dir()
    tokenizer = Tokenizer.from_checkpoint(path)
    root = stdlib_root()
    texts = [t for p in split_files(root)[1] if (t := read_source(root / p)) and len(t) > MIN_CHARS]
    windows = [tokenizer.encode(t)[:window] for t in texts[:num_files]]
    kw = {"device": device, "dtype": dtype, "progress": False}
    reference = load_model(path, **kw)
    fp8 = load_model(path, quantization="fp8", **kw)
    nll_ref = nll_fp8 = 0.0
    count = 0
    for ids in windows:
        nll_ref += _nll(_logits(reference, ids, device), ids)
        nll_fp8 += _nll(_logits(fp8, ids, device), ids)
        count += len(ids) - 1
    agree = total = 0
    for ids in windows[:num_prompts]:
        a = _greedy(reference, ids[:64], greedy_tokens, device)
        b = _greedy(fp8, ids[:64], greedy_tokens, device)
        same = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        agree += same  # tokens agreeing before the first divergence
        total += len(a)
    return Fp8Quality(count, math.exp(nll_ref / count), math.exp(nll_fp8 / count), total,
                      agree / total)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description="FP8 quality on the embedded checkpoint")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--num-files", type=int, default=12)
    parser.add_argument("--window", type=int, default=384)
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--greedy-tokens", type=int, default=128)
    args = parser.parse_args()
    q = measure(
        device=torch.device(args.device),
        dtype=getattr(torch, args.dtype),
        num_files=args.num_files,
        window=args.window,
        num_prompts=args.num_prompts,
        greedy_tokens=args.greedy_tokens,
    )
    print(f"device {args.device}, {args.dtype}, {q.num_tokens} held-out tokens")
    print(f"perplexity: checkpoint {q.ppl_reference:.4f}, FP8 on load {q.ppl_fp8:.4f} "
          f"({100 * q.ppl_increase:+.2f}%)")  # fmt: skip
    print(f"greedy: {100 * q.greedy_agreement:.1f}% of {q.num_greedy} tokens agree before the "
          "first divergence")  # fmt: skip


if __name__ == "__main__":
    main()
