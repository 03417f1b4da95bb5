"""The drafter trainer (scripts/train_drafter) computes what the server runs: on the embedded
model and its shipped DFlash drafter, the trainer's tapped states (transformers'
`hidden_states[i + 1]`) equal `forward_tapped`'s, and the trainer's module, loaded with the
shipped weights, proposes the blocks the server's path (`write_context`, `propose`) proposes at
the same anchors, whole blocks and the cut ones the engine drafts from. A change to either side's
taps, positions, anchor, mask token, context or head breaks this (docs/model.md §17)."""

from __future__ import annotations

import importlib
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.decoder import Qwen3_8ForCausalLM
from sparkinfer.model.drafters.cache import allocate_drafter_cache
from sparkinfer.model.drafters.dflash import BlockDrafter
from sparkinfer.model.drafters.weights import load_drafter
from sparkinfer.model.embedded import embedded_checkpoint_dir, embedded_drafter_dir
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.model.weights import load_model

# The trainer's files are scripts, not a package: imported from their folder.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "train_drafter"))
drafter_model = importlib.import_module("drafter_model")

PAGE = 16
SOURCE = '''import os
import sys


def read_lines(path):
    """Return the lines of the file at path, without their line ends."""
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\\n") for line in f]


def count_words(lines):
    counts = {}
    for line in lines:
        for word in line.split():
            counts[word] = counts.get(word, 0) + 1
    return counts


def main(argv):
    for path in argv[1:]:
        counts = count_words(read_lines(path))
        for word, n in sorted(counts.items()):
            print(f"{path}: {word}: {n}")
'''


@pytest.fixture(scope="module")
def target() -> Qwen3_8ForCausalLM:
    return load_model(embedded_checkpoint_dir(), device="cpu", dtype=torch.float32, progress=False)


@pytest.fixture(scope="module")
def drafter(target: Qwen3_8ForCausalLM) -> BlockDrafter:
    return load_drafter("embedded", target, progress=False).eval()


@pytest.fixture(scope="module")
def tokens() -> list[int]:
    ids = Tokenizer.from_checkpoint(embedded_checkpoint_dir()).encode(SOURCE)
    assert len(ids) > 150
    return ids


@pytest.fixture(scope="module")
def trained(target: Qwen3_8ForCausalLM, drafter: BlockDrafter) -> torch.nn.Module:
    """The trainer's module, built as train.py builds it, holding the shipped weights."""
    c, text = drafter.config, target.config.text
    shape = drafter_model.DrafterShape(
        hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_layers=c.num_hidden_layers, num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, vocab_size=text.vocab_size, block_size=c.block_size,
        mask_token_id=c.mask_token_id, target_layer_ids=c.target_layer_ids,
        num_target_layers=text.num_hidden_layers,
    )  # fmt: skip
    model = drafter_model.TrainableDrafter(
        shape, target.model.embed_tokens.weight.detach(), target.lm_head.weight.detach()
    )
    shipped = load_file(embedded_drafter_dir() / "model.safetensors")
    model.load_state_dict({k: v.float() for k, v in shipped.items()}, strict=True)
    return model.eval()


def server_taps(target: Qwen3_8ForCausalLM, tokens: list[int]) -> torch.Tensor:
    """`forward_tapped`'s tapped rows of the tokens, one prefill on fresh caches."""
    n = len(tokens)
    num_blocks = -(-n // PAGE)
    caches = allocate_caches(
        target.cache_spec(), num_blocks=num_blocks, block_size=PAGE, num_slots=1, device="cpu"
    )
    table = list(range(num_blocks))
    batch = ForwardBatch.build([n], [0], [table], [0], caches=caches, block_size=PAGE, device="cpu")
    with torch.inference_mode():
        return target.forward_tapped(torch.tensor(tokens), batch).tapped


def server_block(
    drafter: BlockDrafter, taps: torch.Tensor, tokens: list[int], anchor: int
) -> tuple[list[int], torch.Tensor]:
    """The server's drafts and logits of one block at `anchor` (its context: taps before it)."""
    s = drafter.config.block_size
    num_blocks = -(-(anchor + s) // PAGE)
    cache = allocate_drafter_cache(
        drafter.cache_spec(), num_blocks=num_blocks, block_size=PAGE, device="cpu"
    )
    table = torch.arange(num_blocks)[None]
    drafter.write_context(
        taps[:anchor], torch.arange(anchor), cache, block_tables=table,
        seq_ids=torch.zeros(anchor, dtype=torch.int64),
    )  # fmt: skip
    ids = torch.tensor(tokens[anchor : anchor + 1])
    draft = drafter.propose(
        ids, torch.tensor([anchor]), cache, block_tables=table, num_keys=anchor + s
    )
    return drafter.draft_tokens(draft, ids).tokens[0].tolist(), draft.logits[0]


def test_the_shipped_drafter_taps_the_layers_the_trainer_picks(target, drafter):
    c, text = drafter.config, target.config.text
    assert c.target_layer_ids == drafter_model.dflash_tap_layers(
        text.num_hidden_layers, c.num_hidden_layers
    )
    assert target.tap_layers == c.target_layer_ids


def test_the_trainers_taps_are_the_servers(target, drafter, tokens):
    """target.py's tapped states (transformers' hidden states, one forward) equal the taps the
    server writes into the drafter's context."""
    teacher = importlib.import_module("target").TargetModel(
        embedded_checkpoint_dir(), torch.device("cpu")
    )
    theirs, _, _ = teacher.tapped_states(
        [tokens], [len(tokens) - 1], drafter.config.target_layer_ids
    )
    ours = server_taps(target, tokens)
    torch.testing.assert_close(theirs[0], ours, rtol=1e-4, atol=1e-4 * float(ours.abs().max()))


@pytest.mark.parametrize("block_size", [16, 8, 4])
def test_the_trainers_blocks_are_the_servers(target, drafter, trained, tokens, block_size):
    """At anchors early, mid and late in the tokens, the trainer's module (all anchors in one
    forward, as its loss and held-out acceptance run it) gives the server's logits and drafts,
    for the trained block and the shorter ones the engine cuts it to."""
    taps = server_taps(target, tokens)
    anchors = [5, len(tokens) // 2, len(tokens) - block_size]
    with torch.inference_mode():
        anchor_ids = torch.tensor([[tokens[a] for a in anchors]])
        hidden = trained(taps[None], torch.tensor([anchors]), anchor_ids, block_size)
        theirs = trained.logits(hidden)[0]  # [anchors, block - 1, V]
    cut = replace(drafter.config, block_size=block_size)
    full, drafter.config = drafter.config, cut
    try:
        for i, a in enumerate(anchors):
            drafts, logits = server_block(drafter, taps, tokens, a)
            real = logits[:, : theirs.shape[-1]]
            scale = float(real.abs().max())
            torch.testing.assert_close(theirs[i], real, rtol=1e-4, atol=1e-4 * scale)
            assert drafts == theirs[i].argmax(-1).tolist(), f"anchor {a}"
    finally:
        drafter.config = full
