"""Parse throughput and per-chunk overhead of the ``openai`` provider beside the official
``openai`` SDK, both consuming the same long recorded SSE stream from the same local
server in the same run.

The server runs in its own process and writes the whole recorded stream at once, so
the clients' parsing is what is measured. Three consumers per round, in rotating
order: raw bytes (httpx, no parsing: the transfer floor), the statekernel provider
(parts assembled into a result), and the SDK (typed chunks, content accumulated).
Prints medians over the rounds and the SDK/provider time ratio (above 1: the
provider is faster). Needs the ``bench`` extra (``pip install -e '.[bench]'``).
Run: ``python bench/providers.py [--chunks 20000] [--rounds 7]`` (``--chunks 100
--rounds 1`` runs in a second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx

from statekernel._records.messages import Message, ModelRequest
from statekernel.providers import OpenAIProvider, ResultBuilder

MODEL = "gpt-4o-mini-2024-07-18"
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "streaming",
    "tokens",
]


def recorded_stream(chunks: int) -> bytes:
    """A chat-completions SSE stream: role, text deltas, a tool call split in pieces,
    the finish chunk, the ``include_usage`` chunk and ``[DONE]``."""

    def event(delta: dict[str, object], finish: str | None = None) -> bytes:
        data = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": MODEL,
            "system_fingerprint": "fp_bench",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    out = [event({"role": "assistant", "content": ""})]
    text_chunks = chunks - 12
    out += [event({"content": " " + WORDS[i % len(WORDS)]}) for i in range(text_chunks)]
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": ""}}  # fmt: skip
    out.append(event({"tool_calls": [call]}))
    out += [
        event({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        for piece in ['{"q', 'uery"', ': "s', "treami", 'ng", ', '"n": ', "1", "0}"]
    ]
    out.append(event({}, "tool_calls"))
    usage = {"prompt_tokens": 12, "completion_tokens": chunks, "total_tokens": chunks + 12}
    out.append(b"data: " + json.dumps({"id": "chatcmpl-bench", "object": "chat.completion.chunk",
               "model": MODEL, "choices": [], "usage": usage}).encode() + b"\n\n")  # fmt: skip
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def serve(chunks: int, ready: multiprocessing.SimpleQueue) -> None:  # type: ignore[type-arg]
    """Serve the recorded stream to every request (runs in a child process)."""
    body = recorded_stream(chunks)
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"cache-control: no-cache\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request_head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in request_head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(head + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())


Consumer = Callable[[], Awaitable[int]]


def consumers(url: str) -> dict[str, tuple[Consumer, Callable[[], Awaitable[None]]]]:
    request = ModelRequest(model=f"openai/{MODEL}", messages=[Message.user("go")])
    raw_client = httpx.AsyncClient(timeout=60)
    provider = OpenAIProvider(base_url=url, api_key="sk-bench")

    async def raw() -> int:
        size = 0
        async with raw_client.stream("POST", f"{url}/chat/completions", json={}) as response:
            async for data in response.aiter_bytes():
                size += len(data)
        return size

    async def ours() -> int:
        builder, count = ResultBuilder(), 0
        async for part in provider.stream(request):
            builder.add(part)
            count += 1
        assert builder.result().tool_calls[0].arguments == '{"query": "streaming", "n": 10}'
        return count

    import openai  # the bench extra; not a runtime dependency

    sdk_client = openai.AsyncOpenAI(base_url=url, api_key="sk-bench", max_retries=0)

    async def sdk() -> int:
        stream = await sdk_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "go"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        text, count = [], 0
        async for chunk in stream:
            count += 1
            if chunk.choices and chunk.choices[0].delta.content:
                text.append(chunk.choices[0].delta.content)
        return count

    return {
        "raw bytes": (raw, raw_client.aclose),
        "statekernel": (ours, provider.aclose),
        "openai SDK": (sdk, sdk_client.close),
    }


async def measure(url: str, chunks: int, rounds: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {}
    items = consumers(url)
    names = list(items)
    for name in names:  # warm up connections and imports
        await items[name][0]()
    for round_index in range(rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            began = time.perf_counter()
            await items[name][0]()
            timings.setdefault(name, []).append(time.perf_counter() - began)
    for _, close in items.values():
        await close()
    return timings


def report(timings: dict[str, list[float]], chunks: int, size: int) -> None:
    medians = {name: statistics.median(values) for name, values in timings.items()}
    floor = medians["raw bytes"]
    print(f"{chunks} chunks, {size / 1e6:.1f} MB, median of {len(timings['raw bytes'])} rounds")
    print(f"{'consumer':<14}{'total ms':>10}{'chunks/s':>12}{'us/chunk':>10}{'over raw':>10}")
    for name, seconds in medians.items():
        extra = (seconds - floor) / chunks * 1e6
        print(
            f"{name:<14}{seconds * 1e3:>10.1f}{chunks / seconds:>12,.0f}"
            f"{seconds / chunks * 1e6:>10.2f}{extra:>10.2f}"
        )
    ratio = medians["openai SDK"] / medians["statekernel"]
    print(f"SDK time / statekernel time: {ratio:.2f} (above 1: statekernel is faster)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    ready = context.SimpleQueue()
    server = context.Process(target=serve, args=(args.chunks, ready), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{ready.get()}"
        timings = asyncio.run(measure(url, args.chunks, args.rounds))
        report(timings, args.chunks, len(recorded_stream(args.chunks)))
    finally:
        server.terminate()
        server.join()


if __name__ == "__main__":
    main()
