"""Layer 3, beside the storage protocol: the model protocol (``protocol``): what the
kernel needs from a model provider (``ModelProvider.stream``), the provider-neutral
stream parts providers yield, and their assembly into a ``ModelResult``. The providers
themselves are ``statekernel.providers``."""

__all__: list[str] = []
