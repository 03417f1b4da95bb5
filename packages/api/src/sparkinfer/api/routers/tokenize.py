"""`POST /v1/tokenize` and `POST /v1/detokenize`."""

from __future__ import annotations

from fastapi import APIRouter
from sparkinfer.api.dependencies import ServerState, State
from sparkinfer.api.errors import InvalidRequest
from sparkinfer.api.media import expand_media, load_media, media_parts, template_messages
from sparkinfer.api.schemas.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from sparkinfer.model.chat_template import ChatOptions
from sparkinfer.multimodal import ProcessedMedia
from starlette.concurrency import run_in_threadpool

router = APIRouter()


@router.post("/v1/tokenize")
async def tokenize(body: TokenizeRequest, state: State) -> TokenizeResponse:
    """Token ids of a raw prompt (control tokens allowed) or of chat messages after the template
    (image and video placeholders expanded, as the chat route sends them to the engine)."""
    state.check_model(body.model)
    if body.messages is not None:
        parts = media_parts(body.messages, has_vision=state.media is not None)
        media = await load_media(parts, state.media) if parts and state.media else []
        options = ChatOptions(
            add_generation_prompt=body.add_generation_prompt,
            enable_thinking=True if body.enable_thinking is None else body.enable_thinking,
        )
        ids = await run_in_threadpool(_chat_ids, body, state, options, media)
    else:  # a long prompt takes the CPU for up to seconds: off the event loop
        ids = await run_in_threadpool(state.tokenizer.encode, body.prompt or "", allow_special=True)
    strs = [state.tokenizer.id_to_token(i) or "" for i in ids] if body.return_token_strs else None
    return TokenizeResponse(
        tokens=ids, count=len(ids), max_model_len=state.max_model_len, token_strs=strs
    )


def _chat_ids(
    body: TokenizeRequest, state: ServerState, options: ChatOptions, media: list[ProcessedMedia]
) -> list[int]:
    assert body.messages is not None
    messages = template_messages(body.messages)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    rendered = state.chat_template.render(messages, tools=tools, options=options)
    ids = state.tokenizer.encode_chat(rendered.segments)
    if media and state.media is not None:
        ids, _ = expand_media(ids, media, state.media, state.tokenizer)
    return ids


@router.post("/v1/detokenize")
async def detokenize(body: DetokenizeRequest, state: State) -> DetokenizeResponse:
    state.check_model(body.model)
    bad = [t for t in body.tokens if not 0 <= t < state.tokenizer.vocab_size]
    if bad:
        raise InvalidRequest(
            f"tokens holds {bad[0]}; token ids are in [0, {state.tokenizer.vocab_size})",
            param="tokens",
        )
    return DetokenizeResponse(prompt=state.tokenizer.decode(body.tokens))
