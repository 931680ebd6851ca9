"""The stored format shared by the stores: everything about a run's bytes, read in this
order.

* ``documents``: a stored document as compact UTF-8 JSON, times as integer
  microseconds, ``CorruptCheckpoint`` for what cannot be read;
* ``blobs``: long strings and large JSON values kept once per run by a hash of their
  text, the markers that stand for them, the escaping that keeps a user's ``$`` keys
  from being read as markers;
* ``converter``: the storage converter, the plain one of
  ``statekernel._records.convert`` built with the hooks that make blobs, references
  into the message log and integer times, lent for each commit or load with what it
  needs (no global or context variable);
* ``patches``: a head as a patch of the head before it;
* ``events``: a commit's events inside its commit log entry;
* ``codec``: how a run becomes an append-only message log, turn log, blobs, a small
  head and a commit log, and back;
* ``dicts``: the preset dictionary commit log entries are deflated with;
* ``checksum``: the CRC32 every stored record ends with.
"""

__all__: list[str] = []
