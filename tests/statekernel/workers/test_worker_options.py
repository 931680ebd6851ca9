"""``Worker`` options are checked when it is made: ``InvalidArgument`` naming the option."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

import statekernel as sk
from statekernel.errors import InvalidArgument


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("concurrency", "4"),
        ("concurrency", 0),
        ("concurrency", 2.0),
        ("concurrency", True),
        ("lease_ttl", math.nan),
        ("lease_ttl", math.inf),
        ("lease_ttl", "30"),
        ("lease_ttl", 0),
        ("grace", math.nan),
        ("grace", -1),
        ("grace", "5"),
        ("block", math.inf),
        ("block", "1"),
        ("block", None),
        ("max_deliveries", "10"),
        ("max_deliveries", 1.5),
        ("max_deliveries", 0),
        ("queue", 5),
        ("name", 5),
    ],
)
def test_a_wrong_option_is_refused(option: str, value: Any) -> None:
    with pytest.raises(InvalidArgument, match=rf"^{option} .*{re.escape(repr(value))}"):
        sk.Worker("redis://127.0.0.1:1/0", **{option: value})


def test_options_as_they_are_used() -> None:
    worker = sk.Worker("redis://127.0.0.1:1/0", lease_ttl=3, grace=0, block=1)
    assert (worker.lease_ttl, worker.grace, worker.block) == (3.0, 0.0, 1.0)
    assert type(worker.lease_ttl) is float
