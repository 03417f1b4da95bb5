"""The determinism eval's offline twin: the same prompts through sparkinfer.model + Engine on CPU.

With `determinism --reference CHECKPOINT` (or `--reference embedded`, the server's default
built-in model) every depth's greedy answer is also computed here in fp32 on the CPU, with the
plain-torch reference ops, and compared with the server's text. Both sides then tokenize the raw
prompt the same way, so the server is asked through /v1/completions. A bf16 GPU server can
legitimately drift from the fp32 reference after some tokens; an exact match is expected from a
CPU fp32 server.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from sparkinfer.bench.errors import UsageError
from sparkinfer.bench.evals.determinism import DepthResult
from sparkinfer.bench.report import log
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.tokenizer import Tokenizer

EMBEDDED = "embedded"


@dataclass
class _Loaded:
    tokenizer: Tokenizer
    model: Qwen3_8ForCausalLM
    eos_token_ids: tuple[int, ...]


def _load(source: str) -> _Loaded:
    from sparkinfer.model import embedded
    from sparkinfer.model.hub import fetch_checkpoint
    from sparkinfer.model.weights import load_model, read_checkpoint_configs

    if source == EMBEDDED:
        source = str(embedded.embedded_checkpoint_dir())
    try:
        configs = read_checkpoint_configs(fetch_checkpoint(source))  # a hub id: its weights too
    except (OSError, ValueError) as e:
        raise UsageError(
            f"--reference {source!r} is not a readable checkpoint ({e}): give a small "
            f"checkpoint folder or '{EMBEDDED}'"
        ) from e
    tokenizer = Tokenizer.from_checkpoint(configs.path)
    model = load_model(
        configs.path, device="cpu", dtype=torch.float32, num_real_tokens=tokenizer.vocab_size
    )
    gen_eos = configs.generation.eos_token_ids
    eos = tuple(dict.fromkeys((*gen_eos, *tokenizer.eos_token_ids)))
    return _Loaded(tokenizer, model, eos)


def fill(results: list[DepthResult], source: str, *, max_tokens: int) -> None:
    """Set each result's `reference` to the offline greedy answer to the same prompt."""
    from sparkinfer.bench.engine_config import offline_config
    from sparkinfer.scheduler.engine import Engine
    from sparkinfer.scheduler.request import SamplingParams

    log(f"determinism: building the CPU reference from {source}")
    loaded = _load(source)
    tok = loaded.tokenizer
    prompts = [tok.encode(r.prompt, allow_special=True) for r in results]
    room = max(len(p) for p in prompts) + max_tokens + 1
    config = replace(
        offline_config(None, max_num_seqs=1, max_model_len=room),
        eos_token_ids=loaded.eos_token_ids,
        deterministic=True,
    )
    engine = Engine.from_model(loaded.model, config, device="cpu")
    try:
        for res, ids in zip(results, prompts, strict=True):
            log(f"determinism: reference at depth {res.depth} ({len(ids)} tokens)")
            out = engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=max_tokens))
            res.reference = tok.decode(out, skip_special=True)  # type: ignore[attr-defined]
    finally:
        engine.shutdown()
