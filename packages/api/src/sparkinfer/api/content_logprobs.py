"""Which of a choice's sampled tokens make up its content, for `logprobs.content`.

The model writes `reasoning</think>\\n\\nanswer` and tool calls in XML; the output parsers take
the reasoning, the call markup and the whitespace around them out of the content. Logprobs are
reported for the content's tokens only, so that their bytes join to exactly the content: the
tokens up to `</think>` are reasoning, and after it a token is content when its bytes continue
the content released so far (a token the parsers left out never does, and is skipped).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from sparkinfer.api.reasoning_parser import THINK_END
from sparkinfer.model.tokenizer import Tokenizer
from sparkinfer.scheduler.request import TokenLogprob


class ContentLogprobs:
    """One choice's logprob entries, handed out as its content grows (`take`)."""

    def __init__(self, tokenizer: Tokenizer, *, is_thinking: bool) -> None:
        self.tokenizer = tokenizer
        self._end_id = tokenizer.token_to_id(THINK_END) if is_thinking else None
        self._is_reasoning = self._end_id is not None  # before the model's `</think>`
        self._pending: deque[TokenLogprob] = deque()  # answer tokens not yet matched or skipped
        self._num_matched = 0  # bytes of the content the handed-out tokens cover

    def push(self, entries: Sequence[TokenLogprob]) -> None:
        """The entries of the tokens one engine step sampled, in order."""
        for entry in entries:
            if self._is_reasoning:
                self._is_reasoning = entry.token_id != self._end_id
                continue
            self._pending.append(entry)

    def take(self, content: str) -> list[TokenLogprob]:
        """The pending entries whose tokens spell the part of `content` (the whole content so
        far) not yet covered; tokens that are no part of it are skipped."""
        data = content.encode()
        out: list[TokenLogprob] = []
        while self._pending and self._num_matched < len(data):
            raw = self.tokenizer.token_bytes(self._pending[0].token_id)
            rest = data[self._num_matched :]
            if raw and rest.startswith(raw):
                out.append(self._pending.popleft())
                self._num_matched += len(raw)
            elif raw.startswith(rest):  # the token's end is not released yet
                break
            else:  # markup or whitespace the parsers left out
                self._pending.popleft()
        return out

    def finish(self, content: str) -> list[TokenLogprob]:
        """The last entries once the choice has ended; what is left is no part of the content."""
        out = self.take(content)
        self._pending.clear()
        return out
