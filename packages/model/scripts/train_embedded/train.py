"""Train the embedded model: a small Qwen3.8-architecture code model with its MTP head.

    python3 packages/model/scripts/train_embedded/train.py --out DIR

One seeded, reproducible command on one GPU (PYTHONPATH over the packages' src folders): it reads
Python source from this machine's installation (the standard library's train split and installed
packages), trains a byte-level BPE on it, builds chat turns with the model's own chat template,
trains trunk and MTP head jointly (bf16 autocast, AdamW, warmup then cosine, gradient clipping),
and writes an HF-layout checkpoint (safetensors, config, generation config, tokenizer with the
chat template, model card) that transformers and sparkinfer both load.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bpe
import data
import export
import model_config
from mtp_head import MTPHead
from sparkinfer.model.tokenizer import QWEN_CONTROL_TOKENS, Tokenizer
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

MTP_WEIGHTS = (0.3, 0.15)  # loss weight of the head's first and second draft step


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 1400
    batch_size: int = 32
    seq_len: int = 1024
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    vocab_size: int = 8192
    char_budget: int = 120_000_000  # raw source characters (about 3.5 per token)
    tokenizer_chars: int = 24_000_000  # the BPE trains on the first this many
    max_tasks: int = 60_000
    task_repeats: int = 2  # each task twice (with thinking drawn anew): answers matter most
    num_tool_calls: int = 5_000
    num_json: int = 4_000
    num_greetings: int = 400
    eval_every: int = 300
    num_eval_rows: int = 64


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def losses(trunk, mtp: MTPHead, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Cross-entropies of the trunk (t+1) and the head's two draft steps (t+2, t+3), plus the
    rate at which the first draft's argmax equals the trunk's own argmax for t+2."""
    B, L = ids.shape
    hidden = trunk.model(input_ids=ids).last_hidden_state  # after the final norm
    logits = trunk.lm_head(hidden[:, :-1]).float()
    ce0 = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
    embed = trunk.model.embed_tokens
    outs, ces, prev = [], [], hidden
    for step in (1, 2):
        n = L - step  # positions whose step-th next token is known
        pos = torch.arange(step, L, device=ids.device).view(1, 1, -1).expand(3, B, -1)
        pe = trunk.model.rotary_emb(prev, pos)
        h = mtp(embed(ids[:, step:]), prev[:, :n], pe, pos[0])
        draft = trunk.lm_head(h[:, :-1]).float()
        ces.append(F.cross_entropy(draft.flatten(0, 1), ids[:, step + 1 :].flatten()))
        outs.append(draft)
        prev = h
    agree = (outs[0].argmax(-1) == logits[:, 1:].argmax(-1)).float().mean()
    return ce0, ces[0], ces[1], agree


def param_groups(modules, weight_decay: float):
    decay, keep = [], []
    for module in modules:
        for name, p in module.named_parameters():
            (decay if p.ndim >= 2 and "embed" not in name else keep).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(trunk, mtp, rows: torch.Tensor, device) -> dict[str, float]:
    trunk.eval(), mtp.eval()
    sums = torch.zeros(4)
    for i in range(0, len(rows), 8):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            vals = losses(trunk, mtp, rows[i : i + 8].to(device).long())
        sums += torch.stack([v.float().cpu() for v in vals])
    trunk.train(), mtp.train()
    ce0, ce1, ce2, agree = (sums / math.ceil(len(rows) / 8)).tolist()
    return {"loss": ce0, "ppl": math.exp(ce0), "mtp1_loss": ce1, "mtp2_loss": ce2,
            "mtp_t2_agreement": agree}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    for name, value in asdict(TrainConfig()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--no-packages", action="store_true", help="standard library only")
    args = parser.parse_args()
    cfg = TrainConfig(**{k: getattr(args, k) for k in asdict(TrainConfig())})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    random.seed(cfg.seed), torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    sources = data.collect_sources(char_budget=cfg.char_budget, use_packages=not args.no_packages)
    log(f"corpus: {sources.num_stdlib_train} stdlib train files, {sources.num_package_files} "
        f"package files, {sum(map(len, sources.train)) / 1e6:.1f}M chars; "
        f"{len(sources.held_out)} held-out files")  # fmt: skip
    sample, size = [], 0
    for text in sources.train:
        if size >= cfg.tokenizer_chars:
            break
        sample.append(text)
        size += len(text)
    raw_tok = bpe.train_bpe(sample, vocab_size=cfg.vocab_size)
    args.out.mkdir(parents=True, exist_ok=True)
    bpe.save_tokenizer(raw_tok, args.out, chat_template=export.chat_template_source())
    tokenizer = Tokenizer.from_checkpoint(args.out)
    control = {t: tokenizer.control_tokens[t] for t in QWEN_CONTROL_TOKENS}
    log(f"tokenizer: {raw_tok.get_vocab_size()} ids")

    plain = data.plain_encoder(raw_tok)
    raw_docs = [e.ids for e in plain.encode_batch(sources.train, add_special_tokens=False)]
    chat_docs, counts = data.chat_documents(
        sources.train, args.out, rng=random.Random(cfg.seed), max_tasks=cfg.max_tasks,
        task_repeats=cfg.task_repeats,
        num_tool_calls=cfg.num_tool_calls, num_json=cfg.num_json,
        num_greetings=cfg.num_greetings,
    )  # fmt: skip
    num_raw, num_chat = sum(map(len, raw_docs)), sum(map(len, chat_docs))
    log(f"tokens: raw {num_raw / 1e6:.1f}M, chat {num_chat / 1e6:.1f}M ({counts})")
    eos = control["<|endoftext|>"]
    rows_needed = cfg.steps * cfg.batch_size
    stream = data.pack(raw_docs + chat_docs, eos_id=eos, num_tokens=rows_needed * cfg.seq_len,
                       seed=cfg.seed).view(rows_needed, cfg.seq_len)  # fmt: skip
    held_docs = [e.ids for e in plain.encode_batch(sources.held_out, add_special_tokens=False)]
    held = data.pack(held_docs, eos_id=eos, num_tokens=cfg.num_eval_rows * cfg.seq_len,
                     seed=cfg.seed + 1).view(cfg.num_eval_rows, cfg.seq_len)  # fmt: skip

    text_cfg = model_config.text_config(cfg.vocab_size, control)
    hf_cfg = Qwen3_5TextConfig(**text_cfg)
    hf_cfg._attn_implementation = "sdpa"
    trunk = Qwen3_5ForCausalLM(hf_cfg).to(device)
    mtp = MTPHead(hf_cfg).to(device)
    num_params = sum(p.numel() for p in trunk.parameters()) + sum(
        p.numel() for p in mtp.parameters()
    )
    log(f"model: {num_params / 1e6:.2f}M parameters (trunk + MTP head, tied embeddings)")
    opt = torch.optim.AdamW(
        param_groups([trunk, mtp], cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
        fused=device.type == "cuda",
    )  # fmt: skip
    params = [p for g in opt.param_groups for p in g["params"]]
    tokens_per_step = cfg.batch_size * cfg.seq_len
    recent: list[float] = []
    t_train = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        ids = stream[step * cfg.batch_size : (step + 1) * cfg.batch_size].to(device).long()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            ce0, ce1, ce2, agree = losses(trunk, mtp, ids)
        loss = ce0 + MTP_WEIGHTS[0] * ce1 + MTP_WEIGHTS[1] * ce2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        recent = [*recent[-49:], ce0.item()] if step % 5 == 0 or step >= cfg.steps - 50 else recent
        if step % 25 == 0 or step == cfg.steps - 1:
            rate = (step + 1) * tokens_per_step / (time.perf_counter() - t_train)
            log(f"step {step:5d}/{cfg.steps} loss {ce0.item():.3f} mtp {ce1.item():.3f}/"
                f"{ce2.item():.3f} agree {agree.item():.2f} lr {lr_at(step, cfg):.2e} "
                f"gnorm {grad_norm.item():.2f} {rate / 1e3:.0f}K tok/s")  # fmt: skip
        if (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            log(f"held-out: {evaluate(trunk, mtp, held, device)}")
    train_s = time.perf_counter() - t_train
    final = evaluate(trunk, mtp, held, device)
    summary = {
        "train_seconds": round(train_s, 1),
        "tokens_per_second": round(cfg.steps * tokens_per_step / train_s),
        "train_tokens": cfg.steps * tokens_per_step,
        "final_train_loss": round(sum(recent[-50:]) / len(recent[-50:]), 4),
        "held_out": {k: round(v, 4) for k, v in final.items()},
        "parameters": num_params,
        "corpus": {"stdlib_train_files": sources.num_stdlib_train,
                   "package_files": sources.num_package_files,
                   "held_out_files": len(sources.held_out), "raw_tokens": num_raw,
                   "chat_tokens": num_chat, **asdict(counts)},
        "config": asdict(cfg),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "python": sys.version.split()[0],
    }  # fmt: skip
    log(f"done: {json.dumps(summary)}")
    export.write_checkpoint(args.out, trunk, mtp, text_cfg, control, summary)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
