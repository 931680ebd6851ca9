"""``Closing``: ``async with`` for the objects statekernel closes with ``aclose()``
(stores, kernels, MCP connections): entering gives the object, leaving closes it."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["Closing"]


class Closing:
    """Base of an object closed by ``aclose()``, usable as ``async with obj: ...``."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Release what the object holds; calling it again does nothing."""
        raise NotImplementedError
