"""Layer 1, the records: immutable ``attrs`` records of a run (messages, turns, tool
call records, events, JSON values), the checks of values given to them, and the plain
``cattrs`` converter that turns them into data and back (``convert``). How a store
keeps them as bytes is the stored format's (``statekernel.stores._format``). Depends
on nothing but ``statekernel.errors``."""

__all__: list[str] = []
