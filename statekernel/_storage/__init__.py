"""Layer 3, the protocols: what the kernel needs from a checkpoint store (``protocol``:
compare-and-set commits, leases, events, listings, and the optional features a store
may declare) and from a model provider (``provider``: ``ModelProvider.stream`` and the
provider-neutral stream parts), and where the default store is configured (``config``).
The stores themselves are ``statekernel.stores``; their stored format is
``statekernel.stores._format``."""

__all__: list[str] = []
