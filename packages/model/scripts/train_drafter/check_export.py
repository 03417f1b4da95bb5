"""After export: sparkinfer's own loader reads the drafter beside the target (CPU, fp32), and its
server path (`forward_tapped`, `write_context`, `propose`) gives the drafts the trained module
gives on held-out sequences. Prints the agreement; a failure is printed, not raised (the files
are written by then)."""

from __future__ import annotations

from pathlib import Path

import torch
from drafter_model import TrainableDrafter
from sparkinfer.model.cache_spec import allocate_caches
from sparkinfer.model.drafters.cache import allocate_drafter_cache
from sparkinfer.model.drafters.weights import load_drafter
from sparkinfer.model.forward_batch import ForwardBatch
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.model.weights import load_model
from target import Sequences

PAGE = 16
NUM_SEQUENCES = 3


@torch.no_grad()
def server_drafts(model, drafter, tokens: list[int], anchor: int) -> tuple[list[int], torch.Tensor]:
    """The drafts the server's path gives at `anchor` (context: tokens before it), and the
    tapped states of that context."""
    num_blocks = -(-(anchor + drafter.config.block_size) // PAGE)
    caches = allocate_caches(
        model.cache_spec(), num_blocks=num_blocks, block_size=PAGE, num_slots=1, device="cpu"
    )
    cache = allocate_drafter_cache(
        drafter.cache_spec(), num_blocks=num_blocks, block_size=PAGE, device="cpu"
    )
    table = torch.arange(num_blocks)[None]
    batch = ForwardBatch.build(
        [anchor], [0], [table[0].tolist()], [0], caches=caches, block_size=PAGE, device="cpu"
    )
    tapped = model.forward_tapped(torch.tensor(tokens[:anchor]), batch).tapped
    drafter.write_context(
        tapped, torch.arange(anchor), cache, block_tables=table,
        seq_ids=torch.zeros(anchor, dtype=torch.int64),
    )  # fmt: skip
    ids = torch.tensor(tokens[anchor : anchor + 1])
    draft = drafter.propose(
        ids, torch.tensor([anchor]), cache, block_tables=table,
        num_keys=anchor + drafter.config.block_size,
    )  # fmt: skip
    return drafter.draft_tokens(draft, ids).tokens[0].tolist(), tapped


def report(
    target_dir: Path, drafter_dir: Path, trained: TrainableDrafter, held: Sequences, block: int
) -> None:
    try:
        tok = Tokenizer.from_checkpoint(target_dir)
        model = load_model(
            target_dir, device="cpu", dtype=torch.float32, num_real_tokens=tok.vocab_size
        )
        drafter = load_drafter(drafter_dir, model, progress=False)
        same = total = 0
        worst_tap = 0.0
        for i in range(min(NUM_SEQUENCES, len(held))):
            length, start = int(held.lengths[i]), int(held.starts[i])
            tokens = held.ids[i, :length].tolist()
            anchor = (start + length - 1) // 2
            ours, tapped = server_drafts(model, drafter, tokens, anchor)
            stored = held.taps[i, :anchor].float().cpu()
            worst_tap = max(worst_tap, ((tapped - stored).abs().max() / stored.abs().max()).item())
            ids = torch.tensor([tokens])
            anchors = torch.tensor([[anchor]])
            hidden = trained(held.taps[i : i + 1, :length].float().cpu(), anchors,
                             ids[:, anchor : anchor + 1], block)  # fmt: skip
            theirs = trained.logits(hidden).argmax(-1)[0, 0].tolist()
            same += sum(a == b for a, b in zip(ours, theirs, strict=True))
            total += len(ours)
        print(f"check: sparkinfer's loader and server path agree with the trained module on "
              f"{same} of {total} drafts; taps differ from transformers' by at most "
              f"{worst_tap:.2e} of their scale", flush=True)  # fmt: skip
    except Exception as exc:  # report it: the files are already written
        print(f"check FAILED: {type(exc).__name__}: {exc}", flush=True)
