"""Layer 1, the records: immutable ``attrs`` records of a run (messages, turns, tool
call records, events, JSON values) and the one ``cattrs`` converter that turns them
into data (``convert``), with the hooks through which a store keeps each thing once
(``storing``). Depends on nothing but ``statekernel.errors``."""

__all__: list[str] = []
