"""``POST /v1/tokenizers/estimate-token-count``: Kimi's token estimate, in Moonshot's shape."""

from __future__ import annotations

from pydantic import BaseModel

from kimi_server.protocol.chat import ChatCompletionRequest


class TokenEstimateRequest(ChatCompletionRequest):
    """A Chat Completions body (``model`` and ``messages``, and ``tools`` where the request
    would have them): its prompt is counted as that request's would be billed."""


class TokenEstimate(BaseModel):
    total_tokens: int


class TokenEstimateResponse(BaseModel):
    data: TokenEstimate
