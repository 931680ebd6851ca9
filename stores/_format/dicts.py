"""Compression of commit log entries with a preset dictionary of the stored format.

A commit log entry is a small JSON document (a head patch and a few events, a few
hundred bytes) made mostly of the same keys, state names and shapes every time; raw
deflate with a dictionary of those shrinks it to about a fifth. Stored entries
are ``NUL 0x01`` + deflate(JSON) with ``ENTRY_DICT``.

``ENTRY_DICT`` is part of the stored format: it must never change. A different
dictionary needs a new marker byte, with this one still read.
"""

from __future__ import annotations

import zlib
from typing import Any

from statekernel.stores._format.documents import corrupt, dump_bytes, load_json

__all__ = ["ENTRY_DICT", "dump_entry", "load_entry"]

_SAMPLES = (
    '{"p":{"state":"paused","pause":{"reason":"waiting for approval","resume_to":"dispatchi'
    'ng_tools"},"updated_at":1800000000000000},"r":12,"q":12,"E":[{"type":"run_paused","dat'
    'a":{"reason":"waiting for approval","resume_to":"dispatching_tools","metadata":{}}}]}',
    '{"p":{"state":"failed","failure":{"error":"ProviderUnavailable","message":"overloaded"'
    ',"failed_in":"calling_model"},"updated_at":1800000000000000},"r":30,"q":30,"E":[{"type'
    '":"run_failed","data":{"error":"ProviderUnavailable","message":"overloaded","failed_in'
    '":"calling_model"}}]}',
    '{"p":{"state":"completed","updated_at":1800000000000000,"usage":{"input_tokens":40,"ou'
    'tput_tokens":20},"$m":[0,8],"$t":[0,4],"-":["current_turn"]},"r":8,"q":28,"E":[{"type"'
    ':"model_completed","data":{"index":3,"finish_reason":"stop","tool_calls":[]}},{"type":'
    '"turn_completed","data":{"index":3}},{"type":"run_completed","data":{"reason":"stop"}}'
    "]}",
    '{"f":{"run_id":"00000000000000000000000000000000","model":"openai/gpt-4o","revision":0'
    ',"state":"init","max_turns":10,"created_at":1800000000000000,"updated_at":180000000000'
    '0000,"schema_version":1,"$m":[0,2],"$t":[0,0]},"r":0,"q":0,"E":[{"type":"input_receive'
    'd","data":{"messages":2,"roles":["system","user"]}}]}',
    '{"p":{"state":"calling_model","updated_at":1800000000000000,"current_turn":{"index":0,'
    '"request":{"model":"openai/gpt-4o","messages":{"$r":[0,2]},"tools":{"$v":"000000000000'
    '0000000000"}},"model_attempts":1}},"r":1,"q":1,"E":[{"type":"run_started","data":{"mod'
    'el":"openai/gpt-4o"},"at":1800000000000000},{"type":"turn_started","data":{"index":0},'
    '"at":1800000000000000},{"type":"turn_prepared","data":{"index":0,"model":"openai/gpt-4'
    'o","messages":2,"tools":["search"]},"at":1800000000000000},{"type":"model_started","da'
    'ta":{"index":0,"attempt":1}}]}',
    '{"p":{"state":"dispatching_tools","updated_at":1800000000000000,"~current_turn":{"resu'
    'lt":{"message":{"$m":2},"usage":{"input_tokens":10,"output_tokens":5},"finish_reason":'
    '"tool_calls","model":"gpt-4o"},"in_flight":[{"id":"call_000001","name":"search","argum'
    'ents":"{\\"query\\": \\"\\", \\"limit\\": 10}","input":{"query":"","limit":10},"attempt":1,"'
    'started_at":1800000000000000}]},"usage":{"input_tokens":10,"output_tokens":5},"$m":[0,'
    '3]},"r":2,"q":5,"E":[{"type":"model_completed","data":{"index":0,"finish_reason":"tool'
    '_calls","tool_calls":[{"id":"call_000001","name":"search"}]},"at":1800000000000000},{"'
    'type":"tool_call_started","data":{"call_id":"call_000001","name":"search","attempt":1}'
    "}]}",
    '{"p":{"state":"calling_model","updated_at":1800000000000000,"~current_turn":{"index":1'
    ',"~request":{"messages":{"$r":[0,4]}},"-":["result","in_flight"]},"$m":[0,4],"$t":[0,1'
    ']},"r":3,"q":7,"E":[{"type":"tool_call_completed","data":{"call_id":"call_000001","nam'
    'e":"search","is_error":false},"at":1800000000000000},{"type":"tools_completed","data":'
    '{"index":0,"calls":1},"at":1800000000000000},{"type":"turn_completed","data":{"index":'
    '0},"at":1800000000000000},{"type":"turn_started","data":{"index":1},"at":1800000000000'
    '000},{"type":"turn_prepared","data":{"index":1,"model":"openai/gpt-4o","messages":4,"t'
    'ools":["search"]},"at":1800000000000000},{"type":"model_started","data":{"index":1,"at'
    'tempt":1}}]}',
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
        if data[:1] == _MARK[:1] and data[1:2] > _MARK[1:]:
            raise corrupt(
                what,
                f"commit log entry format {data[1]}, newer than {_MARK[1]} (the only one this"
                " release reads): a newer statekernel wrote it; upgrade to read it",
            )
        raise corrupt(what, "not a stored commit log entry")
    try:
        unpacker = zlib.decompressobj(-15, ENTRY_DICT)
        data = unpacker.decompress(data[2:])
    except zlib.error as exc:
        raise corrupt(what, exc) from exc
    if not unpacker.eof:
        raise corrupt(what, "a commit log entry cut short")
    return load_json(data, what)
