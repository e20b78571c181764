"""The embedded engine's settings, as the server's configuration hands them over."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kimi_server.engines.llamacpp.cpu_wait import CpuPoll
from kimi_server.engines.llamacpp.repetition import RepetitionLimits


@dataclass(frozen=True)
class EmbeddedConfig:
    model_path: Path
    n_ctx: int = 32768
    n_parallel: int = 8
    n_threads: int = 0  # 0: one per core this process may run on
    # How long llama.cpp's threads spin before they sleep: 0 sleeps at once; "auto" spins
    # while the machine's other work leaves the cores free (cpu_wait.py, wait_governor.py).
    cpu_poll: CpuPoll = "auto"
    reasoning_format: str = "prompted"
    temperature: float = 0.7
    top_p: float = 0.95
    verbose: bool = False
    # Prompt cache: cached sequences resident at once (llama.cpp slots beyond n_parallel are
    # only storage), the token bound on them, and the rest of the ledger's limits.
    cache_entries: int = 16
    cache_max_tokens: int | None = None  # None: half of n_ctx
    cache_enabled: bool = True
    cache_ttl_scale: float = 1.0
    cache_groups: dict[str, str] | None = None  # key id -> shared namespace
    mmproj: Path | None = None  # multimodal projector: the model sees images
    # The most prompt tokens one request may bring (None: the window), and the turns a prompt
    # is read in, alone and beside other requests (prefill.py, docs/configuration.md).
    max_prompt_tokens: int | None = None
    prefill_turn: int = 512  # tokens of prompt per llama.cpp call on an idle engine (= n_batch)
    prefill_turn_shared: int = 0  # the same while other requests run (0: no turns)
    prefill_slowdown: float = 3.0  # beside others, a prompt still reads at >= 1/this of its speed
    repetition: RepetitionLimits = field(default_factory=RepetitionLimits)  # ends looping answers
    # Reasoning attempts decoded at once on free slots (extra_attempts.py), seeded requests too.
    reasoning_together: int = 1
    reasoning_together_seeded: bool = False


def threads_for(requested: int) -> int:
    if requested > 0:
        return requested
    # The cores this process may run on (a container's or taskset's CPU set), not the host's.
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no sched_getaffinity on this platform
        return max(1, os.cpu_count() or 1)
