"""The drafter's model card (README.md), from the run's summary."""

from __future__ import annotations

from typing import Any


def _acceptance_rows(evaluation: dict[str, dict[str, float]]) -> list[str]:
    kinds = sorted({k for per in evaluation.values() for k in per})
    head = "| block | " + " | ".join(kinds) + " |"
    rows = [head, "|---" * (len(kinds) + 1) + "|"]
    for name, per in evaluation.items():
        rows.append(f"| {name.removeprefix('block_')} | "
                    + " | ".join(f"{per.get(k, 0):.2f}" for k in kinds) + " |")  # fmt: skip
    return rows


def _position_rows(by_position: dict[str, float]) -> list[str]:
    """At block 8, the mean tokens a verify emits by the anchor's position (none: no rows)."""
    if not by_position:
        return []
    names = list(by_position)
    return [
        "At block 8 by the anchor's position (the drafter's context length), every generated "
        "anchor of the held-out continuations: mean accepted drafts + 1:",
        "",
        "| " + " | ".join(names) + " |",
        "|---" * len(names) + "|",
        "| " + " | ".join(f"{by_position[k]:.2f}" for k in names) + " |",
        "",
    ]


def model_card(s: dict[str, Any]) -> str:
    d, data, cfg = s["drafter"], s["data"], s["config"]
    curve = s["curve"]
    shown = curve if len(curve) <= 12 else curve[:: max(1, len(curve) // 10)] + curve[-1:]
    lines = [
        "# sparkinfer/qwen3.8-code-tiny-dflash",
        "",
        "A DFlash block drafter for the embedded model (`sparkinfer/qwen3.8-code-tiny`), trained "
        "by self-distillation: it reads the target's hidden states at layers "
        f"{d['dflash_config']['target_layer_ids']} and fills a block of {d['block_size']} rows "
        f"(the anchor and {d['block_size'] - 1} mask tokens) in one non-causal forward. "
        "Select it with `--draft-model embedded`.",
        "",
        f"- **Layout**: `DFlashDraftModel` (docs/model.md §17): {d['num_hidden_layers']} Qwen3 "
        f"layers, hidden {d['hidden_size']}, SwiGLU {d['intermediate_size']}, "
        f"{d['num_attention_heads']} query / {d['num_key_value_heads']} key-value heads of "
        f"{d['head_dim']}, rope theta {d['rope_theta']:g}, mask token "
        f"{d['dflash_config']['mask_token_id']} (`<|audio_start|>`, the published drafters' "
        f"mask id); {s['parameters']:,} parameters in bf16; the target's embedding and LM head "
        "are shared, not stored.",
        f"- **Data**: {data['sequences']:,} greedy continuations of the target "
        f"({data['generated_tokens']:,} generated tokens; by prompt kind {data['by_kind']}): "
        '"write a function" requests of the task families and of standard-library docstrings '
        f"(chat template, thinking on for {cfg['thinking_rate']:.0%}), and openings of "
        "standard-library files; training splits only. Of the generated tokens checked, "
        f"{data['greedy_check']['argmax']:,} of {data['greedy_check']['checked']:,} are the "
        "argmax of the target's forward over the whole sequence (the continuations are greedy).",
        f"- **Training**: {s['steps']:,} steps in {s['train_seconds']} s on {s['device']}: "
        f"{cfg['batch_seqs']} sequences x {cfg['anchors_per_seq']} random anchors a step, "
        "cross-entropy of each mask row against the target's token, weighted exp(-(k-1)/gamma) "
        "for the k-th draft; AdamW "
        f"(lr {cfg['lr']:g}, betas 0.9/0.95, weight decay {cfg['weight_decay']:g}), "
        f"{cfg['warmup_steps']} warmup steps then cosine to {cfg['min_lr_ratio']:g}x over the "
        f"time left, gradient clipping {cfg['grad_clip']:g}, bf16 autocast, seed {cfg['seed']}.",
        "",
        "Loss (decay-weighted) and first-draft accuracy over training:",
        "",
        "| step | s | loss | first draft right |",
        "|---|---|---|---|",
        *(
            f"| {c['step']} | {c['s']} | {c['loss']:.4f} | {c['first_draft_acc']:.3f} |"
            for c in shown
        ),
        "",
        f"Held-out acceptance ({data['held_out_sequences']} held-out prompts: held-out task "
        "names and phrasings, held-out library files; opening: the bench's `spec --prompt "
        "held-out --context 512` prompts): tokens per target step of greedy speculative "
        "decoding along the target's own continuations (accepted drafts + 1):",
        "",
        *_acceptance_rows(s["held_out_tokens_per_step"]),
        "",
        *_position_rows(s.get("held_out_block_8_by_position", {})),
        "Command (one GPU; PYTHONPATH over the packages' `src` folders):",
        "",
        f"    {s['command']}",
        "",
    ]
    return "\n".join(lines)
