"""Check a written checkpoint: transformers loads it, sparkinfer loads it, and both give the
same fp32 logits on a held-out file's opening (prints the largest difference)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from sparkinfer.bench.evals.code_corpus import read_source, split_files, stdlib_root
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.model.weights import load_model
from transformers import Qwen3_5ForCausalLM

BLOCK = 16


def main(folder: Path) -> None:
    tok = Tokenizer.from_checkpoint(folder)
    root = stdlib_root()
    text = next(t for p in split_files(root)[1] if (t := read_source(root / p)) and len(t) > 2000)
    ids = tok.encode(text)[:256]
    hf = Qwen3_5ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    model = load_model(folder, device="cpu", dtype=torch.float32, num_real_tokens=tok.vocab_size)
    num_blocks = -(-len(ids) // BLOCK)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=num_blocks, block_size=BLOCK, num_slots=1, device="cpu"
    )
    batch = ForwardBatch.build(
        [len(ids)], [0], [list(range(num_blocks))], [0], caches=caches, block_size=BLOCK,
        device="cpu",
    )  # fmt: skip
    with torch.no_grad():
        ours = model.compute_logits(model(torch.tensor(ids), batch))
    diff = (ours - ref).abs().max().item()
    scale = ref.abs().max().item()
    print(f"verify: {len(ids)} tokens, max |ours - transformers| {diff:.3e} of logit scale "
          f"{scale:.2f} ({diff / scale:.2e})")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
