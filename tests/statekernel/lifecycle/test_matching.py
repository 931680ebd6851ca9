"""What a tool call asks for is its tool and its arguments as parsed JSON: the key
does not depend on key order, whitespace or how a whole number is written, and tells
apart calls that ask for different things."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from statekernel._lifecycle.matching import call_key
from statekernel.testing import strategies as sts


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(v) for v in value]
    return value


@given(st.dictionaries(st.text(max_size=6), sts.json_values(6), max_size=4))
def test_the_key_ignores_key_order_and_whitespace(arguments: dict[str, Any]) -> None:
    written = json.dumps(arguments)
    rewritten = json.dumps(_reordered(arguments), indent=2, ensure_ascii=False)
    assert call_key("pay", written) == call_key("pay", rewritten)


def test_the_key_tells_apart_what_differs() -> None:
    key = call_key("pay", '{"to": "bob", "amount": 5}')
    assert key == ("pay", '{"amount":5,"to":"bob"}')
    assert call_key("pay", '{"amount":5.0,"to":"bob"}') == key
    assert call_key("pay", '{"amount":6,"to":"bob"}') != key
    assert call_key("refund", '{"amount":5,"to":"bob"}') != key
    assert call_key("flag", '{"on": true}') != call_key("flag", '{"on": 1}')
    assert call_key("pay", "") == call_key("pay", "{}") == ("pay", "{}")
    assert call_key("pay", '{"to": "bob"') is None
    assert call_key("pay", "[1, 2]") is None
