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

import tokenizers
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bpe
import data
import export
import model_config
import task_eval
from mtp_head import MTPHead
from sparkinfer.model.chat_template import ChatTemplate
from sparkinfer.model.tokenizer import QWEN_CONTROL_TOKENS, Tokenizer
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

MTP_WEIGHTS = (0.3, 0.15)  # loss weight of the head's first and second draft step
EXPORT_RESERVE_S = 25.0  # final evaluations and the export (a few seconds on the GPU machine)
TRAIN_SHARE = 0.97  # of the time left, the share for training steps (evaluations take the rest)


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 4000  # the most steps; --train-budget-s may stop the schedule earlier
    batch_size: int = 32
    seq_len: int = 1024
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    vocab_size: int = 8192
    char_budget: int = 30_000_000  # raw source characters (about 3.5 per token)
    tokenizer_chars: int = 24_000_000  # the BPE trains on the first this many
    num_tasks: int = 240_000  # sampled "write a function" tasks, kept when they pass their tests
    num_tool_calls: int = 8_000  # each a call turn and a turn that reads the result
    num_unserved: int = 4_000
    num_plain_with_tools: int = 4_000
    num_json: int = 12_000
    num_greetings: int = 1_500
    num_readme: int = 300
    thinking_rate: float = 0.6
    train_budget_s: float = 0.0  # > 0: after 40 steps, fit the step count to this many seconds
    deadline_s: float = 0.0  # > 0: ... and end the whole run (export included) within this
    eval_every: int = 500
    num_eval_rows: int = 64


def lr_at(step: int, cfg: TrainConfig, num_steps: int) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, num_steps - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def _masked_ce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    weight = mask.flatten().float()
    return (ce * weight).sum() / weight.sum().clamp(min=1.0)


def losses(trunk, mtp: MTPHead, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Cross-entropies of the trunk (t+1) and the head's two draft steps (t+2, t+3) over the
    target tokens (`mask` 1: source code and chat replies, not prompts), plus the rate at which
    the first draft's argmax equals the trunk's own argmax for t+2."""
    B, L = ids.shape
    hidden = trunk.model(input_ids=ids).last_hidden_state  # after the final norm
    logits = trunk.lm_head(hidden[:, :-1]).float()
    ce0 = _masked_ce(logits, ids[:, 1:], mask[:, 1:])
    embed = trunk.model.embed_tokens
    outs, ces, prev = [], [], hidden
    for step in (1, 2):
        n = L - step  # positions whose step-th next token is known
        pos = torch.arange(step, L, device=ids.device).view(1, 1, -1).expand(3, B, -1)
        pe = trunk.model.rotary_emb(prev, pos)
        h = mtp(embed(ids[:, step:]), prev[:, :n], pe, pos[0])
        draft = trunk.lm_head(h[:, :-1]).float()
        ces.append(_masked_ce(draft, ids[:, step + 1 :], mask[:, step + 1 :]))
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
            batch = rows[i : i + 8].to(device).long()
            vals = losses(trunk, mtp, batch, torch.ones_like(batch))
        sums += torch.stack([v.float().cpu() for v in vals])
    trunk.train(), mtp.train()
    ce0, ce1, ce2, agree = (sums / math.ceil(len(rows) / 8)).tolist()
    return {
        "loss": ce0,
        "ppl": math.exp(ce0),
        "mtp1_loss": ce1,
        "mtp2_loss": ce2,
        "mtp_t2_agreement": agree,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    for name, value in asdict(TrainConfig()).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--no-packages", action="store_true", help="standard library only")
    parser.add_argument(
        "--tokenizer-from",
        type=Path,
        default=None,
        help="reuse this checkpoint's tokenizer instead of training one",
    )
    parser.add_argument(
        "--max-shard-bytes",
        type=int,
        default=0,
        help="> 0: split the weights into safetensors shards of at most this size",
    )
    args = parser.parse_args()
    cfg = TrainConfig(**{k: getattr(args, k) for k in asdict(TrainConfig())})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    random.seed(cfg.seed), torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    log = lambda msg: print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    sources = data.collect_sources(char_budget=cfg.char_budget, use_packages=not args.no_packages)
    log(
        f"corpus: {sources.num_stdlib_train} stdlib train files, {sources.num_package_files} "
        f"package files, {sum(map(len, sources.train)) / 1e6:.1f}M chars; "
        f"{len(sources.held_out)} held-out files"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    raw_tok = _tokenizer(args, cfg, sources.train)
    tokenizer = Tokenizer.from_checkpoint(args.out)
    control = {t: tokenizer.control_tokens[t] for t in QWEN_CONTROL_TOKENS}
    log(f"tokenizer: {raw_tok.get_vocab_size()} ids")

    plain = data.plain_encoder(raw_tok)
    raw_docs = [
        (e.ids, [1] * len(e.ids))
        for e in plain.encode_batch(sources.train, add_special_tokens=False)
    ]
    mix = data.ChatMix(
        cfg.num_tasks,
        cfg.num_tool_calls,
        cfg.num_unserved,
        cfg.num_plain_with_tools,
        cfg.num_json,
        cfg.num_greetings,
        cfg.num_readme,
        cfg.thinking_rate,
    )
    chat_docs, counts = data.chat_documents(args.out, rng=random.Random(cfg.seed), mix=mix)
    num_raw = sum(len(d[0]) for d in raw_docs)
    num_chat = sum(len(d[0]) for d in chat_docs)
    num_reply = sum(sum(d[1]) for d in chat_docs)
    log(
        f"tokens: raw {num_raw / 1e6:.1f}M, chat {num_chat / 1e6:.1f}M of which replies "
        f"{num_reply / 1e6:.1f}M ({counts})"
    )
    eos = control["<|endoftext|>"]
    rows_needed = cfg.steps * cfg.batch_size
    stream, stream_mask = data.pack(
        raw_docs + chat_docs, eos_id=eos, num_tokens=rows_needed * cfg.seq_len, seed=cfg.seed
    )
    stream = stream.view(rows_needed, cfg.seq_len)
    stream_mask = stream_mask.view(rows_needed, cfg.seq_len)
    held_docs = [
        (e.ids, [1] * len(e.ids))
        for e in plain.encode_batch(sources.held_out, add_special_tokens=False)
    ]
    held = data.pack(
        held_docs, eos_id=eos, num_tokens=cfg.num_eval_rows * cfg.seq_len, seed=cfg.seed + 1
    )[0].view(cfg.num_eval_rows, cfg.seq_len)
    log("packed the stream")
    encoder = data.ChatEncoder(tokenizer, ChatTemplate.builtin(tokenizer))
    task_rows = task_eval.task_rows(encoder, pad_id=eos)

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
        param_groups([trunk, mtp], cfg.weight_decay),
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=device.type == "cuda",
    )
    params = [p for g in opt.param_groups for p in g["params"]]
    tokens_per_step = cfg.batch_size * cfg.seq_len
    num_steps = cfg.steps
    recent: list[float] = []
    t_train = time.perf_counter()
    step = 0
    t_warm = t_train
    while step < num_steps:
        lr = lr_at(step, cfg, num_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        rows = slice(step * cfg.batch_size, (step + 1) * cfg.batch_size)
        ids = stream[rows].to(device).long()
        mask = stream_mask[rows].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            ce0, ce1, ce2, agree = losses(trunk, mtp, ids, mask)
        loss = ce0 + MTP_WEIGHTS[0] * ce1 + MTP_WEIGHTS[1] * ce2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        recent = [*recent[-49:], ce0.item()] if step % 5 == 0 or step >= num_steps - 50 else recent
        if step % 25 == 0 or step == num_steps - 1:
            rate = (step + 1) * tokens_per_step / (time.perf_counter() - t_train)
            log(
                f"step {step:5d}/{num_steps} loss {ce0.item():.3f} mtp {ce1.item():.3f}/"
                f"{ce2.item():.3f} agree {agree.item():.2f} lr {lr:.2e} "
                f"gnorm {grad_norm.item():.2f} {rate / 1e3:.0f}K tok/s"
            )
        step += 1
        if step == 10:
            t_warm = time.perf_counter()  # the first steps include compilation and warm-up
        if step == 40 and (cfg.train_budget_s > 0 or cfg.deadline_s > 0):
            now = time.perf_counter()
            per_step = (now - t_warm) / 30
            budget = (cfg.train_budget_s or math.inf) - (now - t_train)
            if cfg.deadline_s > 0:  # keep EXPORT_RESERVE_S for the final evaluation and export
                budget = min(budget, cfg.deadline_s - (now - t0) - EXPORT_RESERVE_S)
            fits = int(TRAIN_SHARE * budget / per_step)
            num_steps = max(step, min(cfg.steps, step + fits))
            log(f"{per_step:.3f} s a step: {num_steps} steps fit the budget")
        if step % cfg.eval_every == 0 and step < num_steps:
            log(f"held-out: {evaluate(trunk, mtp, held, device)}")
            log(f"held-out tasks: {task_eval.greedy_matches(trunk, task_rows, device)}")
    train_s = time.perf_counter() - t_train
    final = evaluate(trunk, mtp, held, device)
    final_tasks = task_eval.greedy_matches(trunk, task_rows, device)
    summary = {
        "train_seconds": round(train_s, 1),
        "tokens_per_second": round(num_steps * tokens_per_step / train_s),
        "steps": num_steps,
        "train_tokens": num_steps * tokens_per_step,
        "final_train_loss": round(sum(recent[-50:]) / len(recent[-50:]), 4),
        "held_out": {k: round(v, 4) for k, v in final.items()},
        "held_out_tasks": final_tasks,
        "parameters": num_params,
        "corpus": {
            "stdlib_train_files": sources.num_stdlib_train,
            "package_files": sources.num_package_files,
            "held_out_files": len(sources.held_out),
            "raw_tokens": num_raw,
            "chat_tokens": num_chat,
            "reply_tokens": num_reply,
            **asdict(counts),
        },
        "config": asdict(cfg),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "python": sys.version.split()[0],
    }
    log(f"done: {json.dumps(summary)}")
    export.write_checkpoint(
        args.out, trunk, mtp, text_cfg, control, summary, max_shard_bytes=args.max_shard_bytes
    )
    log(f"wrote {args.out}")


def _tokenizer(args, cfg: TrainConfig, texts: list[str]):
    """Train the BPE on the first `tokenizer_chars` of the corpus, or reuse a checkpoint's; write
    it with the chat template into the output folder."""
    if args.tokenizer_from is not None:
        raw_tok = tokenizers.Tokenizer.from_file(str(args.tokenizer_from / "tokenizer.json"))
        if raw_tok.get_vocab_size() != cfg.vocab_size:
            raise ValueError(
                f"{args.tokenizer_from} has {raw_tok.get_vocab_size()} ids, not "
                f"--vocab-size {cfg.vocab_size}: pass the matching size"
            )
    else:
        sample, size = [], 0
        for text in texts:
            if size >= cfg.tokenizer_chars:
                break
            sample.append(text)
            size += len(text)
        raw_tok = bpe.train_bpe(sample, vocab_size=cfg.vocab_size)
    bpe.save_tokenizer(raw_tok, args.out, chat_template=export.chat_template_source())
    return raw_tok


if __name__ == "__main__":
    main()
