"""The stored format shared by the persistent stores: how a run becomes an append-only
message log, turn log, blobs, a small head and a commit log (``codec``), the
compression dictionaries of its documents (``dicts``), the events of a commit
(``events``) and the checksum every stored value ends with (``checksum``)."""

__all__: list[str] = []
