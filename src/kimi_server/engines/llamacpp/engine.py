"""The embedded engine: one GGUF model served by llama.cpp's own server loop, in-process."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncGenerator
from typing import Any

from kimi_server.engines.llamacpp import wait_governor
from kimi_server.engines.llamacpp.answer import GrammarChecker, plan_answer
from kimi_server.engines.llamacpp.answer_prefix import lead_text
from kimi_server.engines.llamacpp.cpu_wait import apply_wait_level, governed, pool_poll
from kimi_server.engines.llamacpp.embedded_config import EmbeddedConfig, threads_for
from kimi_server.engines.llamacpp.extra_attempts import spare_slots
from kimi_server.engines.llamacpp.gguf_meta import read_gguf_info
from kimi_server.engines.llamacpp.grammar import syntax_for_template
from kimi_server.engines.llamacpp.multimodal import MEDIA_MARKER, media_of
from kimi_server.engines.llamacpp.phases import (
    PhaseContext,
    Tally,
    answer_turn,
    prompted_generation,
)
from kimi_server.engines.llamacpp.prefill import TurnSizes, long_prompt_cuts, read_in_turns, turns_to_run
from kimi_server.engines.llamacpp.prompt_cache import CacheLimits, CacheStats, PromptCacheLedger
from kimi_server.engines.llamacpp.rendered import Rendered, RenderedPrompts
from kimi_server.engines.llamacpp.runner import CompletionRunner
from kimi_server.engines.llamacpp.template import ChatTemplate
from kimi_server.engines.llamacpp.tokenizer import PromptTokenizer, load_prompt_tokenizer
from kimi_server.engines.types import EngineEvent, GenerationRequest
from kimi_server.engines.web_search_tool import expose_web_search
from kimi_server.errors import EngineUnavailableError
from kimi_server.parsers.reasoning import get_reasoning_format

log = logging.getLogger(__name__)
IMAGE_TOKENS_ESTIMATE = 768  # an image's prompt tokens before the projector has seen it
MMPROJ_MIN_BATCH = 512  # llama.cpp's default micro-batch: room for one image's tokens at once


class EmbeddedEngine:
    def __init__(self, config: EmbeddedConfig) -> None:
        self.config = config
        self.name = f"embedded:{config.model_path.name}"
        apply_wait_level(config.cpu_poll)  # before anything imports xllamacpp
        self.fmt = get_reasoning_format(config.reasoning_format)
        info = read_gguf_info(config.model_path)
        self.template = ChatTemplate(info.chat_template, bos_token=info.bos_token, eos_token=info.eos_token)
        self.syntax = syntax_for_template(self.template.source)
        self._runner: CompletionRunner | None = None
        self._checker: GrammarChecker | None = None
        self._governor: wait_governor.WaitGovernor | None = None
        self._server: Any = None
        self._tokenizer: PromptTokenizer | None = None
        self._rendered = RenderedPrompts()
        self._scrubs: set[asyncio.Task[None]] = set()
        self.cache = PromptCacheLedger(
            CacheLimits(
                holders=self.slots,
                max_active=config.n_parallel,
                max_tokens=config.cache_max_tokens if config.cache_max_tokens is not None else config.n_ctx // 2,
                enabled=config.cache_enabled,
                ttl_scale=config.cache_ttl_scale,
                bytes_per_token=info.kv_bytes_per_token or 0,
                groups=config.cache_groups or {},
            )
        )

    @property
    def slots(self) -> int:
        return max(self.config.n_parallel, self.config.cache_entries)

    @property
    def utility_slot(self) -> int:
        """One extra slot, never a cache entry, for the server's own short calls (grammar
        probes, the tool decision step): they must not evict or read any tenant's KV."""
        return self.slots

    def cache_stats(self, key_id: str) -> CacheStats:
        return self.cache.stats(key_id)

    def accepts_images(self) -> bool:
        return self.config.mmproj is not None

    def tenant_stats(self, key_id: str) -> dict[str, int]:
        """One API key's own calls in flight and calls cancelled by its clients leaving."""
        runner = self._runner
        return runner.calls.tenant(key_id) if runner else {"active_calls": 0, "cancelled_calls": 0}

    def context_length(self) -> int:
        # One unified KV cache: a single request may use all of it.
        return self.config.n_ctx

    def prompt_token_limit(self) -> int | None:
        return self.config.max_prompt_tokens

    def counts_exactly(self) -> bool:
        return self._tokenizer is not None and self._tokenizer.exact

    def concurrency(self) -> int:
        return self.config.n_parallel

    def stats(self) -> dict[str, int]:
        """Server-wide totals, for operators (never shown to a tenant)."""
        runner = self._runner
        return {
            "active_calls": runner.calls.active if runner else 0,
            "cancelled_calls": runner.calls.cancelled if runner else 0,
            **self.cache.totals(),
            **(self._governor.figures() if self._governor is not None else {}),
        }

    async def probe(self) -> dict[str, Any]:
        """One output token on the utility slot, bounded in time (``/health?deep=1``)."""
        from kimi_server.engines.llamacpp.health import one_token

        return {"model": self.config.model_path.name, **await one_token(self._runner, self.utility_slot)}

    async def start(self) -> None:
        if self._runner is None:
            self._tokenizer = await asyncio.to_thread(load_prompt_tokenizer, self.config.model_path)
            log.info("prompt tokens of %s counted by %s", self.config.model_path.name, self._tokenizer.kind)
            self._server = await asyncio.to_thread(self._load)
            if governed(self.config.cpu_poll):
                self._governor = wait_governor.acquire(threads_for(self.config.n_threads))
            self._runner = CompletionRunner(self._server, max_workers=4 * self.slots, pinned=True)
            self._checker = GrammarChecker(self._runner, slot=self.utility_slot)

    def _load(self) -> Any:
        apply_wait_level(self.config.cpu_poll)
        import xllamacpp  # imported late: loading it costs time and tests may not need it

        cfg = self.config
        params = xllamacpp.CommonParams()
        params.model.path = str(cfg.model_path)
        params.n_ctx = cfg.n_ctx
        # One slot per cached sequence; the ledger keeps at most n_parallel of them generating.
        params.n_parallel = self.slots + 1  # + the utility slot
        params.kv_unified = True  # slots share one context instead of n_ctx / n_parallel each
        # Every request names its slot (the ledger's choice), which bypasses llama.cpp's own
        # slot choice and its host-RAM prompt cache: that cache would hand one tenant's saved
        # KV to another and save/clear slots behind the ledger's back.
        params.cache_ram_mib = 0
        params.cache_idle_slots = False
        params.n_cache_reuse = 0  # reuse only true prefixes, never shifted chunks
        # One long turn of a prompt read alone is one step (prefill.py). llama.cpp needs room
        # in one batch for a token of every slot (it aborts at load otherwise), and some
        # projectors need a whole image in one batch.
        floor = MMPROJ_MIN_BATCH if cfg.mmproj is not None else 0
        params.n_batch = params.n_ubatch = max(cfg.prefill_turn, params.n_parallel, floor)
        # No spinning by default: on cores shared with other work, threads spinning while they
        # wait take the time the working ones need (cpu_wait.py).
        for cpu in (params.cpuparams, params.cpuparams_batch):
            cpu.n_threads = threads_for(cfg.n_threads)
            cpu.poll = pool_poll(cfg.cpu_poll)
        params.ctx_shift = False  # never silently drop the start of a conversation
        params.warmup = False
        params.endpoint_metrics = False
        # llama.cpp's server always opens an HTTP listener of its own, and xllamacpp has no
        # switch to skip it. It gets a Unix socket in a private directory instead of a TCP port,
        # and the socket's name is removed once the server is up: nothing can connect to it.
        # The key nobody knows stays as a second lock. Every request goes through this process.
        params.api_keys = [os.urandom(24).hex()]
        private = tempfile.mkdtemp(prefix="kimi-llama-")  # mode 0700
        params.hostnames = [os.path.join(private, "llama.sock")]
        if cfg.mmproj is not None:
            params.mmproj.path = str(cfg.mmproj)
        if not cfg.verbose:
            params.verbosity = -1
        try:
            return xllamacpp.Server(params)
        except Exception as exc:
            log.error("failed to load %s: %s", cfg.model_path, exc)
            raise EngineUnavailableError("The model could not be loaded.") from None
        finally:
            shutil.rmtree(private, ignore_errors=True)

    async def close(self) -> None:
        for task in list(self._scrubs):
            task.cancel()
        if self._runner is not None:
            self._runner.shutdown()
        wait_governor.release(self._governor)
        self._governor = None
        self._runner, self._server, self._checker = None, None, None

    def _render(self, request: GenerationRequest) -> str:
        history = (self.fmt.opener, self.fmt.closer)
        return self.template.render(request.messages, tools=request.tools, history_reasoning=history)

    async def count_prompt_tokens(self, request: GenerationRequest) -> int | None:
        """The first call's prompt tokens, as llama.cpp will count them: the conversation
        rendered through the chat template, tokenized by the model's own tokenizer (or bounded,
        see tokenizer.py). Each image counts a fixed estimate: its tokens depend on the projector.
        Runs in a worker thread, so a long prompt never stalls the event loop."""
        tokenizer = self._tokenizer
        if tokenizer is None:
            return None
        exposed = expose_web_search(request)

        lead = lead_text(request.answer_prefix)  # Partial Mode: the text the answer continues

        def count() -> Rendered:
            prompt = self._render(exposed)
            images = prompt.count(MEDIA_MARKER)
            counted = tokenizer.count(prompt.replace(MEDIA_MARKER, "") + lead)
            return Rendered(prompt, counted + images * IMAGE_TOKENS_ESTIMATE)

        rendered = await asyncio.to_thread(count)
        self._rendered.keep(request, rendered)  # on the event loop: the memo is not thread-safe
        return rendered.tokens

    def _sampling(self) -> dict[str, Any]:
        return {"temperature": self.config.temperature, "top_p": self.config.top_p}

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[EngineEvent, None]:
        if self._runner is None or self._checker is None:
            raise EngineUnavailableError("The engine is not running.")
        counted = self._rendered.take(request)  # rendered once already, while admission counted it
        request = expose_web_search(request)  # $web_search as a function
        media = media_of(request) if self.config.mmproj is not None else ()
        plan = plan_answer(request, self.syntax)
        # Before the first event: a schema the grammar compiler rejects is still a plain 400.
        await self._checker.check(plan, request)
        # Rendering runs in a worker thread so a large (size-checked) prompt never stalls the
        # event loop that serves every other request.
        # Earlier reasoning (a client's reasoning_content, a Responses reasoning item) is shown
        # back inside the format's tags, as the model's own thinking before that answer.
        history = (self.fmt.opener, self.fmt.closer)
        prompt = counted.prompt if counted is not None else await asyncio.to_thread(self._render, request)
        policy = request.cache
        lease = await self.cache.acquire(policy.namespace, prompt, policy.ttl_seconds, model=request.model)
        settled = False

        def settle(tally: Tally) -> bool:
            nonlocal settled
            settled = True
            return self.cache.commit(
                lease,
                tally.held_text,
                tally.held_tokens,
                prompt_tokens=tally.prompt,
                cached_tokens=tally.cached,
            )

        ctx = PhaseContext(
            self._runner,
            request,
            self.fmt,
            self._sampling(),
            # A seeded request computes its whole prompt every time: a prompt served from the
            # cache leaves its last token to a batch of another shape, which shifts the logits
            # enough to change a sampled token.
            slot=lease.holder,
            reuse=lease.reuse and request.seed is None,
            settle=settle,
            utility_slot=self.utility_slot,
            context_window=self.config.n_ctx,
            media=media,
            answer_prompt=answer_turn(self.template, request, self.fmt, history),
            repetition=self.config.repetition,
            lead=lead_text(request.answer_prefix, plan.echo),
        )
        cfg = self.config
        sizes = TurnSizes(cfg.prefill_turn, cfg.prefill_turn_shared, cfg.prefill_slowdown)
        cuts = await long_prompt_cuts(self._tokenizer, prompt, sizes) if not media else []
        if not cuts and not media and counted is not None:
            ctx.spare = spare_slots(
                self.cache,
                request,
                prompt,
                counted.tokens,
                together=cfg.reasoning_together,
                seeded_too=cfg.reasoning_together_seeded,
                after_give_back=self._scrub_stale,
            )
        if cuts and ctx.reuse and lease.previous is not None:
            cuts = turns_to_run(cuts, prompt, lease.previous.text)
        try:
            if cuts:
                await read_in_turns(ctx, prompt, cuts, sizes, shared=lambda: self.cache.leased() > 1)
            async for event in prompted_generation(ctx, prompt, plan):
                yield event
        finally:
            if not settled:
                # Cancelled or failed part-way: the slot's content is unknown, so it is nobody's
                # cache any more.
                self.cache.abandon(lease)
            self._scrub_stale()

    def _scrub_stale(self) -> None:
        """Frees the KV of slots the cache no longer covers (expired, evicted, abandoned)."""
        runner = self._runner
        if runner is None:
            return
        for holder in self.cache.take_stale():
            task = asyncio.get_running_loop().create_task(self._scrub(runner, holder))
            self._scrubs.add(task)
            task.add_done_callback(self._scrubs.discard)

    async def _scrub(self, runner: CompletionRunner, holder: int) -> None:
        # llama.cpp has no per-slot erase in-process: recomputing a one-token prompt without
        # reuse drops everything else the slot held. The ledger keeps the slot out of use
        # until this is done (llama.cpp queues it behind a cancelled call still on the slot).
        body = {"prompt": " ", "n_predict": 0, "cache_prompt": False, "id_slot": holder}
        try:
            async for _ in runner.stream(body):
                pass
        except Exception as exc:
            log.warning("could not clear slot %d: %s", holder, exc)
        finally:
            self.cache.scrubbed(holder)
