"""Layer 4, the kernel: the API (``kernel.Kernel``), the drive of one run (``drive``:
effect, transition, commit, and where a crash can land), and what a run calls out to:
models (``model``), tools (``tools``, ``schema``, ``mcp``), dispatch policy, hooks,
middleware, questions (``asking``), child runs (``delegate``) and telemetry. The only
ties upward are the lazy registries that resolve a store URL (``statekernel.stores``)
and a model string (``statekernel.providers``) when a kernel needs one."""

__all__: list[str] = []
