"""Write the trained model as an HF-layout checkpoint: the text model and a tiny random vision
tower through transformers' `save_pretrained`, the MTP head's `mtp.*` tensors added beside them,
a generation config, and a model card with the run's figures."""

from __future__ import annotations

import json
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import model_config
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

MODEL_ID = "sparkinfer/qwen3.8-code-tiny"
GENERATION = {"temperature": 0.7, "top_k": 20, "top_p": 0.95, "do_sample": True}


def chat_template_source() -> str:
    """The chat template the server ships, so the checkpoint renders prompts the same way."""
    path = resources.files("sparkinfer.model") / "templates" / "qwen3_8.jinja"
    return path.read_text(encoding="utf-8")


def write_checkpoint(
    out: Path,
    trunk: torch.nn.Module,
    mtp: torch.nn.Module,
    text_cfg: dict[str, Any],
    control: dict[str, int],
    summary: dict[str, Any],
) -> None:
    config = Qwen3_5Config(**model_config.checkpoint_config(text_cfg, control))
    torch.manual_seed(1)  # the vision tower's random weights
    full = Qwen3_5ForConditionalGeneration(config)
    missing = full.model.language_model.load_state_dict(
        {k: v.detach().float().cpu() for k, v in trunk.model.state_dict().items()}
    )
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    full = full.to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        full.save_pretrained(tmp)
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(Path(tmp).glob("*.safetensors")):
            tensors.update(load_file(shard))
        (out / "config.json").write_text((Path(tmp) / "config.json").read_text())
    for name, value in mtp.state_dict().items():
        tensors[f"mtp.{name}"] = value.detach().to(torch.bfloat16).cpu().contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    eos = [control["<|im_end|>"], control["<|endoftext|>"]]
    generation = {"bos_token_id": control["<|endoftext|>"], "eos_token_id": eos,
                  "pad_token_id": control["<|endoftext|>"], **GENERATION}  # fmt: skip
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "README.md").write_text(model_card(summary))


def model_card(s: dict[str, Any]) -> str:
    c, cfg, held = s["corpus"], s["config"], s["held_out"]
    lines = [
        f"# {MODEL_ID}",
        "",
        "A small code model of the Qwen3.8 architecture, trained for testing SparkInfer: it is "
        "**not a general assistant**. It writes short Python functions, makes Qwen XML tool "
        "calls for a given tool schema, answers with JSON objects for a described schema, and "
        "gives the server, its speculative decoder and its quality checks a model whose output "
        "means something.",
        "",
        "- **Architecture**: 8 layers (Gated DeltaNet x3, gated attention x1, twice), hidden 256, "
        "SwiGLU 640, 4 query / 2 key-value heads of 64 with a gated q and partial rotary (16 "
        "dims), (1+w) norms, tied embeddings, an MTP head in Qwen's layout (`mtp.*`), and a tiny "
        "vision tower with **random weights** (2 blocks, hidden 32) so image and video requests "
        f"run end to end. {s['parameters']:,} trained parameters.",
        f"- **Tokenizer**: byte-level BPE of {cfg['vocab_size']:,} ids trained on the same corpus "
        "(Qwen's pre-tokenizer regex and NFC), with all 33 Qwen control tokens at the end.",
        "- **Corpus**: Python source read at training time from the training machine's Python "
        f"{s['python']} installation: {c['stdlib_train_files']:,} standard-library files of the "
        f"train split and {c['package_files']:,} installed-package files ({c['raw_tokens']:,} "
        f'tokens), plus {c["tasks"]:,} "write a function" tasks made from them (each '
        f"{cfg['task_repeats']} times; the answer's docstring cut to its first line), "
        f"{c['tool_calls']:,} tool-call turns, {c['json']:,} JSON turns and {c['greetings']:,} "
        f"greetings ({c['chat_tokens']:,} tokens), rendered by the built-in chat template with "
        "thinking on and off.",
        "- **Split rule** (`sparkinfer.bench.evals.code_corpus.is_held_out`): a file is held out "
        "when the SHA-256 of its name (folder/name for `__init__.py` and `__main__.py`) falls in "
        "the first 5 of 100 buckets; package files the rule holds out, or equal to a held-out "
        "file, are skipped.",
        f"- **Training**: {cfg['steps']:,} steps of {cfg['batch_size']}x{cfg['seq_len']} tokens "
        f"({s['train_tokens']:,} tokens) in {s['train_seconds']:.0f} s on one {s['gpu']} "
        f"({s['tokens_per_second']:,} tokens/s): AdamW (lr {cfg['lr']}, betas 0.9/0.95, weight "
        f"decay {cfg['weight_decay']}), {cfg['warmup_steps']} warmup steps then cosine to "
        f"{cfg['min_lr_ratio']}x, gradient clipping at {cfg['grad_clip']}, bf16 autocast, seed "
        f"{cfg['seed']}; trunk and MTP head jointly (loss weights 1, 0.3 for t+2, 0.15 for t+3).",
        f"- **Result**: final train loss {s['final_train_loss']:.3f}; held-out loss "
        f"{held['loss']:.3f} (perplexity {held['ppl']:.2f} per token, against "
        f"{cfg['vocab_size']:,} for a uniform guess); the MTP head's first draft agrees with the "
        f"trunk's own next-but-one token on {held['mtp_t2_agreement']:.1%} of held-out positions.",
        "",
        "Its quality on a test machine's held-out files (perplexity, answers that parse, MTP "
        "agreement, tool calls and JSON that close) is checked by the test suite and recorded "
        'in docs/benchmarks.md, section "The embedded code model".',
        "",
        "Command (one GPU; PYTHONPATH over the packages' `src` folders):",
        "",
        "    python3 packages/model/scripts/train_embedded/train.py --out DIR",
        "",
    ]
    return "\n".join(lines)
