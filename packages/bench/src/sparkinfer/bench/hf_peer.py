"""transformers' Qwen3.5 text model on the same shapes: the plain peer of the offline benchmark.

transformers is optional here (a test dependency of the workspace); without it, or when the model
does not fit beside what is left on the device, the peer is reported as skipped with the reason.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import torch
from sparkinfer.bench.report import log
from sparkinfer.model.config import TextConfig


@dataclass(frozen=True)
class PeerRow:
    phase: str  # "prefill 4096", "decode @4096"
    tok_s: float | None
    note: str


def hf_text_config(cfg: TextConfig):
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        layer_types=list(cfg.layer_types),
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        linear_num_key_heads=cfg.linear_num_key_heads,
        linear_num_value_heads=cfg.linear_num_value_heads,
        linear_key_head_dim=cfg.linear_key_head_dim,
        linear_value_head_dim=cfg.linear_value_head_dim,
        linear_conv_kernel_dim=cfg.linear_conv_kernel_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor,
            "mrope_section": list(cfg.mrope_section),
            "mrope_interleaved": True,
        },
    )


def _sync_time(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(
    cfg: TextConfig, *, context: int, new_tokens: int, prefill_lengths: tuple[int, ...]
) -> list[PeerRow]:
    """Prefill each length (one forward) and greedy decode `new_tokens` after `context` tokens."""
    try:
        from transformers import Qwen3_5ForCausalLM
    except ImportError as e:
        return [PeerRow("all", None, f"skipped: transformers is not installed ({e})")]
    log("offline: building the transformers peer (bf16, random weights)")
    try:
        with torch.device("cuda"):
            model = Qwen3_5ForCausalLM._from_config(hf_text_config(cfg), dtype=torch.bfloat16)
        model.eval()
    except torch.OutOfMemoryError:
        gc.collect()
        torch.cuda.empty_cache()
        return [PeerRow("all", None, "skipped: the model does not fit in the free device memory")]
    rows = []
    with torch.inference_mode():
        for n in prefill_lengths:
            rows.append(_prefill(model, n))
        rows.append(_decode(model, context, new_tokens))
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def _ids(length: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(length)
    return torch.randint(0, 248_077, (1, length), generator=gen).cuda()


def _prefill(model, length: int) -> PeerRow:
    log(f"offline: transformers prefill {length}")
    ids = _ids(length)
    try:
        model(ids[:, :256], use_cache=False, logits_to_keep=1)  # warm-up
        elapsed = _sync_time(lambda: model(ids, use_cache=False, logits_to_keep=1))
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return PeerRow(f"prefill {length}", None, "out of memory")
    return PeerRow(f"prefill {length}", length / elapsed, "one forward, torch GDN path")


def _decode(model, context: int, new_tokens: int) -> PeerRow:
    log(f"offline: transformers decode {new_tokens} tokens at {context}")
    ids = _ids(context)
    kwargs = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    try:
        first = _sync_time(
            lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
        )
        total = _sync_time(
            lambda: model.generate(
                ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs
            )
        )
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return PeerRow(f"decode @{context}", None, "out of memory")
    return PeerRow(f"decode @{context}", (new_tokens - 1) / (total - first), "generate(), greedy")
