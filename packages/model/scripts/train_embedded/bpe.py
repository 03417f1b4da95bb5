"""The embedded model's tokenizer: a byte-level BPE trained on the corpus with HF `tokenizers`.

Same normaliser, pre-tokenizer regex and byte-level mapping as Qwen's tokenizer, a smaller learned
vocabulary, and every Qwen control token appended after it in Qwen's order, so the chat template,
reasoning and tool-call parsers and the vision placeholders work unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from sparkinfer.model.tokenizer import (
    QWEN_CONTROL_TOKENS,
    QWEN_NON_SKIPPED_TOKENS,
    QWEN_PRETOKENIZE_REGEX,
)
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)


def train_bpe(texts: Iterable[str], *, vocab_size: int) -> Tokenizer:
    """A byte-level BPE of `vocab_size` ids in all: learned tokens, then the control tokens."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(QWEN_CONTROL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    for text in QWEN_CONTROL_TOKENS:  # one at a time, so ids follow Qwen's order
        token = AddedToken(text, special=text not in QWEN_NON_SKIPPED_TOKENS, normalized=False)
        tok.add_special_tokens([token]) if token.special else tok.add_tokens([token])
    if tok.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"the BPE has {tok.get_vocab_size()} ids, not {vocab_size}: the corpus is too small "
            "for this vocabulary; give it more text or ask for fewer ids"
        )
    return tok


def save_tokenizer(tok: Tokenizer, folder: Path, *, chat_template: str) -> None:
    """tokenizer.json and a tokenizer_config.json carrying the chat template."""
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 262144,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": chat_template,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
