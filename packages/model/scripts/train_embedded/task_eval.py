"""A quick read of the held-out "write a function" tasks during training, by teacher forcing: the
reference answer, rendered as the server renders the request (thinking on, its default), goes
through the trunk in one batch, and an answer counts when the trunk's argmax equals the next
reference token at every reply position, which is exactly when greedy decoding writes the
reference. The signature (the answer's `def` or `class` line) is counted apart: the usual miss is
a wrong name. Greedy reference answers are a lower bound on answers that pass their tests.

Only the figure is read: no held-out task is ever trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from data import ChatEncoder
from sparkinfer.bench.evals.task_prompts import held_out_tasks
from synthetic import task_turn


@dataclass(frozen=True)
class TaskRows:
    ids: torch.Tensor  # [N, L] right-padded
    reply: torch.Tensor  # [N, L] 1 where the token is a reply token
    signature: torch.Tensor  # [N, L] 1 where the token is in the reply up to the signature line


def task_rows(encoder: ChatEncoder, pad_id: int) -> TaskRows:
    """The held-out tasks' prompts and reference answers as one padded batch."""
    rows, replies, sigs = [], [], []
    for task in held_out_tasks():
        ids, mask = encoder.encode(task_turn(task), thinking=True)
        start = mask.index(1)
        first_line = task.solution.split("\n")[0] + "\n"
        sig_end = len(ids)
        for k in range(start + 1, len(ids) + 1):
            if first_line in encoder.tokenizer.decode(ids[start:k]):
                sig_end = k
                break
        rows.append(ids)
        replies.append(mask)
        sigs.append([0] * start + [1] * (sig_end - start) + [0] * (len(ids) - sig_end))
    width = max(map(len, rows))

    def pad(xs: list[list[int]], value: int) -> torch.Tensor:
        return torch.tensor([x + [value] * (width - len(x)) for x in xs])

    return TaskRows(pad(rows, pad_id), pad(replies, 0), pad(sigs, 0))


@torch.no_grad()
def greedy_matches(trunk, rows: TaskRows, device: torch.device) -> dict[str, float]:
    """How many held-out tasks the trunk answers with the reference (greedy), and how many it
    starts with the reference signature."""
    was_training = trunk.training
    trunk.eval()
    ids = rows.ids.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = trunk(input_ids=ids).logits[:, :-1]
    right = logits.argmax(-1) == ids[:, 1:]
    reply = rows.reply[:, 1:].to(device).bool()
    sig = rows.signature[:, 1:].to(device).bool()
    trunk.train(was_training)
    return {
        "tasks": len(ids),
        "greedy_reference": int((right | ~reply).all(-1).sum()),
        "greedy_signature": int((right | ~sig).all(-1).sum()),
        "reply_token_accuracy_pct": round(100 * float((right & reply).sum() / reply.sum()), 1),
    }
