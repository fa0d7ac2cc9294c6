"""`pipeinfer serve`'s own settings (the job it serves with has a JobConfig): where the HTTP
server listens and who may call it, how many requests may wait, and what a request that
does not say gets. The front uses them (it has no JobConfig), and so does the job's intake."""

from __future__ import annotations

from dataclasses import dataclass

from ..model.sampling import SamplingParams

# What a request may reuse of the prompt prefix a slot keeps (engine/head/prompt_cache.py):
# only cells with a fresh evaluation's bits (the default), the whole common prefix as
# llama-server does (may change an answer's last bits), or nothing.
EXACT, LLAMA_SERVER, OFF = "exact", "llama-server", "off"
CACHE_MODES = (EXACT, LLAMA_SERVER, OFF)


@dataclass(frozen=True)
class ServeConfig:
    model_name: str = ""               # the model's name in the API (--alias)
    host: str = "127.0.0.1"
    port: int = 8080                   # 0: any free port
    queue: int = 16                    # requests that may wait for a slot (503 beyond)
    api_key: str | None = None         # required on every endpoint but /health
    cors_origins: tuple[str, ...] = ("*",)
    parallel: int = 4                  # requests generated at once (the job's slots)
    cache_prompt: str = EXACT          # what a request that does not refuse it may reuse
    defaults: SamplingParams = SamplingParams()   # a request's sampling where it gives none
    channel: str | None = None         # the address of the front that launched the job
