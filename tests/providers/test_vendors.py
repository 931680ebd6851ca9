"""Every seed provider by its ``provider/model`` string, over a loopback server: the
table's base URLs and key variables, Azure's deployment URL, and the vendors' quirks
(usage fields, ``<think>`` sections, short tool-call ids) normalised."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from statekernel._records.messages import (
    Message,
    ModelRequest,
    ModelResult,
    ReasoningPart,
    ToolCall,
    ToolResult,
    Usage,
)
from statekernel.errors import ConfigError
from statekernel.providers import (
    VENDORS,
    AzureOpenAIProvider,
    OpenAIProvider,
    ReasoningDelta,
    StreamPart,
    TextDelta,
    assemble,
    builtin_names,
    builtin_provider,
    complete,
)
from statekernel.providers._openai import short_call_id
from statekernel.providers._think import ThinkSplitter, split_think

from .conftest import WireServer

SEED = [
    "openai", "anthropic", "ollama", "azure", "google", "gemini", "groq", "deepseek",
    "mistral", "xai", "grok", "together", "fireworks", "cerebras", "deepinfra",
    "openrouter", "perplexity", "cohere", "baseten", "vllm", "lmstudio", "llamacpp",
]  # fmt: skip


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": choices,
        **extra,
    }


def request(model: str, **kw: Any) -> ModelRequest:
    kw.setdefault("messages", [Message.user("hi")])
    return ModelRequest(model=model, **kw)


def test_every_seed_provider_name_is_built_in() -> None:
    assert set(SEED) <= set(builtin_names())


@pytest.mark.parametrize("name", sorted(VENDORS))
async def test_each_vendor_streams_from_its_base_url_with_its_key(
    name: str, wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    vendor = VENDORS[name]
    assert vendor.base_url.startswith(("https://", "http://localhost:"))
    monkeypatch.setenv(vendor.url_env, f"{wire.url}/v9")
    monkeypatch.setenv(vendor.key_env or "", f"key-of-{name}")
    provider = builtin_provider(name)
    assert isinstance(provider, OpenAIProvider)
    assert provider.name == name
    wire.sse([chunk({"content": "hello"}), chunk({}, "stop")], done=True)
    result = assemble([p async for p in provider.stream(request(f"{name}/some-model"))])
    await provider.aclose()
    assert result.text == "hello"
    seen = wire.requests[0]
    assert seen.path == "/v9/chat/completions"
    assert seen.headers["authorization"] == f"Bearer key-of-{name}"
    body = seen.json()
    assert body["model"] == "some-model"
    assert ("stream_options" in body) == vendor.stream_usage


@pytest.mark.parametrize("name", sorted(n for n, v in VENDORS.items() if v.needs_key))
def test_a_hosted_vendor_without_its_key_is_a_config_error(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_env = VENDORS[name].key_env or ""
    monkeypatch.delenv(key_env, raising=False)
    with pytest.raises(ConfigError, match=f"the {name} provider needs {key_env}"):
        builtin_provider(name)


@pytest.mark.parametrize("name", ["vllm", "lmstudio", "llamacpp"])
async def test_a_local_server_needs_no_key(
    name: str, wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(f"{name.upper()}_API_KEY", raising=False)
    monkeypatch.setenv(f"{name.upper()}_BASE_URL", wire.url)
    provider = builtin_provider(name)
    wire.sse([chunk({"content": "ok"}), chunk({}, "stop")], done=True)
    assert assemble([p async for p in provider.stream(request(f"{name}/q"))]).text == "ok"
    await provider.aclose()
    assert "authorization" not in wire.requests[0].headers


def test_aliases_and_unknown_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XAI_API_KEY", "k")
    monkeypatch.setenv("GEMINI_API_KEY", "k")
    assert builtin_provider("grok").name == "xai"  # type: ignore[attr-defined]
    assert builtin_provider("gemini").name == "google"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"unknown model provider 'nope' \(built in: .*groq"):
        builtin_provider("nope")


async def test_azure_posts_to_the_deployment_with_api_key_and_version(
    wire: WireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", wire.url + "/")
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "azure-secret")
    monkeypatch.delenv("AZURE_OPENAI_API_VERSION", raising=False)
    monkeypatch.setenv("OPENAI_API_VERSION", "2025-01-01-preview")
    provider = builtin_provider("azure")
    assert isinstance(provider, AzureOpenAIProvider)
    wire.sse([chunk({"content": "from azure"}), chunk({}, "stop")], done=True)
    req = request("azure/my deployment", max_tokens=50)
    result = assemble([p async for p in provider.stream(req)])
    await provider.aclose()
    assert result.text == "from azure"
    seen = wire.requests[0]
    path = "/openai/deployments/my%20deployment/chat/completions"
    assert seen.path == f"{path}?api-version=2025-01-01-preview"
    assert seen.headers["api-key"] == "azure-secret"
    assert "authorization" not in seen.headers
    assert seen.json()["max_completion_tokens"] == 50
    assert "azure-secret" not in repr(provider)


def test_azure_without_endpoint_or_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_OPENAI_ENDPOINT", raising=False)
    with pytest.raises(ConfigError, match="AZURE_OPENAI_ENDPOINT"):
        builtin_provider("azure")
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://r.openai.azure.com")
    monkeypatch.delenv("AZURE_OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="AZURE_OPENAI_API_KEY"):
        builtin_provider("azure")


async def test_think_sections_streamed_in_pieces_become_reasoning(wire: WireServer) -> None:
    provider = OpenAIProvider(base_url=wire.url, api_key="k", name="together", think_tags=True)
    text = "<think>\nThe user greets.</think>\n\nHello <think> is a tag."
    wire.sse([chunk({"content": text[i : i + 3]}) for i in range(0, len(text), 3)], done=True)
    parts = [p async for p in provider.stream(request("together/deepseek-r1"))]
    result = assemble(parts)
    assert _reasoning(result) == "The user greets."
    assert result.text == "Hello <think> is a tag."
    assert not any(isinstance(p, TextDelta) and "</think>" in p.text for p in parts)
    wire.json(
        {
            "model": "m",
            "choices": [
                {"message": {"content": "<think>hmm</think>Yes."}, "finish_reason": "stop"}
            ],
        }
    )
    whole = await complete(provider, request("together/x", options={"stream": False}))
    await provider.aclose()
    assert (_reasoning(whole), whole.text) == ("hmm", "Yes.")


def _reasoning(result: ModelResult) -> str:
    return "".join(p.text for p in result.message.content if isinstance(p, ReasoningPart))


async def test_usage_in_groq_and_deepseek_places(wire: WireServer) -> None:
    provider = OpenAIProvider(base_url=wire.url, api_key="k", name="groq")
    groq_usage = {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}
    wire.sse(
        [chunk({"content": "a"}), chunk({}, "stop", x_groq={"id": "r", "usage": groq_usage})],
        done=True,
    )
    result = assemble([p async for p in provider.stream(request("groq/llama"))])
    assert result.usage == Usage(30, 5)
    deepseek_usage = {
        "prompt_tokens": 100,
        "completion_tokens": 7,
        "prompt_cache_hit_tokens": 64,
        "prompt_cache_miss_tokens": 36,
    }
    wire.sse([chunk({"content": "b"}, "stop"), chunk(None, usage=deepseek_usage)], done=True)
    result = assemble([p async for p in provider.stream(request("deepseek/chat"))])
    await provider.aclose()
    assert result.usage == Usage(36, 7, cache_read_tokens=64)


async def test_short_call_ids_keep_calls_and_results_paired(wire: WireServer) -> None:
    provider = OpenAIProvider(base_url=wire.url, api_key="k", name="mistral", short_call_ids=True)
    long_id, short = "call_0123456789abcdef", "Ab3dE6gH9"
    messages = [
        Message.user("weather?"),
        Message.assistant(tool_calls=[ToolCall(long_id, "w", "{}"), ToolCall(short, "w", "{}")]),
        Message(
            role="tool", content=(ToolResult(long_id, "w", "sun"), ToolResult(short, "w", "rain"))
        ),
    ]
    wire.sse([chunk({"content": "ok"}, "stop")], done=True)
    await assemble_from(provider, request("mistral/large", messages=messages))
    await provider.aclose()
    sent = wire.requests[0].json()["messages"]
    mapped = short_call_id(long_id)
    assert len(mapped) == 9
    assert mapped.isalnum()
    assert [c["id"] for c in sent[1]["tool_calls"]] == [mapped, short]
    assert [m["tool_call_id"] for m in sent[2:]] == [mapped, short]


async def assemble_from(provider: OpenAIProvider, req: ModelRequest) -> None:
    assemble([p async for p in provider.stream(req)])


_PLAIN = st.text(st.sampled_from("ab <>/\nthinkoug"), max_size=30).filter(
    lambda t: "<think>" not in t and "</think>" not in t and "<thought>" not in t
)


@given(
    reasoning=_PLAIN.filter(lambda t: "</" not in t),
    text=_PLAIN,
    cuts=st.lists(st.integers(1, 9), max_size=20),
    tag=st.sampled_from(["think", "thought"]),
)
def test_a_think_section_splits_the_same_however_the_stream_is_cut(
    reasoning: str, text: str, cuts: list[int], tag: str
) -> None:
    content = f"<{tag}>{reasoning}</{tag}>{text}"
    parts: list[StreamPart] = []
    splitter, at = ThinkSplitter(), 0
    for size in cuts:
        parts += splitter.feed(content[at : at + size])
        at += size
    parts += [*splitter.feed(content[at:]), *splitter.end()]
    got_reasoning = "".join(p.text for p in parts if isinstance(p, ReasoningDelta))
    got_text = "".join(p.text for p in parts if isinstance(p, TextDelta))
    assert (got_reasoning, got_text) == split_think(content)
    assert got_reasoning == reasoning.lstrip("\n")
    assert got_text == text.lstrip("\n")


@given(st.text(max_size=30))
def test_content_without_a_leading_section_is_all_text(text: str) -> None:
    if not text.lstrip().startswith(("<think>", "<thought>")):
        assert split_think(text) == ("", text)
