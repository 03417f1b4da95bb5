"""`POST /v1/tokenize` and `POST /v1/detokenize`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from sparkinfer.api.chat_request import chat_prompt_ids
from sparkinfer.api.dependencies import State
from sparkinfer.api.media import load_media, media_parts
from sparkinfer.api.request_body import JsonBody
from sparkinfer.api.sampling import check_token_ids, encode_prompt
from sparkinfer.api.schemas.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from sparkinfer.model.chat_template import ChatOptions
from starlette.concurrency import run_in_threadpool

router = APIRouter()


@router.post("/v1/tokenize")
async def tokenize(
    body: Annotated[TokenizeRequest, Depends(JsonBody(TokenizeRequest))], state: State
) -> TokenizeResponse:
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
        tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
        ids, _ = await run_in_threadpool(
            chat_prompt_ids, state, body.messages, tools, options, media
        )
    else:  # a long prompt takes the CPU for up to seconds: off the event loop
        ids = await run_in_threadpool(
            encode_prompt, state.tokenizer, body.prompt or "", state.max_model_len, param="prompt"
        )
    strs = [state.tokenizer.id_to_token(i) or "" for i in ids] if body.return_token_strs else None
    return TokenizeResponse(
        tokens=ids, count=len(ids), max_model_len=state.max_model_len, token_strs=strs
    )


@router.post("/v1/detokenize")
async def detokenize(
    body: Annotated[DetokenizeRequest, Depends(JsonBody(DetokenizeRequest))], state: State
) -> DetokenizeResponse:
    state.check_model(body.model)
    check_token_ids(body.tokens, "tokens", state.tokenizer)
    return DetokenizeResponse(prompt=state.tokenizer.decode(body.tokens))
