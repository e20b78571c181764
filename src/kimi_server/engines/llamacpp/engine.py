"""The embedded engine: one GGUF model served by llama.cpp's own server loop, in-process."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimi_server.engines.llamacpp.answer import GrammarChecker, plan_answer
from kimi_server.engines.llamacpp.gguf_meta import read_gguf_info
from kimi_server.engines.llamacpp.grammar import syntax_for_template
from kimi_server.engines.llamacpp.phases import PhaseContext, prompted_generation
from kimi_server.engines.llamacpp.runner import CompletionRunner
from kimi_server.engines.llamacpp.template import ChatTemplate
from kimi_server.errors import EngineUnavailableError
from kimi_server.parsers.reasoning import get_reasoning_format
from kimi_server.serving.types import EngineEvent, GenerationRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedConfig:
    model_path: Path
    n_ctx: int = 16384
    n_parallel: int = 8
    n_threads: int = 0  # 0: one per core
    reasoning_format: str = "prompted"
    temperature: float = 0.7
    top_p: float = 0.95
    verbose: bool = False


def _threads(requested: int) -> int:
    return requested if requested > 0 else max(1, os.cpu_count() or 1)


class EmbeddedEngine:
    def __init__(self, config: EmbeddedConfig) -> None:
        self.config = config
        self.name = f"embedded:{config.model_path.name}"
        self.fmt = get_reasoning_format(config.reasoning_format)
        info = read_gguf_info(config.model_path)
        self.template = ChatTemplate(
            info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token
        )
        self.syntax = syntax_for_template(self.template.source)
        self._runner: CompletionRunner | None = None
        self._checker: GrammarChecker | None = None
        self._server: Any = None

    def accepts_images(self) -> bool:
        return False

    async def start(self) -> None:
        if self._runner is None:
            self._server = await asyncio.to_thread(self._load)
            self._runner = CompletionRunner(self._server, max_workers=4 * self.config.n_parallel)
            self._checker = GrammarChecker(self._runner)

    def _load(self) -> Any:
        import xllamacpp  # imported late: loading it costs time and tests may not need it

        cfg = self.config
        params = xllamacpp.CommonParams()
        params.model.path = str(cfg.model_path)
        params.n_ctx = cfg.n_ctx
        params.n_parallel = cfg.n_parallel
        params.kv_unified = True  # slots share one context instead of n_ctx / n_parallel each
        params.cpuparams.n_threads = _threads(cfg.n_threads)
        params.cpuparams_batch.n_threads = _threads(cfg.n_threads)
        params.ctx_shift = False  # never silently drop the start of a conversation
        params.warmup = False
        params.endpoint_metrics = False
        # llama.cpp's server also opens an HTTP port of its own on loopback; lock it with a key
        # nobody knows, since every request reaches it through this process instead.
        params.api_keys = [os.urandom(24).hex()]
        if not cfg.verbose:
            params.verbosity = -1
        try:
            return xllamacpp.Server(params)
        except Exception as exc:
            log.error("failed to load %s: %s", cfg.model_path, exc)
            raise EngineUnavailableError("The model could not be loaded.") from None

    async def close(self) -> None:
        if self._runner is not None:
            self._runner.shutdown()
        self._runner, self._server, self._checker = None, None, None

    def _sampling(self) -> dict[str, Any]:
        return {"temperature": self.config.temperature, "top_p": self.config.top_p}

    async def generate(self, request: GenerationRequest) -> AsyncIterator[EngineEvent]:
        if self._runner is None or self._checker is None:
            raise EngineUnavailableError("The engine is not running.")
        plan = plan_answer(request, self.syntax)
        # Before the first event: a schema the grammar compiler rejects is still a plain 400.
        await self._checker.check(plan, request)
        prompt = self.template.render(
            request.messages,
            tools=request.tools,
            history_reasoning=(self.fmt.opener, self.fmt.closer),
        )
        ctx = PhaseContext(self._runner, request, self.fmt, self._sampling())
        async for event in prompted_generation(ctx, prompt, plan):
            yield event
