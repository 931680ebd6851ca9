"""Layer 6, the workers: processes that take runs off a Redis run queue and drive them
under a lease (``worker``, ``task``, ``lease``). They depend on the kernel and the Redis
store; the kernel never imports them."""

__all__: list[str] = []
