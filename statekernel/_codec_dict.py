"""Compression of commit log entries with a preset dictionary of the stored format.

A commit log entry is a small JSON document (a head patch and a few events, about
150 bytes) made mostly of the same keys, state names and shapes every time; raw
deflate with a dictionary of those shrinks it to about a third. Stored entries
are ``NUL 0x01`` + deflate(JSON) with ``ENTRY_DICT``.

``ENTRY_DICT`` is part of the stored format: it must never change. A different
dictionary needs a new marker byte, with this one still read.
"""

from __future__ import annotations

import zlib
from typing import Any

from statekernel._codec_base import corrupt, dump_bytes, load_json

__all__ = ["ENTRY_DICT", "dump_entry", "load_entry"]

_SAMPLES = (
    '{"p":{"s":"paused","P":["waiting for approval","dispatching_tools",{}],"ua":1800000000000000}'
    ',"q":12,"E":[[10,["waiting for approval","dispatching_tools",{}]]]}',
    '{"p":{"s":"failed","F":["ProviderUnavailable","overloaded","calling_model"],'
    '"ua":1800000000000000},"q":30,"E":[[13,["ProviderUnavailable","overloaded",'
    '"calling_model"]]]}',
    '{"p":{"s":"completed","ua":1800000000000000,"$m":[0,3],"$t":[0,1],"-":["T"]},"q":8,'
    '"E":[[9,[0]],[15,["stop"]]]}',
    '{"f":{"id":"00000000000000000000000000000000","M":"openai/gpt-4o","r":0,"s":"init",'
    '"c":{},"x":10,"ca":1800000000000000,"ua":1800000000000000,"sv":1,"$m":[0,2],'
    '"$t":[0,0]},"q":0,"E":[[0,["openai/gpt-4o"]],[12,[2,["system","user"]]]]}',
    '{"p":{"s":"calling_model","T":{"i":5,"q":{"M":"openai/gpt-4o","m":{"$r":[0,11]},'
    '"T":{"$v":"0000000000000000000000"}}},"ua":1800000000000000},"q":41,'
    '"E":[[1,[5]],[2,[5,"openai/gpt-4o",11,["search"]]]]}',
    '{"p":{"~T":{"n":1},"ua":1800000000000000},"q":43,"E":[[3,[5,1]]]}',
    '{"p":{"s":"dispatching_tools","~T":{"a":{"m":{"$m":11},"u":[10,5],"f":"tool_calls",'
    '"M":"gpt-4o"},"p":[[0,{"$a":1}]]},"U":[60,30],"ua":1800000000000000,"$m":[0,12]},'
    '"q":44,"E":[[5,[5,"tool_calls",[{"id":"call_5_0","name":"search"}]]]]}',
    '{"p":{"~T":{"f":[[0,{"$a":1},null,null,1,1800000000000000]],"-":["p"]},'
    '"ua":1800000000000000},"q":45,"E":[[6,["call_5_0","search",1]]]}',
    '{"p":{"~T":{"d":[[0,{"$a":1},{"$b":"0000000000000000000000"},null,1,1800000000000000,'
    '1800000000000000]],"-":["f"]},"ua":1800000000000000},"q":46,'
    '"E":[[7,["call_5_0","search",false]]]}',
    '{"p":{"s":"preparing_turn","ua":1800000000000000,"$m":[0,13],"$t":[0,6],"-":["T"]},'
    '"q":47,"E":[[8,[5,1]],[9,[5]]]}',
)

ENTRY_DICT = "".join(_SAMPLES).encode()
"""The preset dictionary: typical entries of the kernel's lifecycle, most common last."""

_MARK = b"\x00\x01"


def dump_entry(entry: dict[str, Any]) -> bytes:
    """A commit log entry as stored: compressed with ``ENTRY_DICT``."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15, 9, zlib.Z_DEFAULT_STRATEGY, ENTRY_DICT)
    return _MARK + packer.compress(dump_bytes(entry)) + packer.flush()


def load_entry(data: bytes, what: str) -> Any:
    """A stored commit log entry as a document."""
    if data[:2] != _MARK:
        raise corrupt(what, "not a stored commit log entry")
    try:
        unpacker = zlib.decompressobj(-15, ENTRY_DICT)
        data = unpacker.decompress(data[2:])
    except zlib.error as exc:
        raise corrupt(what, exc) from exc
    if not unpacker.eof:
        raise corrupt(what, "a commit log entry cut short")
    return load_json(data, what)
