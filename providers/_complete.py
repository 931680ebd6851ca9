"""Run one request to its end and assemble the result."""

from __future__ import annotations

from statekernel._records.messages import ModelRequest, ModelResult
from statekernel._storage.provider import ModelProvider, ResultBuilder
from statekernel.providers._http import closing_stream

__all__ = ["complete"]


async def complete(provider: ModelProvider, request: ModelRequest) -> ModelResult:
    """Stream ``request`` from ``provider`` to its end and return the assembled result.

    Returns:
        The result the stream's parts assemble to.

    Raises:
        ProviderError: the provider failed (its ``stream`` raised one), or its stream
            sent an invalid part or ended without a ``StreamEnd``.
    """
    builder = ResultBuilder()
    async with closing_stream(provider.stream(request)) as parts:
        async for part in parts:
            builder.add(part)
    return builder.result()
