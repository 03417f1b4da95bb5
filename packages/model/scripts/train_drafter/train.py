"""Train the embedded model's DFlash block drafter by self-distillation, within a time budget.

    python3 packages/model/scripts/train_drafter/train.py \
        --target packages/model/src/sparkinfer/model/embedded_checkpoint

One seeded command on one GPU (PYTHONPATH over the packages' src folders; runs on the CPU with
tiny settings for a smoke test). Steps, each within its share of --budget-s (all of it counted
from the start, loading and export included):

1. Prompts: "write a function" requests of the task families and of standard-library
   docstrings (chat template, thinking on or off), and openings of standard-library files
   (`prompts.py`); training splits only, and a held-out set from the held-out splits.
2. The target's own greedy continuations of them (transformers, fp32), then one forward over
   prompt + continuation for the tapped layers' states (`target.py`).
3. The drafter (`drafter_model.py`, DFlash layout: Qwen3 layers over the target's taps, blocks
   of an anchor and mask tokens, non-causal within a block) learns to fill each block with the
   target's next tokens: anchors drawn at random over the continuations, cross-entropy on each
   mask row weighted exp(-(k - 1) / gamma) for the k-th draft (the DFlash paper's decay: early
   drafts matter most, a later one only counts when all before it are accepted); the target's
   embedding and LM head are shared and frozen. AdamW, warmup then cosine over the time left.
4. Held-out acceptance: tokens per target step along each held-out continuation, as greedy
   speculative decoding would take them, at the trained block and at block 8, by prompt kind
   ("opening": the bench's `spec --prompt held-out --context 512` prompts), and at block 8 by
   the anchor's position (context length).
5. Export: config.json, model.safetensors (bf16), training.json and README.md into --out (the
   folder it ships in), and into --copy-to if given; then a check that sparkinfer's
   loader reads it and proposes what the trained module proposes.
"""

from __future__ import annotations

import time

STARTED = time.monotonic()

import argparse  # noqa: E402
import bisect  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterable  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import card  # noqa: E402
import prompts  # noqa: E402
from drafter_model import DrafterShape, TrainableDrafter, dflash_tap_layers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from sparkinfer.model.config import load_model_config  # noqa: E402
from sparkinfer.model.tokenizer import Tokenizer  # noqa: E402
from target import Sequences, TargetModel  # noqa: E402

REPO = Path(__file__).resolve().parents[4]
SHIPPED = REPO / "packages/model/src/sparkinfer/model/embedded_checkpoint/dflash"
MASK_TOKEN = "<|audio_start|>"  # the published drafters' mask id (248070 in Qwen's vocabulary)
FILES = ("config.json", "model.safetensors", "training.json", "README.md")
HELD = "held-out "  # the kind's prefix of a held-out prompt while they generate together
GREEDY_CHECK = [0, 0]  # generated tokens that are the teacher-forced argmax, tokens checked
DECAY_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}  # the DFlash paper's gamma per block size


@dataclass(frozen=True)
class DraftTrainConfig:
    seed: int = 0
    budget_s: float = 525.0  # the whole run, from the start (under a 10-minute device call)
    generate_share: float = 0.4  # of the budget, the most that generation may take
    reserve_s: float = 25.0  # kept for evaluation, export and the check
    num_layers: int = 3
    tap_end_before: int = 3  # the last tap is layer num_target_layers - this (`dflash_tap_layers`)
    block_size: int = 16
    num_prompts: int = 16384  # the most; generation usually stops at its time share first
    held_out_each: int = 32
    gen_batch: int = 512  # prompts to 1,024 tokens: half the rows of a forward keep its peak low
    max_new_tokens: int = 256  # the bench's --new-tokens
    thinking_rate: float = 0.6
    batch_seqs: int = 64
    anchors_per_seq: int = 16
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_steps: int = 1_000_000
    log_every: int = 100


def elapsed() -> float:
    return time.monotonic() - STARTED


def log(msg: str) -> None:
    print(f"[{elapsed():7.1f}s] {msg}", flush=True)


def generate(
    target: TargetModel,
    batch: list[prompts.Prompt],
    cfg: DraftTrainConfig,
    tap_layers: tuple[int, ...],
) -> tuple[list[list[int]], list[int], torch.Tensor]:
    """(rows, starts, taps) of one batch of prompts."""
    rows = target.continue_greedily([p.ids for p in batch], cfg.max_new_tokens)
    starts = [len(p.ids) for p in batch]
    taps, agree, total = target.tapped_states(rows, starts, tap_layers)
    GREEDY_CHECK[0] += agree
    GREEDY_CHECK[1] += total
    return rows, starts, taps


def collect(
    target: TargetModel,
    pool: Iterable[prompts.Prompt],
    cfg: DraftTrainConfig,
    tap_layers: tuple[int, ...],
    *,
    limit: int,
    deadline: float,
) -> Sequences:
    """Continuations and taps of up to `limit` prompts, batch by batch until the pool or the time
    ends; sequences with no generated token to predict after the anchor are dropped."""
    dtype = torch.bfloat16 if target.device.type == "cuda" else torch.float32
    parts: list[tuple[list[list[int]], list[int], torch.Tensor, list[str]]] = []
    pool = iter(pool)
    last = 0.0
    for i in range(0, limit, cfg.gen_batch):
        if elapsed() + last > deadline:  # the next batch would end past the deadline
            break
        began = elapsed()
        batch = list(itertools.islice(pool, min(cfg.gen_batch, limit - i)))
        if not batch:
            break
        batch.sort(key=lambda p: -len(p.ids))
        rows, starts, taps = generate(target, batch, cfg, tap_layers)
        # on the host until all are in: the batches' padded taps and the packed copy would not
        # fit on the device together once prompts run to 1,024 tokens
        parts.append((rows, starts, taps.to(dtype).cpu(), [p.kind for p in batch]))
        del taps
        last = elapsed() - began
        done = sum(len(p[0]) for p in parts)
        log(f"generated {done} sequences ({sum(len(r) for p in parts for r in p[0])} tokens)")
    keep = [
        (r, s, p[2][j], p[3][j])
        for p in parts
        for j, (r, s) in enumerate(zip(p[0], p[1], strict=True))
        if len(r) - s >= 2
    ]
    width = max(len(r) for r, _, _, _ in keep)
    ids = torch.zeros((len(keep), width), dtype=torch.int64, device=target.device)
    taps = torch.zeros((len(keep), width, keep[0][2].shape[-1]), dtype=dtype, device=target.device)
    for i, (r, _, t, _) in enumerate(keep):
        ids[i, : len(r)] = torch.tensor(r, device=target.device)
        taps[i, : len(r)] = t[: len(r)]
    as_long = {"dtype": torch.int64, "device": target.device}
    return Sequences(
        ids=ids,
        taps=taps,
        lengths=torch.tensor([len(r) for r, _, _, _ in keep], **as_long),
        starts=torch.tensor([s for _, s, _, _ in keep], **as_long),
        kinds=[k for _, _, _, k in keep],
    )


def decay_weights(block_size: int, device: torch.device) -> torch.Tensor:
    """[S - 1]: exp(-(k - 1) / gamma) for the k-th draft of a block."""
    gamma = DECAY_GAMMA.get(block_size, block_size / 2.3)
    k = torch.arange(1, block_size, device=device, dtype=torch.float32)
    return torch.exp(-(k - 1) / gamma)


def block_loss(
    model: TrainableDrafter, data: Sequences, cfg: DraftTrainConfig, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(decay-weighted cross-entropy, first-draft accuracy) of one random batch of blocks."""
    device = data.ids.device
    s = cfg.block_size
    idx = torch.randint(len(data), (cfg.batch_seqs,), generator=gen, device=device)
    lengths, starts = data.lengths[idx], data.starts[idx]
    width = int(lengths.max())
    ids, taps = data.ids[idx, :width], data.taps[idx, :width]
    spread = (lengths - 1 - starts).float()  # anchors: starts .. lengths - 2
    u = torch.rand((cfg.batch_seqs, cfg.anchors_per_seq), generator=gen, device=device)
    anchors = starts[:, None] + (u * spread[:, None]).long()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        hidden = model(taps, anchors, ids.gather(1, anchors), s)
        logits = model.logits(hidden)  # [B, N, S - 1, V]
    label_pos = anchors[:, :, None] + torch.arange(1, s, device=device)
    valid = label_pos < lengths[:, None, None]
    labels = ids.gather(1, label_pos.clamp(max=width - 1).flatten(1)).view(label_pos.shape)
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none")
    weight = valid.float() * decay_weights(s, device)
    loss = (ce.view(weight.shape) * weight).sum() / weight.sum()
    first = (logits[:, :, 0].argmax(-1) == labels[:, :, 0]).float().mean()
    return loss, first


def lr_at(step: int, progress: float, cfg: DraftTrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    cos = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


def train(
    model: TrainableDrafter, data: Sequences, cfg: DraftTrainConfig, *, deadline: float
) -> dict[str, object]:
    device = data.ids.device
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    keep = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": keep, "weight_decay": 0}],
        lr=cfg.lr, betas=(0.9, 0.95), fused=device.type == "cuda",
    )  # fmt: skip
    start = elapsed()
    curve: list[dict[str, float]] = []
    sums, count, step = torch.zeros(2, device=device), 0, 0
    while step < cfg.max_steps and elapsed() < deadline:
        progress = (elapsed() - start) / max(deadline - start, 1e-6)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, progress, cfg)
        loss, first = block_loss(model, data, cfg, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sums += torch.stack([loss.detach(), first.detach()])
        count += 1
        step += 1
        if step % cfg.log_every == 0 or step == cfg.max_steps or elapsed() >= deadline:
            mean_loss, mean_first = (sums / count).tolist()
            curve.append({"step": step, "s": round(elapsed(), 1), "loss": round(mean_loss, 4),
                          "first_draft_acc": round(mean_first, 4)})  # fmt: skip
            log(f"step {step}: loss {mean_loss:.4f}, first draft right {mean_first:.3f}")
            sums.zero_()
            count = 0
    return {"steps": step, "train_seconds": round(elapsed() - start, 1), "curve": curve}


@torch.no_grad()
def accepted_drafts(model: TrainableDrafter, data: Sequences, i: int, block: int) -> list[int]:
    """Per anchor over sequence i's continuation: how many of the block's drafts in a row are the
    target's own next tokens."""
    device = data.ids.device
    start, length = int(data.starts[i]), int(data.lengths[i])
    ids, taps = data.ids[i : i + 1, :length], data.taps[i : i + 1, :length]
    anchors = torch.arange(start, length - 1, device=device)[None]
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        drafts = model.logits(model(taps, anchors, ids.gather(1, anchors), block)).argmax(-1)[0]
    pos = anchors[0, :, None] + torch.arange(1, block, device=device)
    right = (drafts == ids[0, pos.clamp(max=length - 1)]) & (pos < length)
    return right.int().cumprod(dim=1).sum(dim=1).tolist()


def tokens_per_step(model: TrainableDrafter, data: Sequences, block: int) -> dict[str, float]:
    """Greedy speculative decoding along each held-out continuation: each target step accepts
    the drafts that match and adds its own token; the mean tokens per step, by prompt kind."""
    model.eval()
    totals: dict[str, list[int]] = {}
    for i, kind in enumerate(data.kinds):
        accepted = accepted_drafts(model, data, i, block)
        tokens = steps = a = 0
        while a < len(accepted):
            tokens += accepted[a] + 1
            steps += 1
            a += accepted[a] + 1
        for key in (kind, "all"):
            t = totals.setdefault(key, [0, 0])
            t[0] += tokens
            t[1] += steps
    model.train()
    return {k: round(t / max(s, 1), 3) for k, (t, s) in sorted(totals.items())}


POSITION_BUCKETS = (128, 256, 512, 1024)  # upper ends of the context lengths reported apart


def position_bucket(position: int) -> str:
    """The name of a context length's bucket: "<128", "128-256", ..., ">=1024"."""
    edges = (0, *POSITION_BUCKETS)
    i = bisect.bisect_right(edges, position)
    if i == len(edges):
        return f">={edges[-1]}"
    return f"<{edges[1]}" if i == 1 else f"{edges[i - 1]}-{edges[i]}"


def acceptance_by_position(
    model: TrainableDrafter, data: Sequences, block: int
) -> dict[str, float]:
    """Mean tokens a verify would emit (accepted drafts + 1) of a block at every generated
    anchor, by the anchor's position (its context's length), buckets in order."""
    model.eval()
    sums: dict[str, list[int]] = {}
    for i in range(len(data)):
        start = int(data.starts[i])
        for j, accepted in enumerate(accepted_drafts(model, data, i, block)):
            t = sums.setdefault(position_bucket(start + j), [0, 0])
            t[0] += accepted + 1
            t[1] += 1
    model.train()
    order = [position_bucket(p) for p in (0, *POSITION_BUCKETS)]
    return {k: round(sums[k][0] / sums[k][1], 3) for k in order if k in sums}


def export(
    model: TrainableDrafter,
    shape: DrafterShape,
    out: Path,
    summary: dict[str, object],
    copy_to: Path | None,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(shape.dumps())
    save_file(model.checkpoint_tensors(), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "README.md").write_text(card.model_card(summary))
    if copy_to is not None:
        copy_to.mkdir(parents=True, exist_ok=True)
        for name in FILES:
            shutil.copy2(out / name, copy_to / name)
        log(f"copied the drafter to {copy_to}")


def parse_args() -> tuple[argparse.Namespace, DraftTrainConfig]:
    parser = argparse.ArgumentParser(description="Train the embedded model's DFlash drafter.")
    parser.add_argument("--target", type=Path, required=True, help="the target checkpoint folder")
    parser.add_argument("--out", type=Path, default=SHIPPED, help="the drafter folder to write")
    parser.add_argument("--copy-to", type=Path, default=None, help="also copy the files here")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    for field, value in asdict(DraftTrainConfig()).items():
        parser.add_argument("--" + field.replace("_", "-"), type=type(value), default=value)
    args = parser.parse_args()
    cfg = DraftTrainConfig(**{f: getattr(args, f) for f in asdict(DraftTrainConfig())})
    return args, cfg


def main() -> None:
    args, cfg = parse_args()
    torch.manual_seed(cfg.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device(args.device)
    text = load_model_config(args.target).text
    tap_layers = dflash_tap_layers(text.num_hidden_layers, cfg.num_layers, cfg.tap_end_before)
    tokenizer = Tokenizer.from_checkpoint(args.target)
    shape = DrafterShape(
        hidden_size=text.hidden_size, intermediate_size=text.intermediate_size,
        num_layers=cfg.num_layers, num_heads=text.num_attention_heads,
        num_kv_heads=text.num_key_value_heads, head_dim=text.head_dim,
        rms_norm_eps=text.rms_norm_eps, rope_theta=text.rope_theta, vocab_size=text.vocab_size,
        block_size=cfg.block_size, mask_token_id=tokenizer.control_tokens[MASK_TOKEN],
        target_layer_ids=tap_layers, num_target_layers=text.num_hidden_layers,
    )  # fmt: skip
    log(f"drafter: {shape}")
    maker = prompts.PromptMaker(tokenizer, cfg.thinking_rate)
    rng = random.Random(cfg.seed)
    held_pool = prompts.held_out_prompts(maker, cfg.held_out_each, rng)
    pool = prompts.training_prompts(maker, rng)
    log(f"{len(held_pool)} held-out prompts")
    target = TargetModel(args.target, device)
    held_kinds = [HELD + p.kind for p in held_pool]
    held_pool = [prompts.Prompt(k, p.ids) for k, p in zip(held_kinds, held_pool, strict=True)]
    both = collect(
        target, itertools.chain(held_pool, pool), cfg, tap_layers,
        limit=len(held_pool) + cfg.num_prompts, deadline=cfg.budget_s * cfg.generate_share,
    )  # fmt: skip
    held, data = both.split(lambda kind: kind.startswith(HELD))
    del both  # its taps are copied into the two parts
    held.kinds = [k.removeprefix(HELD) for k in held.kinds]
    generated = int((data.lengths - data.starts).sum())
    agree, checked = GREEDY_CHECK
    log(f"training data: {len(data)} sequences, {generated} generated tokens; "
        f"{agree} of {checked} checked tokens are the teacher-forced argmax")  # fmt: skip
    model = TrainableDrafter(shape, target.embed_weight, target.lm_head_weight).to(device)
    del target
    result = train(model, data, cfg, deadline=cfg.budget_s - cfg.reserve_s)
    evaluation = {
        f"block_{b}": tokens_per_step(model, held, b) for b in sorted({cfg.block_size, 8})
    }
    by_position = acceptance_by_position(model, held, 8)
    log(f"held-out tokens per target step: {evaluation}; at block 8 by position: {by_position}")
    command = "python3 " + " ".join(shlex.quote(a) for a in sys.argv)
    summary: dict[str, object] = {
        "command": command,
        "target": str(args.target),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": asdict(cfg),
        "drafter": shape.config_json(),
        "data": {
            "sequences": len(data),
            "generated_tokens": generated,
            "by_kind": {k: data.kinds.count(k) for k in sorted(set(data.kinds))},
            "held_out_sequences": len(held),
            "greedy_check": {"argmax": agree, "checked": checked},
        },
        **result,
        "held_out_tokens_per_step": evaluation,
        "held_out_block_8_by_position": by_position,
    }
    export(model, shape, args.out, summary, args.copy_to)
    log(f"wrote {args.out}")
    import check_export  # the server's own path; CPU, after the files are safe

    check_export.report(args.target, args.out, model.cpu().float(), held, cfg.block_size)
    log("done")


if __name__ == "__main__":
    main()
