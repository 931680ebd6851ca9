"""Layer 5, the kernel: the API (``kernel.Kernel``), the drive of one run (``drive``:
effect, transition, commit, and where a crash can land; its model call in
``model_call``, its tool calls in ``tool_calls``), and what a run calls out to:
tools (``tools``, ``schema``, ``mcp``), dispatch policy, hooks, middleware, questions
(``asking``), child runs (``delegate``) and telemetry. Models are reached through
their protocol (``statekernel._storage.provider``). The adapters below it are reached only
through the lazy registries that resolve a store URL (``statekernel.stores``) and a
model string (``statekernel.providers``) when a kernel needs one."""

__all__: list[str] = []
