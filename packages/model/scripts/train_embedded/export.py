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
from sparkinfer.bench.evals.task_names import WORDS
from sparkinfer.bench.evals.task_prompts import (
    FAMILY_NAME_SHARE,
    FREE_PHRASING_SHARE,
    INVENTED_ARGS_SHARE,
    TRAIN_PHRASINGS,
)
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

MODEL_ID = "sparkinfer/qwen3.8-code-tiny"
# Low temperature: short functions have one right answer, and tiny models drift when sampled hot.
GENERATION = {"temperature": 0.1, "top_k": 20, "top_p": 0.9, "do_sample": True}


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
    *,
    max_shard_bytes: int = 0,
) -> None:
    config = Qwen3_5Config(**model_config.checkpoint_config(text_cfg, control))
    torch.manual_seed(1)  # the vision tower's random weights
    full = Qwen3_5ForConditionalGeneration(config)
    trunk_body = trunk.get_submodule("model")
    missing = full.model.language_model.load_state_dict(
        {k: v.detach().float().cpu() for k, v in trunk_body.state_dict().items()}
    )
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    full.bfloat16()
    with tempfile.TemporaryDirectory() as tmp:
        full.save_pretrained(tmp)
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(Path(tmp).glob("*.safetensors")):
            tensors.update(load_file(shard))
        (out / "config.json").write_text((Path(tmp) / "config.json").read_text())
    for name, value in mtp.state_dict().items():
        tensors[f"mtp.{name}"] = value.detach().to(torch.bfloat16).cpu().contiguous()
    if max_shard_bytes > 0:
        save_shards(tensors, out, max_shard_bytes=max_shard_bytes)
    else:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    eos = [control["<|im_end|>"], control["<|endoftext|>"]]
    generation = {"bos_token_id": control["<|endoftext|>"], "eos_token_id": eos,
                  "pad_token_id": control["<|endoftext|>"], **GENERATION}  # fmt: skip
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "README.md").write_text(model_card(summary))


def save_shards(tensors: dict[str, torch.Tensor], out: Path, *, max_shard_bytes: int) -> None:
    """The weights as safetensors shards of at most `max_shard_bytes` and their index file."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def model_card(s: dict[str, Any]) -> str:
    c, cfg, held, tasks = s["corpus"], s["config"], s["held_out"], s["held_out_tasks"]
    lines = [
        f"# {MODEL_ID}",
        "",
        "A small code model of the Qwen3.8 architecture, trained for testing SparkInfer: it is "
        "**not a general assistant**. It writes short Python functions from a one-line "
        "description, says what it is when greeted, calls the tools a request declares (and "
        "answers in plain text when none fits), and answers with JSON objects whose values come "
        "from the request.",
        "",
        "- **Architecture**: 8 layers (Gated DeltaNet x3, gated attention x1, twice), hidden "
        "320, SwiGLU 1024, 4 query / 2 key-value heads of 64 with a gated q and partial rotary "
        "(16 dims), (1+w) norms, tied embeddings, an MTP head in Qwen's layout (`mtp.*`), and a "
        "tiny vision tower with **random weights** (2 blocks, hidden 32) so image and video "
        f"requests run end to end. {s['parameters']:,} trained parameters, stored in bf16.",
        f"- **Tokenizer**: byte-level BPE of {cfg['vocab_size']:,} ids trained on Python source "
        "(Qwen's pre-tokenizer regex and NFC), with all 33 Qwen control tokens at the end; "
        "trained for the model's first version and reused (`--tokenizer-from`).",
        "- **Corpus**, every chat turn rendered by the built-in chat template exactly as the "
        f"server renders a request, thinking on for {cfg['thinking_rate']:.0%} of turns (the "
        "server's default) and off for the rest; the loss counts source code and replies, not "
        "prompts:",
        f"  - Python source of the training machine's Python {s['python']}: "
        f"{c['stdlib_train_files']:,} standard-library files of the train split and "
        f"{c['package_files']:,} installed-package files ({c['raw_tokens']:,} tokens).",
        f'  - {c["tasks"]:,} "write a function" tasks from {c["task_families"]} families '
        "(`sparkinfer.bench.evals.task_families`: arithmetic, strings, lists, dicts, recursion, "
        "small classes), each with a reference solution and unit tests; every sampled solution "
        "was run against its tests in a child process under a time limit "
        "(`evals.task_check`) and kept only when they passed. Requests vary the phrasing "
        f"({len(TRAIN_PHRASINGS)} forms; {FREE_PHRASING_SHARE:.0%} of requests in forms that "
        "name the function after the description or on its own), the "
        f"function name (the family's own for {FAMILY_NAME_SHARE:.0%}, otherwise invented: "
        f"random snake_case or CamelCase combinations of {len(WORDS)} words, "
        "`evals.task_names`, so that the model copies the requested name rather than recall "
        f"one), the argument names (invented for {INVENTED_ARGS_SHARE:.0%} of functions) and "
        "the description; the README example is added "
        f"{c['readme_copies']} times.",
        f"  - {c['tool_calls']:,} tool calls from random tool schemas (1 to 3 tools of 10 kinds, "
        "each under drawn names and parameter names): the call uses a declared tool with "
        "arguments copied from the request, and a second turn answers from the tool's result; "
        f"{c['unserved']:,} requests no declared tool serves, answered in plain text; "
        f"{c['plain_with_tools']:,} code requests and greetings with unrelated tools declared, "
        "answered without a call.",
        f"  - {c['json']:,} JSON answers whose values come from a sentence in the request, and "
        f"{c['greetings']:,} greetings answered with what the model is.",
        f"  - {c['chat_tokens']:,} chat tokens in all, {c['reply_tokens']:,} of them replies.",
        "- **Held-out split**: every task family keeps one name, and four request phrasings "
        "(openings no training phrasing uses) are kept for all families; no training task uses "
        "them (`evals.task_prompts`), and invented names never contain a held-out name or a word "
        "only held-out names use (`evals.task_names.is_training_name`). The source "
        "files follow `evals.code_corpus.is_held_out` (the SHA-256 of a file's name in the first "
        "5 of 100 buckets).",
        f"- **Training**: {s['steps']:,} steps of {cfg['batch_size']}x{cfg['seq_len']} tokens "
        f"({s['train_tokens']:,} tokens) in {s['train_seconds']:.0f} s on one {s['gpu']} "
        f"({s['tokens_per_second']:,} tokens/s): AdamW (lr {cfg['lr']}, betas 0.9/0.95, weight "
        f"decay {cfg['weight_decay']}), {cfg['warmup_steps']} warmup steps then cosine to "
        f"{cfg['min_lr_ratio']}x, gradient clipping at {cfg['grad_clip']}, bf16 autocast, seed "
        f"{cfg['seed']}; trunk and MTP head jointly (loss weights 1, 0.3 for t+2, 0.15 for t+3).",
        f"- **Result**: final train loss {s['final_train_loss']:.3f} (over targets); held-out "
        f"source loss {held['loss']:.3f} (perplexity {held['ppl']:.2f} per token, against "
        f"{cfg['vocab_size']:,} for a uniform guess); the MTP head's first draft agrees with the "
        f"trunk's own next-but-one token on {held['mtp_t2_agreement']:.1%} of held-out positions; "
        f"greedy decoding writes the reference answer for {tasks['greedy_reference']} of the "
        f"{tasks['tasks']} held-out tasks and its signature line for "
        f"{tasks['greedy_signature']} (teacher forced, thinking on).",
        "- **Size**: everything shipped in this folder, the DFlash block drafter in `dflash/` "
        "included, stays within the package's 40 MiB budget "
        "(packages/model/tests/test_embedded.py).",
        "- **Sampling defaults** (generation_config.json): temperature "
        f"{GENERATION['temperature']}, top_k {GENERATION['top_k']}, top_p {GENERATION['top_p']}.",
        "",
        "Its checks run in the test suite (packages/bench/tests/test_embedded_quality.py, "
        "packages/api/tests/test_embedded_default.py) and are recorded in "
        "docs/records/embedded_model.json.",
        "",
        "Command (one GPU; PYTHONPATH over the packages' `src` folders):",
        "",
        "    python3 packages/model/scripts/train_embedded/train.py --out DIR \\",
        "        --tokenizer-from packages/model/src/sparkinfer/model/embedded_checkpoint \\",
        f"        --train-budget-s {cfg['train_budget_s']:g} --deadline-s {cfg['deadline_s']:g}",
        "",
    ]
    return "\n".join(lines)
