"""The vendors reached over the chat-completions wire format, with their quirks.

Each entry names the base URL, the environment variable of the API key, and what its
wire does differently; ``builtin_provider`` turns an entry into an ``OpenAIProvider``.
Every vendor's base URL can be overridden with ``<NAME>_BASE_URL`` (a proxy, a
gateway, a region, a test server).
"""

from __future__ import annotations

import attrs

__all__ = ["ALIASES", "VENDORS", "Vendor"]


@attrs.frozen
class Vendor:
    """An OpenAI-compatible vendor: where it listens, its key, and its quirks.

    ``think_tags``: reasoning arrives as a ``<think>...</think>`` section at the start
    of the content (open-weight reasoning models as these hosts serve them); it becomes
    reasoning. ``short_call_ids``: the vendor accepts only tool-call ids of nine
    letters and digits, so ids are mapped (the same id always to the same short one).
    ``stream_usage``: it accepts ``stream_options.include_usage``.
    """

    name: str
    base_url: str
    key_env: str | None
    needs_key: bool = True
    think_tags: bool = False
    short_call_ids: bool = False
    stream_usage: bool = True

    @property
    def url_env(self) -> str:
        """The environment variable that overrides the base URL."""
        return f"{self.name.upper()}_BASE_URL"


def _local(name: str, port: int) -> Vendor:
    """A local server (no key needed; one may be set with ``<NAME>_API_KEY``)."""
    key = f"{name.upper()}_API_KEY"
    return Vendor(name, f"http://localhost:{port}/v1", key, needs_key=False, think_tags=True)


VENDORS: dict[str, Vendor] = {
    v.name: v
    for v in (
        Vendor("groq", "https://api.groq.com/openai/v1", "GROQ_API_KEY", think_tags=True),
        Vendor("deepseek", "https://api.deepseek.com/v1", "DEEPSEEK_API_KEY"),
        Vendor(
            "mistral",
            "https://api.mistral.ai/v1",
            "MISTRAL_API_KEY",
            short_call_ids=True,
            stream_usage=False,
        ),
        Vendor("xai", "https://api.x.ai/v1", "XAI_API_KEY"),
        Vendor("together", "https://api.together.xyz/v1", "TOGETHER_API_KEY", think_tags=True),
        Vendor(
            "fireworks",
            "https://api.fireworks.ai/inference/v1",
            "FIREWORKS_API_KEY",
            think_tags=True,
        ),
        Vendor("cerebras", "https://api.cerebras.ai/v1", "CEREBRAS_API_KEY", think_tags=True),
        Vendor(
            "deepinfra", "https://api.deepinfra.com/v1/openai", "DEEPINFRA_API_KEY", think_tags=True
        ),
        Vendor("openrouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY"),
        Vendor("perplexity", "https://api.perplexity.ai", "PERPLEXITY_API_KEY", think_tags=True),
        Vendor("cohere", "https://api.cohere.ai/compatibility/v1", "CO_API_KEY"),
        Vendor("baseten", "https://inference.baseten.co/v1", "BASETEN_API_KEY", think_tags=True),
        Vendor(
            "google",
            "https://generativelanguage.googleapis.com/v1beta/openai",
            "GEMINI_API_KEY",
            think_tags=True,
        ),
        _local("vllm", 8000),
        _local("lmstudio", 1234),
        _local("llamacpp", 8080),
    )
}
"""The OpenAI-compatible vendors by provider name."""

ALIASES: dict[str, str] = {"grok": "xai", "gemini": "google"}
"""Other names of a vendor in model strings (``grok/grok-4`` is ``xai/grok-4``)."""
