"""A run's tags: a few ``key -> value`` strings to find runs by, and their rules.

Tags are set when a run starts (``Kernel.start(tags=)``) and changed with
compare-and-set (``Kernel.update_tags``). Stores index them (SQLite and PostgreSQL in a
table of (run, key, value), Redis in a set of runs per ``key=value``; the file and
memory stores read every head), so ``list_runs(tags={...})`` finds the runs that carry
every pair given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from statekernel._records.values import shown
from statekernel.errors import InvalidTag

__all__ = [
    "MAX_TAGS",
    "MAX_TAG_VALUE",
    "TAG_KEY",
    "check_tag_filter",
    "check_tag_keys",
    "check_tags",
    "parse_tag",
]

TAG_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""What a tag key looks like: 1 to 64 letters, digits, ``_``, ``.``, ``:`` or ``-``."""

MAX_TAG_VALUE = 256
"""The longest tag value, in characters."""

MAX_TAGS = 32
"""The most tags a run carries."""


def _key(key: Any, what: str) -> str:
    if type(key) is not str or TAG_KEY.fullmatch(key) is None:
        raise InvalidTag(
            f"{what}: tag key {shown(key)} must be 1 to 64 of A-Z a-z 0-9 _ . : -",
            key=key if type(key) is str else None,
        )
    return key


def _value(key: str, value: Any, what: str) -> str:
    if type(value) is not str:
        raise InvalidTag(f"{what}: tag {key!r} must have a str value, got {shown(value)}", key=key)
    if len(value) > MAX_TAG_VALUE:
        raise InvalidTag(
            f"{what}: tag {key!r} has a value of {len(value)} characters (at most {MAX_TAG_VALUE})",
            key=key,
        )
    if "\x00" in value or not _encodable(value):
        raise InvalidTag(f"{what}: tag {key!r} has a value UTF-8 cannot hold", key=key)
    return value


def _encodable(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _pairs(tags: Any, what: str) -> dict[str, str]:
    if not isinstance(tags, Mapping):
        raise InvalidTag(f"{what} must be a mapping of str to str, got {shown(tags)}")
    return {_key(k, what): _value(k, v, what) for k, v in tags.items()}


def check_tags(tags: Any, what: str = "tags") -> dict[str, str]:
    """A run's tags as it keeps them (a new ``dict``); ``InvalidTag`` naming the key
    that breaks a rule, or saying there are more than ``MAX_TAGS``."""
    found = _pairs(tags, what)
    if len(found) > MAX_TAGS:
        raise InvalidTag(f"{what}: {len(found)} tags, a run carries at most {MAX_TAGS}")
    return found


def check_tag_filter(tags: Any, what: str = "tags") -> dict[str, str] | None:
    """The ``tags`` of a listing: None (no filter) or pairs that each follow the rules
    (an empty mapping is no filter either)."""
    if tags is None:
        return None
    found = check_tags(tags, what)
    return found or None


def check_tag_keys(keys: Any, what: str = "remove") -> tuple[str, ...]:
    """Tag keys to remove: an iterable of keys (not one string)."""
    if isinstance(keys, str | bytes | Mapping) or not isinstance(keys, Iterable):
        raise InvalidTag(f"{what} must be an iterable of tag keys, got {shown(keys)}")
    return tuple(dict.fromkeys(_key(k, what) for k in keys))


def parse_tag(text: str) -> tuple[str, str]:
    """``key=value`` (as the command line and the web view take a tag) as a pair; the
    value may be empty and hold ``=``. ``InvalidTag`` when there is no ``=`` or the pair
    breaks a rule."""
    key, sep, value = text.partition("=")
    if not sep:
        raise InvalidTag(f"tag {text!r} must look like key=value", key=key or None)
    return _key(key, "tag"), _value(key, value, "tag")
