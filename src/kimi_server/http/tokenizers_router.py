"""``POST /v1/tokenizers/estimate-token-count``: the prompt tokens a Chat Completions body would
bring, counted by the served model's own tokenizer through the same plan the request would take
(so the estimate is the ``prompt_tokens`` it would be billed). Free, but under the key's RPM."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from kimi_server.gate.admit import Caller
from kimi_server.gate.auth import Principal
from kimi_server.gate.request_record import request_record
from kimi_server.http.generating import ERRORS
from kimi_server.http.link import HttpLink
from kimi_server.http.routes import ESTIMATE_TOKENS
from kimi_server.http.state import app_pipeline, authenticated
from kimi_server.protocol.tokenizers import TokenEstimate, TokenEstimateRequest, TokenEstimateResponse
from kimi_server.serving.chat_front import CHAT

router = APIRouter(tags=["Tokenizers"])


@router.post(ESTIMATE_TOKENS, responses=ERRORS)
async def estimate_token_count(
    body: TokenEstimateRequest, request: Request, principal: Principal = Depends(authenticated)
) -> TokenEstimateResponse:
    """The prompt tokens of a Chat Completions body, as the request would be billed (the embedded
    engine's and a llama.cpp upstream's own tokenizer; elsewhere the admission's estimate)."""
    caller = Caller(principal, request_record(request.scope), HttpLink(request))
    total = await app_pipeline(request).count_prompt(CHAT, body, caller)
    return TokenEstimateResponse(data=TokenEstimate(total_tokens=total))
