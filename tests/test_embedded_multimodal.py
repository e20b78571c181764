"""The embedded engine's image plumbing (``--mmproj``), as far as it goes without a vision model:
no small one with a projector is packaged for these machines. What reaches llama.cpp is checked
with a fake speaking xllamacpp's completion protocol."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import pytest

from kimi_server.engines.llamacpp.answer import plan_answer
from kimi_server.engines.llamacpp.embedded_config import EmbeddedConfig
from kimi_server.engines.llamacpp.engine import EmbeddedEngine
from kimi_server.engines.llamacpp.grammar import syntax_for_template
from kimi_server.engines.llamacpp.multimodal import MEDIA_MARKER, media_of
from kimi_server.engines.llamacpp.phases import PhaseContext, answer_turn, prompted_generation
from kimi_server.engines.llamacpp.runner import CompletionRunner
from kimi_server.engines.llamacpp.template import CHATML, ChatTemplate
from kimi_server.engines.types import Message
from kimi_server.errors import InvalidRequestError
from kimi_server.models.pull import resolve_model
from kimi_server.models.store import ModelStore, default_models_dir
from kimi_server.parsers.reasoning import get_reasoning_format
from tests.media_samples import data_url, image
from tests.test_phases import FakeLlama, request


def test_prompt_carries_one_marker_and_one_payload_per_image() -> None:
    a, b = data_url("image/png", image("PNG")), data_url("image/jpeg", image("JPEG"))
    req = request(2, 4, 16)
    req = type(req)(**{**req.__dict__, "messages": (Message("user", "Compare these.", images=(a, b)),)})
    prompt = ChatTemplate(CHATML).render(req.messages)
    assert prompt.count(MEDIA_MARKER) == 2 and prompt.index(MEDIA_MARKER) < prompt.index("Compare")
    media = media_of(req)
    assert [base64.b64decode(m) for m in media] == [image("PNG"), image("JPEG")]
    llama = FakeLlama(natural_stop=3)

    async def main() -> None:
        fmt = get_reasoning_format("prompted")
        turn = answer_turn(ChatTemplate(CHATML), req, fmt)
        ctx = PhaseContext(CompletionRunner(llama), req, fmt, {}, media=media, answer_prompt=turn)
        plan = plan_answer(req, syntax_for_template(CHATML))
        [e async for e in prompted_generation(ctx, prompt, plan)]

    asyncio.run(main())
    for body in llama.calls:
        assert body["prompt"]["multimodal_data"] == list(media)
        # Attempts extend the prompt; the answer adds the draft's turn after the conversation.
        assert body["prompt"]["prompt_string"].startswith(prompt.removesuffix("<|im_start|>assistant\n"))
    # Same words, another image: the prompt text differs, so no cache entry is shared.
    other = ChatTemplate(CHATML).render((Message("user", "Compare these.", images=(b, a)),))
    assert other != prompt


def test_videos_are_refused_by_the_embedded_engine() -> None:
    req = request(2, 4, 16)
    req = type(req)(**{**req.__dict__, "messages": (Message("user", "x", videos=("data:video/mp4;base64,AA",)),)})
    with pytest.raises(InvalidRequestError) as err:
        media_of(req)
    assert err.value.param == "messages[0]"


def test_mmproj_makes_the_engine_see(tmp_path: Path) -> None:
    model = resolve_model("smollm2-135m", ModelStore(default_models_dir()), auto_pull=True)
    blind = EmbeddedEngine(EmbeddedConfig(model_path=Path(model)))
    seeing = EmbeddedEngine(EmbeddedConfig(model_path=Path(model), mmproj=tmp_path / "mmproj.gguf"))
    assert not blind.accepts_images() and seeing.accepts_images()
